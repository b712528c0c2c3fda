//! The [`LeaseStore`] over etcd: a session lease per process, candidate keys queued by
//! `create_revision`, terms fenced by that revision.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, Renewed, Result, Term, Transition,
};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::time::Instant;

use crate::changes::Position;
use crate::config::EtcdConfig;
use crate::error::{CONNECT, STORE, map_error};
use crate::record::{
    Keys, Snapshot, TTL_RANGE, candidate_value, end_term, ended_value, first_of, kvs_of, last_of, revision,
    session_ttl_secs, started_value,
};
use crate::session::{self, Ownership, Session};

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
/// # Cancel safety
///
/// The engine runs every call to completion (or a TTL); a caller that drops one half-way
/// leaves nothing half-written, because every write is one etcd transaction. A dropped
/// `acquire` may leave the candidate's key queued, or a grant written that nobody heard of:
/// the engine's read-back adopts it, or the candidate's next `acquire` ends that term as
/// expired and queues afresh with a new term (its `withdraw` ends it too). A dropped renewal
/// cuts a keepalive round short; the next caller sends another.
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
    /// The endpoints as errors name them: `h1:2379,h2:2379`.
    pub(crate) endpoints: String,
    pub(crate) client: Client,
    /// One session per etcd lease TTL (whole seconds).
    pub(crate) sessions: Mutex<HashMap<i64, Arc<AsyncMutex<Option<Session>>>>>,
    /// The current session id per TTL, readable without waiting for a keepalive in flight.
    pub(crate) current: Mutex<HashMap<i64, i64>>,
    /// Sessions this store had and etcd has since dropped (their keys are gone or going).
    pub(crate) retired: Mutex<HashSet<i64>>,
    /// Where each candidate key of this process stands, for its change stream.
    positions: Mutex<HashMap<String, watch::Sender<Option<Position>>>>,
    /// Grants this store has sent and not seen confirmed (the answer of the transaction or of
    /// its keepalive was lost), by candidate key.
    unconfirmed: Mutex<HashMap<String, Unconfirmed>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster named by an `etcd://` or `etcds://` URL (see [`EtcdConfig`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a bad URL; [`Error::Unreachable`] or [`Error::Timeout`] when no
    /// endpoint answers; a permanent error for refused credentials or a port that does not
    /// serve etcd.
    pub async fn connect(url: &str) -> Result<EtcdStore> {
        EtcdStore::from_config(url.parse()?).await
    }

    /// Connects with a configuration, and checks that the cluster answers: every endpoint is
    /// asked once, at the same time, and one answer is enough.
    ///
    /// # Errors
    ///
    /// As [`EtcdStore::connect`].
    pub async fn from_config(config: EtcdConfig) -> Result<EtcdStore> {
        let options = config.connect_options()?;
        let endpoints = config.endpoints.join(",");
        let probes = config
            .endpoints
            .iter()
            .map(|endpoint| session::probe(&config, endpoint, options.clone()));
        let mut failures = Vec::new();
        for answer in futures::future::join_all(probes).await {
            match answer {
                Ok(()) => {
                    failures.clear();
                    break;
                }
                Err(e) => failures.push(e),
            }
        }
        if let Some(failure) = session::pick(failures) {
            return Err(failure);
        }
        let connecting = Client::connect(config.endpoints.clone(), Some(options));
        let client = match tokio::time::timeout(config.timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(map_error(CONNECT, &endpoints, &e)),
            Err(_) => {
                return Err(Error::Timeout {
                    store: STORE,
                    operation: CONNECT,
                    after: config.timeout,
                });
            }
        };
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                config,
                endpoints,
                client,
                sessions: Mutex::default(),
                current: Mutex::default(),
                retired: Mutex::default(),
                positions: Mutex::default(),
                unconfirmed: Mutex::default(),
            }),
        })
    }

    /// The configuration (its `Debug` and `Display` redact the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// Grants term `at.rev` to the candidate's key, which is bound to session `at.lease`.
    ///
    /// The grant is answered only when the transaction succeeded and a keepalive of the session,
    /// sent after `started` (when this `acquire` began), found it alive: the key, present when
    /// the transaction applied, lives a TTL from a moment after the request began, whichever of
    /// the two etcd applied first.
    ///
    /// [`Send::Together`] sends both at once, neither waiting for the other's answer, so that
    /// the write goes out even when no reply comes back (the engine then settles the outcome by
    /// reading back, and [`EtcdStore::vouched`] checks what the read shows).
    /// [`Send::KeepaliveFirst`] sends the transaction once the keepalive is confirmed: under a
    /// burst (1,000 elections at once) the shared keepalive round is not queued behind every
    /// transaction. `previous` is a term whose holder vanished without an end record: it is
    /// recorded as expired in the same transaction.
    #[allow(clippy::too_many_arguments)]
    async fn grant(
        &self,
        keys: &Keys,
        own: &str,
        request: &AcquireRequest,
        at: Position,
        previous: Option<i64>,
        started: Instant,
        send: Send,
    ) -> Result<Granting> {
        let inner = &self.inner;
        let rev = at.rev;
        let mut compares = vec![
            Compare::create_revision(own.to_string(), CompareOp::Equal, rev),
            Compare::lease(own.to_string(), CompareOp::Equal, at.lease),
            // Every candidate key was created at or after ours: we are first.
            Compare::create_revision(keys.candidates(), CompareOp::Greater, rev - 1).with_prefix(),
            Compare::create_revision(keys.started(rev), CompareOp::Equal, 0),
        ];
        let mut ops = vec![TxnOp::put(keys.started(rev), started_value(&request.candidate), None)];
        if let Some(previous) = previous {
            compares.push(Compare::create_revision(keys.ended(previous), CompareOp::Equal, 0));
            ops.push(TxnOp::put(keys.ended(previous), ended_value(EndReason::Expired), None));
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let (written, alive) = match send {
            Send::Together => {
                // Until its answers say otherwise, this grant may be written and unconfirmed.
                let sent = Unconfirmed {
                    rev,
                    lease: at.lease,
                    kept_alive: false,
                };
                inner.set_unconfirmed(own, Some(sent));
                let written = inner.txn("acquire (grant)", txn);
                let alive = inner.refreshed_since(at.ttl_secs, started);
                futures::join!(written, alive)
            }
            Send::KeepaliveFirst => {
                let alive = inner.refreshed_since(at.ttl_secs, started).await?;
                if alive != Some(at.lease) {
                    return Ok(Granting::SessionGone);
                }
                let sent = Unconfirmed {
                    rev,
                    lease: at.lease,
                    kept_alive: true,
                };
                inner.set_unconfirmed(own, Some(sent));
                (inner.txn("acquire (grant)", txn).await, Ok(alive))
            }
        };
        if !written?.succeeded() {
            // Not cleared: the conditions may fail because an earlier grant of ours applied.
            return Ok(Granting::NotFirst);
        }
        if alive? != Some(at.lease) {
            inner.confirmed(own, rev);
            return Ok(Granting::SessionGone);
        }
        inner.confirmed(own, rev);
        inner.publish(own, Some(Position { granted: true, ..at }));
        Ok(Granting::Granted(Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(u64::try_from(rev).unwrap_or(0)),
            ttl: request.ttl,
            token: rev.to_string(),
        }))
    }

    /// What `inspect` shows of a read. A read-back is safe to adopt only if the holder's key
    /// lives a TTL from a moment after the engine's oldest acquire whose outcome is unknown (the
    /// engine believes the grant from that acquire's send time). A grant answered by `acquire`,
    /// or sent after a keepalive confirmed, has that; one that this store sent together with its
    /// keepalive and never saw confirmed (answers lost) is shown only once a keepalive of its
    /// session, sent after `since` (when the read began), is confirmed. A grant of this store
    /// that no answer confirmed counts as reported once shown: the candidate's next `acquire`
    /// does not hand it out again. A holder on a session of this store that etcd has dropped is
    /// gone with it: the lease shows free. Every other read costs no request more (an `inspect`
    /// does not keep anything alive).
    pub(crate) async fn vouched(&self, keys: &Keys, snapshot: &Snapshot, since: Instant) -> Result<Observation> {
        let inner = &self.inner;
        let Some(holder) = snapshot.holder() else {
            return Ok(snapshot.observation(&keys.lease));
        };
        let ttl_secs = match inner.ownership(holder.lease) {
            Ownership::Foreign => return Ok(snapshot.observation(&keys.lease)),
            Ownership::Retired => return Ok(snapshot.expired_observation(&keys.lease)),
            Ownership::Current(ttl_secs) => ttl_secs,
        };
        let own = keys.candidate(&holder.id);
        let Some(sent) = inner
            .unconfirmed(&own)
            .filter(|u| u.rev == holder.rev && u.lease == holder.lease)
        else {
            return Ok(snapshot.observation(&keys.lease));
        };
        if !sent.kept_alive && inner.refreshed_since(ttl_secs, since).await? != Some(holder.lease) {
            return Ok(snapshot.expired_observation(&keys.lease));
        }
        inner.confirmed(&own, holder.rev);
        let position = Position {
            rev: holder.rev,
            lease: holder.lease,
            ttl_secs,
            granted: true,
        };
        inner.publish(&own, Some(position));
        Ok(snapshot.observation(&keys.lease))
    }

    /// Takes the candidate's place in the queue (a key already there stays, with its place) and
    /// reads who is first, in one transaction. A session that etcd no longer knows is replaced
    /// by a new one.
    async fn enqueue(&self, keys: &Keys, own: &str, request: &AcquireRequest) -> Result<Queued> {
        let inner = &self.inner;
        let ttl_secs = session_ttl_secs(request.ttl);
        let mut session = inner.session(ttl_secs).await?;
        let queue = |session: i64| {
            let [a, b, c] = Snapshot::reads(keys);
            let put = TxnOp::put(
                own.to_string(),
                candidate_value(request.ttl),
                Some(PutOptions::new().with_lease(session)),
            );
            Txn::new()
                .when([Compare::create_revision(own.to_string(), CompareOp::Equal, 0)])
                .and_then([put, a, b, c])
                .or_else({
                    let [a, b, c] = Snapshot::reads(keys);
                    [TxnOp::get(own.to_string(), None), a, b, c]
                })
        };
        let resp = match inner.txn_unless_lease_gone("acquire", queue(session)).await? {
            Some(resp) => resp,
            None => {
                // The session expired (the process was cut off for a TTL): a new one.
                inner.forget_session(ttl_secs, session).await;
                session = inner.session(ttl_secs).await?;
                inner.txn("acquire", queue(session)).await?
            }
        };
        let ops = resp.op_responses();
        let snapshot = Snapshot::parse(keys, &ops, 1)?;
        let (rev, lease) = if resp.succeeded() {
            (revision(&resp), session)
        } else {
            let kv = kvs_of(&ops, 0)
                .first()
                .ok_or_else(|| Error::corrupt(STORE, &request.lease, "own key vanished inside a transaction"))?;
            let me = keys.parse_candidate(kv)?;
            (me.rev, me.lease)
        };
        Ok(Queued {
            session,
            snapshot,
            rev,
            lease,
        })
    }

    fn keys(&self, lease: &LeaseName) -> Keys {
        Keys::new(&self.inner.config.prefix, lease)
    }
}

