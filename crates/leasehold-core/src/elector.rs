//! The tokio driver: [`Elector`], [`Leader`] and the events everyone can observe.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::error::{Error, Result};
use crate::machine::{DeposedReason, Input, Machine, OpId, Output, Reply, Request};
use crate::store::{Announcements, Changes, LeaseStore};
use crate::telemetry::{self, PreviousHolder, RequestGuard};
pub(crate) use crate::time::now;
use crate::timing::{PerMille, Timing};
mod builder;
mod driver;
mod health;
mod leader;
mod refusals;
mod scope;

pub use builder::ElectorBuilder;
pub use health::Health;
pub use leader::Leader;
use leader::{Alive, Command, Mailbox, Shared, Status};
pub(crate) use scope::{Asked, Scope};

use crate::types::{Acquired, Announces, CandidateId, Capabilities, LeaseName, Renewed, Term, random_u64};

/// Who leads a lease, as one candidate sees it.
///
/// With the `serde` feature it serializes; `since` is written as a wall-clock time (see
/// [`Event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The holder.
    pub holder: CandidateId,
    /// Its term.
    pub term: Term,
    /// When this candidate first saw it lead (local monotonic time).
    #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::instant"))]
    pub since: Instant,
    /// The same moment by the wall clock, for logs and dashboards (never used for a decision).
    #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::system"))]
    pub since_wall: SystemTime,
    /// The lease is reserved for `holder` by a hand-over ([`Leader::hand_over`]) and not taken
    /// yet: nobody leads until it takes it (with a new term); `term` is the previous holder's.
    /// If it never does, the reservation ends after its TTL.
    #[cfg_attr(feature = "serde", serde(default))]
    pub reserved: bool,
}

/// What happens to an election, as one candidate sees it. Subscribe with [`Elector::events`].
///
/// The `Instant`s are this process's monotonic clock; [`Event::wall_clock`] turns one into a
/// wall-clock time for a log line. With the `serde` feature an event serializes (externally
/// tagged, snake case: `{"elected":{"term":3,"at":"2026-11-23T21:50:01.123456789Z",...}}`),
/// every `Instant` written as the RFC 3339 wall-clock time it corresponds to; deserializing maps
/// it back onto this process's monotonic clock.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Event {
    /// This candidate became leader.
    Elected {
        /// The fencing term.
        term: Term,
        /// When the grant's reply was processed.
        #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::instant"))]
        at: Instant,
        /// Until when the leadership may be believed (it moves forward with every renewal).
        #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::instant"))]
        valid_until: Instant,
    },
    /// This candidate stopped being leader; emitted once its work has stopped.
    Deposed {
        /// The term that ended.
        term: Term,
        /// Why.
        reason: DeposedReason,
        /// When believed leadership ended ([`Leader::ensure_valid`] failed from then on).
        #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::instant"))]
        believed_until: Instant,
        /// How long the work took to return after it was cancelled, if it returned by itself
        /// (serialized as seconds, a number).
        #[cfg_attr(feature = "serde", serde(with = "crate::types::serde_time::seconds_opt"))]
        work_stopped_after: Option<Duration>,
        /// Whether the work had to be aborted at `valid_until`.
        aborted: bool,
    },
    /// The leader this candidate sees changed (`None`: nobody holds the lease).
    LeaderChanged(Option<LeaderInfo>),
    /// A store request failed; the election carries on. [`Error::is_transient`] tells a
    /// request that may have been applied (read back and retried) from a definite failure.
    StoreTrouble {
        /// The error. Serialized as its one-line text (read back as an [`Error::Store`] that ends
        /// with that text).
        #[cfg_attr(feature = "serde", serde(with = "serde_error"))]
        error: Arc<Error>,
    },
}

/// An event's error as its text: errors hold client errors that do not serialize.
#[cfg(feature = "serde")]
mod serde_error {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Error;

