//! The conformance scenarios: plain public async functions, one per guarantee.
//!
//! Each takes the [`Backend`] under test, uses a fresh random lease name, derives every wait
//! from the TTL it picks from the store's capabilities, runs its electors under a
//! [`SafetyChecker`], and panics with a message naming the backend, the scenario and what went
//! wrong. [`conformance_tests!`](crate::conformance_tests) turns them into one test each.

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, join_all};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, DeposedReason, Elector, ElectorBuilder, EndReason, Error,
    Event, Leader, LeaseName, LeaseStore, Renewed, Term, random_u64,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::checker::SafetyChecker;
use crate::faults::{Direction, Fault, Faults};

/// The names of every scenario, in the order [`conformance_tests!`](crate::conformance_tests)
/// lists them.
pub const SCENARIOS: &[&str] = &[
    "acquire_release_reacquire",
    "renew_keeps_lease",
    "race_has_one_winner",
    "crash_successor_after_valid_until",
    "graceful_release_fast_handover",
    "partitioned_leader_steps_down",
    "store_outage_no_leader_then_one",
    "slow_store_no_double_leadership",
    "lost_reply_resolved_by_read_back",
    "terms_increase_and_history",
    "corrupt_record_is_typed_error",
    "invalid_inputs",
    "thousand_leases",
    "stalled_task_steps_down",
];

/// The TTL a scenario uses: `at_least`, raised to the store's minimum and capped at its maximum.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_conformance::scenarios::pick_ttl;
/// use leasehold_core::{LeaseStore, MemoryStore};
///
/// let caps = MemoryStore::new().capabilities();
/// assert_eq!(pick_ttl(&caps, Duration::from_secs(1)), Duration::from_secs(1));
/// ```
pub fn pick_ttl(capabilities: &Capabilities, at_least: Duration) -> Duration {
    at_least.max(*capabilities.ttl.start()).min(*capabilities.ttl.end())
}

/// What every scenario starts from: the backend, a fresh lease, the TTL and the checker.
struct Scene {
    backend: Arc<dyn Backend>,
    prefix: String,
    lease: String,
    caps: Capabilities,
    ttl: Duration,
    checker: SafetyChecker,
    started: Instant,
}

impl Scene {
    async fn new(backend: Arc<dyn Backend>, scenario: &str) -> Scene {
        Scene::with_ttl(backend, scenario, Duration::from_secs(1)).await
    }

    async fn with_ttl(backend: Arc<dyn Backend>, scenario: &str, at_least: Duration) -> Scene {
        let prefix = format!("{}::{scenario}", backend.name());
        let store = backend
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{prefix}: cannot connect: {e}"));
        let caps = store.capabilities();
        let ttl = pick_ttl(&caps, at_least);
        let lease = format!("conf-{scenario}-{:x}", random_u64());
        let scene = Scene {
            backend,
            prefix,
            lease,
            caps,
            ttl,
            checker: SafetyChecker::new(),
            started: Instant::now(),
        };
        scene.log(format_args!(
            "lease {} ttl {:?} capabilities {:?}",
            scene.lease, scene.ttl, scene.caps
        ));
        scene
    }

    fn log(&self, msg: impl Display) {
        eprintln!("[{} +{:.3}s] {msg}", self.prefix, self.started.elapsed().as_secs_f64());
    }

    fn lease_name(&self) -> LeaseName {
        LeaseName::new(self.lease.clone()).expect("scenario lease names are valid")
    }

    /// Another fresh lease for scenarios that need two.
    fn other_lease(&self, tag: &str) -> String {
        format!("{}-{tag}", self.lease)
    }

    async fn connect(&self) -> Arc<dyn LeaseStore> {
        self.backend
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{}: cannot connect: {e}", self.prefix))
    }

    async fn connect_faulty(&self) -> (Arc<dyn LeaseStore>, Faults) {
        self.backend
            .connect_faulty()
            .await
            .unwrap_or_else(|e| panic!("{}: cannot connect through faults: {e}", self.prefix))
    }

    fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    fn retry_every(&self) -> Duration {
        self.ttl / 5
    }

    const JITTER: f64 = 0.2;

    /// The longest a follower waits between two attempts.
    fn retry_bound(&self) -> Duration {
        self.retry_every().mul_f64(1.0 + Self::JITTER)
    }

    fn request_timeout(&self) -> Duration {
        self.ttl / 4
    }

    /// A builder with the suite's explicit short timings.
    fn builder(&self, store: Arc<dyn LeaseStore>, lease: &str, id: &str) -> ElectorBuilder {
        Elector::builder(store, lease)
            .candidate_id(id)
            .ttl(self.ttl)
            .renew_every(self.renew_every())
            .retry_every(self.retry_every())
            .jitter(Self::JITTER)
            .drift(0.01)
            .step_down_margin(self.ttl / 4)
            .request_timeout(self.request_timeout())
    }

    /// Builds an elector and puts it under the checker.
    fn watched(&self, builder: ElectorBuilder) -> Elector {
        let elector = builder
            .build()
            .unwrap_or_else(|e| panic!("{}: cannot build an elector: {e}", self.prefix));
        self.checker.watch(&elector);
        elector
    }

    /// An elector for the scenario's lease, under the checker.
    fn elector(&self, store: Arc<dyn LeaseStore>, id: &str) -> Elector {
        self.watched(self.builder(store, &self.lease, id))
    }

    async fn within<F: Future>(&self, what: &str, limit: Duration, fut: F) -> F::Output {
        match tokio::time::timeout(limit, fut).await {
            Ok(output) => output,
            Err(_) => panic!("{}: {what} did not happen within {limit:?}", self.prefix),
        }
    }

    async fn campaign(&self, elector: &Elector, limit: Duration) -> Leader {
        let what = format!("{} being elected", elector.id());
        self.within(&what, limit, elector.campaign())
            .await
            .unwrap_or_else(|e| panic!("{}: {} cannot campaign: {e}", self.prefix, elector.id()))
    }

    async fn finish(&self) {
        let intervals = self.checker.intervals().await;
        if intervals.len() <= 12 {
            for i in &intervals {
                let at = |t: Instant| secs(t.saturating_duration_since(self.started));
                let end = i.end.map_or_else(|| "open".to_string(), at);
                let why = i.reason.as_ref().map(ToString::to_string).unwrap_or_default();
                self.log(format_args!(
                    "  {} term {} [{} .. {}] {why}",
                    i.candidate,
                    i.term,
                    at(i.start),
                    end
                ));
            }
        }
        match self.checker.check().await {
            Ok(summary) => self.log(format_args!("{summary}; done")),
            Err(report) => panic!("{}: {report}", self.prefix),
        }
    }

