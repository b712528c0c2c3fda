//! The world's bookkeeping: what every candidate, the store and the probe saw, and the checks
//! run on it after each seed.

use super::*;

impl World {
    pub(crate) fn new(start: Instant, candidates: usize) -> Self {
        World {
            start,
            finished: false,
            trace: Vec::new(),
            leaders: HashMap::new(),
            next_slot: 0,
            ledger: Vec::new(),
            elections: Vec::new(),
            grants: HashMap::new(),
            task_ends: HashMap::new(),
            drops: Vec::new(),
            outages: Vec::new(),
            refused_in_outage: vec![Vec::new(); candidates],
            released: HashSet::new(),
            violations: Vec::new(),
            reported: HashSet::new(),
            lagged: 0,
            last_valid: HashMap::new(),
            blocked: HashMap::new(),
            lock_delay: false,
            lock_delay_length: Duration::ZERO,
            returned: vec![None; candidates],
            stopped_work: HashSet::new(),
            stats: Stats::default(),
        }
    }

    pub(crate) fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    pub(crate) fn t(&self, at: Instant) -> String {
        format!("{:.3}s", self.since(at).as_secs_f64())
    }

    pub(crate) fn log(&mut self, line: impl AsRef<str>) {
        let line = format!("{:>9} {}", self.t(Instant::now()), line.as_ref());
        self.trace.push(line);
    }

    pub(crate) fn violation(&mut self, kind: Kind, detail: String) {
        self.log(format!("VIOLATION {}: {detail}", kind.name()));
        let at = self.since(Instant::now());
        self.violations.push(Violation { kind, at, detail });
    }

    /// Reports once per `key`.
    pub(crate) fn violation_once(&mut self, kind: Kind, key: String, detail: String) {
        if self.reported.insert(key) {
            self.violation(kind, detail);
        }
    }

    pub(crate) fn on_event(&mut self, c: usize, event: Event) {
        match event {
            Event::Elected { term, at, valid_until } => {
                let (at, valid_until) = (Instant::from_std(at), Instant::from_std(valid_until));
                self.stats.elections += 1;
                self.log(format!(
                    "c{c} ELECTED term {term}, believed until {}",
                    self.t(valid_until)
                ));
                self.elections.push(Election {
                    c,
                    term,
                    at,
                    valid_until,
                    end: None,
                });
            }
            Event::Deposed {
                term,
                reason,
                believed_until,
                work_stopped_after,
                aborted,
                ..
            } => {
                let believed_until = Instant::from_std(believed_until);
                self.log(format!(
                    "c{c} DEPOSED term {term} ({reason}), believed until {}, work stopped after {work_stopped_after:?}, aborted {aborted}",
                    self.t(believed_until)
                ));
                if let Some(e) = self.elections.iter_mut().find(|e| e.c == c && e.term == term) {
                    e.end = Some(believed_until);
                }
                if aborted && self.stopped_work.contains(&(c, term)) {
                    self.violation(
                        Kind::StoppedAborted,
                        format!(
                            "c{c} term {term} ({reason}): its work resigned or handed over, and was still \
                             waited for until valid_until and aborted"
                        ),
                    );
                }
                // What the candidate should have released: its own term, unless the store proved
                // it lost or could not be read; a newer term of its own that the store showed
                // superseding it (an acquire of its own applied late, believed by nobody).
                let due = match &reason {
                    DeposedReason::Superseded {
                        by: Some(by),
                        term: Some(newer),
                    } if by.as_str() == format!("c{c}") => Some(*newer),
                    DeposedReason::Superseded { .. } | DeposedReason::StoreError { .. } => None,
                    DeposedReason::RenewFailed { .. } if self.lock_delay => None,
                    _ => Some(term),
                };
                if self.lock_delay
                    && matches!(reason, DeposedReason::RenewFailed { .. })
                    && self.released.contains(&(c, term))
                {
                    self.violation(
                        Kind::DelaySkipped,
                        format!(
                            "c{c} stepped down from term {term} ({reason}) with a lock_delay and released it: \
                             a clean end lets the next candidate skip the delay kept for this holder"
                        ),
                    );
                }
                // A newer stray of its own (another acquire applied late) is the one to give back.
                let released = |due: &Term| self.released.iter().any(|(r, t)| *r == c && t >= due);
                if let Some(due) = due.filter(|due| !aborted && !released(due)) {
                    self.violation(
                        Kind::Stranded,
                        format!(
                            "c{c} stepped down from term {term} ({reason}) once its work had stopped, and sent no \
                             release of term {due}: the lease stays held until it expires"
                        ),
                    );
                }
            }
            Event::LeaderChanged(info) => {
                let seen = info.map_or("nobody".to_string(), |l| format!("{} term {}", l.holder, l.term));
                self.log(format!("c{c} sees leader {seen}"));
            }
            Event::StoreTrouble { error } => self.log(format!("c{c} store trouble: {error}")),
            other => self.log(format!("c{c} event {other:?}")),
        }
    }

