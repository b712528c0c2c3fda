//! The [`LeaseStore`] over etcd: a session lease per process, candidate keys queued by
//! `create_revision`, terms fenced by that revision.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant, HolderInfo,
    LeaseName, LeaseStore, Notifications, Observation, Renewed, Result, Term, Transition,
};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::time::Instant;

use crate::admission::Admission;
use crate::changes::Position;
use crate::config::EtcdConfig;
use crate::record::{
    Candidate, Ended, Keys, Started, TTL_RANGE, candidate_value, ended_value, session_ttl_secs, started_value,
};

pub(crate) const STORE: &str = "etcd";

/// How often an `acquire` may start over (a session that expired under it, a key of another
/// session to clear, a lost race) before it gives up with an error.
const ACQUIRE_ATTEMPTS: usize = 4;

/// A lease store on an etcd cluster.
///
/// Like etcd's `concurrency.Session` and `Election`, but fenced: each store holds one etcd lease
/// (a *session*) per distinct TTL, shared by every election of the process; each candidate puts
/// a key bound to it; the candidate whose key has the lowest `create_revision` leads, and that
/// revision is its term (etcd revisions never go back, so terms strictly increase, also across
/// restarts). Waiting candidates watch only their predecessor's key (FIFO, no thundering herd).
/// See [`docs`](crate::docs) for the details and why each step keeps the contract.
///
/// Clones share the connection and the sessions. Create one per process (like a
/// `concurrency.Session`), not one per election.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_etcd::EtcdStore;
///
/// # async fn demo() -> leasehold_core::Result<()> {
/// let store = EtcdStore::connect("etcd://10.0.0.5:2379,10.0.0.6:2379/myapp").await?;
/// let elector = Elector::builder(Arc::new(store), "invoice-scheduler").ttl(Duration::from_secs(10)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    client: Client,
    /// One session per etcd lease TTL (whole seconds).
    sessions: Mutex<HashMap<i64, Arc<AsyncMutex<Option<Session>>>>>,
    /// The current session id per TTL, readable without waiting for a keepalive in flight.
    current: Mutex<HashMap<i64, i64>>,
    /// Where each candidate key of this process stands, for its change stream.
    positions: Mutex<HashMap<String, watch::Sender<Option<Position>>>>,
    /// Grants (candidate key, term) written to etcd whose `acquire` did not return them (its
    /// future was dropped), with when the grant was sent: the engine never learnt of them, so
    /// they may be handed out again, but only within a TTL of being sent (see `acquire`).
    undelivered: Mutex<HashMap<(String, i64), Instant>>,
    /// etcd leases granted for one grant each (see `EtcdStore::grant_in_one_shot`).
    private: Mutex<HashSet<i64>>,
    requests: AtomicU64,
    admission: Admission,
}

/// How many requests one store keeps in flight at most (see [`Admission`]).
const IN_FLIGHT: usize = 16;

