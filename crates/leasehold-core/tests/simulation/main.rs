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

mod net;
mod seed;
mod services;
mod world;

use net::*;
use seed::*;
use services::*;

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
