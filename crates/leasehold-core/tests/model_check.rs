//! Model check of the real election state machine with `stateright`.
//!
//! Three candidates run [`Machine`] (the same code the tokio driver runs) against a modelled
//! compare-and-set store. The checker explores every interleaving of:
//!
//! - global time advancing in steps, each candidate's clock running at its own rate
//!   (1.0, 0.9 and 1.1: they differ by up to 22%, within the configured `drift` of 20%);
//! - each candidate acting when its timer is due, or being paused (a stop-the-world pause of
//!   the process: its clock runs on, it neither acts nor receives) and resumed later;
//! - requests and replies delivered late, interleaved across connections in any order (FIFO
//!   within one direction of one connection), or lost (up to a bound);
//! - a leader resigning.
//!
//! Properties: at no instant do two candidates believe they lead (each checked with
//! [`Machine::believes_leader`] at its own local time), and every election has a term greater
//! than every earlier one. A second test breaks the rule on purpose (drift 0 with the same clock
//! rates) and asserts that the checker finds the double leadership.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use leasehold_core::machine::{Input, Machine, OpId, Output, Reply, Request};
use leasehold_core::{
    Acquired, CandidateId, EndReason, Expiry, Grant, HolderInfo, LeaseName, Millis, Notifications, Observation,
    Renewed, Term, Timing,
};
use stateright::{Checker, Model, Property};

static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