/// An etcd lease held by this store.
#[derive(Clone, Debug)]
struct Session {
    id: i64,
    /// When the last keepalive (or the grant) that etcd confirmed was *sent*: the lease lives at
    /// least its TTL from a moment after this.
    confirmed: Instant,
    /// The keys bound to the lease, read after a keepalive sent at the given instant.
    keys: Option<(Instant, Arc<HashSet<Vec<u8>>>)>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.inner.config)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster named by an `etcd://` or `etcds://` URL (see [`EtcdConfig`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a bad URL; [`Error::Unreachable`] or [`Error::Timeout`] when no
    /// endpoint answers; [`Error::Store`] for refused credentials or TLS settings.
    pub async fn connect(url: &str) -> Result<EtcdStore> {
        EtcdStore::connect_with(url.parse()?).await
    }

    /// Connects with a configuration, and checks that the cluster answers.
    ///
    /// # Errors
    ///
    /// As [`EtcdStore::connect`].
    pub async fn connect_with(config: EtcdConfig) -> Result<EtcdStore> {
        if config.endpoints.is_empty() {
            return Err(Error::InvalidUrl {
                url: config.redacted_url(),
                reason: "no endpoint".into(),
            });
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            // etcd refuses pings more often than every 5 s, and pings without a stream.
            .with_keep_alive(Duration::from_secs(10), config.timeout)
            .with_keep_alive_while_idle(false);
        if let (Some(user), password) = (&config.user, &config.password) {
            options = options.with_user(user.clone(), password.clone().unwrap_or_default());
        }
        if config.tls {
            let mut tls = etcd_client::TlsOptions::new();
            match &config.ca {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| Error::InvalidUrl {
                        url: config.redacted_url(),
                        reason: format!("cannot read the CA file {}: {e}", path.display()),
                    })?;
                    tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
                }
                None => tls = tls.with_native_roots(),
            }
            options = options.with_tls(tls);
        }
        let timeout = config.timeout;
        let connecting = Client::connect(config.endpoints.clone(), Some(options));
        let client = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(map_error(e)),
            Err(_) => {
                return Err(Error::Timeout {
                    store: STORE,
                    operation: "connect",
                    after: timeout,
                });
            }
        };
        let store = EtcdStore {
            inner: Arc::new(Inner {
                config,
                client,
                sessions: Mutex::default(),
                current: Mutex::default(),
                positions: Mutex::default(),
                undelivered: Mutex::default(),
                private: Mutex::default(),
                requests: AtomicU64::new(0),
                admission: Admission::new(IN_FLIGHT),
            }),
        };
        // The client connects lazily: ask something cheap so that a wrong address fails here.
        // A dead endpoint fails the requests routed to it until the balance stops choosing it,
        // so try a few times per endpoint before giving up.
        let mut attempts = 3 * store.inner.config.endpoints.len();
        loop {
            let probe = GetOptions::new().with_count_only();
            match store
                .inner
                .get("connect", store.inner.config.prefix.clone(), Some(probe))
                .await
            {
                Ok(_) => return Ok(store),
                Err(e) if e.is_transient() && attempts > 1 => attempts -= 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// The configuration (its `Debug` and `Display` redact the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// How many requests this store has sent to etcd so far (reads, transactions, keepalives,
    /// watch creations): for measuring, e.g. requests per leadership transition.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The underlying etcd client (shared with the store).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Grants a queued candidate that has become first in one transaction, needing no answer
    /// to any earlier request: so that it works even when replies are lost (the engine then
    /// settles the outcome by reading back).
    ///
    /// The promise needs the key to live a TTL from a moment after the request began. Instead of
    /// a confirmed keepalive of the shared session, the transaction binds the key to a fresh etcd
    /// lease, granted (with an id chosen here) just before it: if the transaction applies, that
    /// lease exists, and it was granted after this request began. `None`: not first, or the
    /// fresh lease was not there yet; the caller takes the ordinary path.
    async fn grant_in_one_shot(
        &self,
        keys: &Keys,
        own: &str,
        request: &AcquireRequest,
        position: Position,
    ) -> Result<Option<Grant>> {
        let inner = &self.inner;
        let private = i64::try_from(leasehold_core::random_u64() >> 2).unwrap_or(1).max(1);
        inner.private.lock().expect("private lock").insert(private);
        let ttl_secs = position.ttl_secs;
        let granting = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let mut client = inner.client();
                let options = etcd_client::LeaseGrantOptions::new().with_id(private);
                inner
                    .call_now("lease grant", async move {
                        client.lease_grant(ttl_secs, Some(options)).await
                    })
                    .await
            })
        };
        // Give the grant a head start; its answer is not needed (it may be lost).
        let _ = tokio::time::timeout(Duration::from_millis(50), granting).await;
        let rev = position.rev;
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.to_string(), CompareOp::Equal, rev),
                // Every candidate key was created at or after ours: we are first.
                Compare::create_revision(keys.candidates(), CompareOp::Greater, rev - 1).with_prefix(),
                Compare::create_revision(keys.started(rev), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    own.to_string(),
                    candidate_value(request.ttl),
                    Some(PutOptions::new().with_lease(private)),
                ),
                TxnOp::put(keys.started(rev), started_value(&request.candidate), None),
            ]);
        inner
            .undelivered()
            .entry((own.to_string(), rev))
            .or_insert_with(Instant::now);
        let granted = match inner.txn("acquire (grant)", txn).await {
            Ok(resp) => resp.succeeded(),
            Err(e) if lease_not_found(&e) => false,
            Err(e) => return Err(e),
        };
        if !granted {
            inner.undelivered().remove(&(own.to_string(), rev));
            return Ok(None);
        }
        inner.undelivered().remove(&(own.to_string(), rev));
        let position = Position {
            lease: private,
            granted: true,
            ..position
        };
        inner.publish(own, Some(position));
        Ok(Some(Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(u64::try_from(rev).unwrap_or(0)),
            ttl: request.ttl,
            token: rev.to_string(),
        }))
    }

    /// Ends this candidate's grant that was sent a TTL ago or more and never reached the engine
    /// (see `Inner::undelivered`): the engine's belief in it, counted from its oldest unanswered
    /// acquire, has lapsed. Left alone, the candidate's session keepalives would keep the key,
    /// and so the lease, alive for nobody while its answers keep coming too late. One request,
    /// sent before anything else, so that it takes effect even if this call's answers are late:
    /// if the grant was made, the key goes and its end is recorded; if not, nothing changes.
    async fn end_undelivered(&self, keys: &Keys, own: &str, ttl: Duration) -> Result<()> {
        let stale: Vec<i64> = {
            let mut undelivered = self.inner.undelivered();
            let stale: Vec<i64> = undelivered
                .iter()
                .filter(|((key, _), sent)| key == own && sent.elapsed() >= ttl)
                .map(|((_, rev), _)| *rev)
                .collect();
            undelivered.retain(|(key, rev), _| key != own || !stale.contains(rev));
            stale
        };
        for rev in stale {
            self.inner.publish(own, None);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(own.to_string(), CompareOp::Equal, rev),
                    Compare::create_revision(keys.started(rev), CompareOp::Greater, 0),
                    Compare::create_revision(keys.ended(rev), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::delete(own.to_string(), None),
                    TxnOp::put(keys.ended(rev), ended_value(EndReason::Expired), None),
                ]);
            self.inner.txn("acquire (end undelivered grant)", txn).await?;
        }
        Ok(())
    }

    /// Renews a grant whose key is bound to its own etcd lease: a keepalive of that lease (sent
    /// after the renewal began), then the key is checked.
    async fn renew_private(&self, grant: &Grant, keys: &Keys, lease: i64) -> Result<Renewed> {
        let inner = &self.inner;
        if inner.keep_private_alive(lease).await? {
            let own_key = keys.candidate(&grant.holder);
            let own = inner.get("renew", own_key.clone(), None).await?;
            if let Some(kv) = own.kvs().first() {
                let me = keys.parse_candidate(kv)?;
                if me.lease == lease && me.term() == grant.term {
                    let ttl_secs = session_ttl_secs(grant.ttl);
                    let position = Position {
                        rev: me.rev,
                        lease,
                        ttl_secs,
                        granted: true,
                    };
                    inner.publish(&own_key, Some(position));
                    return Ok(Renewed::Renewed(grant.clone()));
                }
            }
        }
        Ok(Renewed::Lost(self.inspect(&grant.lease).await?))
    }

    /// The engine holds this grant (it renews or releases it): it is no longer undelivered.
    fn delivered(&self, keys: &Keys, grant: &Grant) {
        if let Ok(term) = i64::try_from(grant.term.0) {
            self.inner.undelivered().remove(&(keys.candidate(&grant.holder), term));
        }
    }

    fn keys(&self, lease: &LeaseName) -> Keys {
        Keys::new(&self.inner.config.prefix, lease)
    }
}

