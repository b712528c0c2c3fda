//! Deterministic simulation of the real [`Elector`] driver under a seeded fault network.
//!
//! Each seed runs 3 or 4 candidates against one shared [`MemoryStore`] for 30 simulated seconds
//! (TTL 1 s; 500 seeds per expiry mode, 1,000 per run) on a current-thread tokio runtime with paused time, once per expiry mode of the
//! store (`simulation_server_clock`, `simulation_observed_expiry`). Every candidate reaches the
//! store through its own [`Net`], a `LeaseStore` wrapper that draws each request's fate from a
//! seeded generator:
//!
//! - delays the request and the reply independently (so requests reorder);
//! - refuses it at once with [`Error::Unreachable`] without applying it;
//! - applies it but loses the reply (the engine times out);
//! - applies it *late*: the request travels 0.4-2 TTL, and is applied by a spawned task even
//!   after the caller gave up on it, as real stores apply abandoned requests;
//! - holds every request and reply of a candidate during its pauses, and refuses everything during
//!   its outages (2-5 s).
//!
//! The wrapper forwards every [`LeaseStore`] method (hand-overs, `renew_many`, `list`, breaks,
//! announcements); change notifications and announcements are delayed, cut short or unavailable.
//! The candidates are services: a
//! `run` whose future is dropped by a `tokio::select!` (the obvious shutdown) and later restarted,
//! a `run_until`, or a `campaign` with a timeout and work done inline. Their work checks
//! `ensure_valid` before every side effect, heartbeats, sometimes ignores cancellation, resigns,
//! hands over to another candidate (also once `cancelled()` fired, the natural shutdown, and from
//! a clone of its handle while the work runs on), returns, fails, or blocks the whole runtime for
//! a while (a blocking call: the clock jumps while
//! no task runs). Half the seeds are *turbulent*: most campaigns poll (a released lease stays free
//! for up to a retry interval), 10-30% of requests arrive late, leaderships are short and services
//! restart at once; that is what it takes for an acquire left over from an earlier campaign to land
//! on a free lease (finding 1).
//!
//! Checked after each seed (a failure names the seed, the check and the trace):
//!
//! - `overlap`: believed leadership never overlaps. Each election is an interval on the one tokio
//!   clock, from `Event::Elected::at` to `Event::Deposed::believed_until` (or the end); and a probe
//!   calls `ensure_valid(0)` on every live `Leader` every 5 ms and fails on two `Ok`s (`probe`).
//! - `belief`: an election is never believed longer than `believed_ttl` after the store applied the
//!   acquire that made its grant (a grant is believed from a send time, never a later one). This is
//!   finding 1 of issue 12 even when no overlap follows.
//! - `terms`: successive elections have strictly increasing terms.
//! - `late-work`: a task appends (term, instant) to a ledger only right after `ensure_valid` was
//!   `Ok`; no entry of term T is at or after the election of a higher term.
//! - `dropped-run`: after a `run` future is dropped, the leader's task has stopped by the
//!   `valid_until` it had then, and no ledger entry of its term is later than the drop (finding 2).
//! - `cancel`: once the clock is past `valid_until - step_down_margin`, `is_cancelled()` is true,
//!   whatever the driver is doing (finding 6; found by the blocking sections).
//! - `retry-storm`: while a candidate's store refuses everything, it sends at most
//!   [`MAX_REFUSED_PER_SECOND`] requests in any simulated second (finding 7).
//! - `stranded`: a leader whose step-down ended with its work stopped (not aborted) sent a
//!   release of its term, unless the store had proved the lease lost (superseded) or could not be
//!   read (a store error); superseded by a newer term of its own (an acquire of its own applied
//!   late), a release of that term. With a `lock_delay`, a leader deposed for want of a confirmed
//!   renewal releases nothing (the next candidate must wait the delay). Otherwise the lease stays held until it expires and everyone
//!   waits a TTL (on stores without a clock, a TTL after they first saw its last version). Seen
//!   once on SQLite: a leader deposed because its renewal went unanswered sent none.
//! - `delay-skipped`: with a `lock_delay`, a leader deposed for want of a confirmed renewal sent a
//!   release of its term, however the step-down was noticed (the driver's timer, or the work's own
//!   `is_cancelled()` first): the clean end would let the next candidate skip the delay kept for
//!   exactly this holder (session 11 review).
//! - `late-grant`: no acquire of a `run` or `run_until` is granted after it returned (within the
//!   engine's bound on a call, a TTL from its send): nobody would renew or release that grant, and
//!   every other candidate would wait a TTL (issue 31, finding 3: found in 8 of 200 seeds with the
//!   driver's fix switched off).
//! - `stopped-aborted`: work that resigned or handed over as its last act (its handle had no other
//!   clone) is never waited for until `valid_until` and aborted (issue 31, finding 4: a hand-over
//!   after a deposition that left nothing to release; found in 86 of 200 seeds with the fix off).
//! - `livelock`: the engine polled one request's future [`SPIN_POLLS`] times at one simulated
//!   instant (a busy loop: paused time can never move again; in real time it burns a core until
//!   the reply). The request is then answered as refused, so the seed goes on. A slower fallback
//!   ([`unstick`]) catches busy loops elsewhere: the watchdog thread sees the probe stop.
//! - `panic`, `events-lost`, `hang`: a panic on the simulation's thread, a lagging event
//!   subscriber (the checks would be incomplete), a seed that did not finish in wall time.
//!
//! A task counts as stopped when it returns, is aborted, or calls `resign` (the engine takes that
//! as "the work has stopped"; `resign` then waits for the release, up to `request_timeout`).
//!
//! Replay: `LEASEHOLD_SIM_SEED=<n> cargo test -p leasehold-core --test simulation <server_clock|
//! observed_expiry> -- --nocapture` runs one seed and prints its full trace; `LEASEHOLD_SIM_SEEDS`
//! (how many, default [`DEFAULT_SEEDS`]) and `LEASEHOLD_SIM_FIRST` (first seed, default 0) choose a
//! range; `LEASEHOLD_SIM_REPEAT=<k>` runs each seed up to k times until it fails. A seed fixes the plan, every pause and outage, and the generators that draw each
//! request's fate (one per candidate, in the order that candidate sends) and each service's and
//! task's decisions; the engine's jitter is 0, so its retry times are fixed too. What a replay does
//! not fix: `tokio::select!` without `biased` picks among branches ready at the same instant at
//! random (in `run_until`, `campaign`'s spawn, tokio's own), and record versions come from
//! `random_u64`. So a replay usually gives the same trace byte for byte (4 of 5 replays did when
//! measured), and otherwise the same schedule with some tie resolved differently; the trace's hash
//! is printed to compare runs. A failure found in a batch is normally reproduced by its replay.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, DeposedReason, Elector, Error, Event,
    Grant, Leader, LeaseName, LeaseStore, MemoryStore, Observation, Renewed, Result, Term, Transition,
};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::{Instant, sleep, sleep_until, timeout};

