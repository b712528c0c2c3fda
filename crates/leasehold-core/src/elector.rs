//! The tokio driver: [`Elector`], [`Leader`] and the events everyone can observe.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::error::{Error, Result};
use crate::machine::{DeposedReason, Input, Machine, OpId, Output, Reply, Request};
use crate::store::{Changes, LeaseStore};
use crate::telemetry::{self, RequestGuard};
use crate::timing::{Millis, Timing};
use crate::types::{
    Acquired, CandidateId, Capabilities, EndReason, LeaseName, Notifications, Observation, Renewed, Term, random_u64,
};

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
        /// How long the work took to return after it was cancelled, if it returned by itself.
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

/// Builds an [`Elector`]. Every timing field defaults from the TTL (see [`Timing`]).
#[derive(Debug)]
#[must_use]
pub struct ElectorBuilder {
    store: Arc<dyn LeaseStore>,
    lease: String,
    id: Option<String>,
    ttl: Duration,
    renew_every: Option<Duration>,
    retry_every: Option<Duration>,
    jitter: Option<f64>,
    drift: Option<f64>,
    step_down_margin: Option<Duration>,
    request_timeout: Option<Duration>,
    stall_timeout: Option<Duration>,
    lock_delay: Option<Duration>,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = Some(value);
            self
        }
    )*};
}

impl ElectorBuilder {
    /// The TTL the store keeps the lease for after each renewal. Default 10 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// This candidate's id (default: [`CandidateId::generate`]).
    pub fn candidate_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    setters! {
        /// How often the leader renews. Default `ttl / 3`.
        renew_every: Duration,
        /// How often followers retry and failed requests are retried. Default `ttl / 5`.
        retry_every: Duration,
        /// Random extra fraction of `retry_every`, 0 to 1. Default 0.2.
        jitter: f64,
        /// The bound on clock-rate differences, 0 to 0.5. Default 0.01.
        drift: f64,
        /// How long before `valid_until` the work is cancelled when renewals fail. Default `ttl / 10`.
        step_down_margin: Duration,
        /// How long a store request may take before its outcome counts as unknown. Default `renew_every`.
        request_timeout: Duration,
        /// Step down when the work has not called [`Leader::heartbeat`] for this long. Default none.
        stall_timeout: Duration,
        /// Wait this long before taking over a lease whose holder expired. Default none.
        lock_delay: Duration,
    }

    /// The timing this builder describes, not yet validated.
    pub fn timing(&self) -> Timing {
        let mut t = Timing::new(self.ttl);
        if let Some(v) = self.renew_every {
            t.renew_every = v;
            t.request_timeout = v;
        }
        t.retry_every = self.retry_every.unwrap_or(t.retry_every);
        t.jitter = self.jitter.map_or(t.jitter, Millis::from_f64);
        t.drift = self.drift.map_or(t.drift, Millis::from_f64);
        t.step_down_margin = self.step_down_margin.unwrap_or(t.step_down_margin);
        t.request_timeout = self.request_timeout.unwrap_or(t.request_timeout);
        t.stall_timeout = self.stall_timeout;
        t.lock_delay = self.lock_delay;
        t
    }

