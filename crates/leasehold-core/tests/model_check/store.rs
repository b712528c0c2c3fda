//! The modelled store, queue and network: how requests are applied and answered, and how the
//! answers are fed to each candidate's machine.

use super::*;

impl Election {
    /// The store time (µs) before which nobody but leader `i` may be granted once `i` was
    /// deposed for want of a confirmed renewal with a `lock_delay`: its `valid_until` (on its own
    /// clock, turned into store time) plus the delay. Nothing released the lease, so the store
    /// keeps it until it expires, no earlier than `valid_until`; a contender that then finds it
    /// free waits the delay on its own clock, which may run fast by up to `drift`, so the delay
    /// counts here as `lock_delay * (1 - drift)`.
    pub(crate) fn lock_delay_due(&self, i: usize, valid_until: Instant) -> Option<u64> {
        let delay = self.timing.lock_delay?;
        let local = valid_until.duration_since(*BASE).as_micros() as u64;
        let store = local * 1_000 / self.rates[i];
        let delay = delay.as_micros() as u64 * u64::from(1_000 - self.timing.drift.0) / 1_000;
        Some(store + delay)
    }

    /// The store grants a new term to `to`: checked against the lock delay of the last leader
    /// deposed without a confirmed renewal.
    pub(crate) fn granting(&self, s: &mut State, to: usize) {
        if let Some((deposed, term, due)) = s.delay_due
            && deposed != to
            && s.last_term > term
            && s.now * 1_000 < due
        {
            s.delay_skipped = true;
        }
    }

    pub(crate) fn observation(&self, s: &State) -> Observation {
        Observation {
            lease: lease(),
            holder: s.record.as_ref().map(|r| HolderInfo {
                id: candidate(r.holder),
                term: Term(r.term),
                ttl: self.timing.ttl,
                version: r.version.to_string(),
                orphaned: false,
                reserved: r.reserved,
                store_remaining: (self.expiry == Expiry::ServerClock)
                    .then(|| Duration::from_millis(r.expires_at.saturating_sub(s.now))),
            }),
            last_term: Term(s.last_term),
            previous_end: if s.record.is_none() { s.previous_end } else { None },
        }
    }

    pub(crate) fn grant(&self, r: &Record) -> Grant {
        Grant {
            lease: lease(),
            holder: candidate(r.holder),
            term: Term(r.term),
            ttl: self.timing.ttl,
            token: r.version.to_string(),
        }
    }

    /// The store applies a request at the current real time.
    pub(crate) fn apply(&self, s: &mut State, from: usize, request: &Request) -> ModelReply {
        if self.queue.is_some() {
            return self.apply_queue(s, from, request);
        }
        if self.expiry == Expiry::ServerClock && s.record.as_ref().is_some_and(|r| s.now >= r.expires_at) {
            s.record = None;
            s.previous_end = Some(EndReason::Expired);
        }
        let ttl = self.timing.ttl.as_millis() as u64;
        s.versions += 1;
        let version = s.versions;
        match request {
            Request::Acquire(req) => {
                if self.own_acquire_frees && s.record.as_ref().is_some_and(|r| r.holder == from && !r.reserved) {
                    s.record = None;
                    s.previous_end = Some(EndReason::Expired);
                    return ModelReply::Acquire(Acquired::Held(self.observation(s)));
                }
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
                s.hand_over_taken |= s.record.as_ref().is_some_and(|r| r.reserved && r.holder == from);
                s.last_term += 1;
                self.granting(s, from);
                let term = s.last_term;
                let record = Record {
                    holder: from,
                    term,
                    version,
                    expires_at: s.now + ttl,
                    reserved: false,
                };
                let grant = self.grant(&record);
                s.record = Some(record);
                self.announce(s, from);
                ModelReply::Acquire(Acquired::Granted(grant))
            }
            Request::Renew(g) => match &mut s.record {
                Some(r) if r.holder == from && Term(r.term) == g.term && !r.reserved => {
                    r.version = version;
                    r.expires_at = s.now + ttl;
                    let grant = self.grant(r);
                    self.announce(s, from);
                    ModelReply::Renew(Renewed::Renewed(grant))
                }
                _ => ModelReply::Renew(Renewed::Lost(self.observation(s))),
            },
            Request::Release(g) => {
                if s.record
                    .as_ref()
                    .is_some_and(|r| r.holder == from && Term(r.term) == g.term && !r.reserved)
                {
                    s.record = None;
                    s.previous_end = Some(EndReason::Released);
                }
                ModelReply::Release
            }
            Request::HandOver(g, to) => {
                if let Some(r) = s
                    .record
                    .as_mut()
                    .filter(|r| r.holder == from && Term(r.term) == g.term && !r.reserved)
                {
                    r.holder = (0..self.candidates)
                        .find(|&c| candidate(c) == *to)
                        .expect("a modelled candidate");
                    r.reserved = true;
                    r.version = version;
                    r.expires_at = s.now + ttl;
                    s.reserved_since = Some(s.now);
                }
                ModelReply::Release
            }
            Request::Inspect => ModelReply::Inspect(self.observation(s)),
            Request::Withdraw => ModelReply::Withdraw,
        }
    }