    pub(super) fn serialize<S: Serializer>(error: &Arc<Error>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(error)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Error>, D::Error> {
        let text = String::deserialize(d)?;
        Ok(Arc::new(Error::Store {
            store: "deserialized",
            source: text.into(),
        }))
    }
}

impl Event {
    /// The wall-clock time of an `Instant` of this process (such as [`Event::Elected`]'s `at`),
    /// for logs: the wall clock now, minus how long ago the instant was. Never use it for a
    /// decision (the wall clock can jump).
    pub fn wall_clock(instant: Instant) -> SystemTime {
        crate::types::wall_clock(instant)
    }
}

/// How many events a subscriber may fall behind by. tokio allocates every slot up front (about
/// 19 KB), so the channel is made on the first subscription: an elector nobody listens to
/// (thousands of leases in one process) does not pay for it.
const EVENT_CAPACITY: usize = 128;

/// One candidate for one lease: campaigns, holds, renews and steps down.
///
/// Cheap to clone. See [`Elector::run`] for the usual way to use it.
#[derive(Clone, Debug)]
pub struct Elector {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn LeaseStore>,
    lease: LeaseName,
    id: CandidateId,
    timing: Timing,
    caps: Capabilities,
    leader: Mutex<LeaderSeen>,
    /// While this candidate leads: until when its leadership may be believed.
    leading: Mutex<Option<Instant>>,
    /// Made by the first [`Elector::events`] call; until then events go nowhere.
    events: std::sync::OnceLock<broadcast::Sender<Event>>,
    /// After a step-down, the next campaign waits until then so another candidate can win.
    not_before: Mutex<Option<Instant>>,
    /// The machine of the previous campaign: the next one continues from what it knew (the
    /// oldest acquire whose outcome is unknown may still be applied by the store).
    earlier: Mutex<Option<Machine>>,
    /// Held by the running driver: a new campaign starts only once the previous one has finished
    /// stepping down or withdrawing, so a store never sees two campaigns of one candidate.
    one_driver: Arc<tokio::sync::Mutex<()>>,
    /// Campaigns waiting for `one_driver`, and their wake-up of the driver holding it: a driver
    /// that only sends deletions again then hands them to the next campaign's machine
    /// ([`Machine::continue_from`]) instead of making it wait for the store.
    campaigns_waiting: AtomicUsize,
    campaign_wanted: tokio::sync::Notify,
    /// The lease whose holder names a successor to hand over to, if the leader watches it.
    hand_over_requests: Option<LeaseName>,
    /// A campaign ends with the store's refusal once it has lasted this long.
    give_up_when_refused_for: Option<Duration>,
    /// When the store last answered a request without an error: nanoseconds after `created`,
    /// plus one (0: never).
    answered: AtomicU64,
    created: Instant,
}

impl Inner {
    /// The store answered a request without an error, now.
    fn store_answered(&self) {
        let nanos = now().saturating_duration_since(self.created).as_nanos();
        self.answered
            .store(u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1, Ordering::Relaxed);
    }

    /// When the store last answered a request without an error.
    fn answered_at(&self) -> Option<Instant> {
        match self.answered.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.created + Duration::from_nanos(n - 1)),
        }
    }
}

/// The leader this candidate sees. Its watch channel is made by the first [`Elector::observe`]:
/// a few hundred bytes that thousands of leases nobody observes in one process do not pay for.
#[derive(Debug, Default)]
struct LeaderSeen {
    current: Option<LeaderInfo>,
    watch: Option<watch::Sender<Option<LeaderInfo>>>,
}

/// Why [`Elector::run`] returned.
///
/// Implements [`std::error::Error`] when the task's error type `E` does: then
/// [`source`](std::error::Error::source) of [`RunError::Task`] is the task's error, so its whole
/// `source()` chain is kept (and the `Display` of `Task` does not repeat it). With an `E` that is
/// not an `Error` (`anyhow::Error`, `Box<dyn Error>`), match on the variants.
#[derive(Debug)]
pub enum RunError<E> {
    /// The election could not run (invalid configuration).
    Election(Error),
    /// The task returned this error while it was leader.
    Task(E),
    /// The task panicked while it was leader.
    Panicked,
}