    /// Validates everything and builds the elector.
    ///
    /// Also describes leasehold's metrics to the installed `metrics` recorder and registers this
    /// lease's series at zero (`leasehold_is_leader 0`, ...), so they exist before any election;
    /// the README lists them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`], [`Error::InvalidCandidateId`], [`Error::InvalidTtl`] (outside
    /// the store's range) or [`Error::InvalidConfig`] naming the field and its allowed range.
    pub fn build(self) -> Result<Elector> {
        for (field, value) in [("jitter", self.jitter), ("drift", self.drift)] {
            if let Some(v) = value.filter(|v| !v.is_finite() || *v < 0.0) {
                return Err(Error::config(field, v, "a finite fraction >= 0"));
            }
        }
        let timing = self.timing();
        let lease = LeaseName::new(self.lease)?;
        let id = match self.id {
            Some(id) => CandidateId::new(id)?,
            None => CandidateId::generate(),
        };
        let caps = self.store.capabilities();
        caps.check_ttl(self.store.name(), timing.ttl)?;
        timing.validate()?;
        telemetry::describe();
        telemetry::register(lease.as_str(), self.store.name());
        Ok(Elector {
            inner: Arc::new(Inner {
                store: self.store,
                lease,
                id,
                timing,
                caps,
                leader: watch::channel(None).0,
                leading: Mutex::new(None),
                events: std::sync::OnceLock::new(),
                not_before: Mutex::new(None),
                earlier: Mutex::new(None),
                one_driver: Arc::new(tokio::sync::Mutex::new(())),
            }),
        })
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
    leader: watch::Sender<Option<LeaderInfo>>,
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
        ElectorBuilder {
            store,
            lease: lease.into(),
            id: None,
            ttl: Duration::from_secs(10),
            renew_every: None,
            retry_every: None,
            jitter: None,
            drift: None,
            step_down_margin: None,
            request_timeout: None,
            stall_timeout: None,
            lock_delay: None,
        }
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
    pub fn observe(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.inner.leader.subscribe()
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
        let (elected_tx, elected_rx) = oneshot::channel();
        let inner = self.inner.clone();
        let span = info_span!("election", lease = %self.inner.lease, candidate = %self.inner.id);
        tokio::spawn(
            async move {
                let _running = inner.one_driver.clone().lock_owned().await;
                match Driver::new(inner) {
                    Ok(driver) => driver.run(elected_tx).await,
                    Err(e) => warn!(error = %e, "the election cannot run"),
                }
            }
            .instrument(span),
        );
        elected_rx.await.map_err(|_| Error::Store {
            store: self.inner.store.name(),
            source: "the election driver stopped before electing".into(),
        })
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
    pub async fn run_until<F, Fut, E>(&self, mut task: F, shutdown: impl Future<Output = ()>) -> Result<(), RunError<E>>
    where
        F: FnMut(Leader) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Send + 'static,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let leader = tokio::select! {
                leader = self.campaign() => leader?,
                () = &mut shutdown => return Ok(()),
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
                outcome = &mut handle => Some(outcome),
                () = &mut shutdown => None,
            };
            let Some(outcome) = outcome else {
                let _ = control.commands.send(Command::Shutdown);
                let _ = handle.await;
                control.stepped_down().await;
                return Ok(());
            };
            let reason = control.stepped_down().await;
            if reason == Some(DeposedReason::WorkFinished) {
                return match outcome {
                    Ok(result) => result.map_err(RunError::Task),
                    Err(_) => Err(RunError::Panicked),
                };
            }
            debug!(?reason, "leadership ended; campaigning again");
        }
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

/// The handle of a leader: its fencing term, its deadline, and its duties.
///
/// Clones share one leadership. Dropping every clone (or [`Leader::resign`]) releases the lease.
#[derive(Clone, Debug)]
pub struct Leader {
    shared: Arc<Shared>,
    _alive: mpsc::Sender<()>,
}

#[derive(Debug)]
struct Shared {
    lease: LeaseName,
    holder: CandidateId,
    term: Term,
    elected_at: Instant,
    status: watch::Receiver<Status>,
    token: CancellationToken,
    /// Nanoseconds after `elected_at` of the last heartbeat.
    heartbeat: AtomicU64,
    commands: mpsc::UnboundedSender<Command>,
    abort: Mutex<Option<AbortHandle>>,
    /// The work is cancelled at `valid_until - step_down_margin` at the latest.
    step_down_margin: Duration,
    /// The most a renewal can give: `ttl * (1 - drift)`.
    believed_ttl: Duration,
}

#[derive(Clone, Debug)]
struct Status {
    valid_until: Instant,
    deposed: Option<DeposedReason>,
    stepped_down: bool,
}

#[derive(Debug)]
enum Command {
    Resign(oneshot::Sender<()>),
    Shutdown,
    /// The leader's handle ended the leadership (see [`Input::StepDown`]).
    StepDown(DeposedReason),
}

impl Shared {
    /// Cancels the work and tells the driver to step down, unless that already happened.
    fn step_down(&self, reason: DeposedReason) {
        if !self.token.is_cancelled() {
            self.token.cancel();
            let _ = self.commands.send(Command::StepDown(reason));
        }
    }