    /// Every recorded event of `lease`.
    async fn events_of(&self, lease: &str) -> Vec<(CandidateId, Event)> {
        self.checker
            .records()
            .await
            .into_iter()
            .filter(|r| r.lease.as_str() == lease)
            .map(|r| (r.candidate, r.event))
            .collect()
    }
}

/// Campaigns in the background; the leader arrives on the receiver. Aborting the task withdraws.
fn spawn_campaign(elector: &Elector) -> (JoinHandle<()>, oneshot::Receiver<Leader>) {
    let (tx, rx) = oneshot::channel();
    let elector = elector.clone();
    let task = tokio::spawn(async move {
        if let Ok(leader) = elector.campaign().await {
            let _ = tx.send(leader);
        }
    });
    (task, rx)
}

/// What a leader's task reports.
#[derive(Clone, Debug)]
enum Note {
    Started {
        who: String,
        term: Term,
        at: Instant,
    },
    Cancelled {
        who: String,
        term: Term,
        at: Instant,
        valid_until: Instant,
    },
}

type Task = Box<dyn FnMut(Leader) -> BoxFuture<'static, Result<(), Infallible>> + Send>;

/// A task that heartbeats every `beat` until cancelled, and reports when it starts and stops.
fn steady_task(who: &str, beat: Duration, notes: mpsc::UnboundedSender<Note>) -> Task {
    let who = who.to_string();
    Box::new(move |leader: Leader| {
        let (who, notes) = (who.clone(), notes.clone());
        Box::pin(async move {
            let term = leader.term();
            let _ = notes.send(Note::Started {
                who: who.clone(),
                term,
                at: leader.elected_at(),
            });
            loop {
                tokio::select! {
                    () = leader.cancelled() => {
                        let at = Instant::now();
                        let _ = notes.send(Note::Cancelled { who, term, at, valid_until: leader.valid_until() });
                        return Ok(());
                    }
                    () = tokio::time::sleep(beat) => leader.heartbeat(),
                }
            }
        })
    })
}

/// An elector running `Elector::run_until` in the background.
struct Runner {
    elector: Elector,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl Runner {
    fn spawn(elector: Elector, task: Task) -> Runner {
        let (stop, mut stopped) = watch::channel(false);
        let running = elector.clone();
        let handle = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = running.run_until(task, shutdown).await {
                panic!("{} stopped running: {e}", running.id());
            }
        });
        Runner { elector, stop, handle }
    }

    async fn stop(self, scene: &Scene) {
        let _ = self.stop.send(true);
        let what = format!("{} shutting down", self.elector.id());
        if let Err(e) = scene.within(&what, scene.ttl * 3, self.handle).await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

async fn next_note(scene: &Scene, notes: &mut mpsc::UnboundedReceiver<Note>, what: &str, limit: Duration) -> Note {
    scene
        .within(what, limit, notes.recv())
        .await
        .expect("the note senders live as long as the runners")
}

async fn next_start(
    scene: &Scene,
    notes: &mut mpsc::UnboundedReceiver<Note>,
    what: &str,
    limit: Duration,
) -> (String, Term, Instant) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Note::Started { who, term, at } = next_note(scene, notes, what, left).await {
            return (who, term, at);
        }
    }
}

/// Completes once `stop` is set (or its sender is gone).
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn request(lease: &LeaseName, candidate: &CandidateId, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: candidate.clone(),
        ttl,
        takeover: None,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// Raw store API: acquire a free lease, a second candidate sees it held, release, reacquire
/// with a higher term; `inspect` and `history` agree.
///
/// # Panics
///
/// When the store breaks the contract.
pub async fn acquire_release_reacquire(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "acquire_release_reacquire").await;
    let p = &scene.prefix;
    let (store_a, store_b) = (scene.connect().await, scene.connect().await);
    let lease = scene.lease_name();
    let a = CandidateId::new("candidate-a").expect("valid id");
    let b = CandidateId::new("candidate-b").expect("valid id");

    let free = store_a
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect of a new lease: {e}"));
    assert!(free.holder.is_none(), "{p}: a new lease must be free: {free:?}");

    let g1 = match store_a.acquire(&request(&lease, &a, scene.ttl)).await {
        Ok(Acquired::Granted(g)) => g,
        other => panic!("{p}: acquiring a free lease must grant it, got {other:?}"),
    };
    assert_eq!(
        (&g1.lease, &g1.holder),
        (&lease, &a),
        "{p}: the grant names the lease and the holder"
    );
    assert!(
        g1.term > free.last_term,
        "{p}: term {} must exceed the last term {}",
        g1.term,
        free.last_term
    );

    match store_b.acquire(&request(&lease, &b, scene.ttl)).await {
        Ok(Acquired::Held(observation)) => {
            let holder = observation
                .holder
                .unwrap_or_else(|| panic!("{p}: Held must name the holder"));
            assert_eq!(
                (&holder.id, holder.term),
                (&a, g1.term),
                "{p}: Held names the holder and its term"
            );
            assert!(
                observation.last_term >= g1.term,
                "{p}: last_term {} < {}",
                observation.last_term,
                g1.term
            );
        }
        other => panic!("{p}: a held lease must answer Held to a second candidate, got {other:?}"),
    }
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let holder = seen
        .holder
        .unwrap_or_else(|| panic!("{p}: inspect must show the holder"));
    assert_eq!(
        (&holder.id, holder.term),
        (&a, g1.term),
        "{p}: inspect shows the holder and term"
    );

    let g1 = match store_a.renew(&g1).await {
        Ok(Renewed::Renewed(g)) => g,
        other => panic!("{p}: renewing a held grant must succeed, got {other:?}"),
    };
    assert_eq!(
        (&g1.holder, g1.term),
        (&a, holder.term),
        "{p}: a renewal keeps holder and term"
    );

    store_a
        .release(&g1)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let released = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(
        released.holder.is_none(),
        "{p}: a released lease is free at once: {released:?}"
    );
    assert!(
        released.last_term >= g1.term,
        "{p}: last_term must not go back: {released:?}"
    );
    store_a
        .release(&g1)
        .await
        .unwrap_or_else(|e| panic!("{p}: releasing twice must not be an error: {e}"));

    let g2 = match store_b.acquire(&request(&lease, &b, scene.ttl)).await {
        Ok(Acquired::Granted(g)) => g,
        other => panic!("{p}: acquiring a released lease must grant it, got {other:?}"),
    };
    assert!(
        g2.term > g1.term,
        "{p}: reacquired at term {} after term {}",
        g2.term,
        g1.term
    );
    match store_a.renew(&g1).await {
        Ok(Renewed::Lost(observation)) => {
            let holder = observation.holder.map(|h| (h.id, h.term));
            assert_eq!(
                holder,
                Some((b.clone(), g2.term)),
                "{p}: Lost must prove the new holder"
            );
        }
        other => panic!("{p}: renewing a superseded grant must answer Lost, got {other:?}"),
    }

    let seen = store_a
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let history = store_a
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let holder = seen
        .holder
        .unwrap_or_else(|| panic!("{p}: inspect must show the new holder"));
    assert_eq!(
        (&holder.id, holder.term),
        (&b, g2.term),
        "{p}: inspect shows the new holder"
    );
    let n = history.len();
    assert!(n >= 2, "{p}: history must list both terms: {history:?}");
    let (first, last) = (&history[n - 2], &history[n - 1]);
    assert_eq!((first.term, &first.holder), (g1.term, &a), "{p}: history: {history:?}");
    assert!(
        matches!(first.ended, Some((_, EndReason::Released))),
        "{p}: term {} ended by release: {first:?}",
        g1.term
    );
    assert_eq!(
        (last.term, &last.holder, last.ended),
        (g2.term, &b, None),
        "{p}: history agrees with inspect"
    );

    store_b
        .release(&g2)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let history = store_b
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let last = history
        .last()
        .unwrap_or_else(|| panic!("{p}: history must not be empty"));
    assert!(
        last.term == g2.term && matches!(last.ended, Some((_, EndReason::Released))),
        "{p}: the released term is recorded as released: {history:?}"
    );
    scene.log("ok");
}

