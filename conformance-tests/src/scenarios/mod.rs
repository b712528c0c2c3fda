//! The conformance scenarios: plain public async functions, one per guarantee, grouped by theme.
//!
//! Each takes the [`Backend`] under test, uses a fresh random lease name, derives every wait
//! from the TTL it picks from the store's capabilities, runs its electors under a
//! [`SafetyChecker`], and panics with a message naming the backend, the scenario and what went
//! wrong. A scenario whose guarantee the store does not claim (its [`Capabilities`] say so)
//! logs why and passes. [`suite!`](crate::suite) turns them into one test each.
//!
//! | theme | scenarios |
//! |---|---|
//! | [`basics`] | the raw store API, `renew_many` as `renew`, leading for 10 TTLs, corrupt records, invalid inputs |
//! | [`safety`] | races, a crashed leader, a stalled task |
//! | [`writes`] | writers racing one create, one replace and one takeover: one winner each (a check-then-write store fails) |
//! | [`candidates`] | the store's list of candidates (or `Unsupported`); a hand-over asked from another instance, checked against it |
//! | [`handover`] | graceful handover; FIFO order, followers learning of a new leader from announcements (gated), record-version takeover, `break_lease` (gated); planned handover to a named successor |
//! | [`faults`] | partition, outage, slow store, lost replies, a failed release or withdrawal |
//! | [`history`] | terms increase; how each term ended |
//! | [`listing`] | leases listed by name prefix |
//! | [`shards`] | shard records: compare-and-set, racing writers, listed apart from leases |
//! | [`groups`] | lease groups: balance, stability, a crashed member, a join (the same at 10,000 shards: [`lease_group_at_scale`], not in [`suite!`](crate::suite), see its docs) |
//! | [`cost`] | 1,000 leases; requests per transition, an idle follower's requests (gated) |
//! | [`secrets`] | passwords of the store URL stay out of `Debug` and errors (gated) |
//! | [`restart`] | the store's server restarts, then the leader crashes (gated on [`Backend::can_restart`]) |
//!
//! A scenario that restarts the store's server runs alone: every scenario holds a share of one
//! process-wide lock for as long as it runs, and the restart scenario holds it exclusively (a
//! restart would break the scenarios running beside it; cargo runs test binaries one after
//! another).

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Elector, ElectorBuilder, Event, Grant, Leader, LeaseName,
    LeaseStore, Observation, Term, random_u64,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::checker::SafetyChecker;
use crate::faults::Faults;

pub mod basics;
pub mod candidates;
pub mod cost;
pub mod faults;
pub mod groups;
pub mod handover;
pub mod history;
pub mod listing;
pub mod restart;
pub mod safety;
pub mod secrets;
pub mod secured;
pub mod shards;
pub mod writes;

pub use basics::{
    acquire_by_the_holder_keeps_the_lease, acquire_release_reacquire, corrupt_record_is_typed_error, invalid_inputs,
    renew_keeps_lease, renew_many_answers_as_renew_does,
};
pub use candidates::{a_release_is_the_next_candidates_turn, hand_over_request_checks_the_successor};
pub use cost::{idle_follower_makes_no_requests, requests_per_transition_do_not_grow, thousand_leases};
pub use faults::{
    a_failed_release_does_not_keep_the_lease, lost_reply_resolved_by_read_back, partitioned_leader_steps_down,
    slow_store_no_double_leadership, store_outage_no_leader_then_one,
};
pub use groups::{lease_group_at_scale, lease_group_balances_and_survives_a_crash};
pub use handover::{
    break_lease_ends_the_term, fifo_order, followers_learn_of_a_new_leader, graceful_release_fast_handover,
    hand_over_reserves_the_lease, leader_hands_over_to_a_named_successor, version_takeover,
};
pub use history::{history_records_how_terms_end, terms_increase_and_history};
pub use listing::list_by_prefix;
pub use restart::store_restart_then_leader_crash;
pub use safety::{crash_successor_after_valid_until, race_has_one_winner, stalled_task_steps_down};
pub use secrets::secrets_stay_out_of_debug_and_errors;
pub use shards::shard_records_compare_and_set;
pub use writes::racing_writes_have_one_winner;

/// Calls `$crate::$callback! { $($args)* ; scenario scenario ... }` with every scenario of the
/// suite: the one list that [`SCENARIOS`], [`by_name`] and [`suite!`](crate::suite) are made
/// from.
#[doc(hidden)]
#[macro_export]
macro_rules! __every_scenario {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! {
            $($args)*;
            acquire_release_reacquire
            acquire_by_the_holder_keeps_the_lease
            renew_keeps_lease
            renew_many_answers_as_renew_does
            race_has_one_winner
            racing_writes_have_one_winner
            crash_successor_after_valid_until
            graceful_release_fast_handover
            fifo_order
            followers_learn_of_a_new_leader
            version_takeover
            break_lease_ends_the_term
            hand_over_reserves_the_lease
            leader_hands_over_to_a_named_successor
            hand_over_request_checks_the_successor
            a_release_is_the_next_candidates_turn
            partitioned_leader_steps_down
            store_outage_no_leader_then_one
            slow_store_no_double_leadership
            lost_reply_resolved_by_read_back
            a_failed_release_does_not_keep_the_lease
            terms_increase_and_history
            history_records_how_terms_end
            list_by_prefix
            shard_records_compare_and_set
            lease_group_balances_and_survives_a_crash
            corrupt_record_is_typed_error
            invalid_inputs
            secrets_stay_out_of_debug_and_errors
            thousand_leases
            requests_per_transition_do_not_grow
            idle_follower_makes_no_requests
            stalled_task_steps_down
            store_restart_then_leader_crash
        }
    };
}