    /// The instant the work must be cancelled by if no renewal is confirmed.
    fn cancel_at(&self) -> Instant {
        let valid_until = self.status.borrow().valid_until;
        valid_until.checked_sub(self.step_down_margin).unwrap_or(valid_until)
    }

    /// Whether leadership has ended: the driver cancelled the work, or the clock passed the
    /// step-down point (the driver may not have been scheduled in time to notice).
    fn is_cancelled(&self) -> bool {
        if self.token.is_cancelled() {
            return true;
        }
        if now() < self.cancel_at() {
            return false;
        }
        self.step_down(DeposedReason::RenewFailed {
            last_error: Some("no renewal confirmed by the step-down point".into()),
        });
        true
    }

    /// Waits until stepping down is complete and returns why it happened.
    async fn stepped_down(&self) -> Option<DeposedReason> {
        let mut status = self.status.clone();
        let _ = status.wait_for(|s| s.stepped_down).await;
        status.borrow().deposed.clone()
    }
}

impl Leader {
    /// The fencing token: pass it with every write downstream.
    pub fn term(&self) -> Term {
        self.shared.term
    }

    /// The lease.
    pub fn lease(&self) -> &LeaseName {
        &self.shared.lease
    }

    /// This leader's candidate id.
    pub fn holder(&self) -> &CandidateId {
        &self.shared.holder
    }

    /// When this candidate was elected.
    pub fn elected_at(&self) -> Instant {
        self.shared.elected_at
    }

    /// Until when the leadership may be believed: `sent + ttl * (1 - drift)` of the last
    /// confirmed acquire or renew. Moves forward with every renewal.
    pub fn valid_until(&self) -> Instant {
        self.shared.status.borrow().valid_until
    }

    /// How long the leadership may still be believed (zero once deposed).
    pub fn remaining(&self) -> Duration {
        let status = self.shared.status.borrow();
        if status.deposed.is_some() {
            Duration::ZERO
        } else {
            status.valid_until.saturating_duration_since(now())
        }
    }

    /// Checks, before a side effect, that this candidate still leads and will for at least
    /// `min_remaining`.
    ///
    /// # Errors
    ///
    /// This is the authoritative check: it reads the clock itself, so it is right even when the
    /// runtime is too busy to run the election's driver (then [`Leader::is_cancelled`] and
    /// [`Leader::cancelled`] are right from the step-down point on, but nothing can interrupt
    /// code that never yields).
    ///
    /// When the leader is not deposed but less than `min_remaining` is left (renewals were late),
    /// the leadership ends here: the work is cancelled, the lease released once the work has
    /// returned, and [`Elector::run`] campaigns again rather than returning the task's error. So
    /// `leader.ensure_valid(d)?` in a task is the intended pattern.
    ///
    /// # Errors
    ///
    /// [`Error::NotLeader`] when deposed; [`Error::LeaseEnding`] when too little time is left.
    pub fn ensure_valid(&self, min_remaining: Duration) -> Result<()> {
        let (deposed, remaining) = {
            let status = self.shared.status.borrow();
            (
                status.deposed.clone(),
                status.valid_until.saturating_duration_since(now()),
            )
        };
        if let Some(reason) = deposed {
            return Err(Error::NotLeader {
                lease: self.shared.lease.clone(),
                term: self.shared.term,
                reason: format!("deposed: {reason}"),
            });
        }
        if remaining > min_remaining {
            return Ok(());
        }
        self.shared.step_down(DeposedReason::TooLittleTime {
            remaining,
            required: min_remaining,
        });
        Err(Error::LeaseEnding {
            lease: self.shared.lease.clone(),
            term: self.shared.term,
            remaining,
            required: min_remaining,
            never: min_remaining >= self.shared.believed_ttl,
        })
    }

