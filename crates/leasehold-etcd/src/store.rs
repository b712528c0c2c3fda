//! The [`LeaseStore`] over etcd: a session lease per process, candidate keys queued by
//! `create_revision`, terms fenced by that revision.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant,
    LeaseName, LeaseStore, Notifications, Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::error::{CONNECT, STORE, map_connect};
use crate::record::{
    Keys, Snapshot, TTL_RANGE, end_term, ended_value, first_of, granted_value, last_of, released_value,
    session_ttl_secs, started_value,
};
use crate::session;
use crate::state::{Inner, Position};

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
/// the engine's read-back adopts it, or the candidate's next `acquire` hands that term over to
/// the candidate itself and takes it again with a new term (its `withdraw` ends it). A dropped renewal
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
            Ok(Err(e)) => return Err(map_connect(&e, &endpoints, config.cert.is_some())),
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
                positions: Mutex::default(),
                private: Mutex::default(),
                one_shots: Mutex::default(),
                announcers: Mutex::default(),
            }),
        })
    }

    /// The configuration (its `Debug` and `Display` redact the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
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

    fn keys(&self, lease: &LeaseName) -> Keys {
        Keys::new(&self.inner.config.prefix, lease)
    }

    async fn snapshot(&self, keys: &Keys, operation: &'static str) -> Result<Snapshot> {
        let resp = self
            .inner
            .read_txn(operation, Txn::new().and_then(Snapshot::reads(keys)))
            .await?;
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
            announces: leasehold_core::Announces::Grants,
            fifo: true,
        }
    }

    fn can_break(&self) -> bool {
        true
    }

    /// A straight sequence, never a loop: queue (once; a stale key of this candidate is cleared
    /// first), and if first, confirm the session and grant. Anything that changes in between
    /// is an answer ([`Acquired::Held`]) and the engine asks again.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&request.lease);
        let own = keys.candidate(&request.candidate);
        let ttl_secs = session_ttl_secs(request.ttl);
        inner.place(&own, |p| p.asked = request.ttl);
        let queued = (*inner.position(&own).borrow()).filter(|p| !p.granted && p.ttl_secs == ttl_secs);
        if let Some(position) = queued
            && let Some(grant) = inner.grant_in_one_shot(&keys, &own, request, position).await?
        {
            return Ok(Acquired::Granted(grant));
        }
        // Beside the queue transaction, a keepalive of the session sent after this request began:
        // the place this acquire answers with (a grant, or a place in the queue) then lives a
        // TTL from a moment after the request began. A waiting candidate's turn counts from its
        // session's last confirmed keepalive (see `changes`); without this one, that could be a
        // keepalive of an earlier election of the process, older than the TTL, and the engine
        // then refuses the turn (benchmark samples of 0.1-0.9 s, issue 32). Its failure is left
        // to the grant path below (which needs it) and to the change stream's keepalives.
        let (queued, _) = futures::join!(
            inner.enqueue(&keys, &own, request),
            Box::pin(inner.refreshed_since(ttl_secs, started))
        );
        let mut queued = queued?;
        if !queued.retired && queued.rev <= inner.retired(&own) {
            // This store began to delete the key while this acquire read it: a withdrawal (as
            // the engine sends one while an acquire it gave up on runs on), or a release or
            // hand-over it gave up on. This acquire came before that deletion; it neither takes
            // nor queues the key again (a key queued now may be left behind, unknown to the
            // engine), and is answered with an error, so that an engine still campaigning asks
            // again at its retry pace (a `Held` would leave it waiting for a notification for a
            // place that is going).
            return Err(Error::store(
                STORE,
                "the candidate's key was being deleted by this store (a release, hand-over or withdrawal under way) while this acquire read it: ask again",
            ));
        }
        if queued.is_stale() {
            inner.publish(&own, None);
            if queued.granted_before() {
                // The engine asks again once that leadership ended for it, but this may also
                // be an acquire it gave up on, still running, while it leads on this key: the
                // lease must stay this candidate's (`LeaseStore::acquire`), whereas ending the
                // term would give it to the next in the queue. So the term is handed over to
                // the candidate itself, and this acquire takes the reservation below with a
                // new term; nobody else can take it meanwhile.
                let term = Grant {
                    lease: request.lease.clone(),
                    holder: request.candidate.clone(),
                    term: Term(u64::try_from(queued.rev).unwrap_or(0)),
                    ttl: request.ttl,
                    token: queued.rev.to_string(),
                };
                // Boxed: an acquire in flight stays small (tests/footprint.rs).
                Box::pin(inner.hand_over_key(&term, &request.candidate)).await?;
            } else {
                let clear = end_term(&keys, &own, queued.rev, &queued.snapshot, EndReason::Expired);
                inner.retire(&own, queued.rev);
                inner.txn("acquire (requeue)", clear).await?;
            }
            queued = inner.enqueue(&keys, &own, request).await?;
            if queued.is_stale() {
                // Another process campaigns under the same id, and queued again meanwhile.
                return Ok(Acquired::Held(queued.snapshot.queued_observation(&request.lease)));
            }
        }
        let Some(first) = queued.snapshot.first.as_ref() else {
            return Err(Error::corrupt(STORE, &request.lease, "own key missing from the queue"));
        };
        // A handed-over lease: only its successor may take it, and it goes before the keys
        // queued ahead of its own (they are deleted with the take; see `keys_ahead`).
        let mut ahead = Vec::new();
        let reservation = queued.snapshot.reserved.clone();
        match &reservation {
            Some(r) if r.to != request.candidate => {
                inner.publish(&own, Some(queued.position(ttl_secs, false)));
                return Ok(Acquired::Held(queued.snapshot.observation(&request.lease)));
            }
            Some(r) => {
                if queued.rev <= r.term {
                    // Cannot be while the queue keeps its order; never grant a lower term.
                    return Err(Error::corrupt(
                        STORE,
                        &request.lease,
                        format!(
                            "candidate key at revision {} is not above the handed-over term {}",
                            queued.rev, r.term
                        ),
                    ));
                }
                ahead = inner.keys_ahead(&keys, queued.rev).await?;
            }
            None if first.rev != queued.rev => {
                inner.publish(&own, Some(queued.position(ttl_secs, false)));
                return Ok(Acquired::Held(queued.snapshot.queued_observation(&request.lease)));
            }
            None => {}
        }
        let grant = Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(u64::try_from(queued.rev).unwrap_or(0)),
            ttl: request.ttl,
            token: queued.rev.to_string(),
        };
        // The promise: the key lives a TTL from a moment after this request began, so a
        // keepalive sent after `started` must be confirmed (usually the one sent beside the
        // queue transaction).
        let alive = if queued.private {
            inner.keep_private_alive(queued.lease).await?
        } else {
            inner.refreshed_since(ttl_secs, started).await? == Some(queued.session)
        };
        if !alive {
            // The session expired with our key: the engine asks again, and queues afresh.
            inner.publish(&own, None);
            return Ok(Acquired::Held(queued.snapshot.observation(&request.lease)));
        }
        let rev = queued.rev;
        let grant_txn = |ahead: &[(String, i64)]| {
            let mut compares = vec![
                Compare::create_revision(own.clone(), CompareOp::Equal, rev),
                Compare::create_revision(keys.started(rev), CompareOp::Equal, 0),
            ];
            let mut ops = vec![
                TxnOp::put(keys.started(rev), started_value(&request.candidate), None),
                TxnOp::put(
                    keys.granted(),
                    granted_value(rev, request.ttl, &request.candidate),
                    None,
                ),
            ];
            match &reservation {
                Some(r) => {
                    compares.push(Compare::mod_revision(keys.reserved(), CompareOp::Equal, r.version));
                    ops.push(TxnOp::delete(keys.reserved(), None));
                    for (key, created) in ahead {
                        compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, *created));
                        ops.push(TxnOp::delete(key.clone(), None));
                    }
                }
                None => compares.push(Compare::create_revision(keys.reserved(), CompareOp::Equal, 0)),
            }
            let snapshot = &queued.snapshot;
            if let Some(previous) = snapshot.started.as_ref().filter(|_| !snapshot.latest_ended()) {
                // The previous holder's key is gone without an end record: it expired.
                compares.push(Compare::create_revision(keys.ended(previous.term), CompareOp::Equal, 0));
                ops.push(TxnOp::put(
                    keys.ended(previous.term),
                    ended_value(EndReason::Expired),
                    None,
                ));
            }
            Txn::new().when(compares).and_then(ops)
        };
        // How the term before ended (a fact whether or not the grant goes through), for the
        // engine's metrics: announced before the grant's own announcement can replace it.
        let snapshot = &queued.snapshot;
        let previous = match (&reservation, &snapshot.started) {
            (Some(r), _) => Some((r.term, EndReason::HandedOver)),
            (None, Some(s)) if snapshot.latest_ended() => snapshot.ended.as_ref().map(|e| (s.term, e.reason)),
            (None, Some(s)) => Some((s.term, EndReason::Expired)),
            (None, None) => None,
        };
        if let Some((term, reason)) = previous {
            crate::announce::announce_ended(inner, &keys.lease, term, reason);
        }
        let mut granted = inner.txn("acquire (grant)", grant_txn(&ahead)).await?.succeeded();
        if !granted && reservation.is_some() {
            // A key ahead may have left meanwhile (keys ahead only leave): once more without
            // it, so that the successor, woken once, is not left waiting for a poll.
            let again = inner.keys_ahead(&keys, rev).await?;
            if again != ahead {
                granted = inner.txn("acquire (grant)", grant_txn(&again)).await?.succeeded();
            }
        }
        if granted {
            inner.publish(&own, Some(queued.position(ttl_secs, true)));
            return Ok(Acquired::Granted(grant));
        }
        // Our key, the previous term's end, the reservation or a key ahead changed since the
        // read: look again.
        inner.publish(&own, Some(queued.position(ttl_secs, false)));
        Ok(Acquired::Held(self.inspect(&request.lease).await?))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let started = Instant::now();
        let inner = &self.inner;
        let keys = self.keys(&grant.lease);
        let ttl_secs = session_ttl_secs(grant.ttl);
        // The paths off the common one are boxed, so that 10,000 renewals in flight at once do
        // not each carry their large etcd futures. Keepalive first, then the check: a key seen
        // after a confirmed keepalive lives a TTL from a moment after this request began. Both are shared by every renewal of the
        // session that began before them.
        let own_key = keys.candidate(&grant.holder);
        // A turn's confirmation writes the term's records first (see `Place::records_due`).
        Box::pin(inner.write_records_due(&keys, &own_key, grant.term)).await?;
        let known = *inner.position(&own_key).borrow();
        if let Some(p) = known.filter(|p| p.granted && p.rev == i64::try_from(grant.term.0).unwrap_or(0))
            && inner.private.lock().expect("private lock").contains(&p.lease)
        {
            return Box::pin(self.renew_private(grant, &keys, p.lease)).await;
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
        let own = keys.candidate(&grant.holder);
        let Ok(term) = i64::try_from(grant.term.0) else {
            return Ok(());
        };
        self.inner.write_records_due(&keys, &own, grant.term).await?;
        self.inner.retire(&own, term);
        // The release marker for the successor (its turn, see `changes`) says that the released
        // key was first in the queue and no reservation was there. First: a key is granted
        // only while first (every grant compares the keys ahead, or deletes them with a
        // reservation's take), and no key can be created before it later (revisions only grow),
        // so the granted key is first for as long as it exists: the compare of its create
        // revision is enough (a compare of every candidate key, as the one-shot grant does, cost
        // 0.13 ms more per release here, and grows with the deleted keys etcd keeps until a
        // compaction). A reservation is there only after a hand-over, which deletes the holder's
        // key: none can be while the key exists, and it is compared all the same, which is
        // cheap. Otherwise the key's end is written without the marker.
        let end = [
            TxnOp::delete(own.clone(), None),
            TxnOp::put(keys.ended(term), ended_value(EndReason::Released), None),
        ];
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.clone(), CompareOp::Equal, term),
                Compare::create_revision(keys.reserved(), CompareOp::Equal, 0),
            ])
            .and_then([
                end[0].clone(),
                end[1].clone(),
                TxnOp::put(keys.granted(), released_value(term), None),
            ])
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([Compare::create_revision(own.clone(), CompareOp::Equal, term)])
                    .and_then(end),
            )]);
        // On an error the engine sends the release again (the key stays retired meanwhile).
        let resp = self.inner.txn("release", txn).await?;
        let ended_without_marker = || {
            resp.op_responses()
                .into_iter()
                .any(|r| matches!(r, TxnOpResponse::Txn(t) if t.succeeded()))
        };
        if resp.succeeded() || ended_without_marker() {
            self.inner.publish(&own, None);
        }
        Ok(())
    }

    // `Inner::hand_over_key`; on an error the engine sends the hand-over again.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.inner.hand_over_key(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let keys = self.keys(lease);
        let key = keys.candidate(candidate);
        self.inner.place(&key, |p| p.records_due = None);
        self.inner.publish(&key, None);
        self.inner.withdraw_key(&keys, key).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let keys = self.keys(lease);
        let snapshot = self.snapshot(&keys, "inspect").await?;
        Ok(self.inner.unretired(&keys, lease, snapshot)?.observation(lease))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.inner.list_leases(prefix).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.inner.queued_candidates(lease).await
    }

    /// One range read per 2,500 records under `{prefix}/.shards/` (4 for 10,000), every page at
    /// the revision of the first; each record's version is its key's `mod_revision`.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.inner.shard_records(prefix).await
    }

    /// One transaction: the key `{prefix}/.shards/{name}` is put (and read back for its new
    /// `mod_revision`) if its `mod_revision` is `expected` (`create_revision` 0 for `None`),
    /// else read, which answers the conflict. No retry: an error leaves the outcome to the
    /// engine's read-back.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.inner.write_shard(name, expected, value).await
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
        Ok(Some(crate::changes::changes(
            self.inner.clone(),
            keys,
            candidate.clone(),
            position,
        )))
    }

    /// Every grant rewrites the lease's `granted` key in its own transaction; the store's one
    /// watch on that key per followed lease (shared by its followers, dropped with the last)
    /// passes each new holder on, with no request per grant or per follower.
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let keys = self.keys(lease);
        crate::announce::announcements(&self.inner, keys).await.map(Some)
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let keys = self.keys(lease);
        let snapshot = self.snapshot(&keys, "break_lease").await?;
        if let Some(r) = &snapshot.reserved {
            let txn = Txn::new()
                .when([Compare::mod_revision(keys.reserved(), CompareOp::Equal, r.version)])
                .and_then([TxnOp::delete(keys.reserved(), None)]);
            let resp = self.inner.txn("break_lease", txn).await?;
            return Ok(resp.succeeded().then(|| Term(u64::try_from(r.term).unwrap_or(0))));
        }
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
