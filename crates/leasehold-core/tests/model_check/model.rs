//! The model's steps, the actions possible in a state, and the properties checked.

use super::*;

impl Election {
    /// [`Model::next_state`] without the bookkeeping every step shares.
    pub(crate) fn step(&self, last: &State, action: Action) -> State {
        let mut s = last.clone();
        match action {
            Action::Advance => s.now += STEP_MS,
            Action::Tick(i) => self.feed(&mut s, i, Input::Tick),
            Action::Resign(i) => {
                s.resigns_left -= 1;
                s.work_running[i] = false;
                s.work_said_stopped[i] = true;
                self.feed(&mut s, i, Input::Resign);
            }
            Action::HandOver(i) => {
                s.resigns_left -= 1;
                s.work_running[i] = false;
                s.work_said_stopped[i] = true;
                let to = candidate((i + 1) % self.candidates);
                self.feed(&mut s, i, Input::HandOver { to, work_stopped: true });
            }
            Action::WorkReturns(i) => {
                s.work_running[i] = false;
                s.work_said_stopped[i] = true;
                self.feed(&mut s, i, Input::WorkStopped);
            }
            Action::ResignAfterDeposed(i) => {
                s.work_running[i] = false;
                s.work_said_stopped[i] = true;
                self.feed(&mut s, i, Input::Resign);
            }
            Action::HandOverAfterDeposed(i) => {
                s.work_running[i] = false;
                s.work_said_stopped[i] = true;
                let to = candidate((i + 1) % self.candidates);
                self.feed(&mut s, i, Input::HandOver { to, work_stopped: true });
            }
            Action::StreamOpens(i) => {
                s.streams[i] = true;
                self.feed(&mut s, i, Input::RenewalsAnnounced(true));
            }
            Action::StreamEnds(i) => {
                s.stream_ends_left -= 1;
                s.streams[i] = false;
                self.feed(&mut s, i, Input::RenewalsAnnounced(false));
            }
            Action::CloneResign(i) => {
                s.resigns_left -= 1;
                self.feed(&mut s, i, Input::StepDown(DeposedReason::Resigned));
            }
            Action::CloneHandOver(i) => {
                s.resigns_left -= 1;
                let to = candidate((i + 1) % self.candidates);
                self.feed(
                    &mut s,
                    i,
                    Input::HandOver {
                        to,
                        work_stopped: false,
                    },
                );
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
            Action::HoldBack(k) => {
                s.holdbacks_left -= 1;
                let msg = s.net.remove(k);
                s.late.push(msg);
            }
            Action::ApplyLate(k) => {
                let msg = s.late.remove(k);
                self.answer(&mut s, msg, false);
            }
            Action::Refuse(k) => {
                s.refusals_left -= 1;
                let msg = s.net.remove(k);
                self.answer(&mut s, msg, true);
            }
            Action::Restart(i) => {
                s.restarts_left -= 1;
                s.generation[i] += 1;
                let mut machine = self.machine(i, self.local(&s, i));
                if self.carry_over {
                    machine.continue_from(&s.machines[i]);
                }
                s.machines[i] = machine;
                s.stalled[i] = false;
                s.streams[i] &= !self.announce_lifecycle;
            }
            Action::Shutdown(i) => {
                s.shutdowns_left -= 1;
                self.feed(&mut s, i, Input::Shutdown);
            }
            Action::Stall(i) => {
                s.stalls_left -= 1;
                s.stalled[i] = true;
            }
            Action::StepDown(i, renew_failed) => {
                s.step_downs_left -= 1;
                let reason = if renew_failed {
                    DeposedReason::RenewFailed {
                        last_error: Some("no renewal confirmed by the step-down point".into()),
                    }
                } else {
                    DeposedReason::TooLittleTime {
                        remaining: Duration::ZERO,
                        required: self.timing.step_down_margin,
                    }
                };
                self.feed(&mut s, i, Input::StepDown(reason));
            }
            Action::KeepAlive(i) => {
                s.queue.keepalives_left -= 1;
                self.expire_sessions(&mut s);
                self.keep_alive(&mut s, i);
            }
            Action::Deliver(k) => match s.net.remove(k) {
                msg @ Msg::Request { .. } => self.answer(&mut s, msg, false),
                // The announcement stream outlives a campaign's machine no more than its driver
                // does, but a new campaign's stream would have seen the same announcements.
                Msg::Announce { to, .. } if !s.streams[to] => {}
                Msg::Announce { to, observation } => {
                    s.announced = true;
                    self.feed(&mut s, to, Input::Announced(observation));
                }
                Msg::Turn { to, generation, .. } if generation != s.generation[to] => {}
                Msg::Turn { to, mut turn, .. } => {
                    if self.queue == Some(false) {
                        turn.valid_from = self.local(&s, to);
                    }
                    self.feed(&mut s, to, Input::YourTurn(turn));
                }
                // The earlier campaign's driver is gone: nobody reads this reply.
                Msg::Reply { to, generation, .. } if generation != s.generation[to] => {}
                Msg::Reply { to, id, reply, .. } => {
                    let refused = || Error::unreachable("model", "connection refused");
                    let reply = match reply {
                        ModelReply::Acquire(a) => Reply::Acquire(Ok(a)),
                        ModelReply::Renew(r) => Reply::Renew(Ok(r)),
                        ModelReply::Release => Reply::Release(Ok(())),
                        ModelReply::Inspect(o) => Reply::Inspect(Ok(o)),
                        ModelReply::Withdraw => Reply::Withdraw(Ok(())),
                        ModelReply::Refused(Request::Acquire(_)) => Reply::Acquire(Err(refused())),
                        ModelReply::Refused(Request::Renew(_)) => Reply::Renew(Err(refused())),
                        ModelReply::Refused(Request::Release(_) | Request::HandOver(..)) => {
                            Reply::Release(Err(refused()))
                        }
                        ModelReply::Refused(Request::Withdraw) => Reply::Withdraw(Err(refused())),
                        ModelReply::Refused(Request::Inspect) => Reply::Inspect(Err(refused())),
                    };
                    self.feed(&mut s, to, Input::Reply(id, reply));
                }
            },
        }
        s
    }
}

impl Model for Election {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let machines = (0..self.candidates)
            .map(|i| self.machine(i, local_now(&self.rates, 0, i)))
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
            late: Vec::new(),
            holdbacks_left: self.holdbacks,
            refusals_left: self.refusals,
            restarts_left: self.restarts,
            shutdowns_left: self.shutdowns,
            stalls_left: self.stalls,
            generation: [0; 3],
            stalled: [false; 3],
            max_elected_term: 0,
            term_went_back: false,
            announced: false,
            queue: Queue {
                keepalives_left: self.keepalives,
                ..Queue::default()
            },
            step_downs_left: self.step_downs,
            valid_until: [None; 3],
            delay_due: None,
            delay_skipped: false,
            reserved_since: None,
            work_running: [false; 3],
            work_said_stopped: [false; 3],
            aborted_stopped_work: false,
            hand_over_taken: false,
            unled_since: Some(0),
            streams: [self.announce && !self.announce_lifecycle; 3],
            stream_ends_left: u8::from(self.announce_lifecycle),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A running process acts as soon as its timer is due: time only moves on once every
        // running process has acted. Pauses model everything else.
        let mut someone_due = false;
        for (i, m) in s.machines.iter().enumerate() {
            let now = self.local(s, i);
            if s.paused[i] {
                actions.push(Action::Resume(i));
                continue;
            }
            let focused = self.focus.is_none_or(|f| f == i);
            if s.pauses_left > 0 && focused && (self.focus.is_none() || m.believes_leader(now)) {
                actions.push(Action::Pause(i));
            }
            if m.next_wake().is_some_and(|at| at <= now) {
                someone_due = true;
                actions.push(Action::Tick(i));
            }
            if s.resigns_left > 0 && m.believes_leader(now) && self.focus.is_none_or(|f| f != i) {
                actions.push(Action::Resign(i));
                if self.hand_overs {
                    actions.push(Action::HandOver(i));
                }
            }
            if self.lingering_work && s.work_running[i] && !m.believes_leader(now) {
                actions.push(Action::WorkReturns(i));
                actions.push(Action::ResignAfterDeposed(i));
                if self.hand_overs {
                    actions.push(Action::HandOverAfterDeposed(i));
                }
            }
            if self.clones && s.resigns_left > 0 && m.believes_leader(now) {
                actions.push(Action::CloneResign(i));
                if self.hand_overs {
                    actions.push(Action::CloneHandOver(i));
                }
            }
            if self.announce_lifecycle && m.is_following() {
                if !s.streams[i] {
                    actions.push(Action::StreamOpens(i));
                } else if s.stream_ends_left > 0 {
                    actions.push(Action::StreamEnds(i));
                }
            }
            if s.stalls_left > 0 && !s.stalled[i] && m.believes_leader(now) {
                actions.push(Action::Stall(i));
            }
            if s.step_downs_left > 0 && m.believes_leader(now) {
                actions.push(Action::StepDown(i, true));
                actions.push(Action::StepDown(i, false));
            }
            if s.queue.keepalives_left > 0 && s.queue.sessions[i].is_some() {
                actions.push(Action::KeepAlive(i));
            }
            if s.shutdowns_left > 0 && !m.is_stopped() {
                actions.push(Action::Shutdown(i));
            }
            // The driver ends after a step-down or a shutdown; the next campaign starts a new
            // machine (a follower with nothing outstanding stands for both).
            // (Deletions left to send again go to the new campaign's machine.)
            if s.restarts_left > 0 && focused && (m.is_stopped() || (m.is_following() && m.pending().is_none())) {
                actions.push(Action::Restart(i));
            }
        }
        for k in 0..s.late.len() {
            actions.push(Action::ApplyLate(k));
        }
        let settled = !self.prompt
            || s.net
                .iter()
                .all(|m| matches!(m, Msg::Reply { to, .. } | Msg::Announce { to, .. } | Msg::Turn { to, .. } if s.paused[*to]));
        if s.now < self.horizon_ms && !someone_due && settled {
            actions.push(Action::Advance);
        }
        // Each direction of each candidate's connection is FIFO; the connections interleave freely.
        let channel = |msg: &Msg| match msg {
            Msg::Request { from, .. } => (*from, 0),
            Msg::Reply { to, .. } => (*to, 1),
            Msg::Announce { to, .. } => (*to, 2),
            Msg::Turn { to, .. } => (*to, 3),
        };
        for (k, msg) in s.net.iter().enumerate() {
            if s.net[..k].iter().any(|earlier| channel(earlier) == channel(msg)) {
                continue;
            }
            if let Msg::Reply { to, .. } | Msg::Announce { to, .. } | Msg::Turn { to, .. } = msg
                && s.paused[*to]
            {
                continue;
            }
            actions.push(Action::Deliver(k));
            if s.losses_left > 0 {
                actions.push(Action::Lose(k));
            }
            if let Msg::Request { from, request, .. } = msg {
                let target = match self.focus {
                    None => true,
                    Some(f) => f == *from && matches!(request, Request::Acquire(_)),
                };
                let deletion = matches!(request, Request::Release(_) | Request::HandOver(..) | Request::Withdraw);
                let target = target && (deletion || !self.refuse_only_deletions);
                if !target {
                    continue;
                }
                if s.holdbacks_left > 0 {
                    actions.push(Action::HoldBack(k));
                }
                if s.refusals_left > 0 {
                    actions.push(Action::Refuse(k));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = self.step(last, action);
        let led = (0..s.machines.len()).any(|i| s.machines[i].believes_leader(self.local(&s, i)));
        s.unled_since = if led { None } else { s.unled_since.or(Some(s.now)) };
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one candidate believes it leads", |m: &Election, s: &State| {
                (0..s.machines.len())
                    .filter(|&i| s.machines[i].believes_leader(m.local(s, i)))
                    .count()
                    <= 1
            }),
            Property::always("terms strictly increase", |_, s: &State| !s.term_went_back),
            Property::sometimes("a leader is elected", |_, s: &State| s.max_elected_term >= 1),
            Property::sometimes("leadership changes hands", |_, s: &State| s.max_elected_term >= 2),
            Property::sometimes("an announcement reaches a follower", |_, s: &State| s.announced),
            Property::sometimes(
                "a successor is told its turn on its predecessor's release",
                |_, s: &State| s.queue.on_release,
            ),
            Property::always(
                "no grant inside the lock delay of a leader deposed without a confirmed renewal",
                |_, s: &State| !s.delay_skipped,
            ),
            Property::sometimes("a leader's handle steps it down", |m: &Election, s: &State| {
                s.step_downs_left < m.step_downs
            }),
            Property::sometimes(
                "a leader is deposed without a confirmed renewal, with a lock delay",
                |_, s: &State| s.delay_due.is_some(),
            ),
            Property::always("work that has stopped is never aborted", |_, s: &State| {
                !s.aborted_stopped_work
            }),
            Property::always(
                "a hand-over is taken by its campaigning successor within the bound",
                |m: &Election, s: &State| {
                    let (Some(bound), Some(since), Some(r)) = (m.hand_over_taken_within, s.reserved_since, &s.record)
                    else {
                        return true;
                    };
                    let campaigning = !s.paused[r.holder] && s.machines[r.holder].is_following();
                    !(r.reserved && campaigning && s.now >= since + bound)
                },
            ),
            Property::always(
                "the lease is led again within the bound while a candidate campaigns",
                |m: &Election, s: &State| {
                    let (Some(bound), Some(since)) = (m.led_within, s.unled_since) else {
                        return true;
                    };
                    let campaigning = (0..s.machines.len()).any(|i| !s.paused[i] && s.machines[i].is_following());
                    !(campaigning && s.now >= since + bound)
                },
            ),
            Property::sometimes("a successor takes a lease handed over to it", |_, s: &State| {
                s.hand_over_taken
            }),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.net.len() <= 5
    }
}