    /// Every check that looks at the whole seed.
    pub(crate) fn check(&mut self, end: Instant) {
        self.check_leaderless(end);
        self.check_overlaps(end);
        self.check_beliefs();
        self.check_terms();
        self.check_ledger();
        self.check_dropped_runs(end);
        self.check_refused(end);
        if self.lagged > 0 {
            let lagged = self.lagged;
            self.violation(
                Kind::EventsLost,
                format!("{lagged} events lost by a lagging subscriber: the checks are incomplete"),
            );
        }
    }

    pub(crate) fn describe_grant(&self, term: Term) -> String {
        match self.grants.get(&term) {
            Some(g) => format!(
                "the store granted term {term} to c{}'s request #{} sent at {}, applied at {}",
                g.c,
                g.request,
                self.t(g.sent),
                self.t(g.applied)
            ),
            None => format!("no acquire reply recorded granting term {term}"),
        }
    }

    /// Once the faults have stopped and settled, the lease is never without a believed leader
    /// for longer than a leader that stops renewing takes to end (its work aborted at
    /// `valid_until`, its lease left to expire, observed for a TTL on a store without a clock)
    /// plus the lock delay and two polls, while every service campaigns.
    pub(crate) fn check_leaderless(&mut self, end: Instant) {
        let from = calm_from(self.start) + SETTLE + self.lock_delay_length;
        let bound = TTL * 2 + self.lock_delay_length + RETRY_EVERY * 3;
        let mut intervals: Vec<(Instant, Instant)> =
            self.elections.iter().map(|e| (e.at, e.end.unwrap_or(end))).collect();
        intervals.sort();
        let mut covered = from;
        let mut longest = (Duration::ZERO, from);
        for (at, until) in intervals {
            if until <= covered {
                continue;
            }
            if at > covered && at <= end {
                longest = longest.max((at - covered, covered));
            }
            covered = covered.max(until);
        }
        if end > covered {
            longest = longest.max((end - covered, covered));
        }
        let (gap, since) = longest;
        if from < end && gap > bound {
            let detail = format!(
                "nobody led for {gap:?} from {} with every service campaigning and no faults since {} \
                 (bound {bound:?})",
                self.t(since),
                self.t(calm_from(self.start))
            );
            self.violation(Kind::Leaderless, detail);
        }
    }