const TTL: Duration = Duration::from_secs(1);
const RENEW_EVERY: Duration = Duration::from_millis(300);
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// The default `ttl / 10`.
const STEP_DOWN_MARGIN: Duration = Duration::from_millis(100);
/// `ttl * (1 - drift)` with the default drift of 1%.
const BELIEVED_TTL: Duration = Duration::from_millis(990);
/// Simulated time per seed, unless `LEASEHOLD_SIM_SECONDS` says otherwise.
const SIM_LENGTH: Duration = Duration::from_secs(30);
const PROBE_EVERY: Duration = Duration::from_millis(5);
/// The last part of every seed has no faults: requests are delivered promptly, nothing pauses,
/// blocks or is refused, and every service campaigns with `run` (see [`Kind::Leaderless`]).
const CALM: Duration = Duration::from_secs(10);
/// After the faults stop, requests applied late may still land for up to two TTLs, and a leader
/// they left behind expires a TTL later: the leaderless check starts once that is over.
const SETTLE: Duration = Duration::from_secs(3);
/// How long a refused connection takes to fail (tokio's timers have 1 ms resolution; a refusal
/// in zero time would let a retry loop spin forever at one paused instant).
const REFUSED_AFTER: Duration = Duration::from_millis(1);
/// Requests per simulated second, at most, while every request is refused: what
/// docs/guarantees.md promises a leader sends from its first failed renewal to its step-down,
/// `2 × (1 + (ttl × (1 − drift) − step_down_margin − renew_every) / (retry_every / 4))` = 25 here,
/// plus a follower's acquire and read-back per `retry_every` for the rest of the second (10). An
/// unpaced retry loop sends hundreds (308 measured before the retry floor).
const MAX_REFUSED_PER_SECOND: usize = 35;
/// Seeds per test (each test runs one expiry mode) when `LEASEHOLD_SIM_SEEDS` is not set.
const DEFAULT_SEEDS: u64 = 500;
/// Wall time after which a seed counts as hung.
const WALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);
/// How often one request's future may be polled at one simulated instant before it counts as a
/// busy loop (a healthy driver polls it a few times).
const SPIN_POLLS: u32 = 1_000;
/// Wall time without the probe running after which the watchdog nudges (see [`unstick`]).
const STUCK_AFTER: std::time::Duration = std::time::Duration::from_millis(20);
/// Nudges without simulated time moving after which [`unstick`] reports a busy loop.
const STUCK_NUDGES: u32 = 25;

// ------------------------------------------------------------------------------------------------
// Randomness

/// splitmix64: tiny, seedable, good enough to draw faults.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A whole number of milliseconds in `lo..=hi`.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    /// An independent generator.
    fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}

// ------------------------------------------------------------------------------------------------
// The plan of one seed

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    ServerClock,
    ObservedExpiry,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::ServerClock => "server_clock",
            Mode::ObservedExpiry => "observed_expiry",
        }
    }
}

/// Per-request fault probabilities of one seed.
#[derive(Clone, Copy, Debug)]
struct Faults {
    /// Refused at once, not applied.
    refuse: f64,
    /// Applied, reply never delivered.
    lose_reply: f64,
    /// Applied 0.4-2 TTL after it was sent.
    late: f64,
    /// A request or reply takes 20-400 ms instead of 0-5 ms.
    slow: f64,
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    candidates: usize,
    faults: Faults,
    lock_delay: Option<Duration>,
    stall_timeout: Option<Duration>,
    /// Per work step, the chance that the work blocks the whole runtime for a while.
    block: f64,
    /// The chance that a campaign gets working change notifications (it polls otherwise, so a
    /// released lease stays free for up to a retry interval).
    notifications: f64,
    /// Leaders resign, return or fail soon, and services restart quickly: many campaigns.
    turbulent: bool,
}

impl Plan {
    fn draw(rng: &mut Rng) -> Plan {
        let turbulent = rng.chance(0.5);
        Plan {
            candidates: 3 + rng.below(2) as usize,
            faults: Faults {
                refuse: 0.02 + 0.25 * rng.unit(),
                lose_reply: 0.08 * rng.unit(),
                late: if turbulent {
                    0.10 + 0.20 * rng.unit()
                } else {
                    0.02 + 0.10 * rng.unit()
                },
                slow: 0.25 * rng.unit(),
            },
            lock_delay: rng.chance(0.2).then(|| rng.ms(0, 1_500)),
            stall_timeout: rng.chance(0.2).then(|| rng.ms(300, 800)),
            block: if rng.chance(0.5) { 0.0 } else { 0.002 },
            notifications: if turbulent {
                [0.2, 0.5, 0.8][rng.below(3) as usize]
            } else {
                0.8
            },
            turbulent,
        }
    }
}

/// `count` windows of `min..=max` each, at random in `start..start + SIM_LENGTH`.
fn windows(rng: &mut Rng, start: Instant, count: u64, min: u64, max: u64) -> Arc<[(Instant, Instant)]> {
    let calm = calm_from(start);
    let mut all: Vec<_> = (0..count)
        .map(|_| {
            let from = start + Duration::from_millis(rng.below(sim_length().as_millis() as u64));
            (from.min(calm), (from + rng.ms(min, max)).min(calm))
        })
        .collect();
    all.sort();
    all.into()
}

fn within(windows: &[(Instant, Instant)], at: Instant) -> Option<Instant> {
    windows
        .iter()
        .find(|(from, to)| *from <= at && at < *to)
        .map(|(_, to)| *to)
}

// ------------------------------------------------------------------------------------------------
// What happened in one seed

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Overlap,
    Probe,
    Belief,
    Terms,
    LateWork,
    DroppedRun,
    Cancel,
    RetryStorm,
    Stranded,
    DelaySkipped,
    LateGrant,
    StoppedAborted,
    Leaderless,
    Panic,
    EventsLost,
    Livelock,
    Hang,
}

impl Kind {
    /// Two leaders at once, or work done while another leads.
    fn is_safety(self) -> bool {
        matches!(
            self,
            Kind::Overlap | Kind::Probe | Kind::Belief | Kind::Terms | Kind::LateWork
        )
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Overlap => "overlap",
            Kind::Probe => "probe",
            Kind::Belief => "belief",
            Kind::Terms => "terms",
            Kind::LateWork => "late-work",
            Kind::DroppedRun => "dropped-run",
            Kind::Cancel => "cancel",
            Kind::RetryStorm => "retry-storm",
            Kind::Stranded => "stranded",
            Kind::DelaySkipped => "delay-skipped",
            Kind::LateGrant => "late-grant",
            Kind::StoppedAborted => "stopped-aborted",
            Kind::Leaderless => "leaderless",
            Kind::Panic => "panic",
            Kind::EventsLost => "events-lost",
            Kind::Livelock => "livelock",
            Kind::Hang => "hang",
        }
    }
}

#[derive(Clone, Debug)]
struct Violation {
    kind: Kind,
    at: Duration,
    detail: String,
}

#[derive(Clone, Debug)]
struct Election {
    c: usize,
    term: Term,
    at: Instant,
    valid_until: Instant,
    /// `believed_until` of the Deposed event.
    end: Option<Instant>,
}

/// What the store did with an acquire that granted a term.
#[derive(Clone, Debug)]
struct StoreGrant {
    c: usize,
    request: u64,
    sent: Instant,
    applied: Instant,
    /// The trace position when the store applied it.
    seq: usize,
}