/// One elector leads for 10 TTLs: one election, no deposition, the term unchanged, and
/// `ensure_valid` succeeding throughout.
///
/// # Panics
///
/// When leadership is lost or the term changes.
pub async fn renew_keeps_lease(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "renew_keeps_lease").await;
    let p = &scene.prefix;
    let raw = scene.connect().await;
    let elector = scene.elector(scene.connect().await, "A");
    let leader = scene.campaign(&elector, scene.ttl * 3).await;
    let term = leader.term();
    let until = Instant::now() + scene.ttl * 10;
    let mut least = scene.ttl;
    while Instant::now() < until {
        if let Err(e) = leader.ensure_valid(scene.ttl / 10) {
            panic!("{p}: leadership not valid after {}: {e}", secs(scene.started.elapsed()));
        }
        least = least.min(leader.remaining());
        tokio::time::sleep(scene.ttl / 20).await;
    }
    assert_eq!(leader.term(), term);
    let seen = raw
        .inspect(&scene.lease_name())
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let holder = seen.holder.map(|h| (h.id, h.term));
    assert_eq!(
        holder,
        Some((elector.id().clone(), term)),
        "{p}: the store shows the same holder and term"
    );
    let events = scene.events_of(&scene.lease).await;
    let elected = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Elected { .. }))
        .count();
    let deposed: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Deposed { .. }))
        .collect();
    assert_eq!(elected, 1, "{p}: exactly one election in 10 TTLs");
    assert!(deposed.is_empty(), "{p}: no deposition in 10 TTLs: {deposed:?}");
    scene.log(format_args!(
        "led 10 TTLs at term {term}; least remaining validity {}",
        secs(least)
    ));
    leader.resign().await;
    scene.finish().await;
}

/// 16 candidates, each with its own client, race for the lease in 5 rounds: exactly one wins
/// each round and the others stay followers for at least a TTL.
///
/// # Panics
///
/// When a round has no winner or two.
pub async fn race_has_one_winner(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "race_has_one_winner").await;
    let p = &scene.prefix;
    let mut electors = Vec::new();
    for i in 0..16 {
        electors.push(scene.elector(scene.connect().await, &format!("racer-{i:02}")));
    }
    let mut last_term = Term(0);
    for round in 1..=5 {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let tasks: Vec<JoinHandle<()>> = electors
            .iter()
            .map(|elector| {
                let (elector, tx) = (elector.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(leader) = elector.campaign().await {
                        let _ = tx.send(leader);
                    }
                })
            })
            .collect();
        drop(tx);
        let started = Instant::now();
        let what = format!("round {round}: a winner");
        let winner = scene
            .within(&what, scene.ttl * 3, rx.recv())
            .await
            .expect("the campaigns hold senders");
        let won_after = started.elapsed();
        tokio::time::sleep(scene.ttl).await;
        if let Ok(second) = rx.try_recv() {
            panic!(
                "{p}: round {round}: {} was elected while {} led",
                second.holder(),
                winner.holder()
            );
        }
        if let Err(e) = winner.ensure_valid(Duration::ZERO) {
            panic!("{p}: round {round}: the winner lost the lease without competition: {e}");
        }
        assert!(
            winner.term() > last_term,
            "{p}: round {round}: term {} after {last_term}",
            winner.term()
        );
        last_term = winner.term();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        if let Ok(second) = rx.try_recv() {
            panic!(
                "{p}: round {round}: {} was elected while {} led",
                second.holder(),
                winner.holder()
            );
        }
        scene.log(format_args!(
            "round {round}: {} won at term {} after {}",
            winner.holder(),
            winner.term(),
            secs(won_after)
        ));
        winner.resign().await;
    }
    scene.finish().await;
}