    /// Sessions whose TTL ran out end, with their keys (an expired holder's term ends unmarked).
    pub(crate) fn expire_sessions(&self, s: &mut State) {
        if self.kept_sessions {
            return;
        }
        for i in 0..self.candidates {
            if s.queue.sessions[i].is_some_and(|at| s.now >= at) {
                s.queue.sessions[i] = None;
                s.queue.confirmed[i] = None;
                s.queue.keys.retain(|k| k.0 != i);
            }
        }
        if let Some(g) = s.queue.granted
            && !s.queue.keys.iter().any(|k| k.1 == g)
        {
            s.queue.granted = None;
            s.previous_end = Some(EndReason::Expired);
        }
    }

    /// A keepalive of `i`'s session, sent and confirmed now (a session etcd no longer has is
    /// not revived).
    pub(crate) fn keep_alive(&self, s: &mut State, i: usize) {
        if s.queue.sessions[i].is_some() {
            s.queue.sessions[i] = Some(s.now + self.timing.ttl.as_millis() as u64);
            s.queue.confirmed[i] = Some(self.local(s, i));
        }
    }

    pub(crate) fn queue_observation(&self, s: &State) -> Observation {
        let holder = s
            .queue
            .keys
            .first()
            .filter(|k| s.queue.granted == Some(k.1))
            .map(|k| HolderInfo {
                id: candidate(k.0),
                term: Term(k.1),
                ttl: self.timing.ttl,
                version: k.1.to_string(),
                orphaned: false,
                reserved: false,
                store_remaining: s.queue.sessions[k.0].map(|at| Duration::from_millis(at.saturating_sub(s.now))),
            });
        Observation {
            lease: lease(),
            last_term: Term(s.queue.last_granted),
            previous_end: if holder.is_none() { s.previous_end } else { None },
            holder,
        }
    }

    pub(crate) fn queue_grant(&self, rev: u64, i: usize) -> Grant {
        Grant {
            lease: lease(),
            holder: candidate(i),
            term: Term(rev),
            ttl: self.timing.ttl,
            token: rev.to_string(),
        }
    }

    /// [`Election::apply`] on etcd's queue ([`Queue`]).
    pub(crate) fn apply_queue(&self, s: &mut State, from: usize, request: &Request) -> ModelReply {
        self.expire_sessions(s);
        let ttl = self.timing.ttl.as_millis() as u64;
        let own = s.queue.keys.iter().position(|k| k.0 == from);
        match request {
            Request::Acquire(_) => {
                if s.queue.sessions[from].is_none() {
                    s.queue.sessions[from] = Some(s.now + ttl);
                    s.queue.confirmed[from] = Some(self.local(s, from));
                }
                let at = match own {
                    Some(at) => at,
                    None => {
                        s.last_term += 1;
                        let predecessor = s.queue.keys.last().map(|k| k.1);
                        s.queue.keys.push((from, s.last_term, predecessor));
                        s.queue.keys.len() - 1
                    }
                };
                let (_, rev, _) = s.queue.keys[at];
                if s.queue.started == Some(rev) {
                    // Asked again after that leadership ended for it (or by an abandoned call):
                    // the etcd store hands the term over to the candidate itself and takes it
                    // with a new one, deleting the keys queued ahead of the new key (all others).
                    s.last_term += 1;
                    s.queue.keys = vec![(from, s.last_term, None)];
                    s.queue.granted = Some(s.last_term);
                    s.queue.last_granted = s.last_term;
                    s.queue.started = Some(s.last_term);
                    self.keep_alive(s, from);
                    return ModelReply::Acquire(Acquired::Granted(self.queue_grant(s.last_term, from)));
                }
                if at != 0 {
                    return ModelReply::Acquire(Acquired::Held(self.queue_observation(s)));
                }
                s.queue.granted = Some(rev);
                s.queue.last_granted = s.queue.last_granted.max(rev);
                s.queue.started = Some(rev);
                self.keep_alive(s, from);
                ModelReply::Acquire(Acquired::Granted(self.queue_grant(rev, from)))
            }
            Request::Renew(g) => match own.map(|at| s.queue.keys[at]) {
                Some((_, rev, _)) if Term(rev) == g.term && s.queue.granted == Some(rev) => {
                    self.keep_alive(s, from);
                    s.queue.started = Some(rev);
                    ModelReply::Renew(Renewed::Renewed(self.queue_grant(rev, from)))
                }
                _ => ModelReply::Renew(Renewed::Lost(self.queue_observation(s))),
            },
            Request::Release(g) | Request::HandOver(g, _) => {
                if let Some(at) = own.filter(|at| Term(s.queue.keys[*at].1) == g.term) {
                    let (_, rev, _) = s.queue.keys.remove(at);
                    if s.queue.granted == Some(rev) {
                        s.queue.granted = None;
                    }
                    s.previous_end = Some(EndReason::Released);
                    // A hand-over (not in these runs) leaves a reservation instead: no turn.
                    let next = s.queue.keys.first().copied();
                    if let Some((to, next_rev, predecessor)) = next
                        && at == 0
                        && predecessor == Some(rev)
                        && matches!(request, Request::Release(_))
                    {
                        s.queue.granted = Some(next_rev);
                        s.queue.last_granted = s.queue.last_granted.max(next_rev);
                        s.queue.on_release = true;
                        let valid_from = s.queue.confirmed[to].expect("a queued key's session");
                        let grant = self.queue_grant(next_rev, to);
                        s.net.push(Msg::Turn {
                            to,
                            generation: s.generation[to],
                            turn: Turn { grant, valid_from },
                        });
                    }
                }
                ModelReply::Release
            }
            Request::Inspect => ModelReply::Inspect(self.queue_observation(s)),
            Request::Withdraw => {
                if let Some(at) = own {
                    s.queue.keys.remove(at);
                }
                ModelReply::Withdraw
            }
        }
    }