    /// Whether leadership has ended and the work should stop: true once the driver cancelled the
    /// work, and also once the clock passes `valid_until - step_down_margin` whatever the driver
    /// is doing.
    pub fn is_cancelled(&self) -> bool {
        self.shared.is_cancelled()
    }

    /// Completes when leadership ends and the work should stop: when the driver cancels the
    /// work, or at `valid_until - step_down_margin` at the latest.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn cancelled(&self) {
        let mut status = self.shared.status.clone();
        loop {
            let cancel_at = self.shared.cancel_at();
            tokio::select! {
                () = self.shared.token.cancelled() => return,
                () = tokio::time::sleep_until(cancel_at.into()) => {
                    if self.shared.is_cancelled() {
                        return;
                    }
                }
                changed = status.changed() => {
                    if changed.is_err() {
                        // The driver is gone; it cancels the token before it goes.
                        self.shared.token.cancelled().await;
                        return;
                    }
                }
            }
        }
    }

    /// A token cancelled when leadership ends, to hand to code that takes one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.token.child_token()
    }

    /// Reports that the work is alive and making progress. With a `stall_timeout`, a leader
    /// whose work stops calling this steps down.
    pub fn heartbeat(&self) {
        let nanos = (now() - self.shared.elected_at).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.shared.heartbeat.fetch_max(nanos, Ordering::Relaxed);
    }

    /// Gives up leadership now: the work must have stopped. Releases the lease so the next
    /// candidate can take over at once, and returns when the release is done (or failed).
    pub async fn resign(self) {
        let (ack, done) = oneshot::channel();
        if self.shared.commands.send(Command::Resign(ack)).is_ok() {
            let _ = done.await;
        }
    }
}

/// A store call under way: its own task, so the engine never drops a store future half-way (a
/// store need not be cancel safe for the engine's sake). The driver stops waiting when the
/// machine gives up on the request (its outcome is then unknown); the call itself runs on to
/// completion, or until [`call_bound`] after it was sent.
struct PendingOp {
    id: OpId,
    /// The reply the machine gets if the call's task ends without one.
    failed: fn(Error) -> Reply,
    task: JoinHandle<Reply>,
}

/// How long a store call may run in its own task: past the lease's TTL its outcome can no
/// longer change what the engine believes (every grant it might carry has expired by the
/// machine's own count), and past `request_timeout` the machine stopped waiting for it.
fn call_bound(timing: &Timing) -> Duration {
    timing.ttl.max(timing.request_timeout)
}

/// The current instant on tokio's clock, so that the engine runs under `tokio::time::pause`.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Runs one [`Machine`] for one campaign and its leadership.
struct Driver {
    inner: Arc<Inner>,
    machine: Machine,
    op: Option<PendingOp>,
    changes: Option<Changes>,
    commands_tx: mpsc::UnboundedSender<Command>,
    commands: mpsc::UnboundedReceiver<Command>,
    alive: Option<mpsc::Sender<()>>,
    alive_rx: mpsc::Receiver<()>,
    leader: Option<LeaderControl>,
    resign_acks: Vec<oneshot::Sender<()>>,
    deposed: Option<(Term, DeposedReason, Instant)>,
    campaign_started: Instant,
    /// The campaign() future was dropped and the machine told to shut down.
    campaign_dropped: bool,
    /// What this campaign saw of another holder, for the failover and handover histograms.
    previous: PreviousHolder,
}

/// Another candidate's term as this one saw it while following.
#[derive(Debug, Default)]
struct PreviousHolder {
    /// The holder, its term and record version, when this candidate first saw that version (its
    /// last renewal seen), and when the store would expire it (if it said).
    seen: Option<(CandidateId, Term, String, Instant, Option<Instant>)>,
    /// When this candidate saw the holder let go: the lease read free as released, or a release
    /// notification.
    released_at: Option<Instant>,
}

struct LeaderControl {
    shared: Arc<Shared>,
    status: watch::Sender<Status>,
    heartbeat_seen: u64,
    work_stopped: bool,
}