/// A scenario: takes the backend, panics when the store breaks the contract.
pub type Scenario = fn(Arc<dyn Backend>) -> BoxFuture<'static, ()>;

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_table {
    (; $($scenario:ident)*) => {
        /// Every scenario with its name, in the suite's order.
        pub const ALL: &[(&str, Scenario)] = &[
            $((stringify!($scenario), (|backend| Box::pin($scenario(backend))) as Scenario)),*
        ];
    };
}

__every_scenario!(__scenario_table {});

/// The names of every scenario, in the suite's order.
pub const SCENARIOS: [&str; ALL.len()] = {
    let mut names = [""; ALL.len()];
    let mut i = 0;
    while i < ALL.len() {
        names[i] = ALL[i].0;
        i += 1;
    }
    names
};

/// The scenario called `name`.
pub fn by_name(name: &str) -> Option<Scenario> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

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

/// Held by every running scenario: shared, or exclusive by one that restarts the server.
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A running scenario's hold on [`SERVER`].
#[allow(dead_code)] // held, never read
enum ServerUse {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Exclusive(tokio::sync::RwLockWriteGuard<'static, ()>),
}

/// What every scenario starts from: the backend, a fresh lease, the TTL and the checker.
struct Scene {
    backend: Arc<dyn Backend>,
    prefix: String,
    lease: String,
    caps: Capabilities,
    /// [`LeaseStore::can_break`].
    can_break: bool,
    ttl: Duration,
    checker: SafetyChecker,
    started: Instant,
    _server: ServerUse,
}

impl Scene {
    async fn new(backend: Arc<dyn Backend>, scenario: &str) -> Scene {
        Scene::with_ttl(backend, scenario, Duration::from_secs(1)).await
    }

    async fn with_ttl(backend: Arc<dyn Backend>, scenario: &str, at_least: Duration) -> Scene {
        let server = ServerUse::Shared(SERVER.read().await);
        Scene::holding(backend, scenario, at_least, server).await
    }

    /// A scene that no other scenario of the process runs beside (it may restart the server).
    async fn exclusive(backend: Arc<dyn Backend>, scenario: &str, at_least: Duration) -> Scene {
        let server = ServerUse::Exclusive(SERVER.write().await);
        Scene::holding(backend, scenario, at_least, server).await
    }

    async fn holding(backend: Arc<dyn Backend>, scenario: &str, at_least: Duration, server: ServerUse) -> Scene {
        let prefix = format!("{}::{scenario}", backend.name());
        let store = backend
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{prefix}: cannot connect: {e}"));
        let caps = store.capabilities();
        let can_break = store.can_break();
        let ttl = pick_ttl(&caps, at_least);
        let lease = format!("conf-{scenario}-{:x}", random_u64());
        let scene = Scene {
            backend,
            prefix,
            lease,
            caps,
            can_break,
            ttl,
            checker: SafetyChecker::new(),
            started: Instant::now(),
            _server: server,
        };
        scene.log(format_args!(
            "lease {} ttl {:?} capabilities {:?}",
            scene.lease, scene.ttl, scene.caps
        ));
        scene
    }

    /// Notes that the store does not claim what the scenario checks; the scenario then passes.
    fn not_applicable(&self, why: impl Display) {
        self.log(format_args!("not applicable: {why}"));
    }

    /// A raw acquire that must be granted.
    async fn grant(&self, store: &dyn LeaseStore, request: &AcquireRequest) -> Grant {
        match store.acquire(request).await {
            Ok(Acquired::Granted(grant)) => grant,
            other => panic!(
                "{}: {} acquiring {} must be granted, got {other:?}",
                self.prefix, request.candidate, request.lease
            ),
        }
    }

    /// A raw acquire that must answer `Held`.
    async fn held(&self, store: &dyn LeaseStore, request: &AcquireRequest) -> Observation {
        match store.acquire(request).await {
            Ok(Acquired::Held(seen)) => seen,
            other => panic!(
                "{}: {} acquiring {} must be answered Held, got {other:?}",
                self.prefix, request.candidate, request.lease
            ),
        }
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

    /// Waits (up to `limit`) until `elector` sees `holder` lead: its first acquire has been
    /// answered, so it follows (or is queued behind) `holder`.
    async fn sees(&self, elector: &Elector, holder: &CandidateId, limit: Duration) {
        let mut seen = elector.observe();
        let what = format!("{} seeing {holder} lead", elector.id());
        self.within(
            &what,
            limit,
            seen.wait_for(|l| l.as_ref().is_some_and(|l| &l.holder == holder)),
        )
        .await
        .expect("the elector lives");
    }

    async fn campaign(&self, elector: &Elector, limit: Duration) -> Leader {
        let what = format!("{} being elected", elector.id());
        self.within(&what, limit, elector.campaign())
            .await
            .unwrap_or_else(|e| panic!("{}: {} cannot campaign: {e}", self.prefix, elector.id()))
    }

    async fn finish(&self) {
        // A leader's `Deposed` event comes once its step-down is complete (its release or
        // hand-over answered), which on a loaded machine can be after its successor's election:
        // wait for it (up to two TTLs) rather than report a leader as still leading whose
        // leadership ended earlier. Its `believed_until` still shows any real overlap, and one
        // that never comes is reported as before.
        let waited_from = Instant::now();
        loop {
            let intervals = self.checker.intervals().await;
            let superseded_open = intervals.iter().any(|open| {
                open.end.is_none()
                    && intervals
                        .iter()
                        .any(|later| later.lease == open.lease && later.start > open.start)
            });
            if !superseded_open || waited_from.elapsed() >= self.ttl * 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("scenario candidate ids are valid")
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
