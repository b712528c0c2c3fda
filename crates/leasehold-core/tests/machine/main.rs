//! Unit tests of the sans-IO election machine ([`Machine`]), one per state transition.
//!
//! No runtime and no store: each test builds instants as `base + ms`, feeds [`Input`]s and
//! asserts on the exact [`Output`]s, on `next_wake()` and on `believes_leader()`.
//!
//! The timing used by most tests is round on purpose: TTL 10 s, drift 20% (so a grant is believed
//! for exactly 8 s after its request was *sent*), renew every 3 s, retry every 2 s without
//! jitter, step-down margin 1 s, request timeout 3 s. A leader that stepped down campaigns again
//! after `step_down_backoff()` = `retry_every * (2 + jitter)` = 4 s.

use std::time::{Duration, Instant};

use leasehold_core::machine::{DeposedReason, Input, Machine, OpId, Output, Reply, Request};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Expiry, Grant, HolderInfo, LeaseName, Notifications,
    Observation, PerMille, Renewed, Term, Timing, Turn,
};

mod ambiguous;
mod campaigning;
mod hand_over;
mod late_replies;
mod leading;
mod lock_delay;
mod stopping;

const TTL: Duration = Duration::from_secs(10);
/// `timing().step_down_backoff()`, in ms.
const BACKOFF: u64 = 4_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn timing() -> Timing {
    Timing {
        ttl: TTL,
        renew_every: ms(3_000),
        retry_every: ms(2_000),
        jitter: PerMille(0),
        drift: PerMille(200),
        step_down_margin: ms(1_000),
        request_timeout: ms(3_000),
        stall_timeout: None,
        lock_delay: None,
    }
}

fn lease() -> LeaseName {
    LeaseName::new("jobs").unwrap()
}

fn me() -> CandidateId {
    CandidateId::new("me").unwrap()
}

fn other() -> CandidateId {
    CandidateId::new("other").unwrap()
}

fn grant(term: u64, token: &str) -> Grant {
    Grant {
        lease: lease(),
        holder: me(),
        term: Term(term),
        ttl: TTL,
        token: token.to_string(),
    }
}

fn holder(id: CandidateId, term: u64, version: &str, store_remaining: Option<Duration>) -> HolderInfo {
    HolderInfo {
        id,
        term: Term(term),
        ttl: TTL,
        version: version.to_string(),
        orphaned: false,
        reserved: false,
        store_remaining,
    }
}

/// The lease held by `holder`.
fn held(holder: HolderInfo) -> Observation {
    Observation {
        lease: lease(),
        last_term: holder.term,
        holder: Some(holder),
        previous_end: None,
    }
}

fn free(last_term: u64, previous_end: EndReason) -> Observation {
    Observation::free(lease(), Term(last_term), Some(previous_end))
}

fn acquire(takeover: Option<&str>) -> Request {
    Request::Acquire(AcquireRequest {
        lease: lease(),
        candidate: me(),
        ttl: TTL,
        takeover: takeover.map(str::to_string),
    })
}

fn unreachable() -> Error {
    Error::unreachable("memory", "connection reset by peer")
}

/// [`Output`] in a comparable form, instants as offsets from the harness's base.
#[derive(Debug, PartialEq)]
enum Ev {
    Send(OpId, Request),
    Elected {
        grant: Grant,
        valid_until: Duration,
    },
    Extended(Duration),
    Deposed {
        term: Term,
        reason: DeposedReason,
        believed_until: Duration,
    },
    AbortWork,
    SteppedDown {
        term: Term,
        work_stopped_after: Option<Duration>,
        aborted: bool,
    },
    LeaderChanged(Option<(CandidateId, Term)>),
    /// A store error, by kind: "timeout", "unreachable", "corrupt" or "other".
    Trouble(&'static str),
    Stopped,
}

struct Harness {
    base: Instant,
    m: Machine,
}

impl Harness {
    fn new(timing: Timing, expiry: Expiry, notifications: Notifications) -> Self {
        let base = Instant::now();
        let m = Machine::new(timing, expiry, notifications, lease(), me(), base, 7).unwrap();
        Harness { base, m }
    }