impl Driver {
    fn new(inner: Arc<Inner>) -> Result<Self> {
        let now = now();
        let first_attempt = inner
            .not_before
            .lock()
            .expect("not_before lock")
            .map_or(now, |t| t.max(now));
        let mut machine = Machine::new(
            inner.timing,
            inner.caps.expiry,
            inner.caps.notifications,
            inner.lease.clone(),
            inner.id.clone(),
            first_attempt,
            random_u64(),
        )?
        .with_store_name(inner.store.name());
        if let Some(earlier) = inner.earlier.lock().expect("earlier lock").as_ref() {
            machine.continue_from(earlier);
        }
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let (alive, alive_rx) = mpsc::channel(1);
        Ok(Driver {
            inner,
            machine,
            op: None,
            changes: None,
            commands_tx,
            commands,
            alive: Some(alive),
            alive_rx,
            leader: None,
            resign_acks: Vec::new(),
            deposed: None,
            campaign_started: now,
            campaign_dropped: false,
            previous: PreviousHolder::default(),
        })
    }

    async fn run(mut self, elected: oneshot::Sender<Leader>) {
        let mut out = Vec::new();
        if self.inner.caps.notifications != crate::Notifications::None {
            // Bounded like any request: a watch that never answers must not stall the campaign.
            // Like every store call it runs in its own task, never dropped half-way.
            let (store, lease, id) = (
                self.inner.store.clone(),
                self.inner.lease.clone(),
                self.inner.id.clone(),
            );
            let bound = call_bound(&self.inner.timing);
            let timeout = |after| Error::Timeout {
                store: self.inner.store.name(),
                operation: "changes",
                after,
            };
            let subscribe = tokio::spawn(
                async move { tokio::time::timeout(bound, store.changes(&lease, &id)).await }.in_current_span(),
            );
            let subscribed = match tokio::time::timeout(self.inner.timing.request_timeout, subscribe).await {
                Ok(Ok(Ok(subscribed))) => subscribed,
                Ok(Ok(Err(_))) => Err(timeout(bound)),
                Ok(Err(e)) => Err(Error::unreachable(
                    self.inner.store.name(),
                    format!("subscribing to changes ended without a reply: {e}"),
                )),
                Err(_) => Err(timeout(self.inner.timing.request_timeout)),
            };
            match subscribed {
                Ok(Some(changes)) => self.changes = Some(changes),
                Ok(None) => self.machine.handle(now(), Input::NotificationsLost, &mut out),
                Err(e) => {
                    warn!(error = %e, "change notifications unavailable; polling");
                    self.machine.handle(now(), Input::NotificationsLost, &mut out);
                }
            }
        }
        let mut elected = Some(elected);
        let mut elected_tx = None;
        loop {
            for output in out.drain(..) {
                if let Some(leader) = self.apply(output) {
                    elected_tx = Some(leader);
                }
            }
            if let Some(leader) = elected_tx.take() {
                // A dropped campaign() future drops the leader handle here, which releases.
                if let Some(tx) = elected.take() {
                    let _ = tx.send(leader);
                }
            }
            if self.machine.is_stopped() || self.finished() {
                break;
            }
            if self.op.as_ref().map(|op| op.id) != self.machine.pending() {
                // The machine gave up on it: stop waiting, let the call run on in its task.
                self.op = None;
            }
            let input = self.next_input(elected.as_mut()).await;
            let now = now();
            self.track_previous(now, &input);
            self.feed_heartbeat(now, &mut out);
            self.machine.handle(now, input, &mut out);
        }
        for ack in self.resign_acks.drain(..) {
            let _ = ack.send(());
        }
    }

    fn finished(&self) -> bool {
        self.leader.as_ref().is_some_and(|l| l.status.borrow().stepped_down)
    }