/// Converts a client error: connection trouble is transient (the request may have been applied),
/// anything the server refused is definite.
pub(crate) fn map_error(e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::Aborted
            | Code::Internal
            | Code::ResourceExhausted => Error::unreachable(STORE, status),
            Code::DeadlineExceeded => Error::unreachable(STORE, status),
            _ => Error::store(STORE, status),
        },
        E::TransportError(e) => Error::unreachable(STORE, e),
        E::IoError(e) => Error::unreachable(STORE, e),
        E::WatchError(e) | E::LeaseKeepAliveError(e) => Error::unreachable(STORE, e),
        other => Error::store(STORE, other),
    }
}

fn lease_not_found(e: &Error) -> bool {
    matches!(e, Error::Store { source, .. } if source.to_string().contains("lease not found"))
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, etcd_client::ResponseHeader::revision)
}

/// The key-values of the `i`-th operation of a transaction (empty if it was not a range).
fn kvs_of(ops: &[TxnOpResponse], i: usize) -> &[KeyValue] {
    match ops.get(i) {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    }
}

fn first_of(prefix: String) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
}

fn last_of(prefix: String, limit: i64) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(limit),
        ),
    )
}

/// What one read of a lease shows: the first candidate, the latest term and the latest end.
#[derive(Debug)]
struct Snapshot {
    first: Option<Candidate>,
    started: Option<Started>,
    ended: Option<Ended>,
}

impl Snapshot {
    /// The reads of a snapshot, as transaction operations.
    fn reads(keys: &Keys) -> [TxnOp; 3] {
        [
            first_of(keys.candidates()),
            last_of(keys.history(), 1),
            last_of(keys.ends(), 1),
        ]
    }