/// The leader crashes (stops renewing, no release): the successor is elected only after the old
/// leader's `valid_until`, and within `ttl + retry_every + slack`.
///
/// # Panics
///
/// When the successor comes too early (unsafe) or too late.
pub async fn crash_successor_after_valid_until(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "crash_successor_after_valid_until").await;
    let p = &scene.prefix;
    let (store_a, faults_a) = scene.connect_faulty().await;
    let a = scene.elector(store_a, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let (campaign_b, elected_b) = spawn_campaign(&b);
    tokio::time::sleep(scene.ttl).await;

    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let leader_b = scene
        .within("B taking over from the crashed leader", scene.ttl * 4, elected_b)
        .await
        .expect("B campaigns");
    let a_valid_until = leader_a.valid_until();
    let b_at = leader_b.elected_at();
    assert!(
        b_at >= a_valid_until,
        "{p}: B was elected {} BEFORE the crashed leader's valid_until",
        secs(a_valid_until - b_at)
    );
    assert!(
        leader_b.term() > leader_a.term(),
        "{p}: term {} after {}",
        leader_b.term(),
        leader_a.term()
    );
    let failover = b_at - crashed;
    let slack = scene.ttl / 2 + Duration::from_millis(500);
    let bound = scene.ttl + scene.retry_bound() + slack;
    scene.log(format_args!(
        "failover {} ({:.2} TTL; {} after the old valid_until; bound {})",
        secs(failover),
        failover.as_secs_f64() / scene.ttl.as_secs_f64(),
        secs(b_at - a_valid_until),
        secs(bound)
    ));
    assert!(
        failover <= bound,
        "{p}: failover took {} > ttl + retry + slack = {}",
        secs(failover),
        secs(bound)
    );
    leader_b.resign().await;
    drop(leader_a);
    campaign_b.abort();
    scene.finish().await;
}

/// The leader resigns: the follower is elected within one retry (poll) interval plus slack.
///
/// # Panics
///
/// When the handover is slower.
pub async fn graceful_release_fast_handover(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "graceful_release_fast_handover").await;
    let p = &scene.prefix;
    let a = scene.elector(scene.connect().await, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let (_campaign_b, elected_b) = spawn_campaign(&b);
    tokio::time::sleep(scene.ttl).await;

    let resigned = Instant::now();
    leader_a.resign().await;
    let leader_b = scene
        .within("B taking over after A resigned", scene.ttl * 3, elected_b)
        .await
        .expect("B campaigns");
    let handover = leader_b.elected_at() - resigned;
    let bound = scene.retry_bound() + Duration::from_millis(250);
    scene.log(format_args!(
        "handover {} (notifications {:?}; bound {})",
        secs(handover),
        scene.caps.notifications,
        secs(bound)
    ));
    assert!(
        handover <= bound,
        "{p}: handover took {} > retry_every * (1 + jitter) + 250ms = {}",
        secs(handover),
        secs(bound)
    );
    leader_b.resign().await;
    scene.finish().await;
}

/// The leader is partitioned from the store: its task is cancelled strictly before its
/// `valid_until`; the follower takes over with a higher term; healed, the old leader rejoins as a
/// follower.
///
/// # Panics
///
/// When the partitioned leader keeps believing too long, nobody takes over, or it leads again.
pub async fn partitioned_leader_steps_down(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "partitioned_leader_steps_down").await;
    let p = &scene.prefix;
    let beat = scene.ttl / 10;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let (store_a, faults_a) = scene.connect_faulty().await;
    let a = Runner::spawn(scene.elector(store_a, "A"), steady_task("A", beat, notes_tx.clone()));
    let (who, a_term, _) = next_start(&scene, &mut notes, "A being elected", scene.ttl * 3).await;
    assert_eq!(who, "A");
    let b = Runner::spawn(
        scene.elector(scene.connect().await, "B"),
        steady_task("B", beat, notes_tx),
    );
    tokio::time::sleep(scene.ttl).await;

    let partitioned = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let note = next_note(&scene, &mut notes, "A's task being cancelled", scene.ttl * 2).await;
    let Note::Cancelled {
        who,
        term,
        at,
        valid_until,
    } = note
    else {
        panic!("{p}: expected A's task to be cancelled first, got {note:?}");
    };
    assert_eq!(
        (who.as_str(), term),
        ("A", a_term),
        "{p}: the partitioned leader is cancelled first"
    );
    assert!(
        at < valid_until,
        "{p}: A's task was cancelled {} AFTER its valid_until",
        secs(at.saturating_duration_since(valid_until))
    );
    let (who, b_term, b_at) = next_start(&scene, &mut notes, "B taking over", scene.ttl * 3).await;
    assert_eq!(who, "B", "{p}: the healthy candidate takes over");
    assert!(b_term > a_term, "{p}: B's term {b_term} must exceed A's {a_term}");
    assert!(b_at >= valid_until, "{p}: B elected before A's valid_until");
    scene.log(format_args!(
        "A cancelled {} after the partition, {} before its valid_until; B elected {} after the partition",
        secs(at - partitioned),
        secs(valid_until - at),
        secs(b_at - partitioned)
    ));

    faults_a.heal();
    let healed = Instant::now();
    let mut seen = a.elector.observe();
    let b_id = b.elector.id().clone();
    let what = "A seeing B as leader after the partition healed";
    scene
        .within(
            what,
            scene.ttl * 3,
            seen.wait_for(|l| l.as_ref().is_some_and(|l| l.holder == b_id && l.term == b_term)),
        )
        .await
        .expect("A's elector lives");
    tokio::time::sleep(scene.ttl).await;
    if let Ok(note) = notes.try_recv() {
        panic!("{p}: nothing may change after the partition healed, got {note:?}");
    }
    scene.log(format_args!(
        "A rejoined as a follower {} after healing",
        secs(healed.elapsed())
    ));
    a.stop(&scene).await;
    b.stop(&scene).await;
    let deposed = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .find_map(|(who, e)| match e {
            Event::Deposed { reason, .. } if who.as_str() == "A" => Some(reason),
            _ => None,
        });
    assert!(
        !matches!(
            deposed,
            None | Some(DeposedReason::Resigned | DeposedReason::WorkFinished)
        ),
        "{p}: A must have been deposed by the partition, got {deposed:?}"
    );
    scene.finish().await;
}