    async fn next_input(&mut self, elected: Option<&mut oneshot::Sender<Leader>>) -> Input {
        let wake = self.machine.next_wake().map(tokio::time::Instant::from_std);
        let work_running = self.leader.as_ref().is_some_and(|l| !l.work_stopped);
        let watching_heartbeats = work_running && self.inner.timing.stall_timeout.is_some();
        let op = &mut self.op;
        let changes = &mut self.changes;
        tokio::select! {
            // Commands before the work's end: a handle that asks to step down and then returns
            // must be seen stepping down, not finishing.
            biased;
            Some(command) = self.commands.recv() => match command {
                Command::Resign(ack) => {
                    self.resign_acks.push(ack);
                    Input::Resign
                }
                Command::Shutdown => Input::Shutdown,
                Command::StepDown(reason) => Input::StepDown(reason),
            },
            None = self.alive_rx.recv(), if work_running && self.alive.is_none() => {
                if let Some(l) = &mut self.leader {
                    l.work_stopped = true;
                }
                Input::WorkStopped
            }
            joined = async { (&mut op.as_mut().expect("guarded").task).await }, if op.is_some() => {
                let PendingOp { id, failed, .. } = self.op.take().expect("guarded");
                let reply = joined.unwrap_or_else(|e| {
                    // Panicked or cancelled: the request may or may not have been applied.
                    failed(Error::unreachable(self.inner.store.name(), format!("the store call ended without a reply: {e}")))
                });
                Input::Reply(id, reply)
            }
            () = async { tokio::time::sleep_until(wake.expect("guarded")).await }, if wake.is_some() => Input::Tick,
            change = async { changes.as_mut().expect("guarded").next().await }, if changes.is_some() => match change {
                Some(()) => Input::Notified,
                None => {
                    self.changes = None;
                    Input::NotificationsLost
                }
            },
            // The campaign() future was dropped: shut down once (its closed channel stays ready,
            // and answering it again and again would spin while the withdraw is under way).
            () = async { elected.expect("guarded").closed().await }, if elected.is_some() && !self.campaign_dropped => {
                self.campaign_dropped = true;
                Input::Shutdown
            }
            // Wake up now and then so heartbeats are seen before a stall deadline.
            () = tokio::time::sleep(self.inner.timing.ttl / 20), if watching_heartbeats => Input::Tick,
        }
    }

    /// Follows what replies and notifications show of another holder (the machine decides;
    /// this only measures).
    fn track_previous(&mut self, now: Instant, input: &Input) {
        let observation: Option<&Observation> = match input {
            Input::Reply(_, Reply::Acquire(Ok(Acquired::Held(o))))
            | Input::Reply(_, Reply::Inspect(Ok(o)))
            | Input::Reply(_, Reply::Renew(Ok(Renewed::Lost(o)))) => Some(o),
            Input::Notified => {
                let p = &mut self.previous;
                if let Some((.., alive_at, store_deadline)) = &p.seen
                    && p.released_at.is_none()
                {
                    // A store that notifies releases only: this is one. One that also notifies
                    // expiry: a release if it came before the store would have expired the lease.
                    let expires = store_deadline.unwrap_or(*alive_at + self.inner.timing.ttl);
                    let release = match self.inner.caps.notifications {
                        Notifications::Release => true,
                        _ => now < expires,
                    };
                    if release {
                        p.released_at = Some(now);
                    }
                }
                None
            }
            _ => None,
        };
        let Some(observation) = observation else { return };
        let p = &mut self.previous;
        match &observation.holder {
            Some(h) if h.id == self.inner.id => {}
            Some(h) => {
                let store_deadline = h.store_remaining.map(|r| now + r);
                match &mut p.seen {
                    Some((id, term, version, _, deadline))
                        if *id == h.id && *term == h.term && *version == h.version =>
                    {
                        *deadline = store_deadline;
                    }
                    seen => {
                        *seen = Some((h.id.clone(), h.term, h.version.clone(), now, store_deadline));
                        p.released_at = None;
                    }
                }
            }
            None => {
                if p.seen.is_some() && p.released_at.is_none() && observation.previous_end == Some(EndReason::Released)
                {
                    p.released_at = Some(now);
                }
            }
        }
    }

    fn feed_heartbeat(&mut self, _now: Instant, out: &mut Vec<Output>) {
        let Some(l) = &mut self.leader else { return };
        let beat = l.shared.heartbeat.load(Ordering::Relaxed);
        if beat > l.heartbeat_seen {
            l.heartbeat_seen = beat;
            let at = l.shared.elected_at + Duration::from_nanos(beat);
            self.machine.handle(now(), Input::Heartbeat(at), out);
        }
    }