impl<E> From<Error> for RunError<E> {
    fn from(e: Error) -> Self {
        RunError::Election(e)
    }
}

impl<E> std::fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Election(e) => e.fmt(f),
            RunError::Task(_) => f.write_str("the leader's task failed"),
            RunError::Panicked => f.write_str("the leader's task panicked"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the election error stands for itself.
            RunError::Election(e) => e.source(),
            RunError::Task(e) => Some(e),
            RunError::Panicked => None,
        }
    }
}

impl Elector {
    /// Starts building an elector for `lease` on `store`.
    pub fn builder(store: Arc<dyn LeaseStore>, lease: impl Into<String>) -> ElectorBuilder {
        ElectorBuilder::new(store, lease.into())
    }

    /// The lease.
    pub fn lease(&self) -> &LeaseName {
        &self.inner.lease
    }

    /// This candidate's id.
    pub fn id(&self) -> &CandidateId {
        &self.inner.id
    }

    /// The validated timing.
    pub fn timing(&self) -> &Timing {
        &self.inner.timing
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.store
    }

    /// The leader as this candidate sees it, updated while it campaigns or leads.
    ///
    /// After a hand-over ([`Leader::hand_over`], or a [`HandOverRequest`](crate::HandOverRequest)
    /// acted on), the value names the successor with [`LeaderInfo::reserved`] set and the
    /// handed-over term: the lease is kept for it, but *nobody leads* until it takes the lease
    /// (with a higher term, reported as a new value). A reservation for a candidate that never
    /// campaigns ends after its TTL, and the next value names whoever takes the lease then. A
    /// status page or a `/leader` endpoint should show a reserved value as "handing over to
    /// `holder`", not as a leader.
    pub fn observe(&self) -> watch::Receiver<Option<LeaderInfo>> {
        let mut seen = self.inner.leader.lock().expect("leader lock");
        let LeaderSeen { current, watch } = &mut *seen;
        watch
            .get_or_insert_with(|| watch::channel(current.clone()).0)
            .subscribe()
    }

    /// Whether this candidate leads now: elected, not deposed, and its believed leadership
    /// (`valid_until`) not yet over. [`Leader::ensure_valid`] is the check to make before a side
    /// effect; this is for status pages and health checks.
    pub fn is_leader(&self) -> bool {
        self.inner
            .leading
            .lock()
            .expect("leading lock")
            .is_some_and(|valid_until| now() < valid_until)
    }