impl Inner {
    fn position(&self, own: &str) -> watch::Sender<Option<Position>> {
        let mut positions = self.positions.lock().expect("positions lock");
        positions
            .entry(own.to_string())
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// The unconfirmed grant of a candidate key, if any.
    fn unconfirmed(&self, own: &str) -> Option<Unconfirmed> {
        self.unconfirmed.lock().expect("unconfirmed lock").get(own).copied()
    }

    /// The grant of `rev` to a candidate key has been answered (or its key is gone).
    fn confirmed(&self, own: &str, rev: i64) {
        let mut unconfirmed = self.unconfirmed.lock().expect("unconfirmed lock");
        if unconfirmed.get(own).is_some_and(|u| u.rev == rev) {
            unconfirmed.remove(own);
        }
    }

    fn set_unconfirmed(&self, own: &str, grant: Option<Unconfirmed>) {
        let mut unconfirmed = self.unconfirmed.lock().expect("unconfirmed lock");
        match grant {
            Some(grant) => unconfirmed.insert(own.to_string(), grant),
            None => unconfirmed.remove(own),
        };
    }

    /// Tells the candidate's change stream where its key stands.
    fn publish(&self, own: &str, position: Option<Position>) {
        self.position(own).send_if_modified(|p| {
            let changed = *p != position;
            *p = position;
            changed
        });
    }

    pub(crate) async fn snapshot(&self, keys: &Keys, operation: &'static str) -> Result<Snapshot> {
        let resp = self.txn(operation, Txn::new().and_then(Snapshot::reads(keys))).await?;
        Snapshot::parse(keys, &resp.op_responses(), 0)
    }
}

/// The candidate's key after [`EtcdStore::enqueue`], and what the read beside it showed.
struct Queued {
    /// The session of the request's TTL.
    session: i64,
    snapshot: Snapshot,
    /// The key's create_revision: its place in the queue.
    rev: i64,
    /// The etcd lease the key is bound to.
    lease: i64,
}

/// A grant sent and not seen confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unconfirmed {
    /// The key's create_revision: the term.
    rev: i64,
    /// The session the key is bound to.
    lease: i64,
    /// Whether a keepalive of the session, sent after the `acquire` began, was confirmed before
    /// the transaction was sent: then the key lives a TTL from a moment after the request began.
    kept_alive: bool,
}