#[derive(Debug)]
struct Held {
    c: usize,
    term: Term,
    leader: Leader,
}

#[derive(Clone, Debug)]
struct DroppedRun {
    c: usize,
    at: Instant,
    term: Term,
    valid_until: Instant,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    requests: u64,
    refused: u64,
    late: u64,
    lost_replies: u64,
    elections: u64,
    work: u64,
    dropped_runs: u64,
    dropped_while_leading: u64,
    blocks: u64,
    /// The most requests a candidate sent in one simulated second while everything was refused.
    max_refused_per_second: usize,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.requests += o.requests;
        self.refused += o.refused;
        self.late += o.late;
        self.lost_replies += o.lost_replies;
        self.elections += o.elections;
        self.work += o.work;
        self.dropped_runs += o.dropped_runs;
        self.dropped_while_leading += o.dropped_while_leading;
        self.blocks += o.blocks;
        self.max_refused_per_second = self.max_refused_per_second.max(o.max_refused_per_second);
    }
}

#[derive(Debug)]
struct World {
    start: Instant,
    finished: bool,
    trace: Vec<String>,
    leaders: HashMap<u64, Held>,
    next_slot: u64,
    /// (candidate, term, instant, trace position) after each `ensure_valid` that was `Ok`. The
    /// trace position orders entries and store grants made at one simulated instant (a blocked
    /// runtime lets many things happen at once).
    ledger: Vec<(usize, Term, Instant, usize)>,
    elections: Vec<Election>,
    grants: HashMap<Term, StoreGrant>,
    task_ends: HashMap<(usize, Term), Instant>,
    drops: Vec<DroppedRun>,
    outages: Vec<Arc<[(Instant, Instant)]>>,
    refused_in_outage: Vec<Vec<Instant>>,
    /// Each candidate's release requests, by term (sent, whatever their fate).
    released: HashSet<(usize, Term)>,
    violations: Vec<Violation>,
    /// Deduplicates repeated probe and cancel findings.
    reported: HashSet<String>,
    lagged: u64,
    /// The last instant the probe saw each leadership pass `ensure_valid(0)`: the end of an
    /// election whose `Deposed` event has not come by the end (it comes once stepping down is
    /// complete).
    last_valid: HashMap<(usize, Term), Instant>,
    /// Blocking sections of each leadership's work: (from, to).
    blocked: HashMap<(usize, Term), Vec<(Instant, Instant)>>,
    /// The candidates run with a `lock_delay`: a leader deposed for want of a confirmed renewal
    /// then leaves its lease to expire (a release would let the next skip the delay).
    lock_delay: bool,
    /// The candidates' `lock_delay` (zero without one).
    lock_delay_length: Duration,
    /// When each candidate's `run` or `run_until` last started and returned, until its service
    /// starts again.
    returned: Vec<Option<(Instant, Instant)>>,
    /// Leaderships whose work said it stopped (it resigned or handed over as its last act).
    stopped_work: HashSet<(usize, Term)>,
    stats: Stats,
}

type Shared = Arc<Mutex<World>>;