    /// A stream of [`Event`]s from now on (a subscriber more than 128 events behind misses the oldest).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.inner
            .events
            .get_or_init(|| broadcast::channel(EVENT_CAPACITY).0)
            .subscribe()
    }

    /// Campaigns until elected and returns the [`Leader`] handle.
    ///
    /// Store errors are retried (every `retry_every`) for as long as it takes; an unknown
    /// outcome is settled by reading the record back. While the handle (or a clone) lives, the
    /// lease is renewed in the background; when leadership ends, [`Leader::cancelled`] fires.
    /// Dropping every handle, or [`Leader::resign`], releases the lease.
    ///
    /// # Errors
    ///
    /// Only when the election cannot run at all.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future withdraws the candidate (and releases a lease granted in
    /// the meantime).
    pub async fn campaign(&self) -> Result<Leader> {
        self.campaign_with(&mut None).await
    }

    /// [`Elector::campaign`], leaving in `driver` what says when the election's driver has
    /// settled, once it started.
    async fn campaign_with(&self, driver: &mut Option<Settled>) -> Result<Leader> {
        let (elected_tx, elected_rx) = oneshot::channel();
        let (settled_tx, settled_rx) = oneshot::channel();
        let inner = self.inner.clone();
        let span = info_span!("election", lease = %self.inner.lease, candidate = %self.inner.id);
        // An earlier campaign's driver may still be settling calls it gave up on: this one starts
        // once it is done (taken here, not in the task, so that campaigns start in call order and
        // a campaign dropped while it waits starts nothing).
        let waiting = CampaignWaiting::new(&inner);
        let running = inner.one_driver.clone().lock_owned().await;
        drop(waiting);
        tokio::spawn(
            async move {
                let _running = running;
                driver::campaign(inner, elected_tx, settled_tx).await;
            }
            .instrument(span),
        );
        *driver = Some(Settled(settled_rx));
        let elected = async {
            elected_rx.await.map_err(|_| Error::Store {
                store: self.inner.store.name(),
                source: "the election driver stopped before electing".into(),
            })
        };
        match self.inner.give_up_when_refused_for {
            // Dropping `elected` ends the campaign (the driver withdraws).
            Some(after) => tokio::select! {
                elected = elected => elected,
                refused = refusals::refused_for(after, self.events(), &self.inner) => Err(refused),
            },
            None => elected.await,
        }
    }

    /// Runs `task` whenever this candidate leads, forever.
    ///
    /// Campaigns; when elected, spawns `task(leader)`; renews; when leadership ends for any
    /// reason the task's [`Leader::cancelled`] fires (at `valid_until - step_down_margin` at the
    /// latest), and a task still running at `valid_until` is aborted. Then it campaigns again:
    /// losing the lease never ends `run`.
    ///
    /// `run` returns only when the task itself returns while still leader: the lease is released
    /// and the task's result returned. A task that stops because [`Leader::ensure_valid`] found
    /// too little time left (its `?` returns [`Error::LeaseEnding`]) does not end `run`: that is
    /// a step-down, and `run` campaigns again.
    ///
    /// Dropping the future (a `select!` against a shutdown signal) cancels the task at once,
    /// aborts it at `valid_until` if it has not returned, and releases the lease as soon as it
    /// has; the election's driver carries that out after `run` is gone. To wait for all of it,
    /// use [`Elector::run_until`].
    ///
    /// # Errors
    ///
    /// [`RunError::Task`] with the task's error, [`RunError::Panicked`], or
    /// [`RunError::Election`] when the election cannot run.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Elector, Leader, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let elector = Elector::builder(Arc::new(MemoryStore::new()), "invoice-scheduler")
    ///     .ttl(Duration::from_secs(2))
    ///     .build()?;
    /// elector
    ///     .run(|leader: Leader| async move {
    ///         for batch in 0..3 {
    ///             leader.ensure_valid(Duration::from_millis(500))?; // before every side effect
    ///             println!("term {} commits batch {batch}", leader.term());
    ///             leader.heartbeat();
    ///         }
    ///         Ok::<(), leasehold_core::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut, E>(&self, task: F) -> Result<(), RunError<E>>
    where
        F: FnMut(Leader) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Send + 'static,
    {
        self.run_until(task, std::future::pending()).await
    }

    /// [`Elector::run`] until `shutdown` completes: then the task is cancelled, given until
    /// `valid_until` to return, the lease released, and `Ok(())` returned.
    ///
    /// # Errors
    ///
    /// As [`Elector::run`].
    pub async fn run_until<F, Fut, E>(&self, task: F, shutdown: impl Future<Output = ()>) -> Result<(), RunError<E>>
    where
        F: FnMut(Leader) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Send + 'static,
    {
        self.run_until_handing_over(task, async {
            shutdown.await;
            None
        })
        .await
    }

    /// [`Elector::run_until`], where `shutdown` may name a successor: a leader then hands the
    /// lease over to it ([`Leader::hand_over`]) once its task has returned, instead of releasing.
    pub(crate) async fn run_until_handing_over<F, Fut, E>(
        &self,
        mut task: F,
        shutdown: impl Future<Output = Option<CandidateId>>,
    ) -> Result<(), RunError<E>>
    where
        F: FnMut(Leader) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Send + 'static,
    {
        let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
        // The previous leadership's driver, which may still be settling the acquires it gave up
        // on when the next campaign begins (that campaign's driver starts once it is done).
        let mut previous: Option<Settled> = None;
        loop {
            // The election's driver: `run_until` returns once it has settled, so that nothing of
            // this election (a call it gave up on, granted late and released by it) lands
            // afterwards but a deletion sent again (conditional on its term, or a withdrawal of
            // a candidate whose next campaign waits for it).
            let mut driver = None;
            let leader = tokio::select! {
                leader = self.campaign_with(&mut driver) => leader?,
                _ = shutdown.clone() => {
                    // The campaign is dropped: its driver withdraws and settles any call it gave
                    // up on, each within its bound; or, if it had not started yet, the previous
                    // leadership's driver settles its own.
                    if let Some(driver) = driver.or(previous) {
                        driver.settled().await;
                    }
                    return Ok(());
                }
            };
            let control = leader.shared.clone();
            let span = info_span!("leader", lease = %leader.lease(), term = %leader.term(), holder = %leader.holder());
            let mut handle = tokio::spawn(task(leader).instrument(span));
            *control.abort.lock().expect("abort lock") = Some(handle.abort_handle());
            // Should this future be dropped (a `select!` against a shutdown signal), the task is
            // cancelled at once, aborted at `valid_until` if it has not returned, and the lease
            // released once it has: the driver carries that out on its own.
            let _stop_on_drop = StopOnDrop(&control);
            let outcome = tokio::select! {
                outcome = &mut handle => Ok(outcome),
                successor = shutdown.clone() => Err(successor),
            };
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(successor) => {
                    if let Some(to) = successor {
                        let _ = control.commands.send(Command::HandOver { to, ack: None });
                    }
                    let _ = control.commands.send(Command::Shutdown);
                    let _ = handle.await;
                    control.stepped_down().await;
                    if let Some(driver) = driver {
                        driver.settled().await;
                    }
                    return Ok(());
                }
            };
            let reason = control.stepped_down().await;
            if reason == Some(DeposedReason::WorkFinished) {
                if let Some(driver) = driver {
                    driver.settled().await;
                }
                return match outcome {
                    Ok(result) => result.map_err(RunError::Task),
                    Err(_) => Err(RunError::Panicked),
                };
            }
            debug!(?reason, "leadership ended; campaigning again");
            previous = driver;
        }
    }
}