/// How [`EtcdStore::grant`] sends its transaction and its keepalive.
#[derive(Clone, Copy, Debug)]
enum Send {
    Together,
    KeepaliveFirst,
}

/// What [`EtcdStore::grant`] came to.
enum Granting {
    Granted(Grant),
    /// The transaction's conditions did not hold: the key is not first, or it changed.
    NotFirst,
    /// The key's session has expired, and the key with it (whether or not the grant was
    /// written: if it was, the term ended at once and the next grant records it as expired).
    SessionGone,
}

impl Queued {
    /// A key that may be granted: bound to this store's session and not granted before. A key
    /// of another session is an earlier incarnation of this candidate (its leadership has
    /// ended) or another process using the same id; a key granted before whose grant was
    /// reported (see [`Queued::unreported`]) means that leadership ended (the engine asks again
    /// only then). Either must go, and the candidate queue afresh with a new term.
    fn is_stale(&self) -> bool {
        self.lease != self.session || self.granted_before()
    }

    /// A grant of this key, on this store's session, that no answer of this store has reported:
    /// an `acquire` sent it and never saw it confirmed (`unconfirmed` is this very key), and no
    /// `inspect` has shown it since. The engine cannot have led with it, so it may have it now,
    /// at the same term.
    fn unreported(&self, unconfirmed: Option<Unconfirmed>) -> bool {
        unconfirmed.is_some_and(|u| u.rev == self.rev && u.lease == self.lease)
            && self.lease == self.session
            && self.granted_before()
            && !self.snapshot.latest_ended()
    }