    /// Parses the three reads starting at `ops[at]`.
    fn parse(keys: &Keys, ops: &[TxnOpResponse], at: usize) -> Result<Snapshot> {
        Ok(Snapshot {
            first: kvs_of(ops, at).first().map(|kv| keys.parse_candidate(kv)).transpose()?,
            started: kvs_of(ops, at + 1)
                .first()
                .map(|kv| keys.parse_started(kv))
                .transpose()?,
            ended: kvs_of(ops, at + 2).first().map(|kv| keys.parse_ended(kv)).transpose()?,
        })
    }

    fn last_term(&self) -> Term {
        Term(self.started.as_ref().map_or(0, |s| u64::try_from(s.term).unwrap_or(0)))
    }

    /// Whether the latest term has an end record.
    fn latest_ended(&self) -> bool {
        matches!((&self.started, &self.ended), (Some(s), Some(e)) if s.term == e.term)
    }

    /// The holder: the first candidate, once it has been granted (its term has a history entry
    /// and no end). A candidate that is first but not yet granted is not a holder.
    fn holder(&self) -> Option<&Candidate> {
        let first = self.first.as_ref()?;
        let started = self.started.as_ref()?;
        (started.term == first.rev && !self.latest_ended()).then_some(first)
    }

    fn observation(&self, lease: &LeaseName) -> Observation {
        match self.holder() {
            Some(holder) => Observation {
                lease: lease.clone(),
                holder: Some(holder_info(holder)),
                last_term: self.last_term(),
                previous_end: None,
            },
            None => {
                let previous_end = match (&self.started, self.latest_ended()) {
                    (None, _) => None,
                    (Some(_), true) => self.ended.as_ref().map(|e| e.reason),
                    // The holder's key went away without an end record: its session expired.
                    (Some(_), false) => Some(EndReason::Expired),
                };
                Observation::free(lease.clone(), self.last_term(), previous_end)
            }
        }
    }

    /// For a candidate queued behind `first`: the first candidate counts as the holder (it is
    /// granted, or will be as soon as it asks).
    fn queued_observation(&self, lease: &LeaseName) -> Observation {
        match &self.first {
            Some(first) => Observation {
                lease: lease.clone(),
                holder: Some(holder_info(first)),
                last_term: self.last_term().max(first.term()),
                previous_end: None,
            },
            None => self.observation(lease),
        }
    }
}

fn holder_info(candidate: &Candidate) -> HolderInfo {
    HolderInfo {
        id: candidate.id.clone(),
        term: candidate.term(),
        ttl: candidate.ttl,
        version: candidate.rev.to_string(),
        store_remaining: None,
    }
}