fn lock(world: &Shared) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl World {
    fn new(start: Instant, candidates: usize) -> Self {
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

    fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    fn t(&self, at: Instant) -> String {
        format!("{:.3}s", self.since(at).as_secs_f64())
    }

    fn log(&mut self, line: impl AsRef<str>) {
        let line = format!("{:>9} {}", self.t(Instant::now()), line.as_ref());
        self.trace.push(line);
    }

    fn violation(&mut self, kind: Kind, detail: String) {
        self.log(format!("VIOLATION {}: {detail}", kind.name()));
        let at = self.since(Instant::now());
        self.violations.push(Violation { kind, at, detail });
    }

    /// Reports once per `key`.
    fn violation_once(&mut self, kind: Kind, key: String, detail: String) {
        if self.reported.insert(key) {
            self.violation(kind, detail);
        }
    }

    fn on_event(&mut self, c: usize, event: Event) {
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
    fn check(&mut self, end: Instant) {
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

    fn describe_grant(&self, term: Term) -> String {
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
    fn check_leaderless(&mut self, end: Instant) {
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

    fn check_overlaps(&mut self, end: Instant) {
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
    fn check_beliefs(&mut self) {
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

    fn check_terms(&mut self) {
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

    fn check_ledger(&mut self) {
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

    fn check_dropped_runs(&mut self, end: Instant) {
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

    fn check_refused(&mut self, end: Instant) {
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

// ------------------------------------------------------------------------------------------------
// The fault network

enum Fate {
    Refuse,
    Deliver {
        to_store: Duration,
        to_caller: Duration,
        lose_reply: bool,
        late: bool,
    },
}

fn draw(rng: &mut Rng, f: &Faults) -> Fate {
    if rng.chance(f.refuse) {
        return Fate::Refuse;
    }
    let late = rng.chance(f.late);
    let to_store = if late {
        rng.ms(400, 2_000)
    } else if rng.chance(f.slow) {
        rng.ms(20, 400)
    } else {
        rng.ms(0, 5)
    };
    let to_caller = if rng.chance(f.slow) {
        rng.ms(20, 400)
    } else {
        rng.ms(0, 5)
    };
    Fate::Deliver {
        to_store,
        to_caller,
        lose_reply: rng.chance(f.lose_reply),
        late,
    }
}

/// Waits while the candidate's network is paused.
async fn wait_unpaused(pauses: &[(Instant, Instant)]) {
    while let Some(until) = within(pauses, Instant::now()) {
        sleep_until(until).await;
    }
}

/// What a reply says, for the trace, and the term it grants.
trait Describe {
    fn describe(&self) -> String;
    fn granted(&self) -> Option<Term> {
        None
    }
}

impl Describe for Acquired {
    fn describe(&self) -> String {
        match self {
            Acquired::Granted(g) => format!("granted term {}", g.term),
            Acquired::Held(o) => format!("held: {}", describe_observation(o)),
        }
    }
    fn granted(&self) -> Option<Term> {
        match self {
            Acquired::Granted(g) => Some(g.term),
            Acquired::Held(_) => None,
        }
    }
}

impl Describe for Vec<Result<Renewed>> {
    fn describe(&self) -> String {
        let renewed = self.iter().filter(|r| matches!(r, Ok(Renewed::Renewed(_)))).count();
        format!("{renewed} of {} renewed", self.len())
    }
}

impl Describe for Vec<Observation> {
    fn describe(&self) -> String {
        format!("{} leases", self.len())
    }
}

impl Describe for Option<Term> {
    fn describe(&self) -> String {
        format!("broke term {self:?}")
    }
}

impl Describe for Renewed {
    fn describe(&self) -> String {
        match self {
            Renewed::Renewed(g) => format!("renewed term {}", g.term),
            Renewed::Lost(o) => format!("lost: {}", describe_observation(o)),
        }
    }
}

impl Describe for Observation {
    fn describe(&self) -> String {
        describe_observation(self)
    }
}

impl Describe for () {
    fn describe(&self) -> String {
        "ok".into()
    }
}

fn describe_observation(o: &Observation) -> String {
    match &o.holder {
        Some(h) => format!("{} holds term {} (last term {})", h.id, h.term, o.last_term),
        None => format!("free (last term {}, {:?})", o.last_term, o.previous_end),
    }
}

/// One candidate's way to the shared store.
struct Net {
    me: usize,
    store: MemoryStore,
    faults: Faults,
    pauses: Arc<[(Instant, Instant)]>,
    outages: Arc<[(Instant, Instant)]>,
    /// From then on, every request is delivered promptly.
    calm_from: Instant,
    /// The chance that a `changes` call gives a working stream.
    notifications: f64,
    rng: Mutex<(Rng, u64)>,
    world: Shared,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").field("me", &self.me).finish_non_exhaustive()
    }
}

impl Net {
    /// One request through the network, guarded against a caller that polls it in a busy loop.
    async fn call<T, F, Fut>(&self, op: &'static str, apply: F) -> Result<T>
    where
        T: Describe + Send + 'static,
        F: FnOnce(MemoryStore) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let me = self.me;
        let mut request = std::pin::pin!(self.deliver(op, apply));
        let mut at = Instant::now();
        let mut polls = 0u32;
        let outcome = std::future::poll_fn(|cx| {
            let now = Instant::now();
            if now != at {
                (at, polls) = (now, 0);
            }
            polls += 1;
            if polls > SPIN_POLLS {
                return std::task::Poll::Ready(None);
            }
            request.as_mut().poll(cx).map(Some)
        })
        .await;
        match outcome {
            Some(result) => result,
            None => {
                lock(&self.world).violation(
                    Kind::Livelock,
                    format!(
                        "c{me}'s engine polled its {op} request {SPIN_POLLS} times at one simulated instant: a busy \
                         loop (simulated time cannot pass; in real time it burns a core until the reply); the \
                         simulation answers it as refused to break the loop"
                    ),
                );
                Err(Error::unreachable("sim", "busy loop broken by the simulation"))
            }
        }
    }

    async fn deliver<T, F, Fut>(&self, op: &'static str, apply: F) -> Result<T>
    where
        T: Describe + Send + 'static,
        F: FnOnce(MemoryStore) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let me = self.me;
        let sent = Instant::now();
        let outage = within(&self.outages, sent).is_some();
        let (id, fate) = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let (rng, next) = &mut *guard;
            *next += 1;
            let fate = draw(rng, &self.faults);
            let calm = Fate::Deliver {
                to_store: rng.ms(0, 5),
                to_caller: rng.ms(0, 5),
                lose_reply: false,
                late: false,
            };
            (*next, if sent >= self.calm_from { calm } else { fate })
        };
        {
            let mut w = lock(&self.world);
            w.stats.requests += 1;
            if outage {
                w.refused_in_outage[me].push(sent);
            }
            let how = match (&fate, outage) {
                (_, true) => "refused (outage)".to_string(),
                (Fate::Refuse, _) => "refused".to_string(),
                (
                    Fate::Deliver {
                        to_store,
                        to_caller,
                        lose_reply,
                        late,
                    },
                    _,
                ) => format!(
                    "to store {to_store:?}{}, reply {}",
                    if *late { " (late)" } else { "" },
                    if *lose_reply {
                        "lost".to_string()
                    } else {
                        format!("{to_caller:?}")
                    }
                ),
            };
            w.log(format!("c{me} #{id} {op}: {how}"));
        }
        let Fate::Deliver {
            to_store,
            to_caller,
            lose_reply,
            late,
        } = fate
        else {
            lock(&self.world).stats.refused += 1;
            sleep(REFUSED_AFTER).await;
            return Err(Error::unreachable("sim", "connection refused (not applied)"));
        };
        if outage {
            lock(&self.world).stats.refused += 1;
            sleep(REFUSED_AFTER).await;
            return Err(Error::unreachable("sim", "connection refused (outage, not applied)"));
        }
        let (tx, rx) = oneshot::channel();
        let store = self.store.clone();
        let pauses = self.pauses.clone();
        let world = self.world.clone();
        // The request is on the wire: it is applied whether or not the caller still waits.
        tokio::spawn(async move {
            sleep(to_store).await;
            wait_unpaused(&pauses).await;
            let result = apply(store).await;
            {
                let mut w = lock(&world);
                if late {
                    w.stats.late += 1;
                }
                if let Some(term) = result.as_ref().ok().and_then(Describe::granted) {
                    let applied = Instant::now();
                    // The engine bounds a call by the TTL from its send (`call_bound`): an acquire
                    // applied within it belongs to the election, which must still be there to
                    // give back what it grants.
                    // (Acquires of an earlier campaign, dropped before it, are its own driver's.)
                    if let Some((_, returned)) = w.returned[me]
                        .filter(|(started, returned)| sent >= *started && applied > *returned && applied < sent + TTL)
                    {
                        let detail = format!(
                            "c{me}'s acquire #{id} (sent {}) granted term {term} at {}, after its run returned at {}: \
                             a grant nobody renews or releases",
                            w.t(sent),
                            w.t(applied),
                            w.t(returned)
                        );
                        w.violation(Kind::LateGrant, detail);
                    }
                    let seq = w.trace.len();
                    w.grants.insert(
                        term,
                        StoreGrant {
                            c: me,
                            request: id,
                            sent,
                            applied,
                            seq,
                        },
                    );
                }
                let what = match &result {
                    Ok(v) => v.describe(),
                    Err(e) => format!("error: {e}"),
                };
                w.log(format!("c{me} #{id} {op} applied: {what}"));
                if lose_reply {
                    w.stats.lost_replies += 1;
                }
            }
            if lose_reply {
                return;
            }
            sleep(to_caller).await;
            wait_unpaused(&pauses).await;
            if tx.send(result).is_err() {
                lock(&world).log(format!("c{me} #{id} {op}: the reply came after the caller gave up"));
            }
        });
        match rx.await {
            Ok(result) => result,
            Err(_) => std::future::pending().await,
        }
    }
}

#[async_trait]
impl LeaseStore for Net {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let request = request.clone();
        let op = if request.takeover.is_some() {
            "acquire (takeover)"
        } else {
            "acquire"
        };
        self.call(op, move |s| async move { s.acquire(&request).await }).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let grant = grant.clone();
        self.call("renew", move |s| async move { s.renew(&grant).await }).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let grant = grant.clone();
        lock(&self.world).released.insert((self.me, grant.term));
        self.call("release", move |s| async move { s.release(&grant).await })
            .await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let grants = grants.to_vec();
        self.call("renew_many", move |s| async move { s.renew_many(&grants).await })
            .await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let (grant, to) = (grant.clone(), to.clone());
        lock(&self.world).released.insert((self.me, grant.term));
        let op = "hand_over";
        self.call(op, move |s| async move { s.hand_over(&grant, &to).await })
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let prefix = prefix.to_string();
        self.call("list", move |s| async move { s.list(&prefix).await }).await
    }

    fn can_break(&self) -> bool {
        self.store.can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let lease = lease.clone();
        self.call("break", move |s| async move { s.break_lease(&lease).await })
            .await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        // Announcements come late, and some streams end after a while (as notifications do).
        let mut rng = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            guard.0.fork()
        };
        if !rng.chance(self.notifications) {
            return Ok(None);
        }
        let Some(inner) = self.store.announcements(lease).await? else {
            return Ok(None);
        };
        let items = if rng.chance(0.3) {
            1 + rng.below(30) as usize
        } else {
            usize::MAX
        };
        let delayed = inner.take(items).then(move |observation| {
            let delay = rng.ms(0, 50);
            async move {
                sleep(delay).await;
                observation
            }
        });
        Ok(Some(Box::pin(delayed)))
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let (lease, candidate) = (lease.clone(), candidate.clone());
        self.call("withdraw", move |s| async move { s.withdraw(&lease, &candidate).await })
            .await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let lease = lease.clone();
        self.call("inspect", move |s| async move { s.inspect(&lease).await })
            .await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.store.history(lease, limit).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let (choice, mut rng) = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let (rng, _) = &mut *guard;
            let works = rng.chance(self.notifications);
            (if works { 2 } else { rng.below(2) }, rng.fork())
        };
        match choice {
            0 => Err(Error::unreachable("sim", "watch refused")),
            1 => Ok(None),
            _ => {
                let Some(inner) = self.store.changes(lease, candidate).await? else {
                    return Ok(None);
                };
                // Notifications arrive late, and some streams end after a while (polling then).
                let items = if rng.chance(0.3) {
                    1 + rng.below(30) as usize
                } else {
                    usize::MAX
                };
                let delayed = inner.take(items).then(move |change| {
                    let delay = rng.ms(0, 50);
                    async move {
                        sleep(delay).await;
                        change
                    }
                });
                Ok(Some(Box::pin(delayed)))
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Candidates: services and their work

/// Removes a leader from the probe's list and records when its work ended.
struct Registration {
    world: Shared,
    slot: u64,
    c: usize,
    term: Term,
}

impl Registration {
    /// The work has stopped (it returned, was aborted, or calls `resign`, which the engine takes
    /// as "the work has stopped" and which then waits for the release).
    fn end(&self, how: &str) {
        let mut w = lock(&self.world);
        if w.finished || w.leaders.remove(&self.slot).is_none() {
            return;
        }
        w.task_ends.insert((self.c, self.term), Instant::now());
        let (c, term) = (self.c, self.term);
        w.log(format!("c{c} work of term {term} {how}"));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.end("ended");
    }
}

fn register(world: &Shared, c: usize, leader: &Leader) -> Registration {
    let mut w = lock(world);
    let slot = w.next_slot;
    w.next_slot += 1;
    let term = leader.term();
    w.leaders.insert(
        slot,
        Held {
            c,
            term,
            leader: leader.clone(),
        },
    );
    w.log(format!("c{c} work of term {term} started"));
    Registration {
        world: world.clone(),
        slot,
        c,
        term,
    }
}

/// Checks finding 6: past `valid_until - step_down_margin`, the leader is cancelled whatever the
/// driver is doing.
fn check_cancelled(w: &mut World, c: usize, leader: &Leader, when: &str) {
    let now = Instant::now();
    let cancel_at = Instant::from_std(leader.valid_until()) - STEP_DOWN_MARGIN;
    if now > cancel_at && !leader.is_cancelled() {
        let term = leader.term();
        let detail = format!(
            "c{c} term {term}: is_cancelled() is false {:?} after valid_until - step_down_margin ({}), {when}",
            now - cancel_at,
            w.t(cancel_at)
        );
        w.violation_once(Kind::Cancel, format!("cancel {c} {term}"), detail);
    }
}

/// A blocking section: the whole runtime (every candidate, the store) stops while time passes,
/// as a blocking call on a current-thread runtime does.
fn block(world: &Shared, c: usize, leader: &Leader, duration: Duration) {
    lock(world).log(format!("c{c} work blocks the runtime for {duration:?}"));
    let from = Instant::now();
    // The first poll of `advance` moves the clock; the rest is a yield, which is not wanted here.
    let _ = tokio::time::advance(duration).now_or_never();
    let mut w = lock(world);
    w.stats.blocks += 1;
    w.blocked
        .entry((c, leader.term()))
        .or_default()
        .push((from, Instant::now()));
    check_cancelled(&mut w, c, leader, "right after a blocking section");
}

/// A leader's work: checks `ensure_valid` before every side effect (a ledger entry).
async fn work(
    c: usize,
    leader: Leader,
    world: Shared,
    mut rng: Rng,
    plan: Plan,
    may_ignore_cancel: bool,
) -> std::result::Result<(), String> {
    let term = leader.term();
    let registration = register(&world, c, &leader);
    let ignores_cancel = may_ignore_cancel && rng.chance(0.15);
    let stalls_after = if plan.stall_timeout.is_some() && rng.chance(0.3) {
        rng.below(100)
    } else {
        u64::MAX
    };
    let steps = match (plan.turbulent, rng.chance(0.5)) {
        (false, true) => u64::MAX,
        (false, false) => rng.below(300),
        (true, _) => rng.below(60),
    };
    let min_remaining = if rng.chance(0.5) {
        Duration::ZERO
    } else {
        rng.ms(1, 150)
    };
    let other = CandidateId::new(format!(
        "c{}",
        (c + 1 + rng.below(plan.candidates as u64 - 1) as usize) % plan.candidates
    ))
    .expect("a candidate id");
    // Stops as the natural shutdown does once `cancelled()` fired: hands over or resigns.
    let on_cancel = rng.below(3);
    // With a clone alive, the work counts as stopped only once that clone is gone too.
    let cloned = rng.chance(0.1);
    if cloned {
        // Another clone of the handle ends the leadership while this work runs on.
        let (clone, to, after, hand_over) = (leader.clone(), other.clone(), rng.ms(0, 800), rng.chance(0.5));
        let world = world.clone();
        tokio::spawn(async move {
            sleep(after).await;
            lock(&world).log(format!(
                "c{c} a clone of term {term}'s handle {}",
                if hand_over { "hands over" } else { "resigns" }
            ));
            if hand_over {
                clone.hand_over(&to).await;
            } else {
                clone.resign().await;
            }
        });
    }
    for step in 0.. {
        let nap = rng.ms(1, 40);
        if ignores_cancel {
            sleep(nap).await;
        } else {
            tokio::select! {
                biased;
                () = leader.cancelled() => {
                    match on_cancel {
                        0 => return Ok(()),
                        1 => {
                            registration.end("hands over after cancellation (its work has stopped)");
                            if !cloned {
                                lock(&world).stopped_work.insert((c, term));
                            }
                            leader.hand_over(&other).await;
                        }
                        _ => {
                            registration.end("resigns after cancellation (its work has stopped)");
                            if !cloned {
                                lock(&world).stopped_work.insert((c, term));
                            }
                            leader.resign().await;
                        }
                    }
                    return Ok(());
                }
                () = sleep(nap) => {}
            }
        }
        if rng.chance(plan.block) && Instant::now() < calm_from(lock(&world).start) {
            block(&world, c, &leader, rng.ms(20, 1_200));
        }
        match leader.ensure_valid(min_remaining) {
            Ok(()) => {
                let mut w = lock(&world);
                let seq = w.trace.len();
                w.ledger.push((c, term, Instant::now(), seq));
                w.stats.work += 1;
                drop(w);
                if step < stalls_after {
                    leader.heartbeat();
                }
            }
            Err(e) if ignores_cancel => {
                if step % 50 == 0 {
                    lock(&world).log(format!("c{c} work of term {term} (ignoring cancellation): {e}"));
                }
            }
            Err(e) => {
                lock(&world).log(format!("c{c} work of term {term} stops: {e}"));
                return Err(e.to_string());
            }
        }
        if step >= steps {
            return match rng.below(4) {
                0 => {
                    lock(&world).log(format!("c{c} work of term {term} returns"));
                    Ok(())
                }
                1 => {
                    registration.end("resigns (its work has stopped)");
                    leader.resign().await;
                    Ok(())
                }
                2 => {
                    registration.end(&format!("hands over to {other} (its work has stopped)"));
                    leader.hand_over(&other).await;
                    Ok(())
                }
                _ => Err(format!("c{c} work of term {term} fails on purpose")),
            };
        }
    }
    Ok(())
}

fn tasks(
    c: usize,
    world: Shared,
    mut rng: Rng,
    plan: Plan,
) -> impl FnMut(Leader) -> futures::future::BoxFuture<'static, std::result::Result<(), String>> {
    move |leader| work(c, leader, world.clone(), rng.fork(), plan, true).boxed()
}

/// A service that embeds the elector: starts, is shut down, restarts, until the end.
async fn service(c: usize, elector: Elector, world: Shared, mut rng: Rng, plan: Plan, end: Instant) {
    let calm = calm_from(lock(&world).start);
    while Instant::now() < end {
        lock(&world).returned[c] = None;
        let started = Instant::now();
        if started >= calm {
            lock(&world).log(format!("c{c} service runs (calm)"));
            let task = tasks(c, world.clone(), rng.fork(), plan);
            tokio::select! {
                result = elector.run(task) => lock(&world).log(format!("c{c} run returned {result:?}")),
                () = sleep_until(end) => return,
            }
            continue;
        }
        let life = if plan.turbulent {
            rng.ms(100, 4_000)
        } else {
            rng.ms(300, 15_000)
        };
        match rng.below(10) {
            0..=3 => {
                lock(&world).log(format!("c{c} service starts run (shut down after {life:?})"));
                let task = tasks(c, world.clone(), rng.fork(), plan);
                tokio::select! {
                    biased;
                    result = elector.run(task) => {
                        let mut w = lock(&world);
                        w.log(format!("c{c} run returned {result:?}"));
                        w.returned[c] = Some((started, Instant::now()));
                    }
                    () = sleep(life) => dropped_run(&world, c),
                }
            }
            4..=6 => {
                lock(&world).log(format!("c{c} service starts run_until (shutdown after {life:?})"));
                let task = tasks(c, world.clone(), rng.fork(), plan);
                let result = elector.run_until(task, sleep(life)).await;
                let mut w = lock(&world);
                w.log(format!("c{c} run_until returned {result:?}"));
                w.returned[c] = Some((started, Instant::now()));
            }
            _ => {
                lock(&world).log(format!("c{c} campaigns (gives up after {life:?})"));
                match timeout(life, elector.campaign()).await {
                    Err(_) => lock(&world).log(format!("c{c} campaign dropped")),
                    Ok(Err(e)) => lock(&world).log(format!("c{c} campaign failed: {e}")),
                    Ok(Ok(leader)) => {
                        let result = work(c, leader.clone(), world.clone(), rng.fork(), plan, false).await;
                        let resign = rng.chance(0.5);
                        lock(&world).log(format!(
                            "c{c} inline work returned {result:?}; {}",
                            if resign { "resigns" } else { "drops the handle" }
                        ));
                        if resign {
                            leader.resign().await;
                        } else {
                            drop(leader);
                        }
                    }
                }
            }
        }
        sleep(if plan.turbulent {
            rng.ms(0, 300)
        } else {
            rng.ms(0, 2_000)
        })
        .await;
    }
}

/// Records a dropped `run` future and the leaders its task held then.
fn dropped_run(world: &Shared, c: usize) {
    let mut w = lock(world);
    w.stats.dropped_runs += 1;
    let now = Instant::now();
    let held: Vec<_> = w
        .leaders
        .values()
        .filter(|h| h.c == c)
        .map(|h| {
            (
                h.term,
                Instant::from_std(h.leader.valid_until()),
                h.leader.is_cancelled(),
            )
        })
        .collect();
    if held.is_empty() {
        w.log(format!("c{c} run future dropped (not leading)"));
    }
    for (term, valid_until, cancelled) in held {
        w.stats.dropped_while_leading += 1;
        let until = w.t(valid_until);
        w.log(format!(
            "c{c} run future dropped while its task of term {term} runs (valid until {until}, cancelled {cancelled})"
        ));
        w.drops.push(DroppedRun {
            c,
            at: now,
            term,
            valid_until,
        });
    }
}

/// Every few ms: at most one live `Leader` passes `ensure_valid(0)`.
async fn probe(world: Shared, end: Instant, progress: Arc<AtomicU64>) {
    while Instant::now() < end {
        sleep(PROBE_EVERY).await;
        progress.fetch_add(1, Ordering::Relaxed);
        let mut w = lock(&world);
        let mut believing: Vec<_> = w
            .leaders
            .values()
            .filter(|h| h.leader.ensure_valid(Duration::ZERO).is_ok())
            .map(|h| (h.c, h.term))
            .collect();
        let now = Instant::now();
        for key in &believing {
            w.last_valid.insert(*key, now);
        }
        believing.sort();
        believing.dedup();
        if believing.len() > 1 {
            let who: Vec<_> = believing.iter().map(|(c, t)| format!("c{c} term {t}")).collect();
            let detail = format!("ensure_valid(0) is Ok for {} at once", who.join(" and "));
            w.violation_once(Kind::Probe, format!("probe {believing:?}"), detail);
        }
        let leaders: Vec<_> = w.leaders.values().map(|h| (h.c, h.leader.clone())).collect();
        for (c, leader) in leaders {
            check_cancelled(&mut w, c, &leader, "seen by the probe");
        }
    }
}

async fn record_events(c: usize, mut events: broadcast::Receiver<Event>, world: Shared) {
    loop {
        match events.recv().await {
            Ok(event) => lock(&world).on_event(c, event),
            Err(broadcast::error::RecvError::Lagged(n)) => lock(&world).lagged += n,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// One seed

#[derive(Debug)]
struct SeedReport {
    seed: u64,
    plan: Plan,
    violations: Vec<Violation>,
    stats: Stats,
    trace: Vec<String>,
}

fn mix(seed: u64, mode: Mode) -> u64 {
    let salt = match mode {
        Mode::ServerClock => 0x5eed_0001,
        Mode::ObservedExpiry => 0x5eed_0002,
    };
    Rng::new(seed ^ (salt << 32)).next()
}

/// What the watchdog thread sees of a running seed.
#[derive(Clone)]
struct Running {
    world: Shared,
    /// Moves every time the probe runs (every 5 simulated ms).
    progress: Arc<AtomicU64>,
    nudge: mpsc::UnboundedSender<()>,
}

/// Unsticks a livelocked runtime: a task that is always ready (it spins at one instant) keeps
/// paused time from advancing, so every timer waits forever. The watchdog thread nudges when the
/// probe has not run for a while; if time does not move before [`STUCK_NUDGES`] more nudges (half
/// a second of wall time: a loaded machine only slows a step down), this reports a livelock and moves the clock by hand for up to two TTLs, so the seed (and its other checks)
/// can go on. In real time such a spin burns a core for as long as it lasts.
async fn unstick(mut nudges: mpsc::UnboundedReceiver<()>, world: Shared) {
    'nudged: while nudges.recv().await.is_some() {
        while nudges.try_recv().is_ok() {}
        // A runtime that is only slow (a loaded machine: a step at one instant taking more wall
        // time than the watchdog's patience) moves time again; one that spins never does. Half
        // a second of wall time without a simulated millisecond passing is a spin.
        for _ in 0..STUCK_NUDGES {
            tokio::select! {
                biased;
                () = sleep(Duration::from_millis(1)) => continue 'nudged,
                Some(()) = nudges.recv() => {}
            }
        }
        let now = Instant::now();
        lock(&world).violation(
            Kind::Livelock,
            "simulated time stopped: some task is always ready (it spins at one instant); the \
             clock is moved by hand from here (see the trace just before)"
                .to_string(),
        );
        while Instant::now() < now + 2 * TTL {
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        lock(&world).log("the clock was moved by hand for two TTLs");
    }
}

fn simulate(mode: Mode, seed: u64, shared: Arc<Mutex<Option<Running>>>) -> SeedReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = runtime.block_on(async {
        let start = Instant::now();
        let end = start + sim_length();
        let mut rng = Rng::new(mix(seed, mode));
        let plan = Plan::draw(&mut rng);
        let store = match mode {
            Mode::ServerClock => MemoryStore::new(),
            Mode::ObservedExpiry => MemoryStore::observed_expiry(),
        };
        let world: Shared = Arc::new(Mutex::new(World {
            lock_delay: plan.lock_delay.is_some(),
            lock_delay_length: plan.lock_delay.unwrap_or_default(),
            ..World::new(start, plan.candidates)
        }));
        lock(&world).log(format!("{} seed {seed}: {plan:?}", mode.name()));
        let progress = Arc::new(AtomicU64::new(0));
        let (nudge, nudges) = mpsc::unbounded_channel();
        *shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running {
            world: world.clone(),
            progress: progress.clone(),
            nudge,
        });
        for c in 0..plan.candidates {
            let net_rng = rng.fork();
            let mut window_rng = rng.fork();
            let service_rng = rng.fork();
            let pauses = windows(&mut window_rng, start, 6, 50, 1_500);
            let outage_count = window_rng.below(3);
            let outages = windows(&mut window_rng, start, outage_count, 2_000, 5_000);
            lock(&world).outages.push(outages.clone());
            let net = Net {
                me: c,
                store: store.clone(),
                faults: plan.faults,
                pauses,
                outages,
                calm_from: calm_from(start),
                notifications: plan.notifications,
                rng: Mutex::new((net_rng, 0)),
                world: world.clone(),
            };
            let mut builder = Elector::builder(Arc::new(net), "sim")
                .candidate_id(format!("c{c}"))
                .ttl(TTL)
                .renew_every(RENEW_EVERY)
                .retry_every(RETRY_EVERY)
                .jitter(0.0);
            if let Some(delay) = plan.lock_delay {
                builder = builder.lock_delay(delay);
            }
            if let Some(stall) = plan.stall_timeout {
                builder = builder.stall_timeout(stall);
            }
            let elector = builder.build().expect("a valid configuration");
            tokio::spawn(record_events(c, elector.events(), world.clone()));
            tokio::spawn(service(c, elector, world.clone(), service_rng, plan, end));
        }
        tokio::spawn(probe(world.clone(), end, progress));
        tokio::spawn(unstick(nudges, world.clone()));
        sleep_until(end).await;
        // Let the event subscribers catch up with what happened at the last instant.
        tokio::task::yield_now().await;
        let mut w = lock(&world);
        w.finished = true;
        w.check(end);
        SeedReport {
            seed,
            plan,
            violations: std::mem::take(&mut w.violations),
            stats: w.stats,
            trace: std::mem::take(&mut w.trace),
        }
    });
    drop(runtime);
    report
}

// ------------------------------------------------------------------------------------------------
// Many seeds

/// Panics on simulation threads, by thread name, for the report.
static PANICS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            if thread.starts_with("sim-") {
                PANICS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((thread, info.to_string()));
            }
            default(info);
        }));
    });
}

/// When the seed's fault-free tail begins.
fn calm_from(start: Instant) -> Instant {
    start + sim_length().saturating_sub(CALM)
}

fn sim_length() -> Duration {
    env_u64("LEASEHOLD_SIM_SECONDS").map_or(SIM_LENGTH, Duration::from_secs)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
    })
}

/// FNV-1a of the trace, to compare two runs of one seed.
fn trace_hash(trace: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in trace {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn hung_trace(shared: &Mutex<Option<Running>>) -> Vec<String> {
    let Some(Running { world, .. }) = shared.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
        return Vec::new();
    };
    for _ in 0..100 {
        if let Ok(w) = world.try_lock() {
            let mut trace = w.trace.clone();
            trace.push("VIOLATION hang: the seed stopped here (its thread still runs)".into());
            return trace;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Vec::new()
}

fn run_seed(mode: Mode, seed: u64) -> SeedReport {
    let thread = format!("sim-{}-{seed}", mode.name());
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Mutex::new(None));
    let world = shared.clone();
    std::thread::Builder::new()
        .name(thread.clone())
        .spawn(move || {
            let _ = tx.send(simulate(mode, seed, world));
        })
        .expect("a simulation thread");
    let started = std::time::Instant::now();
    let mut last_progress = (u64::MAX, started);
    let outcome = loop {
        match rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if started.elapsed() < WALL_LIMIT => {
                let running = shared.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(running) = running {
                    let progress = running.progress.load(Ordering::Relaxed);
                    if progress != last_progress.0 {
                        last_progress = (progress, std::time::Instant::now());
                    } else if last_progress.1.elapsed() >= STUCK_AFTER {
                        let _ = running.nudge.send(());
                        last_progress.1 = std::time::Instant::now();
                    }
                }
            }
            other => break other,
        }
    };
    let mut report = match outcome {
        Ok(report) => report,
        Err(e) => SeedReport {
            seed,
            plan: Plan::draw(&mut Rng::new(mix(seed, mode))),
            violations: vec![Violation {
                kind: if matches!(e, std::sync::mpsc::RecvTimeoutError::Timeout) {
                    Kind::Hang
                } else {
                    Kind::Panic
                },
                at: Duration::ZERO,
                detail: format!("the seed did not finish ({e:?})"),
            }],
            stats: Stats::default(),
            // What happened before it hung, if the world can be had (it is not locked for long).
            trace: hung_trace(&shared),
        },
    };
    let panics: Vec<_> = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|p| p.into_inner()))
        .into_iter()
        .filter(|(t, _)| *t == thread)
        .collect();
    for (_, message) in panics {
        report.violations.push(Violation {
            kind: Kind::Panic,
            at: Duration::ZERO,
            detail: message,
        });
    }
    report
}

fn print_failure(mode: Mode, report: &SeedReport, full_trace: bool) {
    println!("\n=== {} seed {} FAILED ({:?})", mode.name(), report.seed, report.plan);
    let mut shown: HashMap<Kind, usize> = HashMap::new();
    for v in &report.violations {
        let n = shown.entry(v.kind).or_default();
        *n += 1;
        if *n <= 3 || full_trace {
            println!("  {} at {:.3}s: {}", v.kind.name(), v.at.as_secs_f64(), v.detail);
        }
    }
    for (kind, n) in shown.into_iter().filter(|(_, n)| *n > 3) {
        println!("  ... {} {} violations in all", n, kind.name());
    }
    println!(
        "  replay: LEASEHOLD_SIM_SEED={} cargo test -p leasehold-core --test simulation {} -- --nocapture",
        report.seed,
        mode.name()
    );
    if report.trace.is_empty() {
        return;
    }
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "simulation-{}-{}.log",
        mode.name(),
        report.seed
    ));
    if std::fs::write(&path, report.trace.join("\n")).is_ok() {
        println!("  full trace: {}", path.display());
    }
    if !full_trace {
        // The trace up to the first violation found while running, or the last lines.
        let first = report
            .trace
            .iter()
            .position(|l| l.contains("VIOLATION"))
            .unwrap_or(report.trace.len() - 1);
        let from = first.saturating_sub(60);
        println!("  trace, lines {from}..={first}:");
        for line in &report.trace[from..=first] {
            println!("    {line}");
        }
    }
}

