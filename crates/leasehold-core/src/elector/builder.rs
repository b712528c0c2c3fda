//! [`ElectorBuilder`]: the timing and identity of one candidate, checked before anything runs.

use super::*;

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
    hand_over_requests: bool,
    give_up_when_refused_for: Option<Duration>,
}

impl ElectorBuilder {
    pub(super) fn new(store: Arc<dyn LeaseStore>, lease: String) -> Self {
        ElectorBuilder {
            store,
            lease,
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
            hand_over_requests: false,
            give_up_when_refused_for: None,
        }
    }
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

    /// Whether the leader watches for requests to hand the lease over
    /// ([`LeaseName::hand_over_requests`], e.g. from `leasehold handover LEASE --to ID`). Default
    /// off (`leasehold run` turns it on). On, the leader reads that lease once per `renew_every`
    /// (one more store read per renewal, and a task per leader);
    /// when someone holds it, the leader steps down, and once its work has returned hands the
    /// lease to the candidate named there ([`LeaseStore::hand_over`]).
    pub fn hand_over_requests(mut self, enabled: bool) -> Self {
        self.hand_over_requests = enabled;
        self
    }

    /// Give up a campaign when the store has refused this candidate ([`Error::Refused`]: a wrong
    /// password, key or token, missing rights, a missing table) for `after`, with nothing else
    /// happening in between: [`Elector::campaign`] then returns that refusal, and
    /// [`Elector::run`] returns it as [`RunError::Election`]. Like `leasehold run --auth-retry`
    /// (which exits 6). Default: campaign for as long as it takes (a refusal is retried at
    /// `retry_every`, and reported as [`Event::StoreTrouble`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Elector, MemoryStore};
    ///
    /// let elector = Elector::builder(Arc::new(MemoryStore::new()), "jobs")
    ///     .give_up_when_refused_for(Duration::from_secs(60))
    ///     .build()?;
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn give_up_when_refused_for(mut self, after: Duration) -> Self {
        self.give_up_when_refused_for = Some(after);
        self
    }

    /// The timing this builder describes, not yet validated.
    pub fn timing(&self) -> Timing {
        let mut t = Timing::new(self.ttl);
        if let Some(v) = self.renew_every {
            t.renew_every = v;
            t.request_timeout = v;
        }
        t.retry_every = self.retry_every.unwrap_or(t.retry_every);
        t.jitter = self.jitter.map_or(t.jitter, PerMille::from_f64);
        t.drift = self.drift.map_or(t.drift, PerMille::from_f64);
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
        // A lease name too long for the suffix has no requests to watch.
        let hand_over_requests = self
            .hand_over_requests
            .then(|| lease.hand_over_requests().ok())
            .flatten();
        Ok(Elector {
            inner: Arc::new(Inner {
                store: self.store,
                lease,
                id,
                timing,
                caps,
                leader: Mutex::default(),
                leading: Mutex::new(None),
                events: std::sync::OnceLock::new(),
                not_before: Mutex::new(None),
                earlier: Mutex::new(None),
                one_driver: Arc::new(tokio::sync::Mutex::new(())),
                campaigns_waiting: AtomicUsize::new(0),
                campaign_wanted: tokio::sync::Notify::new(),
                hand_over_requests,
                give_up_when_refused_for: self.give_up_when_refused_for,
                answered: AtomicU64::new(0),
                created: now(),
            }),
        })
    }
}