impl Inner {
    /// Runs one etcd request under the store's time limit, counting it.
    pub(crate) async fn call<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        // Work under way first: a grant after its queue read, a renewal's check, a release.
        let urgent = matches!(operation, "acquire (grant)" | "acquire (requeue)" | "renew" | "release");
        let _admitted = self.admission.admit(urgent).await;
        self.call_now(operation, fut).await
    }

    /// Runs one etcd request at once, bypassing admission: for the session's keepalive rounds,
    /// which many callers wait for and which must not queue behind them.
    async fn call_now<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.config.timeout, fut).await {
            Ok(result) => result.map_err(map_error),
            Err(_) => Err(Error::Timeout {
                store: STORE,
                operation,
                after: self.config.timeout,
            }),
        }
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    async fn txn(&self, operation: &'static str, txn: Txn) -> Result<TxnResponse> {
        let mut client = self.client();
        self.call(operation, async move { client.txn(txn).await }).await
    }

    pub(crate) async fn get(
        &self,
        operation: &'static str,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse> {
        let mut client = self.client();
        self.call(operation, async move { client.get(key, options).await })
            .await
    }

    fn position(&self, own: &str) -> watch::Sender<Option<Position>> {
        let mut positions = self.positions.lock().expect("positions lock");
        positions
            .entry(own.to_string())
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// Tells the candidate's change stream where its key stands.
    fn publish(&self, own: &str, position: Option<Position>) {
        self.position(own).send_if_modified(|p| {
            let changed = *p != position;
            *p = position;
            changed
        });
    }

    fn undelivered(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i64), Instant>> {
        self.undelivered.lock().expect("undelivered lock")
    }

    fn slot(&self, ttl_secs: i64) -> Arc<AsyncMutex<Option<Session>>> {
        let mut sessions = self.sessions.lock().expect("sessions lock");
        sessions.entry(ttl_secs).or_default().clone()
    }

    /// The session for this TTL, granted if there is none.
    async fn session(&self, ttl_secs: i64) -> Result<i64> {
        if let Some(id) = self.current.lock().expect("current lock").get(&ttl_secs) {
            return Ok(*id);
        }
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if let Some(s) = &*session {
            return Ok(s.id);
        }
        let sent = Instant::now();
        let mut client = self.client();
        let granted = self
            .call("lease grant", async move { client.lease_grant(ttl_secs, None).await })
            .await?;
        *session = Some(Session {
            id: granted.id(),
            confirmed: sent,
            keys: None,
        });
        self.current
            .lock()
            .expect("current lock")
            .insert(ttl_secs, granted.id());
        Ok(granted.id())
    }

    /// The session of this TTL, made sure to have been refreshed by a keepalive *sent* at or
    /// after `since` (keepalives of many callers coalesce: one in flight serves every caller
    /// that asked before it was sent). `None` when the session has expired (its keys are gone);
    /// the next [`Inner::session`] grants a new one.
    pub(crate) async fn refreshed_since(self: &Arc<Self>, ttl_secs: i64, since: Instant) -> Result<Option<i64>> {
        // The round runs to its end even if this caller gives up (the engine's request timeout):
        // otherwise under load every round would be cut short by its own caller, and none would
        // serve the callers queued behind it.
        let inner = self.clone();
        detached(async move { inner.refreshed_since_here(ttl_secs, since).await }).await
    }

    async fn refreshed_since_here(&self, ttl_secs: i64, since: Instant) -> Result<Option<i64>> {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        self.refresh_locked(&mut session, ttl_secs, since).await
    }

    async fn refresh_locked(
        &self,
        session: &mut Option<Session>,
        ttl_secs: i64,
        since: Instant,
    ) -> Result<Option<i64>> {
        let Some(current) = session.clone() else {
            return Ok(None);
        };
        if current.confirmed >= since {
            return Ok(Some(current.id));
        }
        let mut client = self.client();
        // A keepalive later than a third of the TTL is of no use; fail early so callers move on.
        let limit = self
            .config
            .timeout
            .min(Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1)) / 3);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let kept = match tokio::time::timeout(limit, client.lease_keep_alive(current.id)).await {
            Ok(result) => result.map_err(map_error),
            Err(_) => Err(Error::Timeout {
                store: STORE,
                operation: "lease keepalive",
                after: limit,
            }),
        };
        match kept {
            Ok(_) => {
                *session = Some(Session {
                    id: current.id,
                    confirmed: sent,
                    keys: current.keys,
                });
                Ok(Some(current.id))
            }
            // etcd-client reports a lease that is gone (TTL 0) as this error.
            Err(Error::Unreachable { source, .. }) if source.to_string().contains("lease not found") => {
                self.expired(session, ttl_secs);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The keys bound to the session of this TTL, read after a keepalive sent at or after
    /// `since` was confirmed: one round (a keepalive and a key listing) serves every renewal
    /// that began before it. `None` when the session has expired.
    async fn session_keys(
        self: &Arc<Self>,
        ttl_secs: i64,
        since: Instant,
    ) -> Result<Option<(i64, Arc<HashSet<Vec<u8>>>)>> {
        let inner = self.clone();
        detached(async move { inner.session_keys_here(ttl_secs, since).await }).await
    }

    async fn session_keys_here(&self, ttl_secs: i64, since: Instant) -> Result<Option<(i64, Arc<HashSet<Vec<u8>>>)>> {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if let Some(Session {
            id,
            keys: Some((read_after, keys)),
            ..
        }) = &*session
        {
            if *read_after >= since {
                return Ok(Some((*id, keys.clone())));
            }
        }
        let round = Instant::now();
        let Some(id) = self.refresh_locked(&mut session, ttl_secs, round).await? else {
            return Ok(None);
        };
        let mut client = self.client();
        let options = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
        let listed = self
            .call_now("lease keys", async move {
                client.lease_time_to_live(id, Some(options)).await
            })
            .await?;
        if listed.ttl() <= 0 {
            self.expired(&mut session, ttl_secs);
            return Ok(None);
        }
        let keys: Arc<HashSet<Vec<u8>>> = Arc::new(listed.keys().iter().cloned().collect());
        if let Some(s) = session.as_mut() {
            s.keys = Some((round, keys.clone()));
        }
        Ok(Some((id, keys)))
    }

    fn expired(&self, session: &mut Option<Session>, ttl_secs: i64) {
        *session = None;
        self.current.lock().expect("current lock").remove(&ttl_secs);
    }

    /// Refreshes a lease of one grant (see `EtcdStore::grant_in_one_shot`); `false` when it is
    /// gone. Its keepalive is sent after the caller began.
    async fn keep_private_alive(&self, id: i64) -> Result<bool> {
        let mut client = self.client();
        match self
            .call_now("lease keepalive", async move { client.lease_keep_alive(id).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::Unreachable { source, .. }) if source.to_string().contains("lease not found") => {
                self.private.lock().expect("private lock").remove(&id);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Forgets a session that etcd no longer knows.
    async fn forget_session(&self, ttl_secs: i64, id: i64) {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if session.as_ref().is_some_and(|s| s.id == id) {
            self.expired(&mut session, ttl_secs);
        }
    }

    async fn snapshot(&self, keys: &Keys, operation: &'static str) -> Result<Snapshot> {
        let resp = self.txn(operation, Txn::new().and_then(Snapshot::reads(keys))).await?;
        Snapshot::parse(keys, &resp.op_responses(), 0)
    }
}

#[async_trait]
impl LeaseStore for EtcdStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ServerClock,
            notifications: Notifications::ReleaseAndExpiry,
            fifo: true,
            can_break: true,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&request.lease);
        let own = keys.candidate(&request.candidate);
        let ttl_secs = session_ttl_secs(request.ttl);
        self.end_undelivered(&keys, &own, request.ttl).await?;
        // A one-shot grant needs an ungranted key: one granted but undelivered is handed out
        // by the read below.
        let queued = (*inner.position(&own).borrow()).filter(|p| {
            !p.granted && p.ttl_secs == ttl_secs && !inner.undelivered().contains_key(&(own.clone(), p.rev))
        });
        if let Some(position) = queued {
            if let Some(grant) = self.grant_in_one_shot(&keys, &own, request, position).await? {
                return Ok(Acquired::Granted(grant));
            }
        }
        for _ in 0..ACQUIRE_ATTEMPTS {
            let session = inner.session(ttl_secs).await?;
            // Take a place in the queue (once), and read who is first.
            let [a, b, c] = Snapshot::reads(&keys);
            let put = TxnOp::put(
                own.clone(),
                candidate_value(request.ttl),
                Some(PutOptions::new().with_lease(session)),
            );
            let txn = Txn::new()
                .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
                .and_then([put, a, b, c])
                .or_else({
                    let [a, b, c] = Snapshot::reads(&keys);
                    [TxnOp::get(own.clone(), None), a, b, c]
                });
            let resp = match inner.txn("acquire", txn).await {
                Err(e) if lease_not_found(&e) => {
                    inner.forget_session(ttl_secs, session).await;
                    continue;
                }
                other => other?,
            };
            let ops = resp.op_responses();
            let snapshot = Snapshot::parse(&keys, &ops, 1)?;
            let (own_rev, own_lease) = if resp.succeeded() {
                (revision(&resp), session)
            } else {
                let kv = kvs_of(&ops, 0)
                    .first()
                    .ok_or_else(|| Error::corrupt(STORE, &request.lease, "own key vanished inside a transaction"))?;
                let me = keys.parse_candidate(kv)?;
                (me.rev, me.lease)
            };
            let mut position = Position {
                rev: own_rev,
                lease: own_lease,
                ttl_secs,
                granted: false,
            };
            let private = inner.private.lock().expect("private lock").contains(&own_lease);
            if own_lease != session && !private {
                // A key of another session under our id: an earlier incarnation of this
                // candidate (its leadership has ended) or another process using the same id.
                // Clear it and queue afresh, with a new term.
                inner.publish(&own, None);
                inner
                    .txn(
                        "acquire (clear stale key)",
                        end_term(&keys, &own, own_rev, &snapshot, EndReason::Expired),
                    )
                    .await?;
                continue;
            }
            let first = snapshot
                .first
                .as_ref()
                .ok_or_else(|| Error::corrupt(STORE, &request.lease, "own key missing from the queue"))?;
            if first.rev != own_rev {
                inner.publish(&own, Some(position));
                return Ok(Acquired::Held(snapshot.queued_observation(&request.lease)));
            }
            let grant = Grant {
                lease: request.lease.clone(),
                holder: request.candidate.clone(),
                term: Term(u64::try_from(own_rev).unwrap_or(0)),
                ttl: request.ttl,
                token: own_rev.to_string(),
            };
            let granted_before = snapshot.started.as_ref().is_some_and(|s| s.term == own_rev);
            if granted_before && inner.undelivered().contains_key(&(own.clone(), own_rev)) {
                // Granted by an earlier call whose answer never reached the engine: hand it out
                // now, once a keepalive sent after this request began is confirmed.
                let alive = if private {
                    inner.keep_private_alive(own_lease).await?
                } else {
                    inner.refreshed_since(ttl_secs, started).await? == Some(session)
                };
                if !alive {
                    continue;
                }
                inner.undelivered().remove(&(own.clone(), own_rev));
                position.granted = true;
                inner.publish(&own, Some(position));
                return Ok(Acquired::Granted(grant));
            }
            if granted_before {
                // This key was granted before, and the engine asks again: that leadership
                // ended. A new grant needs a new term, so a new key at the end of the queue.
                inner.publish(&own, None);
                inner
                    .txn(
                        "acquire (requeue)",
                        end_term(&keys, &own, own_rev, &snapshot, EndReason::Expired),
                    )
                    .await?;
                continue;
            }
            // First in the queue. The promise: the key lives a TTL from a moment after this
            // request began, so a keepalive sent after `started` must be confirmed.
            match inner.refreshed_since(ttl_secs, started).await? {
                Some(id) if id == session => {}
                _ => continue, // the session expired with our key: queue again
            }
            let mut compares = vec![
                Compare::create_revision(own.clone(), CompareOp::Equal, own_rev),
                Compare::create_revision(keys.started(own_rev), CompareOp::Equal, 0),
            ];
            let mut ops = vec![TxnOp::put(
                keys.started(own_rev),
                started_value(&request.candidate),
                None,
            )];
            if let Some(previous) = snapshot.started.as_ref().filter(|_| !snapshot.latest_ended()) {
                // The previous holder's key is gone without an end record: it expired.
                compares.push(Compare::create_revision(keys.ended(previous.term), CompareOp::Equal, 0));
                ops.push(TxnOp::put(
                    keys.ended(previous.term),
                    ended_value(EndReason::Expired),
                    None,
                ));
            }
            // Until this call returns, the grant counts as undelivered (see `Inner::undelivered`).
            inner
                .undelivered()
                .entry((own.clone(), own_rev))
                .or_insert_with(Instant::now);
            let granted = inner
                .txn("acquire (grant)", Txn::new().when(compares).and_then(ops))
                .await?;
            if granted.succeeded() {
                inner.undelivered().remove(&(own.clone(), own_rev));
                position.granted = true;
                inner.publish(&own, Some(position));
                return Ok(Acquired::Granted(grant));
            }
            inner.undelivered().remove(&(own.clone(), own_rev));
        }
        Err(Error::store(
            STORE,
            format!(
                "acquire of {} did not settle after {ACQUIRE_ATTEMPTS} attempts",
                request.lease
            ),
        ))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&grant.lease);
        let ttl_secs = session_ttl_secs(grant.ttl);
        self.delivered(&keys, grant);
        // The paths off the common one are boxed, so that 10,000 renewals in flight at once do
        // not each carry their large etcd futures. Keepalive first, then the check: a key seen after a confirmed keepalive lives a TTL
        // from a moment after this request began. Both are shared by every renewal of the
        // session that began before them.
        let own_key = keys.candidate(&grant.holder);
        let known = *inner.position(&own_key).borrow();
        if let Some(p) = known.filter(|p| p.granted && p.rev == i64::try_from(grant.term.0).unwrap_or(0)) {
            if inner.private.lock().expect("private lock").contains(&p.lease) {
                return Box::pin(self.renew_private(grant, &keys, p.lease)).await;
            }
        }
        let Some((session, bound)) = inner.session_keys(ttl_secs, started).await? else {
            return Ok(Renewed::Lost(Box::pin(self.inspect(&grant.lease)).await?));
        };
        let known = *inner.position(&own_key).borrow();
        let ours = known
            .is_some_and(|p| p.granted && p.lease == session && Term(u64::try_from(p.rev).unwrap_or(0)) == grant.term);
        if ours && bound.contains(own_key.as_bytes()) {
            // Bound to our live session, and this process has not recreated it since the grant.
            return Ok(Renewed::Renewed(grant.clone()));
        }
        let session = Some(session);
        let own = Box::pin(inner.get("renew", own_key.clone(), None)).await?;
        if let Some(kv) = own.kvs().first() {
            let me = keys.parse_candidate(kv)?;
            let private = inner.private.lock().expect("private lock").contains(&me.lease);
            if private && me.term() == grant.term {
                return Box::pin(self.renew_private(grant, &keys, me.lease)).await;
            }
            if Some(me.lease) == session && me.term() == grant.term {
                let position = Position {
                    rev: me.rev,
                    lease: me.lease,
                    ttl_secs,
                    granted: true,
                };
                inner.publish(&keys.candidate(&grant.holder), Some(position));
                return Ok(Renewed::Renewed(grant.clone()));
            }
        }
        Ok(Renewed::Lost(Box::pin(self.inspect(&grant.lease)).await?))
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let keys = self.keys(&grant.lease);
        self.delivered(&keys, grant);
        let own = keys.candidate(&grant.holder);
        let Ok(term) = i64::try_from(grant.term.0) else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([Compare::create_revision(own.clone(), CompareOp::Equal, term)])
            .and_then([
                TxnOp::delete(own.clone(), None),
                TxnOp::put(keys.ended(term), ended_value(EndReason::Released), None),
            ]);
        let resp = self.inner.txn("release", txn).await?;
        if resp.succeeded() {
            self.inner.publish(&own, None);
        }
        Ok(())
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let keys = self.keys(lease);
        let key = keys.candidate(candidate);
        self.inner.publish(&key, None);
        let own = self.inner.get("withdraw", key.clone(), None).await?;
        let Some(rev) = own.kvs().first().map(KeyValue::create_revision) else {
            return Ok(());
        };
        // A term granted to this key whose answer never reached the engine ends here too.
        let close = Txn::new()
            .when([
                Compare::create_revision(keys.started(rev), CompareOp::Greater, 0),
                Compare::create_revision(keys.ended(rev), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(keys.ended(rev), ended_value(EndReason::Expired), None)]);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None), TxnOp::txn(close)]);
        self.inner.txn("withdraw", txn).await?;
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let keys = self.keys(lease);
        Ok(self.inner.snapshot(&keys, "inspect").await?.observation(lease))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = self.keys(lease);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let txn = Txn::new().and_then([
            last_of(keys.history(), limit),
            last_of(keys.ends(), limit),
            first_of(keys.candidates()),
        ]);
        let resp = self.inner.txn("history", txn).await?;
        let ops = resp.op_responses();
        let ends = kvs_of(&ops, 1)
            .iter()
            .map(|kv| keys.parse_ended(kv))
            .collect::<Result<Vec<_>>>()?;
        let first = kvs_of(&ops, 2).first().map(|kv| keys.parse_candidate(kv)).transpose()?;
        let mut started = kvs_of(&ops, 0)
            .iter()
            .map(|kv| keys.parse_started(kv))
            .collect::<Result<Vec<_>>>()?;
        started.reverse();
        let now = std::time::SystemTime::now();
        let history = started
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let recorded = ends.iter().find(|e| e.term == s.term).map(|e| (e.at, e.reason));
                // No end record, yet a later term exists or the key is gone: the holder's session
                // expired (the next leader records that, unless there was none yet).
                let holds = first.as_ref().is_some_and(|f| f.rev == s.term);
                let inferred = match started.get(i + 1) {
                    Some(next) => Some((next.at, EndReason::Expired)),
                    None if !holds => Some((now, EndReason::Expired)),
                    None => None,
                };
                Transition {
                    term: Term(u64::try_from(s.term).unwrap_or(0)),
                    holder: s.holder.clone(),
                    acquired_at: s.at,
                    ended: recorded.or(inferred),
                }
            })
            .collect();
        Ok(history)
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let keys = self.keys(lease);
        let position = self.inner.position(&keys.candidate(candidate)).subscribe();
        Ok(Some(crate::changes::changes(self.inner.clone(), keys, position)))
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let keys = self.keys(lease);
        let snapshot = self.inner.snapshot(&keys, "break_lease").await?;
        let Some(holder) = snapshot.holder() else {
            return Ok(None);
        };
        let key = keys.candidate(&holder.id);
        let resp = self
            .inner
            .txn(
                "break_lease",
                end_term(&keys, &key, holder.rev, &snapshot, EndReason::Broken),
            )
            .await?;
        Ok(resp.succeeded().then(|| holder.term()))
    }
}

/// Runs `fut` as its own task, so that it completes even when the caller is dropped.
async fn detached<T: Send + 'static>(fut: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    tokio::spawn(fut).await.map_err(|e| Error::store(STORE, e))?
}

/// Deletes the candidate key `key` if it still has `rev`, recording the end of its term if it
/// was granted and has no end yet.
fn end_term(keys: &Keys, key: &str, rev: i64, snapshot: &Snapshot, reason: EndReason) -> Txn {
    let mut ops = vec![TxnOp::delete(key.to_string(), None)];
    let granted = snapshot.started.as_ref().is_some_and(|s| s.term == rev);
    if granted && !snapshot.latest_ended() {
        ops.push(TxnOp::put(keys.ended(rev), ended_value(reason), None));
    }
    Txn::new()
        .when([Compare::create_revision(key.to_string(), CompareOp::Equal, rev)])
        .and_then(ops)
}