    /// A follower of a store with a clock and no notifications (it polls).
    fn follower() -> Self {
        Harness::new(timing(), Expiry::ServerClock, Notifications::None)
    }

    /// A leader of term 1 (token "v1"), whose acquire was sent at 0 and granted at 0: it
    /// believes until 8 000 ms and renews first at 3 000 ms.
    fn leader_with(timing: Timing) -> Self {
        let mut h = Harness::new(timing, Expiry::ServerClock, Notifications::None);
        let op = h.send_at(0);
        let out = h.reply(0, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
        assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
        h
    }

    fn leader() -> Self {
        Harness::leader_with(timing())
    }

    fn at(&self, t: u64) -> Instant {
        self.base + ms(t)
    }

    fn step(&mut self, t: u64, input: Input) -> Vec<Ev> {
        let mut out = Vec::new();
        self.m.handle(self.at(t), input, &mut out);
        out.into_iter().map(|o| self.ev(o)).collect()
    }

    fn tick(&mut self, t: u64) -> Vec<Ev> {
        self.step(t, Input::Tick)
    }

    fn reply(&mut self, t: u64, op: OpId, reply: Reply) -> Vec<Ev> {
        self.step(t, Input::Reply(op, reply))
    }

    /// Ticks at `t` and expects exactly one request to be sent; returns its id.
    fn send_at(&mut self, t: u64) -> OpId {
        match self.tick(t).as_slice() {
            [Ev::Send(op, _)] => *op,
            out => panic!("expected one request at {t} ms, got {out:?}"),
        }
    }

    /// The next wake-up, in ms after base.
    fn wake(&self) -> Option<u64> {
        self.m.next_wake().map(|at| (at - self.base).as_millis() as u64)
    }

    fn believes(&self, t: u64) -> bool {
        self.m.believes_leader(self.at(t))
    }

    fn ev(&self, output: Output) -> Ev {
        let since = |at: Instant| at - self.base;
        match output {
            Output::Send(op, request) => Ev::Send(op, request),
            Output::Elected { grant, valid_until } => Ev::Elected {
                grant,
                valid_until: since(valid_until),
            },
            Output::Extended { valid_until } => Ev::Extended(since(valid_until)),
            Output::Deposed {
                term,
                reason,
                believed_until,
            } => Ev::Deposed {
                term,
                reason,
                believed_until: since(believed_until),
            },
            Output::AbortWork => Ev::AbortWork,
            Output::SteppedDown {
                term,
                work_stopped_after,
                aborted,
            } => Ev::SteppedDown {
                term,
                work_stopped_after,
                aborted,
            },
            Output::LeaderChanged(leader) => Ev::LeaderChanged(leader),
            Output::StoreTrouble(error) => Ev::Trouble(match error {
                Error::Timeout { .. } => "timeout",
                Error::Unreachable { .. } => "unreachable",
                Error::CorruptRecord { .. } => "corrupt",
                Error::Engine { .. } => "engine",
                _ => "other",
            }),
            Output::Stopped => Ev::Stopped,
        }
    }
}

fn sends(out: &[Ev]) -> Vec<&Request> {
    out.iter()
        .filter_map(|e| match e {
            Ev::Send(_, r) => Some(r),
            _ => None,
        })
        .collect()
}

fn sent_op(out: &[Ev]) -> OpId {
    match out.iter().find_map(|e| match e {
        Ev::Send(op, _) => Some(*op),
        _ => None,
    }) {
        Some(op) => op,
        None => panic!("no request sent in {out:?}"),
    }
}

fn superseded(by: CandidateId, term: u64) -> DeposedReason {
    DeposedReason::Superseded {
        by: Some(by),
        term: Some(Term(term)),
    }
}