/// The store is unreachable for every candidate for 2 TTLs: after at most one TTL nobody
/// believes it leads; once it is back, exactly one leader within 2 TTLs.
///
/// # Panics
///
/// When someone believes it leads during the outage, or nobody leads after it.
pub async fn store_outage_no_leader_then_one(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "store_outage_no_leader_then_one").await;
    let p = &scene.prefix;
    let lease = scene.lease_name();
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let mut runners = Vec::new();
    let mut faults = Vec::new();
    for who in ["A", "B", "C"] {
        let (store, f) = scene.connect_faulty().await;
        faults.push(f);
        runners.push(Runner::spawn(
            scene.elector(store, who),
            steady_task(who, scene.ttl / 10, notes_tx.clone()),
        ));
    }
    let (first, term, _) = next_start(&scene, &mut notes, "a first leader", scene.ttl * 3).await;
    scene.log(format_args!("{first} leads at term {term}"));
    tokio::time::sleep(scene.ttl / 2).await;

    let outage = Instant::now();
    for f in &faults {
        f.set(Direction::Both, Fault::Blackhole);
    }
    tokio::time::sleep(scene.ttl * 2).await;
    let believed = scene
        .checker
        .believed_between(&lease, outage + scene.ttl, Instant::now())
        .await;
    assert!(
        believed.is_empty(),
        "{p}: more than one TTL into the outage someone still believed it led: {believed:?}"
    );
    let last_end = scene
        .checker
        .intervals_of(&lease)
        .await
        .iter()
        .filter_map(|i| i.end)
        .max();
    if let Some(end) = last_end {
        scene.log(format_args!(
            "nobody leads from {} into the outage",
            secs(end.saturating_duration_since(outage))
        ));
    }
    while notes.try_recv().is_ok() {}

    for f in &faults {
        f.heal();
    }
    let healed = Instant::now();
    let (who, term, at) = next_start(
        &scene,
        &mut notes,
        "a leader after the outage",
        scene.ttl * 2 + scene.ttl / 2,
    )
    .await;
    scene.log(format_args!(
        "{who} leads at term {term}, {} after the store came back",
        secs(at.saturating_duration_since(healed))
    ));
    tokio::time::sleep(scene.ttl).await;
    let now = Instant::now();
    let leading: Vec<_> = scene
        .checker
        .intervals_of(&lease)
        .await
        .into_iter()
        .filter(|i| i.end.is_none())
        .collect();
    assert_eq!(
        leading.len(),
        1,
        "{p}: exactly one leader a TTL after the outage: {leading:?}"
    );
    assert!(leading[0].start <= now);
    for runner in runners {
        runner.stop(&scene).await;
    }
    scene.finish().await;
}

/// Requests and replies delayed by up to most of a TTL, changing over time, with leaders
/// resigning on a timer: never two leaders, and late renewals or acquires visibly lose.
///
/// # Panics
///
/// On double leadership, or when slowness was never noticed (the scenario did not exercise it).
pub async fn slow_store_no_double_leadership(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "slow_store_no_double_leadership").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    // (request delay, reply delay) as fractions of the TTL; rotated over the candidates.
    let profiles = [(0.3, 0.4), (0.1, 0.2), (0.0, 0.0), (0.2, 0.5)];
    let (stop, stopped) = watch::channel(false);
    let mut faults = Vec::new();
    let mut loops = Vec::new();
    for who in ["A", "B", "C"] {
        let (store, f) = scene.connect_faulty().await;
        faults.push(f);
        let elector = scene.elector(store, who);
        let mut stopped = stopped.clone();
        loops.push(tokio::spawn(async move {
            loop {
                let leader = tokio::select! {
                    leader = elector.campaign() => leader.expect("the election runs"),
                    () = until_stopped(&mut stopped) => return,
                };
                let hold = ttl.mul_f64(0.5 + (random_u64() % 1000) as f64 / 1000.0);
                tokio::select! {
                    () = leader.cancelled() => drop(leader),
                    () = tokio::time::sleep(hold) => leader.resign().await,
                    () = until_stopped(&mut stopped) => {
                        leader.resign().await;
                        return;
                    }
                }
            }
        }));
    }
    for step in 0..6 {
        for (i, f) in faults.iter().enumerate() {
            let (request, reply) = profiles[(i + step) % profiles.len()];
            let fault = |fraction: f64| {
                if fraction == 0.0 {
                    Fault::Pass
                } else {
                    Fault::Delay(ttl.mul_f64(fraction))
                }
            };
            f.set(Direction::Request, fault(request));
            f.set(Direction::Reply, fault(reply));
        }
        tokio::time::sleep(ttl).await;
    }
    for f in &faults {
        f.heal();
    }
    let _ = stop.send(true);
    for task in loops {
        let joined = scene.within("the candidates stopping", ttl * 3, task).await;
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let events = scene.events_of(&scene.lease).await;
    let count = |f: fn(&Event) -> bool| events.iter().filter(|(_, e)| f(e)).count();
    let elected = count(|e| matches!(e, Event::Elected { .. }));
    let renew_failed = count(|e| {
        matches!(
            e,
            Event::Deposed {
                reason: DeposedReason::RenewFailed { .. },
                ..
            }
        )
    });
    let superseded = count(|e| {
        matches!(
            e,
            Event::Deposed {
                reason: DeposedReason::Superseded { .. },
                ..
            }
        )
    });
    let trouble = count(|e| matches!(e, Event::StoreTrouble { .. }));
    scene.log(format_args!(
        "{elected} elections, {renew_failed} deposed by late renewals, {superseded} superseded, {trouble} store troubles"
    ));
    assert!(elected >= 1, "{p}: nobody was ever elected in 6 TTLs");
    assert!(
        renew_failed + superseded + trouble > 0,
        "{p}: no late request was ever refused or noticed: the scenario did not exercise slowness"
    );
    scene.finish().await;
}