fn run_many(mode: Mode) {
    install_panic_hook();
    let single = env_u64("LEASEHOLD_SIM_SEED");
    // A replay may resolve a tie differently (see the module docs): try it up to this many times.
    let repeat = env_u64("LEASEHOLD_SIM_REPEAT").unwrap_or(1).max(1);
    let seeds: Vec<u64> = match single {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("LEASEHOLD_SIM_FIRST").unwrap_or(0);
            let count = env_u64("LEASEHOLD_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
            (first..first + count).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    let mut failed: Vec<(u64, Vec<Kind>)> = Vec::new();
    let (mut printed, mut printed_safety) = (0, 0);
    for &seed in &seeds {
        let mut report = run_seed(mode, seed);
        for _ in 1..repeat {
            if !report.violations.is_empty() {
                break;
            }
            report = run_seed(mode, seed);
        }
        total.add(&report.stats);
        if single.is_some() {
            for line in &report.trace {
                println!("{line}");
            }
            println!("trace hash {:016x}", trace_hash(&report.trace));
        }
        if !report.violations.is_empty() {
            let mut kinds: Vec<_> = report.violations.iter().map(|v| v.kind).collect();
            kinds.sort();
            kinds.dedup();
            // The first few failures, and the first few that broke safety itself.
            let safety = kinds.iter().any(|k| k.is_safety());
            if printed < 3 || (safety && printed_safety < 5) || single.is_some() {
                print_failure(mode, &report, single.is_some());
                printed += 1;
                printed_safety += usize::from(safety);
            } else if safety {
                println!("\n=== {} seed {} FAILED (safety; details only)", mode.name(), seed);
                for v in report.violations.iter().filter(|v| v.kind.is_safety()) {
                    println!("  {} at {:.3}s: {}", v.kind.name(), v.at.as_secs_f64(), v.detail);
                }
            }
            failed.push((seed, kinds));
        }
    }
    let wall = started.elapsed();
    println!(
        "\n{}: {} seeds x {:?} simulated in {:.1?} wall ({:.0?} per seed); {total:?}",
        mode.name(),
        seeds.len(),
        sim_length(),
        wall,
        wall / seeds.len().max(1) as u32
    );
    let mut by_kind: HashMap<Kind, Vec<u64>> = HashMap::new();
    for (seed, kinds) in &failed {
        for kind in kinds {
            by_kind.entry(*kind).or_default().push(*seed);
        }
    }
    let mut kinds: Vec<_> = by_kind.into_iter().collect();
    kinds.sort();
    for (kind, seeds) in &kinds {
        println!("  {} failed {} seeds: {:?}", kind.name(), seeds.len(), seeds);
    }
    // The simulation must have exercised something: elections and work under faults.
    assert!(
        single.is_some() || (total.elections >= seeds.len() as u64 * 10 && total.work > 0 && total.late > 0),
        "the simulation hardly elected anyone: {total:?}"
    );
    assert!(
        failed.is_empty(),
        "{}: {} of {} seeds failed: {}",
        mode.name(),
        failed.len(),
        seeds.len(),
        kinds
            .iter()
            .map(|(k, s)| format!("{} {:?}", k.name(), s))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[test]
fn simulation_server_clock() {
    run_many(Mode::ServerClock);
}

#[test]
fn simulation_observed_expiry() {
    run_many(Mode::ObservedExpiry);
}

/// A `campaign` future dropped while a request is in flight must not make the driver spin: it
/// used to see the dropped receiver as a fresh shutdown on every turn of its loop (the closed
/// channel is always ready), a busy loop until the request's reply or timeout (under paused time
/// the clock never moves again). The network here only delays requests and replies (20-400 ms
/// each way), so every drop happens with a request in flight.
#[test]
fn dropped_campaign_does_not_busy_loop() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let violations = runtime.block_on(async {
        let start = Instant::now();
        let world: Shared = Arc::new(Mutex::new(World::new(start, 1)));
        let net = Net {
            me: 0,
            store: MemoryStore::new(),
            faults: Faults {
                refuse: 0.0,
                lose_reply: 0.0,
                late: 0.0,
                slow: 1.0,
            },
            pauses: Arc::new([]),
            outages: Arc::new([]),
            calm_from: start + Duration::from_secs(3_600),
            notifications: 1.0,
            rng: Mutex::new((Rng::new(12), 0)),
            world: world.clone(),
        };
        let elector = Elector::builder(Arc::new(net), "sim")
            .candidate_id("c0")
            .ttl(TTL)
            .renew_every(RENEW_EVERY)
            .build()
            .expect("a valid configuration");
        for _ in 0..5 {
            let dropped = timeout(Duration::from_millis(10), elector.campaign()).await;
            assert!(
                dropped.is_err(),
                "elected within 10 ms although every request takes 40 ms or more"
            );
            sleep(2 * TTL).await;
        }
        assert!(Instant::now() >= start + 10 * TTL);
        std::mem::take(&mut lock(&world).violations)
    });
    let livelocks: Vec<_> = violations.iter().filter(|v| v.kind == Kind::Livelock).collect();
    assert!(livelocks.is_empty(), "{livelocks:#?}");
}