const TTL_MS: u64 = 1_000;
const STEP_MS: u64 = 100;
/// Clock rates in parts per thousand of real (store) time.
const RATES: [u64; 3] = [1_000, 900, 1_100];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Msg {
    Request { from: usize, id: OpId, request: Request },
    Reply { to: usize, id: OpId, reply: ModelReply },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ModelReply {
    Acquire(Acquired),
    Renew(Renewed),
    Release,
    Inspect(Observation),
    Withdraw,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Record {
    holder: usize,
    term: u64,
    version: u64,
    /// Real (store) time in ms at which the store lets go, for server-clock expiry.
    expires_at: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u64,
    machines: Vec<Machine>,
    record: Option<Record>,
    last_term: u64,
    previous_end: Option<EndReason>,
    versions: u64,
    net: Vec<Msg>,
    losses_left: u8,
    resigns_left: u8,
    paused: [bool; 3],
    pauses_left: u8,
    max_elected_term: u64,
    term_went_back: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Advance,
    Tick(usize),
    Deliver(usize),
    Lose(usize),
    Resign(usize),
    Pause(usize),
    Resume(usize),
}

struct Election {
    expiry: Expiry,
    timing: Timing,
    horizon_ms: u64,
    candidates: usize,
    /// How many messages may be lost, leaders resign and processes pause in one run.
    losses: u8,
    resigns: u8,
    pauses: u8,
}

fn local_now(now_ms: u64, i: usize) -> Instant {
    *BASE + Duration::from_micros(now_ms * RATES[i])
}

fn lease() -> LeaseName {
    LeaseName::new("model").unwrap()
}

fn candidate(i: usize) -> CandidateId {
    CandidateId::new(format!("c{i}")).unwrap()
}

impl Election {
    fn observation(&self, s: &State) -> Observation {
        Observation {
            lease: lease(),
            holder: s.record.as_ref().map(|r| HolderInfo {
                id: candidate(r.holder),
                term: Term(r.term),
                ttl: self.timing.ttl,
                version: r.version.to_string(),
                store_remaining: (self.expiry == Expiry::ServerClock)
                    .then(|| Duration::from_millis(r.expires_at.saturating_sub(s.now))),
            }),
            last_term: Term(s.last_term),
            previous_end: if s.record.is_none() { s.previous_end } else { None },
        }
    }

    fn grant(&self, r: &Record) -> Grant {
        Grant {
            lease: lease(),
            holder: candidate(r.holder),
            term: Term(r.term),
            ttl: self.timing.ttl,
            token: r.version.to_string(),
        }
    }

    /// The store applies a request at the current real time.
    fn apply(&self, s: &mut State, from: usize, request: &Request) -> ModelReply {
        if self.expiry == Expiry::ServerClock && s.record.as_ref().is_some_and(|r| s.now >= r.expires_at) {
            s.record = None;
            s.previous_end = Some(EndReason::Expired);
        }
        let ttl = self.timing.ttl.as_millis() as u64;
        s.versions += 1;
        let version = s.versions;
        match request {
            Request::Acquire(req) => {
                let take = match &s.record {
                    None => true,
                    Some(r) if r.holder == from => true,
                    Some(r) => {
                        self.expiry == Expiry::ObservedByContenders
                            && req.takeover.as_deref() == Some(r.version.to_string().as_str())
                    }
                };
                if !take {
                    return ModelReply::Acquire(Acquired::Held(self.observation(s)));
                }
                s.last_term += 1;
                let term = s.last_term;
                let record = Record {
                    holder: from,
                    term,
                    version,
                    expires_at: s.now + ttl,
                };
                let grant = self.grant(&record);
                s.record = Some(record);
                ModelReply::Acquire(Acquired::Granted(grant))
            }
            Request::Renew(g) => match &mut s.record {
                Some(r) if r.holder == from && Term(r.term) == g.term => {
                    r.version = version;
                    r.expires_at = s.now + ttl;
                    let grant = self.grant(r);
                    ModelReply::Renew(Renewed::Renewed(grant))
                }
                _ => ModelReply::Renew(Renewed::Lost(self.observation(s))),
            },
            Request::Release(g) => {
                if s.record
                    .as_ref()
                    .is_some_and(|r| r.holder == from && Term(r.term) == g.term)
                {
                    s.record = None;
                    s.previous_end = Some(EndReason::Released);
                }
                ModelReply::Release
            }
            Request::Inspect => ModelReply::Inspect(self.observation(s)),
            Request::Withdraw => ModelReply::Withdraw,
        }
    }

    /// Feeds one input to candidate `i` and routes its outputs.
    fn feed(&self, s: &mut State, i: usize, input: Input) {
        let mut out = Vec::new();
        let now = local_now(s.now, i);
        s.machines[i].handle(now, input, &mut out);
        let mut follow_up = Vec::new();
        for output in out {
            match output {
                Output::Send(id, request) => s.net.push(Msg::Request { from: i, id, request }),
                Output::Elected { grant, .. } => {
                    if grant.term.0 <= s.max_elected_term {
                        s.term_went_back = true;
                    }
                    s.max_elected_term = s.max_elected_term.max(grant.term.0);
                }
                // The modelled work stops as soon as it is cancelled.
                Output::Deposed { .. } => follow_up.push(Input::WorkStopped),
                _ => {}
            }
        }
        for input in follow_up {
            self.feed(s, i, input);
        }
    }
}

impl Model for Election {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let machines = (0..self.candidates)
            .map(|i| {
                Machine::new(
                    self.timing,
                    self.expiry,
                    Notifications::None,
                    lease(),
                    candidate(i),
                    local_now(0, i),
                    7,
                )
                .unwrap()
            })
            .collect();
        vec![State {
            now: 0,
            machines,
            record: None,
            last_term: 0,
            previous_end: None,
            versions: 0,
            net: Vec::new(),
            losses_left: self.losses,
            resigns_left: self.resigns,
            paused: [false; 3],
            pauses_left: self.pauses,
            max_elected_term: 0,
            term_went_back: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A running process acts as soon as its timer is due: time only moves on once every
        // running process has acted. Pauses model everything else.
        let mut someone_due = false;
        for (i, m) in s.machines.iter().enumerate() {
            let now = local_now(s.now, i);
            if s.paused[i] {
                actions.push(Action::Resume(i));
                continue;
            }
            if s.pauses_left > 0 {
                actions.push(Action::Pause(i));
            }
            if m.next_wake().is_some_and(|at| at <= now) {
                someone_due = true;
                actions.push(Action::Tick(i));
            }
            if s.resigns_left > 0 && m.believes_leader(now) {
                actions.push(Action::Resign(i));
            }
        }
        if s.now < self.horizon_ms && !someone_due {
            actions.push(Action::Advance);
        }
        // Each direction of each candidate's connection is FIFO; the connections interleave freely.
        let channel = |msg: &Msg| match msg {
            Msg::Request { from, .. } => (*from, false),
            Msg::Reply { to, .. } => (*to, true),
        };
        for (k, msg) in s.net.iter().enumerate() {
            if s.net[..k].iter().any(|earlier| channel(earlier) == channel(msg)) {
                continue;
            }
            if let Msg::Reply { to, .. } = msg {
                if s.paused[*to] {
                    continue;
                }
            }
            actions.push(Action::Deliver(k));
            if s.losses_left > 0 {
                actions.push(Action::Lose(k));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Advance => s.now += STEP_MS,
            Action::Tick(i) => self.feed(&mut s, i, Input::Tick),
            Action::Resign(i) => {
                s.resigns_left -= 1;
                self.feed(&mut s, i, Input::Resign);
            }
            Action::Pause(i) => {
                s.pauses_left -= 1;
                s.paused[i] = true;
            }
            Action::Resume(i) => s.paused[i] = false,
            Action::Lose(k) => {
                s.losses_left -= 1;
                s.net.remove(k);
            }
            Action::Deliver(k) => match s.net.remove(k) {
                Msg::Request { from, id, request } => {
                    let reply = self.apply(&mut s, from, &request);
                    s.net.push(Msg::Reply { to: from, id, reply });
                }
                Msg::Reply { to, id, reply } => {
                    let reply = match reply {
                        ModelReply::Acquire(a) => Reply::Acquire(Ok(a)),
                        ModelReply::Renew(r) => Reply::Renew(Ok(r)),
                        ModelReply::Release => Reply::Release(Ok(())),
                        ModelReply::Inspect(o) => Reply::Inspect(Ok(o)),
                        ModelReply::Withdraw => Reply::Withdraw(Ok(())),
                    };
                    self.feed(&mut s, to, Input::Reply(id, reply));
                }
            },
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one candidate believes it leads", |_, s: &State| {
                (0..s.machines.len())
                    .filter(|&i| s.machines[i].believes_leader(local_now(s.now, i)))
                    .count()
                    <= 1
            }),
            Property::always("terms strictly increase", |_, s: &State| !s.term_went_back),
            Property::sometimes("a leader is elected", |_, s: &State| s.max_elected_term >= 1),
            Property::sometimes("leadership changes hands", |_, s: &State| s.max_elected_term >= 2),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.net.len() <= 5
    }
}

fn timing(drift: u32) -> Timing {
    Timing {
        jitter: Millis(0),
        drift: Millis(drift),
        lock_delay: None,
        ..Timing::new(Duration::from_millis(TTL_MS))
    }
}

fn check(model: Election, max_states: usize) -> (usize, Vec<&'static str>) {
    let checker = model
        .checker()
        .threads(2)
        .target_state_count(max_states)
        .timeout(Duration::from_secs(50))
        .spawn_dfs()
        .join();
    let found: Vec<&'static str> = checker.discoveries().into_keys().collect();
    if let Some(path) = checker.discovery("at most one candidate believes it leads") {
        eprintln!("counterexample: {:?}", path.into_actions());
    }
    (checker.unique_state_count(), found)
}

fn model(expiry: Expiry, drift: u32) -> Election {
    Election {
        expiry,
        timing: timing(drift),
        horizon_ms: 3_000,
        candidates: 3,
        losses: 1,
        resigns: 1,
        pauses: 1,
    }
}

#[test]
fn server_clock_store_is_safe() {
    let (states, found) = check(model(Expiry::ServerClock, 200), 4_000_000);
    println!("server-clock model: {states} unique states explored; discoveries: {found:?}");
    assert!(states >= 100_000, "explored only {states} states");
    assert!(!found.contains(&"at most one candidate believes it leads"));
    assert!(!found.contains(&"terms strictly increase"));
    assert!(found.contains(&"a leader is elected") && found.contains(&"leadership changes hands"));
}

#[test]
fn observed_expiry_store_is_safe() {
    let (states, found) = check(model(Expiry::ObservedByContenders, 200), 4_000_000);
    println!("observed-expiry model: {states} unique states explored; discoveries: {found:?}");
    assert!(states >= 100_000, "explored only {states} states");
    assert!(!found.contains(&"at most one candidate believes it leads"));
    assert!(!found.contains(&"terms strictly increase"));
    assert!(found.contains(&"a leader is elected") && found.contains(&"leadership changes hands"));
}

#[test]
fn ignoring_drift_is_caught() {
    // Clock rates differ by 10% but the machine is told 0%: a slow holder believes longer than
    // the store keeps its lease, and the checker must find the double leadership. Two candidates
    // and no message loss keep the search small enough to be exhaustive.
    let (states, found) = check(
        Election {
            horizon_ms: 1_500,
            candidates: 2,
            losses: 0,
            resigns: 0,
            ..model(Expiry::ServerClock, 0)
        },
        4_000_000,
    );
    println!("broken model: {states} unique states explored; discoveries: {found:?}");
    assert!(
        found.contains(&"at most one candidate believes it leads"),
        "no counterexample found"
    );
}