    /// The store announces the record it just wrote for `from` to everyone else.
    pub(crate) fn announce(&self, s: &mut State, from: usize) {
        if !self.announce {
            return;
        }
        let observation = self.observation(s);
        for to in (0..self.candidates).filter(|&to| to != from && s.streams[to]) {
            s.net.push(Msg::Announce {
                to,
                observation: observation.clone(),
            });
        }
    }

    /// Feeds one input to candidate `i` and routes its outputs.
    pub(crate) fn feed(&self, s: &mut State, i: usize, input: Input) {
        let mut out = Vec::new();
        let now = self.local(s, i);
        if self.timing.stall_timeout.is_some() && !s.stalled[i] {
            // Healthy work reports progress whenever its process runs.
            s.machines[i].handle(now, Input::Heartbeat(now), &mut out);
        }
        s.machines[i].handle(now, input, &mut out);
        let mut follow_up = Vec::new();
        for output in out {
            match output {
                Output::Send(id, request) => s.net.push(Msg::Request {
                    from: i,
                    generation: s.generation[i],
                    id,
                    request,
                }),
                Output::Elected { grant, valid_until } => {
                    if grant.term.0 <= s.max_elected_term {
                        s.term_went_back = true;
                    }
                    s.max_elected_term = s.max_elected_term.max(grant.term.0);
                    s.valid_until[i] = Some(valid_until);
                    s.work_running[i] = true;
                    s.work_said_stopped[i] = false;
                    // A leader's driver drops its announcements.
                    s.streams[i] &= !self.announce_lifecycle;
                }
                Output::Extended { valid_until } => s.valid_until[i] = Some(valid_until),
                // The modelled work stops as soon as it is cancelled.
                Output::Deposed { term, reason, .. } => {
                    let valid_until = s.valid_until[i].take().expect("a leader's valid_until");
                    if matches!(reason, DeposedReason::RenewFailed { .. })
                        && let Some(due) = self.lock_delay_due(i, valid_until)
                    {
                        s.delay_due = Some((i, term.0, due));
                    }
                    if !self.lingering_work && s.work_running[i] {
                        s.work_running[i] = false;
                        follow_up.push(Input::WorkStopped);
                    }
                }
                // (Work cancelled by the deposition of the same step and aborted with it, its
                // process having run only after `valid_until`, never said it stopped.)
                Output::AbortWork => {
                    s.aborted_stopped_work |= s.work_said_stopped[i];
                    s.work_running[i] = false;
                }
                _ => {}
            }
        }
        for input in follow_up {
            self.feed(s, i, input);
        }
    }

    /// The store answers a request: applies it, or refuses it at once without applying it.
    pub(crate) fn answer(&self, s: &mut State, msg: Msg, refuse: bool) {
        self.answer_request(s, msg, refuse);
        if !s.record.as_ref().is_some_and(|r| r.reserved) {
            s.reserved_since = None;
        }
    }

    pub(crate) fn answer_request(&self, s: &mut State, msg: Msg, refuse: bool) {
        let Msg::Request {
            from,
            generation,
            id,
            request,
        } = msg
        else {
            return;
        };
        let reply = if refuse {
            ModelReply::Refused(request)
        } else {
            self.apply(s, from, &request)
        };
        s.net.push(Msg::Reply {
            to: from,
            generation,
            id,
            reply,
        });
    }

    pub(crate) fn local(&self, s: &State, i: usize) -> Instant {
        local_now(&self.rates, s.now, i)
    }

    pub(crate) fn machine(&self, i: usize, now: Instant) -> Machine {
        let mut machine = Machine::new(
            self.timing,
            self.expiry,
            Notifications::None,
            lease(),
            candidate(i),
            now,
            7,
        )
        .unwrap();
        if self.announce && !self.announce_lifecycle {
            machine.handle(now, Input::RenewalsAnnounced(true), &mut Vec::new());
        }
        machine
    }
}
