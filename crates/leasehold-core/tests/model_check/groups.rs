//! Lease groups (issue 33): two members, each running [`Machine`] on its own member lease (a
//! server-clock record), and two shard records written by compare-and-set. A member reads the
//! store (who leads which member lease at which term, and the shard records), claims a shard
//! whose record is free or names a member that its read showed not leading the member term the
//! record names, moves a shard it owns to the other member (its task stops first), and owns a
//! shard once its write is answered or a read shows the record naming it under its member term.
//! Requests and replies are delivered late (FIFO per connection) or lost; a member that owns a
//! shard pauses (its clock runs on, it neither acts nor receives); a member crashes.
//!
//! The rule: a member believes a shard only while its machine believes the member lease, at the
//! member term the record names (the engine's [`Leader::scoped`](leasehold_core) leadership).
//! Property: no shard is believed by two members at one instant. With the rule switched off (a
//! shard believed for as long as its claim stands), the checker finds a double owner: a member
//! pauses, its member lease expires, the other claims the shard.

use super::*;

const MEMBERS: usize = 2;
const SHARDS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct MemberRecord {
    term: u64,
    version: u64,
    expires_at: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShardRec {
    /// `None`: free.
    owner: Option<usize>,
    member_term: u64,
    term: u64,
    version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum GMsg {
    Lease {
        from: usize,
        id: OpId,
        request: Request,
    },
    LeaseReply {
        to: usize,
        id: OpId,
        reply: ModelReply,
    },
    Write {
        from: usize,
        shard: usize,
        expected: u64,
        rec: ShardRec,
    },
    Written {
        to: usize,
        shard: usize,
        ok: bool,
        rec: Option<ShardRec>,
    },
    Read {
        from: usize,
    },
    ReadReply {
        to: usize,
        terms: [Option<u64>; MEMBERS],
        shards: [Option<ShardRec>; SHARDS],
    },
}

impl GMsg {
    /// (member, direction): each direction of each member's connection is FIFO.
    fn channel(&self) -> (usize, u8) {
        match self {
            GMsg::Lease { from, .. } | GMsg::Write { from, .. } | GMsg::Read { from } => (*from, 0),
            GMsg::LeaseReply { to, .. } | GMsg::Written { to, .. } | GMsg::ReadReply { to, .. } => (*to, 1),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GState {
    now: u64,
    machines: Vec<Machine>,
    members: [Option<MemberRecord>; MEMBERS],
    last_term: [u64; MEMBERS],
    versions: u64,
    shards: [Option<ShardRec>; SHARDS],
    net: Vec<GMsg>,
    seen_terms: [[Option<u64>; MEMBERS]; MEMBERS],
    seen_shards: [[Option<ShardRec>; SHARDS]; MEMBERS],
    /// Each member's confirmed ownership of each shard: the member term it was confirmed under.
    owns: [[Option<(u64, u64)>; SHARDS]; MEMBERS],
    writing: [[bool; SHARDS]; MEMBERS],
    /// The member's view of the member terms is at least as new as its view of the record.
    fresh: [[bool; SHARDS]; MEMBERS],
    reading: [bool; MEMBERS],
    paused: [bool; MEMBERS],
    crashed: [bool; MEMBERS],
    losses_left: u8,
    pauses_left: u8,
    crashes_left: u8,
    moves_left: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GAction {
    Advance,
    Tick(usize),
    Deliver(usize),
    Lose(usize),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    Read(usize),
    Claim(usize, usize),
    Move(usize, usize),
}

pub(crate) struct Groups {
    pub(crate) timing: Timing,
    pub(crate) horizon_ms: u64,
    pub(crate) rates: [u64; 3],
    pub(crate) losses: u8,
    pub(crate) pauses: u8,
    pub(crate) crashes: u8,
    pub(crate) moves: u8,
    /// The rule: a shard is believed only while the member lease is, at the record's member term.
    pub(crate) scoped: bool,
    /// A record's owner is judged by a view of the member terms taken after the record was read
    /// (the engine lists the members again after reading the records).
    pub(crate) listing_after_read: bool,
    /// A search for one counterexample: member 0 claims until it pauses, member 1 only after,
    /// and only member 0 pauses (the existing model's `focus`, for the same reason).
    pub(crate) focus: bool,
}

fn member_lease(i: usize) -> LeaseName {
    LeaseName::new(format!("g.m.{i}")).unwrap()
}

impl Groups {
    fn local(&self, s: &GState, i: usize) -> Instant {
        local_now(&self.rates, s.now, i)
    }

    /// Whether member `i` believes shard `shard` at this instant.
    fn believes(&self, s: &GState, i: usize, shard: usize) -> bool {
        let Some((_, member_term)) = s.owns[i][shard] else {
            return false;
        };
        if s.crashed[i] {
            return false;
        }
        if !self.scoped {
            return true;
        }
        let machine = &s.machines[i];
        machine.believes_leader(self.local(s, i)) && machine.term() == Some(Term(member_term))
    }

    fn leading_term(&self, s: &GState, i: usize) -> Option<u64> {
        let machine = &s.machines[i];
        machine
            .believes_leader(self.local(s, i))
            .then(|| machine.term().map(|t| t.0))
            .flatten()
    }

    fn feed(&self, s: &mut GState, i: usize, input: Input) {
        let mut out = Vec::new();
        let now = self.local(s, i);
        s.machines[i].handle(now, input, &mut out);
        for output in out {
            match output {
                Output::Send(id, request) => s.net.push(GMsg::Lease { from: i, id, request }),
                // The shards' tasks are cancelled with the member lease.
                Output::Deposed { .. } => s.owns[i] = [None; SHARDS],
                _ => {}
            }
        }
    }

    fn expire(&self, s: &mut GState) {
        for record in &mut s.members {
            if record.is_some_and(|r| s.now >= r.expires_at) {
                *record = None;
            }
        }
    }

    fn observation(&self, s: &GState, i: usize) -> Observation {
        Observation {
            lease: member_lease(i),
            holder: s.members[i].map(|r| HolderInfo {
                id: candidate(i),
                term: Term(r.term),
                ttl: self.timing.ttl,
                version: r.version.to_string(),
                store_remaining: None,
                orphaned: false,
                reserved: false,
            }),
            last_term: Term(s.last_term[i]),
            previous_end: None,
        }
    }

    fn grant(&self, i: usize, r: &MemberRecord) -> Grant {
        Grant {
            lease: member_lease(i),
            holder: candidate(i),
            term: Term(r.term),
            ttl: self.timing.ttl,
            token: r.version.to_string(),
        }
    }

    /// The store applies a member lease request of member `i` (its lease has no other candidate).
    fn apply_lease(&self, s: &mut GState, i: usize, request: &Request) -> ModelReply {
        self.expire(s);
        let ttl = self.timing.ttl.as_millis() as u64;
        s.versions += 1;
        let version = s.versions;
        match request {
            Request::Acquire(_) => {
                s.last_term[i] += 1;
                let record = MemberRecord {
                    term: s.last_term[i],
                    version,
                    expires_at: s.now + ttl,
                };
                s.members[i] = Some(record);
                ModelReply::Acquire(Acquired::Granted(self.grant(i, &record)))
            }
            Request::Renew(g) => match &mut s.members[i] {
                Some(r) if Term(r.term) == g.term => {
                    r.version = version;
                    r.expires_at = s.now + ttl;
                    let grant = self.grant(i, r);
                    ModelReply::Renew(Renewed::Renewed(grant))
                }
                _ => ModelReply::Renew(Renewed::Lost(self.observation(s, i))),
            },
            Request::Release(g) | Request::HandOver(g, _) => {
                if s.members[i].is_some_and(|r| Term(r.term) == g.term) {
                    s.members[i] = None;
                }
                ModelReply::Release
            }
            Request::Inspect => ModelReply::Inspect(self.observation(s, i)),
            Request::Withdraw => ModelReply::Withdraw,
        }
    }

    fn step(&self, last: &GState, action: GAction) -> GState {
        let mut s = last.clone();
        match action {
            GAction::Advance => s.now += STEP_MS,
            GAction::Tick(i) => self.feed(&mut s, i, Input::Tick),
            GAction::Pause(i) => {
                s.pauses_left -= 1;
                s.paused[i] = true;
            }
            GAction::Resume(i) => s.paused[i] = false,
            GAction::Crash(i) => {
                s.crashes_left -= 1;
                s.crashed[i] = true;
                s.owns[i] = [None; SHARDS];
            }
            GAction::Read(i) => {
                s.reading[i] = true;
                s.net.push(GMsg::Read { from: i });
            }
            GAction::Claim(i, shard) => {
                let term = self.leading_term(&s, i).expect("a claim by a leading member");
                let seen = s.seen_shards[i][shard];
                s.writing[i][shard] = true;
                s.net.push(GMsg::Write {
                    from: i,
                    shard,
                    expected: seen.map_or(0, |r| r.version),
                    rec: ShardRec {
                        owner: Some(i),
                        member_term: term,
                        term: seen.map_or(0, |r| r.term) + 1,
                        version: 0,
                    },
                });
            }
            GAction::Move(i, shard) => {
                s.moves_left -= 1;
                let (version, _) = s.owns[i][shard].take().expect("a move of an owned shard");
                let to = (i + 1) % MEMBERS;
                let term = s.seen_shards[i][shard].map_or(0, |r| r.term);
                s.writing[i][shard] = true;
                s.net.push(GMsg::Write {
                    from: i,
                    shard,
                    expected: version,
                    rec: ShardRec {
                        owner: Some(to),
                        member_term: s.seen_terms[i][to].expect("a move to a member seen leading"),
                        term: term + 1,
                        version: 0,
                    },
                });
            }
            GAction::Lose(k) => {
                s.losses_left -= 1;
                match s.net.remove(k) {
                    GMsg::Write { from, shard, .. } => s.writing[from][shard] = false,
                    GMsg::Written { to, shard, .. } => s.writing[to][shard] = false,
                    GMsg::Read { from } | GMsg::ReadReply { to: from, .. } => s.reading[from] = false,
                    _ => {}
                }
            }
            GAction::Deliver(k) => {
                let msg = s.net.remove(k);
                self.deliver(&mut s, msg);
            }
        }
        s
    }

    fn deliver(&self, s: &mut GState, msg: GMsg) {
        match msg {
            GMsg::Lease { from, id, request } => {
                let reply = self.apply_lease(s, from, &request);
                s.net.push(GMsg::LeaseReply { to: from, id, reply });
            }
            GMsg::LeaseReply { to, id, reply } => {
                let reply = match reply {
                    ModelReply::Acquire(a) => Reply::Acquire(Ok(a)),
                    ModelReply::Renew(r) => Reply::Renew(Ok(r)),
                    ModelReply::Release => Reply::Release(Ok(())),
                    ModelReply::Inspect(o) => Reply::Inspect(Ok(o)),
                    ModelReply::Withdraw | ModelReply::Refused(_) => Reply::Withdraw(Ok(())),
                };
                if !s.crashed[to] {
                    self.feed(s, to, Input::Reply(id, reply));
                }
            }
            GMsg::Write {
                from,
                shard,
                expected,
                rec,
            } => {
                let current = s.shards[shard];
                let ok = current.map_or(0, |r| r.version) == expected;
                if ok {
                    s.versions += 1;
                    s.shards[shard] = Some(ShardRec {
                        version: s.versions,
                        ..rec
                    });
                }
                s.net.push(GMsg::Written {
                    to: from,
                    shard,
                    ok,
                    rec: s.shards[shard],
                });
            }
            GMsg::Written { to, shard, ok, rec } => {
                s.writing[to][shard] = false;
                s.seen_shards[to][shard] = rec;
                s.fresh[to][shard] = false;
                if let (true, Some(r)) = (ok, rec)
                    && r.owner == Some(to)
                    && !s.crashed[to]
                {
                    s.owns[to][shard] = Some((r.version, r.member_term));
                }
            }
            GMsg::Read { from } => {
                self.expire(s);
                let terms = [0, 1].map(|j| s.members[j].map(|r| r.term));
                s.net.push(GMsg::ReadReply {
                    to: from,
                    terms,
                    shards: s.shards,
                });
            }
            GMsg::ReadReply { to, terms, shards } => {
                s.reading[to] = false;
                s.seen_terms[to] = terms;
                s.seen_shards[to] = shards;
                s.fresh[to] = [true; SHARDS];
                if s.crashed[to] {
                    return;
                }
                let leading = self.leading_term(s, to);
                for (shard, record) in shards.iter().enumerate() {
                    // A record naming this member under its member term, not being rewritten
                    // by it: confirmed by the read (a claim whose answer was lost, a move here).
                    if let Some(r) = record
                        && r.owner == Some(to)
                        && Some(r.member_term) == leading
                        && !s.writing[to][shard]
                        && s.owns[to][shard].is_none()
                    {
                        s.owns[to][shard] = Some((r.version, r.member_term));
                    }
                }
            }
        }
    }

    /// Whether member `i`'s view lets it claim `shard` under member term `term`.
    fn claimable(&self, s: &GState, i: usize, shard: usize, term: u64) -> bool {
        match s.seen_shards[i][shard] {
            None => true,
            Some(ShardRec { owner: None, .. }) => true,
            Some(ShardRec {
                owner: Some(o),
                member_term,
                ..
            }) if o == i => member_term != term,
            Some(ShardRec {
                owner: Some(o),
                member_term,
                ..
            }) => (s.fresh[i][shard] || !self.listing_after_read) && s.seen_terms[i][o] != Some(member_term),
        }
    }
}

impl Model for Groups {
    type State = GState;
    type Action = GAction;

    fn init_states(&self) -> Vec<GState> {
        let machines = (0..MEMBERS)
            .map(|i| {
                Machine::new(
                    self.timing,
                    Expiry::ServerClock,
                    Notifications::None,
                    member_lease(i),
                    candidate(i),
                    local_now(&self.rates, 0, i),
                    7,
                )
                .unwrap()
            })
            .collect();
        vec![GState {
            now: 0,
            machines,
            members: [None; MEMBERS],
            last_term: [0; MEMBERS],
            versions: 0,
            shards: [None; SHARDS],
            net: Vec::new(),
            seen_terms: [[None; MEMBERS]; MEMBERS],
            seen_shards: [[None; SHARDS]; MEMBERS],
            owns: [[None; SHARDS]; MEMBERS],
            writing: [[false; SHARDS]; MEMBERS],
            fresh: [[false; SHARDS]; MEMBERS],
            reading: [false; MEMBERS],
            paused: [false; MEMBERS],
            crashed: [false; MEMBERS],
            losses_left: self.losses,
            pauses_left: self.pauses,
            crashes_left: self.crashes,
            moves_left: self.moves,
        }]
    }

    fn actions(&self, s: &GState, actions: &mut Vec<GAction>) {
        // A running member acts as soon as its timer is due: time moves on only once every
        // running member has (pauses model everything else).
        let mut due = false;
        for i in 0..MEMBERS {
            if s.crashed[i] {
                continue;
            }
            if s.paused[i] {
                actions.push(GAction::Resume(i));
                continue;
            }
            let now = self.local(s, i);
            if s.machines[i].next_wake().is_some_and(|at| at <= now) {
                due = true;
                actions.push(GAction::Tick(i));
            }
            // Only an owner's pause can make it believe a shard too long (a claimer's late write
            // is compared by version): the others' pauses would only grow the space.
            if s.pauses_left > 0 && s.owns[i].iter().any(Option::is_some) && (!self.focus || i == 0) {
                actions.push(GAction::Pause(i));
            }
            if s.crashes_left > 0 {
                actions.push(GAction::Crash(i));
            }
            let Some(term) = self.leading_term(s, i) else { continue };
            if !s.reading[i] {
                actions.push(GAction::Read(i));
            }
            for shard in 0..SHARDS {
                if s.writing[i][shard] {
                    continue;
                }
                let turn = !self.focus || (i == 0) == (s.pauses_left > 0);
                if turn && s.owns[i][shard].is_none() && self.claimable(s, i, shard, term) {
                    actions.push(GAction::Claim(i, shard));
                }
                let other = (i + 1) % MEMBERS;
                if s.moves_left > 0 && s.owns[i][shard].is_some() && s.seen_terms[i][other].is_some() {
                    actions.push(GAction::Move(i, shard));
                }
            }
        }
        if s.now < self.horizon_ms && !due {
            actions.push(GAction::Advance);
        }
        for (k, msg) in s.net.iter().enumerate() {
            if s.net[..k].iter().any(|earlier| earlier.channel() == msg.channel()) {
                continue;
            }
            let (member, direction) = msg.channel();
            if direction == 1 && s.paused[member] {
                continue;
            }
            actions.push(GAction::Deliver(k));
            if s.losses_left > 0 {
                actions.push(GAction::Lose(k));
            }
        }
    }

    fn next_state(&self, last: &GState, action: GAction) -> Option<GState> {
        Some(self.step(last, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(
            "no shard has two owners",
            |model: &Groups, s: &GState| {
                (0..SHARDS).all(|shard| (0..MEMBERS).filter(|&i| model.believes(s, i, shard)).count() <= 1)
            },
        )]
    }
}

fn groups_model(scoped: bool) -> Groups {
    Groups {
        timing: Timing {
            jitter: PerMille(0),
            drift: PerMille(200),
            lock_delay: None,
            ..Timing::new(Duration::from_millis(TTL_MS))
        },
        horizon_ms: 2_500,
        rates: [1_000, 1_100, 1_000],
        losses: 1,
        pauses: 1,
        crashes: 1,
        moves: 1,
        scoped,
        listing_after_read: true,
        focus: false,
    }
}

fn check_groups(model: Groups, max_states: usize, breadth_first: bool) -> (usize, bool) {
    let builder = model
        .checker()
        .threads(2)
        .target_state_count(max_states)
        .timeout(Duration::from_secs(1_200));
    let (states, path) = if breadth_first {
        let checker = builder.spawn_bfs().join();
        (
            checker.unique_state_count(),
            checker.discovery("no shard has two owners"),
        )
    } else {
        let checker = builder.spawn_dfs().join();
        (
            checker.unique_state_count(),
            checker.discovery("no shard has two owners"),
        )
    };
    if let Some(path) = &path {
        eprintln!("counterexample: {:?}", path.clone().into_actions());
    }
    (states, path.is_some())
}

/// Two members x two shards, with lost messages, a pause, a crash and a move: no shard is
/// believed by two members at once.
#[test]
fn a_shard_is_believed_only_inside_its_member_lease() {
    let (states, found) = check_groups(groups_model(true), 3_000_000, false);
    eprintln!("groups, the rule on: {states} states");
    assert!(!found, "a shard had two owners");
    // The rule-off search's own space, with the rule on: nothing.
    let focused = Groups {
        losses: 0,
        crashes: 0,
        moves: 0,
        focus: true,
        ..groups_model(true)
    };
    let (states, found) = check_groups(focused, 3_000_000, false);
    eprintln!("groups, the rule on, focused: {states} states");
    assert!(!found, "a shard had two owners (focused)");
}

/// The rule switched off (a shard believed for as long as its claim stands): the checker finds
/// a double owner: member 0 claims, pauses past its member lease's expiry, member 1 claims (a
/// pause alone is enough; the focused search reaches it in a small space).
#[test]
fn a_shard_believed_past_its_member_lease_is_caught() {
    let model = Groups {
        losses: 0,
        crashes: 0,
        moves: 0,
        focus: true,
        ..groups_model(false)
    };
    let (states, found) = check_groups(model, 3_000_000, false);
    eprintln!("groups, the rule off: {states} states");
    assert!(found, "no double owner found with the rule switched off");
}

/// The owner of a record judged by a view of the member terms older than the record (as the
/// engine did before it listed the members again after reading the records): the checker finds
/// a double owner with the rule on. A member's write conflicts and shows a record naming the
/// other member, whose member lease its older view does not show yet; it claims the record at
/// that version while the other member owns it.
#[test]
fn a_claim_judged_on_an_older_listing_is_caught() {
    let model = Groups {
        losses: 0,
        crashes: 0,
        moves: 0,
        listing_after_read: false,
        ..groups_model(true)
    };
    let (states, found) = check_groups(model, 3_000_000, false);
    eprintln!("groups, a listing older than the record: {states} states");
    assert!(found, "no double owner found with claims judged on older listings");
}