    fn granted_before(&self) -> bool {
        self.snapshot.started.as_ref().is_some_and(|s| s.term == self.rev)
    }

    fn position(&self, ttl_secs: i64, granted: bool) -> Position {
        Position {
            rev: self.rev,
            lease: self.lease,
            ttl_secs,
            granted,
        }
    }

    fn grant(&self, request: &AcquireRequest) -> Grant {
        Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(u64::try_from(self.rev).unwrap_or(0)),
            ttl: request.ttl,
            token: self.rev.to_string(),
        }
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
        }
    }

    fn can_break(&self) -> bool {
        true
    }

    /// A straight sequence, never a loop. A candidate this store has queued (and not seen
    /// granted) asks for the grant at once, in one transaction that needs no earlier answer, so
    /// it works even when replies are lost. Otherwise: queue (once; a stale key of this
    /// candidate is cleared first), and if first, grant. Anything that changes in between is an
    /// answer ([`Acquired::Held`]) and the engine asks again.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&request.lease);
        let own = keys.candidate(&request.candidate);
        let ttl_secs = session_ttl_secs(request.ttl);
        let queued = (*inner.position(&own).borrow()).filter(|p| !p.granted && p.ttl_secs == ttl_secs);
        if let Some(at) = queued {
            match Box::pin(self.grant(&keys, &own, request, at, None, started, Send::Together)).await? {
                Granting::Granted(grant) => return Ok(Acquired::Granted(grant)),
                Granting::SessionGone => inner.publish(&own, None),
                Granting::NotFirst => {}
            }
        }
        let mut queued = self.enqueue(&keys, &own, request).await?;
        if queued.unreported(inner.unconfirmed(&own)) {
            // Granted by an earlier call whose answer was lost: the same term, once the key is
            // known to live a TTL from a moment after this request began.
            if inner.refreshed_since(ttl_secs, started).await? == Some(queued.lease) {
                inner.confirmed(&own, queued.rev);
                inner.publish(&own, Some(queued.position(ttl_secs, true)));
                return Ok(Acquired::Granted(queued.grant(request)));
            }
            // Its session expired, and the key with it: queue afresh.
        }
        if queued.is_stale() {
            inner.set_unconfirmed(&own, None);
            inner.publish(&own, None);
            let clear = end_term(&keys, &own, queued.rev, &queued.snapshot, EndReason::Expired);
            inner.txn("acquire (requeue)", clear).await?;
            queued = self.enqueue(&keys, &own, request).await?;
            if queued.is_stale() {
                // Another process campaigns under the same id, and queued again meanwhile.
                return Ok(Acquired::Held(queued.snapshot.queued_observation(&request.lease)));
            }
        }
        let Some(first) = queued.snapshot.first.as_ref() else {
            return Err(Error::corrupt(STORE, &request.lease, "own key missing from the queue"));
        };
        if first.rev != queued.rev {
            inner.publish(&own, Some(queued.position(ttl_secs, false)));
            return Ok(Acquired::Held(queued.snapshot.queued_observation(&request.lease)));
        }
        let snapshot = &queued.snapshot;
        // The previous holder's key is gone without an end record: it expired.
        let previous = snapshot
            .started
            .as_ref()
            .filter(|_| !snapshot.latest_ended())
            .map(|s| s.term);
        let at = queued.position(ttl_secs, false);
        let send = Send::KeepaliveFirst;
        match Box::pin(self.grant(&keys, &own, request, at, previous, started, send)).await? {
            Granting::Granted(grant) => Ok(Acquired::Granted(grant)),
            Granting::SessionGone => {
                // The session expired with our key: the engine asks again, and queues afresh.
                inner.publish(&own, None);
                Ok(Acquired::Held(snapshot.observation(&request.lease)))
            }
            Granting::NotFirst => {
                // Our key, or the previous term's end, changed since the read: look again.
                inner.publish(&own, Some(at));
                Ok(Acquired::Held(self.inspect(&request.lease).await?))
            }
        }
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&grant.lease);
        let ttl_secs = session_ttl_secs(grant.ttl);
        // The paths off the common one are boxed, so that 10,000 renewals in flight at once do
        // not each carry their large etcd futures. Keepalive first, then the check: a key seen
        // after a confirmed keepalive lives a TTL from a moment after this request began. Both
        // are shared by every renewal of the session that began before them.
        let own_key = keys.candidate(&grant.holder);
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
        let own = Box::pin(inner.get("renew", own_key.clone(), None)).await?;
        if let Some(kv) = own.kvs().first() {
            let me = keys.parse_candidate(kv)?;
            if me.lease == session && me.term() == grant.term {
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
            self.inner.set_unconfirmed(&own, None);
            self.inner.publish(&own, None);
        }
        Ok(())
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let keys = self.keys(lease);
        let key = keys.candidate(candidate);
        self.inner.set_unconfirmed(&key, None);
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
        let since = Instant::now();
        let keys = self.keys(lease);
        let snapshot = self.inner.snapshot(&keys, "inspect").await?;
        self.vouched(&keys, &snapshot, since).await
    }

    /// One range request per 1,024 keys under the prefix (history keys included), all at the
    /// revision of the first, decoded as `inspect` decodes one lease.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.list_leases(prefix).await
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
        crate::record::transitions(&keys, &resp.op_responses())
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