    /// Carries out one output; returns a new leader handle on election.
    fn apply(&mut self, output: Output) -> Option<Leader> {
        let lease = self.inner.lease.as_str().to_string();
        match output {
            Output::Send(id, request) => {
                let store = self.inner.store.clone();
                let lease_name = self.inner.lease.clone();
                let me = self.inner.id.clone();
                let guard = RequestGuard {
                    lease: lease.clone(),
                    store: store.name(),
                    operation: telemetry::operation(&request),
                    done: false,
                };
                let failed: fn(Error) -> Reply = match &request {
                    Request::Acquire(_) => |e| Reply::Acquire(Err(e)),
                    Request::Renew(_) => |e| Reply::Renew(Err(e)),
                    Request::Release(_) => |e| Reply::Release(Err(e)),
                    Request::Inspect => |e| Reply::Inspect(Err(e)),
                    Request::Withdraw => |e| Reply::Withdraw(Err(e)),
                };
                let bound = call_bound(&self.inner.timing);
                let operation = telemetry::operation(&request);
                let call = async move {
                    let started = now();
                    let reply = match request {
                        Request::Acquire(r) => Reply::Acquire(store.acquire(&r).await),
                        Request::Renew(g) => {
                            let reply = store.renew(&g).await;
                            metrics::histogram!(telemetry::RENEW_SECONDS, "lease" => g.lease.as_str().to_string())
                                .record((now() - started).as_secs_f64());
                            Reply::Renew(reply)
                        }
                        Request::Release(g) => Reply::Release(store.release(&g).await),
                        Request::Inspect => Reply::Inspect(store.inspect(&lease_name).await),
                        Request::Withdraw => Reply::Withdraw(store.withdraw(&lease_name, &me).await),
                    };
                    guard.finish(&reply);
                    reply
                };
                let store_name = self.inner.store.name();
                let task = tokio::spawn(
                    async move {
                        tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
                            failed(Error::Timeout {
                                store: store_name,
                                operation,
                                after: bound,
                            })
                        })
                    }
                    .in_current_span(),
                );
                self.op = Some(PendingOp { id, failed, task });
                None
            }
            Output::Elected { grant, valid_until } => {
                let now = now();
                info!(term = %grant.term, "elected");
                *self.inner.leading.lock().expect("leading lock") = Some(valid_until);
                metrics::gauge!(telemetry::IS_LEADER, "lease" => lease.clone()).set(1.0);
                metrics::gauge!(telemetry::TERM, "lease" => lease.clone()).set(grant.term.0 as f64);
                metrics::counter!(telemetry::TRANSITIONS, "lease" => lease.clone(), "to" => "leader").increment(1);
                metrics::histogram!(telemetry::CAMPAIGN_SECONDS, "lease" => lease.clone())
                    .record((now - self.campaign_started).as_secs_f64());
                let previous = std::mem::take(&mut self.previous);
                if let Some((.., alive_at, _)) = previous.seen {
                    match previous.released_at {
                        Some(released_at) => metrics::histogram!(telemetry::HANDOVER_SECONDS, "lease" => lease.clone())
                            .record(now.saturating_duration_since(released_at).as_secs_f64()),
                        None => metrics::histogram!(telemetry::FAILOVER_SECONDS, "lease" => lease.clone())
                            .record(now.saturating_duration_since(alive_at).as_secs_f64()),
                    }
                }
                metrics::gauge!(telemetry::REMAINING, "lease" => lease)
                    .set(valid_until.saturating_duration_since(now).as_secs_f64());
                let (status_tx, status) = watch::channel(Status {
                    valid_until,
                    deposed: None,
                    stepped_down: false,
                });
                let shared = Arc::new(Shared {
                    lease: self.inner.lease.clone(),
                    holder: self.inner.id.clone(),
                    term: grant.term,
                    elected_at: now,
                    status,
                    token: CancellationToken::new(),
                    heartbeat: AtomicU64::new(0),
                    commands: self.commands_tx.clone(),
                    abort: Mutex::new(None),
                    step_down_margin: self.inner.timing.step_down_margin,
                    believed_ttl: self.inner.timing.believed_ttl(),
                });
                self.leader = Some(LeaderControl {
                    shared: shared.clone(),
                    status: status_tx,
                    heartbeat_seen: 0,
                    work_stopped: false,
                });
                self.emit(Event::Elected {
                    term: grant.term,
                    at: now,
                    valid_until,
                });
                let alive = self.alive.take().expect("elected once per campaign");
                Some(Leader { shared, _alive: alive })
            }
            Output::Extended { valid_until } => {
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.valid_until = valid_until);
                }
                if let Some(leading) = self.inner.leading.lock().expect("leading lock").as_mut() {
                    *leading = valid_until;
                }
                metrics::gauge!(telemetry::REMAINING, "lease" => lease)
                    .set(valid_until.saturating_duration_since(now()).as_secs_f64());
                None
            }
            Output::Deposed {
                term,
                reason,
                believed_until,
            } => {
                match reason {
                    DeposedReason::Resigned | DeposedReason::WorkFinished => info!(%term, %reason, "stepped down"),
                    _ => warn!(%term, %reason, "deposed"),
                }
                *self.inner.leading.lock().expect("leading lock") = None;
                metrics::gauge!(telemetry::IS_LEADER, "lease" => lease.clone()).set(0.0);
                metrics::gauge!(telemetry::REMAINING, "lease" => lease.clone()).set(0.0);
                metrics::counter!(telemetry::STEP_DOWNS, "lease" => lease.clone(), "reason" => telemetry::step_down_reason(&reason))
                    .increment(1);
                metrics::counter!(telemetry::TRANSITIONS, "lease" => lease, "to" => "follower").increment(1);
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.deposed = Some(reason.clone()));
                    l.shared.token.cancel();
                }
                self.deposed = Some((term, reason, believed_until));
                None
            }
            Output::AbortWork => {
                if let Some(l) = &self.leader {
                    if let Some(handle) = l.shared.abort.lock().expect("abort lock").take() {
                        warn!("the leader's work did not stop by valid_until; aborting it");
                        handle.abort();
                    }
                }
                None
            }
            Output::SteppedDown {
                term,
                work_stopped_after,
                aborted,
            } => {
                let now = now();
                *self.inner.not_before.lock().expect("not_before lock") =
                    Some(now + self.inner.timing.step_down_backoff());
                if let Some((_, reason, believed_until)) = self.deposed.take() {
                    self.emit(Event::Deposed {
                        term,
                        reason,
                        believed_until,
                        work_stopped_after,
                        aborted,
                    });
                }
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.stepped_down = true);
                }
                None
            }
            Output::LeaderChanged(leader) => {
                let info = leader.map(|(holder, term)| LeaderInfo {
                    holder,
                    term,
                    since: now(),
                    since_wall: SystemTime::now(),
                });
                if let Some(info) = &info {
                    metrics::gauge!(telemetry::TERM, "lease" => lease).set(info.term.0 as f64);
                }
                self.inner.leader.send_replace(info.clone());
                self.emit(Event::LeaderChanged(info));
                None
            }
            Output::StoreTrouble(error) => {
                if error.is_transient() {
                    debug!(%error, "store trouble");
                } else {
                    // A definite failure (e.g. credentials or permissions) will not go away by
                    // itself: say so at once; the engine keeps retrying at its pace.
                    warn!(%error, "store trouble");
                }
                telemetry::trouble_counter(&lease, self.inner.store.name(), telemetry::trouble_reason(&error))
                    .increment(1);
                self.emit(Event::StoreTrouble { error: Arc::new(error) });
                None
            }
            Output::Stopped => None,
        }
    }

    fn emit(&self, event: Event) {
        if let Some(events) = self.inner.events.get() {
            let _ = events.send(event);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // However the campaign ends, the next one continues from what this one knew.
        *self.inner.earlier.lock().expect("earlier lock") = Some(self.machine.clone());
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}