    pub(crate) fn check_overlaps(&mut self, end: Instant) {
        // An election still open at the end: believed until the probe last saw it valid, plus
        // one probe period (or, if it never did, its `valid_until` at election).
        let open_end = |e: &Election| match self.last_valid.get(&(e.c, e.term)) {
            Some(at) => (*at + PROBE_EVERY).min(end),
            None => e.valid_until.min(end),
        };
        let mut intervals: Vec<_> = self
            .elections
            .iter()
            .map(|e| (e.at, e.end.unwrap_or_else(|| open_end(e)), e.c, e.term))
            .collect();
        intervals.sort();
        let mut reach: Option<(Instant, Instant, usize, Term)> = None;
        let mut found = Vec::new();
        for &(from, until, c, term) in &intervals {
            if let Some((rfrom, runtil, rc, rterm)) = reach
                && from < runtil
            {
                found.push((rfrom, runtil, rc, rterm, from, until, c, term));
            }
            if reach.is_none_or(|(_, runtil, ..)| until > runtil) {
                reach = Some((from, until, c, term));
            }
        }
        for (af, au, ac, at, bf, bu, bc, bt) in found {
            let detail = format!(
                "c{ac} term {at} believed {}..{} and c{bc} term {bt} believed {}..{} overlap for {:?}; {}; {}",
                self.t(af),
                self.t(au),
                self.t(bf),
                self.t(bu),
                au.min(bu) - bf,
                self.describe_grant(at),
                self.describe_grant(bt),
            );
            self.violation(Kind::Overlap, detail);
        }
    }

    /// A grant is believed from the send time of a request that may have made it: never longer
    /// than `believed_ttl` after the store applied the acquire that did.
    pub(crate) fn check_beliefs(&mut self) {
        let mut found = Vec::new();
        for e in &self.elections {
            if let Some(g) = self.grants.get(&e.term)
                && e.valid_until > g.applied + BELIEVED_TTL
            {
                found.push((e.clone(), g.clone()));
            }
        }
        for (e, g) in found {
            let previous: Vec<_> = self
                .elections
                .iter()
                .filter(|p| p.c == e.c && g.sent < p.at && p.at < e.at)
                .map(|p| format!("term {} at {}", p.term, self.t(p.at)))
                .collect();
            let detail = format!(
                "c{} elected term {} at {}, believed until {}, but the store applied the acquire that granted it \
                 (request #{} sent at {}) at {}: believed {:?} past applied + believed ttl; c{} was elected in between: [{}]",
                e.c,
                e.term,
                self.t(e.at),
                self.t(e.valid_until),
                g.request,
                self.t(g.sent),
                self.t(g.applied),
                e.valid_until - (g.applied + BELIEVED_TTL),
                e.c,
                previous.join(", "),
            );
            self.violation(Kind::Belief, detail);
        }
    }

    pub(crate) fn check_terms(&mut self) {
        let mut by_time: Vec<_> = self.elections.iter().map(|e| (e.at, e.term, e.c)).collect();
        by_time.sort();
        let mut found = Vec::new();
        for pair in by_time.windows(2) {
            if pair[1].1 <= pair[0].1 {
                found.push((pair[0], pair[1]));
            }
        }
        for ((a_at, a_term, a_c), (b_at, b_term, b_c)) in found {
            let detail = format!(
                "c{b_c} elected term {b_term} at {} after c{a_c} was elected term {a_term} at {}",
                self.t(b_at),
                self.t(a_at)
            );
            self.violation(Kind::Terms, detail);
        }
    }

    pub(crate) fn check_ledger(&mut self) {
        // earliest[i]: the first election among the i-th lowest term and every higher one.
        let mut terms: Vec<_> = self.elections.iter().map(|e| (e.term, e.at, e.c)).collect();
        terms.sort();
        let mut earliest: Vec<Option<(Instant, Term, usize)>> = vec![None; terms.len() + 1];
        for i in (0..terms.len()).rev() {
            let (term, at, c) = terms[i];
            earliest[i] = match earliest[i + 1] {
                Some(later) if later.0 <= at => Some(later),
                _ => Some((at, term, c)),
            };
        }
        let first_higher = |term: Term| earliest[terms.partition_point(|(t, ..)| *t <= term)];
        let mut found = HashMap::new();
        for &(c, term, at, seq) in &self.ledger {
            if let Some((elected, higher, hc)) = first_higher(term) {
                // At the same simulated instant, what came first is what the trace shows first:
                // an entry before the store granted the higher term is in time.
                let same_instant_but_later = || self.grants.get(&higher).is_none_or(|g| seq >= g.seq);
                if at > elected || (at == elected && same_instant_but_later()) {
                    found.entry((c, term)).or_insert((at, elected, higher, hc));
                }
            }
        }
        let mut found: Vec<_> = found.into_iter().collect();
        found.sort_by_key(|(k, v)| (v.0, *k));
        for ((c, term), (at, elected, higher, hc)) in found {
            let detail = format!(
                "c{c}'s work of term {term} passed ensure_valid at {} (first such entry), at or after c{hc} was elected term {higher} at {}",
                self.t(at),
                self.t(elected)
            );
            self.violation(Kind::LateWork, detail);
        }
    }