/// Replies lost after the store applied the request: a leader's renewals (reply reset, then
/// reply blackhole, each for less than TTL/2), and a candidate's acquire. Read-back settles
/// them: never two leaders, and the candidate whose acquire was applied becomes leader at the
/// term the store granted, within a couple of retry intervals.
///
/// # Panics
///
/// On double leadership, or when the applied acquire is not recognised.
pub async fn lost_reply_resolved_by_read_back(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "lost_reply_resolved_by_read_back").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;

    // Renewals whose replies are lost: the fault covers the next renewal (and its read-back)
    // and lifts before the deadline, so the leader may survive by read-back and a later renewal,
    // or step down; never may two lead.
    for fault in [Fault::Reset, Fault::Blackhole] {
        let lease = scene.other_lease(&format!("renew-{fault:?}").to_lowercase());
        let (store_a, faults_a) = scene.connect_faulty().await;
        let a = scene.watched(scene.builder(store_a, &lease, "A"));
        let b = scene.watched(scene.builder(scene.connect().await, &lease, "B"));
        let leader_a = scene.campaign(&a, ttl * 3).await;
        let (campaign_b, mut elected_b) = spawn_campaign(&b);
        let renewed = leader_a.valid_until();
        scene
            .within("A's first renewal", ttl * 2, async {
                while leader_a.valid_until() == renewed {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        tokio::time::sleep(ttl / 10).await;
        let before = faults_a.counts();
        faults_a.set(Direction::Reply, fault);
        tokio::time::sleep(ttl.mul_f64(0.35)).await;
        faults_a.heal();
        let during = faults_a.counts();
        tokio::time::sleep(ttl.mul_f64(1.5)).await;
        let outcome = match leader_a.ensure_valid(Duration::ZERO) {
            Ok(()) => "A still leads".to_string(),
            Err(e) => format!("A stepped down ({e})"),
        };
        let b_won = elected_b.try_recv().ok();
        scene.log(format_args!(
            "reply {fault:?} for 0.35 TTL: {} renewals and {} read-backs lost; {outcome}; B {}",
            during.renew - before.renew,
            during.inspect - before.inspect,
            b_won
                .as_ref()
                .map_or("follows".to_string(), |l| format!("took over at term {}", l.term()))
        ));
        assert!(
            during.renew > before.renew,
            "{p}: no renewal was sent while its reply was lost"
        );
        if leader_a.ensure_valid(Duration::ZERO).is_ok() {
            let seen = scene
                .connect()
                .await
                .inspect(&LeaseName::new(lease).expect("valid"))
                .await;
            let holder = seen.ok().and_then(|o| o.holder).map(|h| (h.id, h.term));
            assert_eq!(
                holder,
                Some((a.id().clone(), leader_a.term())),
                "{p}: A leads, so the store must say so"
            );
        }
        campaign_b.abort();
        drop(b_won);
        leader_a.resign().await;
    }

    // An acquire whose reply is lost.
    let lease = scene.other_lease("acquire");
    let lease_name = LeaseName::new(lease.clone()).expect("valid lease name");
    let observer = scene.connect().await;
    let blocker = CandidateId::new("blocker").expect("valid id");
    let Ok(Acquired::Granted(blocking)) = observer.acquire(&request(&lease_name, &blocker, ttl)).await else {
        panic!("{p}: cannot take a fresh lease");
    };
    let (store_c, faults_c) = scene.connect_faulty().await;
    let c = scene.watched(scene.builder(store_c, &lease, "C"));
    let mut c_sees = c.observe();
    let (_campaign_c, elected_c) = spawn_campaign(&c);
    // Wait until C's first acquire was *answered* (C has seen the blocker), not merely sent.
    let what = "C's first acquire (answered Held)";
    scene
        .within(what, ttl * 2, async {
            let _ = c_sees
                .wait_for(|leader| leader.as_ref().is_some_and(|l| l.holder == blocker))
                .await;
        })
        .await;
    faults_c.set(Direction::Reply, Fault::Blackhole);
    tokio::time::sleep(ttl / 20).await;
    observer
        .release(&blocking)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let applied = scene
        .within("C's acquire being applied", ttl * 3, async {
            loop {
                if let Ok(seen) = observer.inspect(&lease_name).await
                    && let Some(h) = seen.holder.filter(|h| &h.id == c.id())
                {
                    return h.term;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    faults_c.heal();
    let healed = Instant::now();
    let d = scene.watched(scene.builder(scene.connect().await, &lease, "D"));
    let (campaign_d, mut elected_d) = spawn_campaign(&d);
    let bound = scene.request_timeout() + scene.retry_bound() * 2 + Duration::from_millis(250);
    let leader_c = scene
        .within("C recognising its applied acquire", ttl * 3, elected_c)
        .await
        .expect("C campaigns");
    let after = leader_c.elected_at().saturating_duration_since(healed);
    scene.log(format_args!(
        "C leads at term {} {} after its lost reply was healed (bound {})",
        leader_c.term(),
        secs(after),
        secs(bound)
    ));
    assert_eq!(
        leader_c.term(),
        applied,
        "{p}: C must lead at the term the store granted, not a new one"
    );
    assert!(
        after <= bound,
        "{p}: C took {} > {} to recognise its applied acquire",
        secs(after),
        secs(bound)
    );
    tokio::time::sleep(ttl).await;
    assert!(elected_d.try_recv().is_err(), "{p}: D was elected while C led");
    campaign_d.abort();
    leader_c.resign().await;
    scene.finish().await;
}

/// 100 transitions between three electors campaigning and resigning quickly: every term greater
/// than the previous, and `history` lists them all in order with their holders, each released.
///
/// # Panics
///
/// When a term does not increase or history disagrees.
pub async fn terms_increase_and_history(backend: Arc<dyn Backend>) {
    const TRANSITIONS: usize = 100;
    let scene = Scene::new(backend, "terms_increase_and_history").await;
    let p = &scene.prefix;
    let lease = scene.lease_name();
    let done = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = watch::channel(false);
    let mut loops = Vec::new();
    for who in ["A", "B", "C"] {
        let builder = scene
            .builder(scene.connect().await, &scene.lease, who)
            .retry_every(scene.ttl / 20);
        let elector = scene.watched(builder);
        let (done, stop, mut stopped) = (done.clone(), stop.clone(), stopped.clone());
        loops.push(tokio::spawn(async move {
            loop {
                let leader = tokio::select! {
                    leader = elector.campaign() => leader.expect("the election runs"),
                    () = until_stopped(&mut stopped) => return,
                };
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                leader.resign().await;
                if n >= TRANSITIONS {
                    let _ = stop.send(true);
                    return;
                }
            }
        }));
    }
    drop(stop);
    let started = Instant::now();
    for task in loops {
        scene
            .within("100 transitions", scene.ttl * 30, task)
            .await
            .expect("the loops do not panic");
    }
    let elapsed = started.elapsed();
    let store = scene.connect().await;
    scene
        .within("the lease being free at the end", scene.ttl * 2, async {
            while store.inspect(&lease).await.map_or(true, |o| o.holder.is_some()) {
                tokio::time::sleep(scene.ttl / 20).await;
            }
        })
        .await;
    let mut elected: Vec<(Instant, Term, CandidateId)> = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .filter_map(|(who, e)| match e {
            Event::Elected { term, at, .. } => Some((at, term, who)),
            _ => None,
        })
        .collect();
    elected.sort_by_key(|(at, ..)| *at);
    assert!(elected.len() >= TRANSITIONS, "{p}: only {} elections", elected.len());
    for pair in elected.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "{p}: term {} ({}) followed term {} ({})",
            pair[1].1,
            pair[1].2,
            pair[0].1,
            pair[0].2
        );
    }
    let history = store
        .history(&lease, 1000)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    assert!(
        history.len() >= elected.len(),
        "{p}: history lists {} terms, {} were granted",
        history.len(),
        elected.len()
    );
    // Every elected term is in the history, with its holder, in order. The history may also list
    // grants nobody was elected with (a grant that arrived after its campaign was dropped is
    // released at once); those must have ended too.
    for (_, term, who) in &elected {
        let entry = history
            .iter()
            .find(|entry| entry.term == *term)
            .unwrap_or_else(|| panic!("{p}: elected term {term} ({who}) is missing from the history"));
        assert_eq!(&entry.holder, who, "{p}: history names the wrong holder: {entry:?}");
        assert!(
            matches!(entry.ended, Some((_, EndReason::Released))),
            "{p}: term {term} was resigned but history says {:?}",
            entry.ended
        );
    }
    for entry in &history {
        assert!(
            entry.ended.is_some(),
            "{p}: the lease is free, yet the history has an open term: {entry:?}"
        );
    }
    for pair in history.windows(2) {
        assert!(
            pair[1].term > pair[0].term,
            "{p}: history terms must increase: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    scene.log(format_args!(
        "{} transitions in {} ({:.1} ms each), terms {}..={}",
        elected.len(),
        secs(elapsed),
        elapsed.as_secs_f64() * 1000.0 / elected.len() as f64,
        elected[0].1,
        elected[elected.len() - 1].1
    ));
    scene.finish().await;
}

/// Someone overwrites the lease's record with garbage: reads give a typed
/// [`Error::CorruptRecord`], the leader steps down with a store error within a TTL, and nobody
/// becomes leader while the record is garbage.
///
/// # Panics
///
/// On a missing or untyped error, a leader that stays, or a new leader.
pub async fn corrupt_record_is_typed_error(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "corrupt_record_is_typed_error").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let lease = scene.lease_name();
    let raw = scene.connect().await;
    let a = scene.elector(scene.connect().await, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, ttl * 3).await;
    let (campaign_b, mut elected_b) = spawn_campaign(&b);
    tokio::time::sleep(ttl / 2).await;

    let corrupted = Instant::now();
    scene
        .backend
        .corrupt(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot corrupt the record: {e}"));
    let expect_corrupt = |what: &str, result: Result<String, Error>| match result {
        Err(Error::CorruptRecord { lease: named, .. }) => {
            assert_eq!(named, scene.lease, "{p}: {what}: the error must name the lease");
        }
        other => {
            panic!("{p}: {what} of a garbage record must fail with CorruptRecord, got {other:?}")
        }
    };
    expect_corrupt("inspect", raw.inspect(&lease).await.map(|o| format!("{o:?}")));
    let intruder = CandidateId::new("intruder").expect("valid id");
    expect_corrupt(
        "acquire",
        raw.acquire(&request(&lease, &intruder, ttl))
            .await
            .map(|o| format!("{o:?}")),
    );

    scene
        .within("the leader stepping down", ttl, leader_a.cancelled())
        .await;
    let stepped_down = corrupted.elapsed();
    drop(leader_a);
    let (campaign_a, mut elected_a) = spawn_campaign(&a);
    tokio::time::sleep(ttl * 2).await;
    assert!(
        elected_a.try_recv().is_err() && elected_b.try_recv().is_err(),
        "{p}: a leader was elected on a garbage record"
    );
    let events = scene.events_of(&scene.lease).await;
    let late: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Elected { at, .. } if *at > corrupted))
        .collect();
    assert!(late.is_empty(), "{p}: elected on a garbage record: {late:?}");
    let reason = events.iter().find_map(|(who, e)| match e {
        Event::Deposed { reason, .. } if who == a.id() => Some(reason.clone()),
        _ => None,
    });
    assert!(
        matches!(reason, Some(DeposedReason::StoreError { .. })),
        "{p}: the leader must step down with a store error, got {reason:?}"
    );
    scene.log(format_args!(
        "the leader stepped down {} after the corruption: {}",
        secs(stepped_down),
        reason.expect("checked")
    ));
    campaign_a.abort();
    campaign_b.abort();
    scene.finish().await;
}

/// Invalid lease names, TTLs outside the store's range and inconsistent timings give typed
/// errors, from the builder and from the raw store.
///
/// # Panics
///
/// When an invalid input is accepted or the error has the wrong type.
pub async fn invalid_inputs(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "invalid_inputs").await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let long = "x".repeat(129);
    for bad in [
        "",
        long.as_str(),
        "a/b",
        "a\u{1}b",
        "line\nbreak",
        "tab\there",
        ".hidden",
        "-dash",
        "sp ace",
    ] {
        match LeaseName::new(bad) {
            Err(Error::InvalidLeaseName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{p}: lease name {bad:?} must be rejected, got {other:?}"),
        }
        match Elector::builder(store.clone(), bad).ttl(scene.ttl).build() {
            Err(Error::InvalidLeaseName { .. }) => {}
            other => panic!("{p}: an elector for lease {bad:?} must not build, got {other:?}"),
        }
    }
    let ok = "x".repeat(128);
    assert!(LeaseName::new(ok.as_str()).is_ok(), "{p}: 128 bytes are allowed");

    let lease = scene.lease_name();
    let who = CandidateId::new("candidate").expect("valid id");
    let (min, max) = (*scene.caps.ttl.start(), *scene.caps.ttl.end());
    let mut bad_ttls = vec![("above the maximum", max.checked_add(Duration::from_secs(1)))];
    match min.checked_sub(Duration::from_millis(1)) {
        Some(below) => bad_ttls.push(("below the minimum", Some(below))),
        None => scene.log("the store accepts any TTL down to zero: no TTL below its minimum to try"),
    }
    for (what, ttl) in bad_ttls {
        let Some(ttl) = ttl else { continue };
        match Elector::builder(store.clone(), scene.lease.clone()).ttl(ttl).build() {
            Err(Error::InvalidTtl {
                ttl: rejected,
                min: lo,
                max: hi,
                ..
            }) => {
                assert_eq!(
                    (rejected, lo, hi),
                    (ttl, min, max),
                    "{p}: the error names the TTL and the range"
                );
            }
            other => panic!("{p}: a TTL {what} ({ttl:?}) must not build, got {other:?}"),
        }
        match store.acquire(&request(&lease, &who, ttl)).await {
            Err(Error::InvalidTtl { ttl: rejected, .. }) => assert_eq!(rejected, ttl),
            other => panic!("{p}: acquire with a TTL {what} ({ttl:?}) must fail with InvalidTtl, got {other:?}"),
        }
    }
    let seen = store
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(
        seen.holder.is_none(),
        "{p}: rejected requests must change nothing: {seen:?}"
    );

    match Elector::builder(store.clone(), scene.lease.clone())
        .ttl(scene.ttl)
        .renew_every(scene.ttl)
        .build()
    {
        Err(
            e @ Error::InvalidConfig {
                field: "renew_every", ..
            },
        ) => {
            assert!(
                e.to_string().contains("renew_every"),
                "{p}: the message names the field: {e}"
            );
        }
        other => panic!("{p}: renew_every >= ttl must be a config error naming renew_every, got {other:?}"),
    }
    match Elector::builder(store.clone(), scene.lease.clone())
        .ttl(scene.ttl)
        .candidate_id("")
        .build()
    {
        Err(Error::InvalidCandidateId { .. }) => {}
        other => panic!("{p}: an empty candidate id must be rejected, got {other:?}"),
    }
    scene.log("ok");
}

/// One process (one client) holds 1,000 leases at once, renews them for 3 TTLs and loses none.
///
/// # Panics
///
/// When a lease is not granted or is lost.
pub async fn thousand_leases(backend: Arc<dyn Backend>) {
    const LEASES: usize = 1000;
    let ttl = backend.many_leases_ttl().unwrap_or(Duration::from_secs(2));
    let scene = Scene::with_ttl(backend, "thousand_leases", ttl).await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| scene.watched(scene.builder(store.clone(), &scene.other_lease(&i.to_string()), "holder")))
        .collect();
    let started = Instant::now();
    let leaders = scene
        .within(
            "1,000 elections",
            scene.ttl * 5,
            join_all(electors.iter().map(Elector::campaign)),
        )
        .await;
    let leaders: Vec<Leader> = leaders
        .into_iter()
        .map(|l| l.unwrap_or_else(|e| panic!("{p}: campaign: {e}")))
        .collect();
    scene.log(format_args!("{LEASES} leases granted in {}", secs(started.elapsed())));
    tokio::time::sleep(scene.ttl * 3).await;
    let lost: Vec<_> = leaders
        .iter()
        .filter(|l| l.ensure_valid(Duration::ZERO).is_err())
        .map(|l| l.lease().clone())
        .collect();
    assert!(
        lost.is_empty(),
        "{p}: {} of {LEASES} leases lost within 3 TTLs, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    let records = scene.checker.records().await;
    let elected = records
        .iter()
        .filter(|r| matches!(r.event, Event::Elected { .. }))
        .count();
    let deposed = records
        .iter()
        .filter(|r| matches!(r.event, Event::Deposed { .. }))
        .count();
    assert_eq!(
        (elected, deposed),
        (LEASES, 0),
        "{p}: one election per lease and no deposition"
    );
    let started = Instant::now();
    join_all(leaders.into_iter().map(Leader::resign)).await;
    scene.log(format_args!(
        "{LEASES} leases held for 3 TTLs; released in {}",
        secs(started.elapsed())
    ));
    scene.finish().await;
}

/// The leader's task stops heartbeating (and ignores cancellation for a while): with
/// `stall_timeout` it steps down, and a healthy candidate takes over with a higher term.
///
/// # Panics
///
/// When the stalled leader stays or nobody takes over.
pub async fn stalled_task_steps_down(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "stalled_task_steps_down").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let stall_timeout = ttl / 2;
    let beat = ttl / 10;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();

    let first_time = Arc::new(AtomicBool::new(true));
    let mut steady = steady_task("A", beat, notes_tx.clone());
    let stalling_notes = notes_tx.clone();
    let stalling: Task = Box::new(move |leader: Leader| {
        if !first_time.swap(false, Ordering::SeqCst) {
            return steady(leader);
        }
        let notes = stalling_notes.clone();
        Box::pin(async move {
            let term = leader.term();
            let _ = notes.send(Note::Started {
                who: "A".into(),
                term,
                at: leader.elected_at(),
            });
            let healthy_until = Instant::now() + ttl;
            while Instant::now() < healthy_until {
                leader.heartbeat();
                tokio::time::sleep(beat).await;
            }
            // Stuck: no more heartbeats, and slow to notice cancellation.
            leader.cancelled().await;
            let at = Instant::now();
            let _ = notes.send(Note::Cancelled {
                who: "A".into(),
                term,
                at,
                valid_until: leader.valid_until(),
            });
            tokio::time::sleep(ttl / 5).await;
            Ok(())
        })
    });
    let a = Runner::spawn(
        scene.watched(
            scene
                .builder(scene.connect().await, &scene.lease, "A")
                .stall_timeout(stall_timeout),
        ),
        stalling,
    );
    let (who, a_term, a_at) = next_start(&scene, &mut notes, "A being elected", ttl * 3).await;
    assert_eq!(who, "A");
    let b_builder = scene
        .builder(scene.connect().await, &scene.lease, "B")
        .stall_timeout(stall_timeout);
    let b = Runner::spawn(scene.watched(b_builder), steady_task("B", beat, notes_tx));

    let note = next_note(&scene, &mut notes, "the stalled leader being cancelled", ttl * 3).await;
    let Note::Cancelled { who, at: cancelled, .. } = note else {
        panic!("{p}: expected the stalled leader to be cancelled first, got {note:?}");
    };
    assert_eq!(who, "A");
    let (who, b_term, b_at) = next_start(&scene, &mut notes, "B taking over from the stalled leader", ttl * 3).await;
    assert_eq!(who, "B", "{p}: the healthy candidate takes over");
    assert!(b_term > a_term, "{p}: B's term {b_term} must exceed A's {a_term}");
    scene.log(format_args!(
        "A cancelled {} after its election (stall_timeout {}), B elected {} later at term {b_term}",
        secs(cancelled - a_at),
        secs(stall_timeout),
        secs(b_at.saturating_duration_since(cancelled))
    ));
    tokio::time::sleep(ttl).await;
    a.stop(&scene).await;
    b.stop(&scene).await;
    let reason = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .find_map(|(who, e)| match e {
            Event::Deposed { term, reason, .. } if who.as_str() == "A" && term == a_term => Some(reason),
            _ => None,
        });
    assert_eq!(
        reason,
        Some(DeposedReason::Stalled),
        "{p}: the stalled leader is deposed as Stalled"
    );
    scene.finish().await;
}