/// Counts a campaign waiting for the previous one's driver while it exists (also when the
/// campaign is dropped while it waits), and wakes that driver.
struct CampaignWaiting<'a>(&'a Inner);

impl<'a> CampaignWaiting<'a> {
    fn new(inner: &'a Inner) -> Self {
        inner.campaigns_waiting.fetch_add(1, Ordering::SeqCst);
        inner.campaign_wanted.notify_waiters();
        CampaignWaiting(inner)
    }
}

impl Drop for CampaignWaiting<'_> {
    fn drop(&mut self) {
        self.0.campaigns_waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    /// Whether a new campaign waits for the running driver.
    fn campaign_waiting(&self) -> bool {
        self.campaigns_waiting.load(Ordering::SeqCst) > 0
    }
}

/// Resolves once a campaign's driver has settled (see `driver::campaign`), or ended.
struct Settled(oneshot::Receiver<()>);

impl Settled {
    async fn settled(self) {
        let _ = self.0.await;
    }
}

/// Shuts the leadership down when dropped before it stepped down (a dropped `run` future).
struct StopOnDrop<'a>(&'a Shared);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if !self.0.status.borrow().stepped_down {
            self.0.token.cancel();
            let _ = self.0.commands.send(Command::Shutdown);
        }
    }
}