    pub(crate) fn check_dropped_runs(&mut self, end: Instant) {
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        for d in &self.drops {
            if !seen.insert((d.c, d.term)) {
                continue;
            }
            // The task must have stopped by `valid_until`, or at the end of a blocking section it
            // was in at `valid_until` (nothing can abort code that does not yield), with one timer
            // tick (1 ms) of slack: the abort is driven by a tokio timer.
            let tick = Duration::from_millis(1);
            let deadline = self
                .blocked
                .get(&(d.c, d.term))
                .into_iter()
                .flatten()
                .filter(|(from, to)| *from <= d.valid_until + tick && d.valid_until < *to)
                .map(|(_, to)| *to)
                .max()
                .unwrap_or(d.valid_until)
                .max(d.valid_until);
            match self.task_ends.get(&(d.c, d.term)) {
                Some(&stopped) if stopped > deadline + tick => found.push(format!(
                    "c{}'s run was dropped at {} while its task of term {} ran (valid until {}); the task stopped only at {}",
                    d.c,
                    self.t(d.at),
                    d.term,
                    self.t(d.valid_until),
                    self.t(stopped)
                )),
                None if end > d.valid_until => found.push(format!(
                    "c{}'s run was dropped at {} while its task of term {} ran (valid until {}); the task was still running at the end",
                    d.c,
                    self.t(d.at),
                    d.term,
                    self.t(d.valid_until)
                )),
                _ => {}
            }
            let after: Vec<_> = self
                .ledger
                .iter()
                .filter(|(c, term, at, _)| *c == d.c && *term == d.term && *at > d.at)
                .map(|&(_, _, at, _)| at)
                .collect();
            if let (Some(first), Some(last)) = (after.first(), after.last()) {
                found.push(format!(
                    "c{}'s run was dropped at {}; its task of term {} still passed ensure_valid {} times, from {} to {}",
                    d.c,
                    self.t(d.at),
                    d.term,
                    after.len(),
                    self.t(*first),
                    self.t(*last)
                ));
            }
        }
        for detail in found {
            self.violation(Kind::DroppedRun, detail);
        }
    }

    pub(crate) fn check_refused(&mut self, end: Instant) {
        let mut found = Vec::new();
        for (c, outages) in self.outages.iter().enumerate() {
            let sent = &self.refused_in_outage[c];
            for &(from, to) in outages.iter() {
                let to = to.min(end);
                let inside: Vec<_> = sent.iter().copied().filter(|at| from <= *at && *at < to).collect();
                // The most requests in any one simulated second of the outage.
                let mut most = 0;
                let mut j = 0;
                for i in 0..inside.len() {
                    while inside[i] - inside[j] >= Duration::from_secs(1) {
                        j += 1;
                    }
                    most = most.max(i + 1 - j);
                }
                self.stats.max_refused_per_second = self.stats.max_refused_per_second.max(most);
                if most > MAX_REFUSED_PER_SECOND {
                    found.push(format!(
                        "c{c} sent {most} requests within one second of its outage {}..{} ({} in all), every one refused; at most {MAX_REFUSED_PER_SECOND} allowed",
                        self.t(from),
                        self.t(to),
                        inside.len()
                    ));
                }
            }
        }
        for detail in found {
            self.violation(Kind::RetryStorm, detail);
        }
    }
}
