//! The [`LeaseStore`] over etcd: a session lease per process, candidate keys queued by
//! `create_revision`, terms fenced by that revision.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use futures::stream::{FuturesUnordered, StreamExt};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant,
    LeaseName, LeaseStore, Notifications, Observation, Renewed, Result, Term, Transition,
};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::time::Instant;

use crate::changes::Position;
use crate::config::EtcdConfig;
use crate::error::{CONNECT, STORE, lease_gone, map_connect_error, map_error};
use crate::record::{
    Keys, Snapshot, TTL_RANGE, candidate_value, end_term, ended_value, first_of, granted_value, kvs_of, last_of,
    released_value, reserved_value, revision, session_ttl_secs, started_value,
};
use crate::session::{self, Session};

/// When a one-shot grant's transaction is sent again while the grant of its lease is unanswered,
/// counted from the first copy (see `EtcdStore::grant_in_one_shot`).
const ONE_SHOT_RESENDS: [Duration; 4] = [
    Duration::from_millis(10),
    Duration::from_millis(30),
    Duration::from_millis(80),
    Duration::from_millis(200),
];

/// At most this many failed deletions are kept to be sent again (see [`Inner::leave`]); the
/// oldest goes first (its key has most likely gone with its session meanwhile).
const MAX_LEFT: usize = 1024;

/// How long after a one-shot grant began one of its copies may still apply: its private lease
/// (granted no earlier, for `ttl_secs`) has expired by then, with etcd's revocation lag and a
/// margin (the entry in `Inner::one_shots` is kept that long, also after the key was withdrawn).
fn one_shot_reach(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1).max(1) * 2 + 1)
}

/// Whether a one-shot grant's transaction that failed its compare found the key bound to that
/// very grant's lease: an earlier copy of it applied.
fn applied_before(resp: &TxnResponse, rev: i64, private: i64) -> bool {
    kvs_of(&resp.op_responses(), 0)
        .first()
        .is_some_and(|kv| kv.create_revision() == rev && kv.lease() == private)
}

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

/// Where one candidate key of this process stands (see `Inner::positions`).
struct Place {
    /// Its place, as the store's last answer for it saw it; read by its change stream.
    position: watch::Sender<Option<Position>>,
    /// The greatest create_revision of the key this store has begun to delete (a release,
    /// hand-over, withdrawal or a requeue's clear): a place at or below it is never published
    /// again (see [`Inner::retire`]).
    retired: i64,
    /// How many acquires of the key's candidate this store has begun: a withdrawal sent again
    /// later is dropped once the candidate campaigns again (see [`Left::Withdraw`]).
    acquires: u64,
    /// The TTL its candidate's latest acquire asked for (a turn grants it).
    asked: Duration,
    /// A turn its change stream gave (see `changes`) whose records (the term's history entry and
    /// announcement) are still to be written: by the engine's confirmation, its next renewal
    /// (or a release or hand-over sent first).
    records_due: Option<RecordsDue>,
}

/// The records of a term granted by a turn, written by the term's first renewal.
#[derive(Clone, Debug)]
pub(crate) struct RecordsDue {
    pub(crate) rev: i64,
    pub(crate) ttl: Duration,
    pub(crate) holder: CandidateId,
}

/// A deletion of this store that failed, to be sent again (see [`Inner::leave`]).
enum Left {
    /// A [`close_key`] transaction.
    Close(Txn),
    /// A withdrawal whose first request (the read of the key) failed, so that the key's
    /// revision is not known: the withdrawal is made again, as long as the candidate has not
    /// begun another acquire since (`acquires` as it was).
    Withdraw { keys: Keys, key: String, acquires: u64 },
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
    /// Where each candidate key of this process stands, for its change stream.
    positions: Mutex<HashMap<String, Place>>,
    /// etcd leases granted for one grant each (see `EtcdStore::grant_in_one_shot`).
    pub(crate) private: Mutex<HashSet<i64>>,
    /// Per candidate key: the position of its latest one-shot grant, and when the first one for
    /// that position began (a turn of that key counts from no later, see
    /// `Inner::one_shot_began`).
    one_shots: Mutex<HashMap<String, (Position, Instant)>>,
    /// One watch per followed lease, shared by its followers in this store (see `announce`).
    pub(crate) announcers: Mutex<HashMap<LeaseName, crate::announce::Announcer>>,
    /// Deletions of candidate keys of this store that failed (a release, hand-over or
    /// withdrawal answered an error), sent again after the next keepalive of any session of
    /// this store (see [`Inner::leave`]).
    left: Mutex<Vec<Left>>,
    /// Held by the task sending `left` again: at most one at a time (released with the task,
    /// also should it panic).
    resending: Arc<AsyncMutex<()>>,
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
            Ok(Err(e)) => return Err(map_connect_error(&endpoints, config.cert.is_some(), &e)),
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
                left: Mutex::default(),
                resending: Arc::default(),
            }),
        })
    }

    /// The configuration (its `Debug` and `Display` redact the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// Grants a queued candidate that has become first in one transaction, needing no answer
    /// to any earlier request: so that it works even when replies are lost (the engine then
    /// settles the outcome by reading back).
    ///
    /// The promise needs the key to live a TTL from a moment after the request began. Instead of
    /// a confirmed keepalive of the shared session, the transaction binds the key to a fresh etcd
    /// lease, granted (with an id chosen here) as this request begins: if the transaction
    /// applies, that lease exists, and it was granted after this request began.
    ///
    /// etcd does not apply two requests in the order they were sent: the transaction often
    /// arrives before its lease exists and fails ("lease not found"; measured here in 35-58% of
    /// single tries). So it is sent again: once the lease grant is confirmed (then it finds the
    /// lease), and, while the grant's answer has not come (replies may be lost), a few times in
    /// the first fraction of a second without waiting for any answer. Each copy is the same
    /// compare-and-set on the key's place and the term's history key, so at most one applies;
    /// a copy that finds the key already bound to this request's lease knows an earlier copy
    /// applied. `None`: not first, or the fresh lease could not be granted; the caller takes
    /// the ordinary path.
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
        let begun = Instant::now();
        // A copy of this transaction may apply at any later moment (copies left unanswered,
        // or a dropped call), rebinding the key to the fresh lease: a grant on release of this
        // key counts from no later than now (see `Inner::one_shot_began`).
        inner
            .one_shots
            .lock()
            .expect("one-shots lock")
            .entry(own.to_string())
            .and_modify(|(p, at)| {
                if p.rev != position.rev || begun.saturating_duration_since(*at) >= one_shot_reach(p.ttl_secs) {
                    (*p, *at) = (position, begun);
                }
            })
            .or_insert((position, begun));
        // Spawned: the lease must be granted even if this call is dropped with copies of the
        // transaction under way.
        let mut lease_grant = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let mut client = inner.client();
                let options = etcd_client::LeaseGrantOptions::new().with_id(private);
                let limit = inner.config.timeout;
                inner
                    .call_shared("lease grant", limit, async move {
                        client.lease_grant(ttl_secs, Some(options)).await
                    })
                    .await
            })
        };
        let rev = position.rev;
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.to_string(), CompareOp::Equal, rev),
                // Every candidate key was created at or after ours: we are first.
                Compare::create_revision(keys.candidates(), CompareOp::Greater, rev - 1).with_prefix(),
                Compare::create_revision(keys.started(rev), CompareOp::Equal, 0),
                // A handed-over lease goes to its successor only (see `acquire`).
                Compare::create_revision(keys.reserved(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    own.to_string(),
                    candidate_value(request.ttl),
                    Some(PutOptions::new().with_lease(private)),
                ),
                TxnOp::put(keys.started(rev), started_value(&request.candidate), None),
                TxnOp::put(
                    keys.granted(),
                    granted_value(rev, request.ttl, &request.candidate),
                    None,
                ),
            ])
            .or_else([TxnOp::get(own.to_string(), None)]);
        let send = || {
            let mut client = inner.kv();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        };
        let mut answers = FuturesUnordered::new();
        answers.push(send());
        let mut resends = ONE_SHOT_RESENDS.iter().map(|after| begun + *after);
        let mut next_resend = resends.next();
        // `None` while the lease grant is unanswered; then whether etcd confirmed it.
        let mut lease: Option<bool> = None;
        // A copy answered that the lease was not there (yet).
        let mut not_yet = false;
        // A copy was sent after etcd confirmed the lease: it finds the lease unless it is gone.
        let mut sent_after_grant = false;
        let granted = loop {
            tokio::select! {
                Some(answer) = answers.next() => match answer {
                    Ok(resp) => break resp.succeeded() || applied_before(&resp, rev, private),
                    Err(e) if lease_gone(&e) => {
                        not_yet = true;
                        if lease == Some(true) && !sent_after_grant {
                            sent_after_grant = true;
                            answers.push(send());
                        } else if lease.is_some() && answers.is_empty() {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Err(map_error("acquire (grant)", &inner.endpoints, &e)),
                },
                joined = &mut lease_grant, if lease.is_none() => {
                    let confirmed = matches!(joined, Ok(Ok(Some(_))));
                    lease = Some(confirmed);
                    next_resend = None;
                    if confirmed && (not_yet || answers.is_empty()) {
                        sent_after_grant = true;
                        answers.push(send());
                    } else if answers.is_empty() {
                        return Ok(None);
                    }
                },
                () = tokio::time::sleep_until(next_resend.unwrap_or(begun)), if next_resend.is_some() => {
                    answers.push(send());
                    next_resend = resends.next();
                },
                else => return Ok(None),
            }
        };
        if !granted {
            return Ok(None);
        }
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

    /// Takes the candidate's place in the queue (a key already there stays, with its place) and
    /// reads who is first, in one transaction. A session that etcd no longer knows is replaced
    /// by a new one.
    async fn enqueue(&self, keys: &Keys, own: &str, request: &AcquireRequest) -> Result<Queued> {
        let inner = &self.inner;
        let retired_before = inner.retired(own);
        let ttl_secs = session_ttl_secs(request.ttl);
        let mut session = inner.session(ttl_secs).await?;
        let queue = |session: i64| {
            let [a, b, c, d] = Snapshot::reads(keys);
            let put = TxnOp::put(
                own.to_string(),
                candidate_value(request.ttl),
                Some(PutOptions::new().with_lease(session)),
            );
            Txn::new()
                .when([Compare::create_revision(own.to_string(), CompareOp::Equal, 0)])
                .and_then([put, a, b, c, d])
                .or_else({
                    let [a, b, c, d] = Snapshot::reads(keys);
                    [TxnOp::get(own.to_string(), None), a, b, c, d]
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
        let private = inner.private.lock().expect("private lock").contains(&lease);
        Ok(Queued {
            session,
            snapshot,
            rev,
            lease,
            private,
            retired: rev <= retired_before,
        })
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

    /// The candidate keys queued ahead of revision `rev`, with their create_revisions. A
    /// successor taking a reservation deletes them in its grant, so that no key created before
    /// its term is ever granted after it (terms keep increasing); their candidates find their
    /// place gone and queue again, behind it. Keys ahead only ever leave (new keys queue
    /// behind), so the take compares each one still there.
    async fn keys_ahead(&self, keys: &Keys, rev: i64) -> Result<Vec<(String, i64)>> {
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_keys_only();
        let resp = self
            .inner
            .get("acquire (keys ahead)", keys.candidates(), Some(options))
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.create_revision()))
            .collect())
    }

    /// One transaction, if the grant's key is still there: delete it, end its term as handed
    /// over, and put the reservation naming `to`, bound to an etcd lease granted just before
    /// with the grant's TTL and never kept alive (etcd deletes an untaken reservation after it).
    /// Also how an acquire that finds its own key granted before hands the term to itself: a
    /// failure there is not sent again (see [`Inner::leave`]), since the engine may lead on that
    /// key (adopted by a read-back while that acquire ran late), and only the reservation for
    /// itself keeps others out when the key goes.
    async fn hand_over_key(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let inner = &self.inner;
        let keys = self.keys(&grant.lease);
        let own = keys.candidate(&grant.holder);
        let Ok(term) = i64::try_from(grant.term.0) else {
            return Ok(());
        };
        inner.write_records_due(&keys, &own, grant.term).await?;
        let ttl_secs = session_ttl_secs(grant.ttl);
        let mut client = inner.client();
        let lease = inner
            .call("hand_over (lease grant)", async move {
                client.lease_grant(ttl_secs, None).await
            })
            .await?
            .id();
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.clone(), CompareOp::Equal, term),
                Compare::create_revision(keys.reserved(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::delete(own.clone(), None),
                TxnOp::put(keys.ended(term), ended_value(EndReason::HandedOver), None),
                TxnOp::put(
                    keys.reserved(),
                    reserved_value(to, term, grant.ttl),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        // On an unknown outcome the fresh lease is left alone: the reservation may be bound to it.
        inner.retire(&own, term);
        let handed = inner.txn("hand_over", txn).await?.succeeded();
        if handed {
            inner.publish(&own, None);
        } else {
            // Not held any more: nothing is handed over, and the fresh lease binds nothing.
            let mut client = inner.client();
            let _ = client.lease_revoke(lease).await;
        }
        Ok(())
    }

    fn keys(&self, lease: &LeaseName) -> Keys {
        Keys::new(&self.inner.config.prefix, lease)
    }
}

impl Inner {
    fn place<T>(&self, own: &str, f: impl FnOnce(&mut Place) -> T) -> T {
        let mut positions = self.positions.lock().expect("positions lock");
        if let Some(place) = positions.get_mut(own) {
            return f(place); // the common case: no key copied
        }
        let place = positions.entry(own.to_string()).or_insert_with(|| Place {
            position: watch::channel(None).0,
            retired: 0,
            acquires: 0,
            asked: Duration::ZERO,
            records_due: None,
        });
        f(place)
    }

    fn position(&self, own: &str) -> watch::Sender<Option<Position>> {
        self.place(own, |place| place.position.clone())
    }

    /// Tells the candidate's change stream where its key stands. A place the store has begun
    /// to delete is published as none (see [`Inner::retire`]).
    fn publish(&self, own: &str, position: Option<Position>) {
        self.place(own, |place| {
            let position = position.filter(|p| p.rev > place.retired);
            place.position.send_if_modified(|p| {
                let changed = *p != position;
                *p = position;
                changed
            });
        });
    }

    /// The key `own` created at `rev` is about to be deleted by this store: its place is no
    /// longer published, from now on. An operation still under way that read the key before
    /// (a late acquire, a renewal) would otherwise publish it again once the deletion is
    /// done, and its change stream would wait in a place that no longer exists: on that
    /// place's predecessor's release it would be granted on release (no request) a deleted
    /// key's term, beside the candidate truly next (two leaders; review test
    /// `review_release.rs`). A key of this store found at or below it is stale (`enqueue`).
    fn retire(&self, own: &str, rev: i64) {
        self.place(own, |place| {
            place.retired = place.retired.max(rev);
            if place.position.borrow().is_some_and(|p| p.rev <= rev) {
                place.position.send_replace(None);
            }
        });
    }

    /// The greatest create_revision of `own` this store has begun to delete (0: none).
    fn retired(&self, own: &str) -> i64 {
        let positions = self.positions.lock().expect("positions lock");
        positions.get(own).map_or(0, |place| place.retired)
    }

    /// The change stream of `own` found its key first at `position` by waiting (its
    /// predecessor released while first): the grant of that turn, its place published as
    /// granted, and its records due. `None` when the store has begun to delete the key.
    pub(crate) fn take_turn(&self, keys: &Keys, own: &str, holder: &CandidateId, position: Position) -> Option<Grant> {
        self.place(own, |place| {
            if position.rev <= place.retired || *place.position.borrow() != Some(position) {
                return None;
            }
            let rev = position.rev;
            place.records_due = Some(RecordsDue {
                rev,
                ttl: place.asked,
                holder: holder.clone(),
            });
            place.position.send_replace(Some(Position {
                granted: true,
                ..position
            }));
            Some(Grant {
                lease: keys.lease.clone(),
                holder: holder.clone(),
                term: Term(u64::try_from(rev).unwrap_or(0)),
                ttl: place.asked,
                token: rev.to_string(),
            })
        })
    }

    /// When a one-shot grant of `own` at `position` began, if one may still apply: a copy left
    /// unanswered may bind the key to its own lease, granted after that one-shot began, at any
    /// later moment (also once a release has made the key first): a turn of that key counts from
    /// no later than this.
    pub(crate) fn one_shot_began(&self, own: &str, position: Position) -> Option<Instant> {
        let one_shots = self.one_shots.lock().expect("one-shots lock");
        one_shots
            .get(own)
            .filter(|(p, began)| p.rev == position.rev && began.elapsed() < one_shot_reach(p.ttl_secs))
            .map(|(_, began)| *began)
    }

    /// Writes the records of the turn of `own` at `term` (its history entry and its
    /// announcement), if they are due: one transaction, only while the key is still the one
    /// granted and no other request wrote them. A key gone meanwhile leaves nothing due (the
    /// request that follows finds it gone).
    async fn write_records_due(&self, keys: &Keys, own: &str, term: Term) -> Result<()> {
        let due = self.place(own, |p| p.records_due.clone());
        let Some(due) = due.filter(|d| u64::try_from(d.rev).ok() == Some(term.0)) else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.to_string(), CompareOp::Equal, due.rev),
                Compare::create_revision(keys.started(due.rev), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(keys.started(due.rev), started_value(&due.holder), None),
                TxnOp::put(keys.granted(), granted_value(due.rev, due.ttl, &due.holder), None),
            ]);
        self.txn("renew (records)", txn).await?;
        self.place(own, |p| p.records_due.take_if(|d| d.rev == due.rev));
        Ok(())
    }

    /// `snapshot` as this store may show it: an error (transient) when its holder is a key this
    /// store has begun to delete (see [`Inner::retire`]). A deletion that failed leaves such a
    /// key in place until it is sent again (see [`Inner::leave`]); shown as holder, the engine's
    /// read-back could adopt its term (an acquire of the same candidate whose answer was lost)
    /// and lead on a key that the resent deletion then deletes under it (review finding).
    pub(crate) fn unretired(&self, keys: &Keys, lease: &LeaseName, snapshot: Snapshot) -> Result<Snapshot> {
        let Some(holder) = snapshot.holder() else {
            return Ok(snapshot);
        };
        if self.retired(&keys.candidate(&holder.id)) >= holder.rev {
            return Err(Error::unreachable(
                STORE,
                format!(
                    "the holder of {lease} (term {}) is a key this store is deleting (a release, hand-over or withdrawal that failed is sent again): look again",
                    holder.rev
                ),
            ));
        }
        Ok(snapshot)
    }

    /// A deletion of one of this store's candidate keys failed (`txn` is its [`close_key`], or
    /// the withdrawal itself when its read failed): the key may be left on a session that the
    /// store's other elections keep alive, where it would hold the lease, or keep the candidates
    /// behind it waiting, for as long (a release that did not free the lease must leave it to
    /// expire after its TTL; a withdrawn candidate must not stay queued). The engine does not ask again (it has stopped), so `txn` is sent
    /// again after the next keepalive of a session of this store, until etcd answers it (a
    /// withdrawal only while its candidate has not campaigned again). Safe at
    /// any later moment: the key was retired (never adopted or granted by this store again, see
    /// [`Inner::retire`]), and the compare of its create_revision leaves a key made later alone.
    /// Without a keepalive there is no session to keep the key either.
    fn leave(&self, txn: Left) {
        let mut left = self.left.lock().expect("left lock");
        if left.len() >= MAX_LEFT {
            left.remove(0);
        }
        left.push(txn);
    }

    /// After a keepalive: sends the deletions that failed (see [`Inner::leave`]) once more, in a
    /// task of its own (the keepalive's waiters, leaders' renewals among them, do not wait for
    /// it; at most one such task at a time), each bounded by `limit`; one that fails again is
    /// kept for the next keepalive.
    pub(crate) fn delete_left(self: &Arc<Self>, limit: Duration) {
        if self.left.lock().expect("left lock").is_empty() {
            return;
        }
        let Ok(resending) = self.resending.clone().try_lock_owned() else {
            return;
        };
        let inner = self.clone();
        tokio::spawn(async move {
            let _resending = resending;
            let left = std::mem::take(&mut *inner.left.lock().expect("left lock"));
            for left in left {
                match left {
                    Left::Close(txn) => {
                        let mut client = inner.kv();
                        let again = txn.clone();
                        let sent = inner
                            .call_shared("delete (left key)", limit, async move { client.txn(again).await })
                            .await;
                        if let Err(error) = sent {
                            tracing::debug!(%error, "deleting a candidate key left by a failed deletion failed; again after the next keepalive");
                            inner.leave(Left::Close(txn));
                        }
                    }
                    // Left again by itself when it fails again.
                    Left::Withdraw { keys, key, acquires } => {
                        if inner.place(&key, |p| p.acquires) == acquires {
                            let _ = inner.withdraw_key(&keys, key, acquires).await;
                        }
                    }
                }
            }
        });
    }

    /// Withdraws the candidate key `key`: reads it, retires it and closes it (see [`close_key`]).
    /// When a request fails the withdrawal is left to be made again (see [`Inner::leave`]): a
    /// withdrawal that did not delete the key would leave it queued on a session the store's
    /// other elections keep alive. `acquires`: the candidate's acquires begun before it.
    async fn withdraw_key(&self, keys: &Keys, key: String, acquires: u64) -> Result<()> {
        let own = match self.get("withdraw", key.clone(), None).await {
            Ok(own) => own,
            Err(e) => {
                self.leave(Left::Withdraw {
                    keys: keys.clone(),
                    key,
                    acquires,
                });
                return Err(e);
            }
        };
        let Some(rev) = own.kvs().first().map(KeyValue::create_revision) else {
            return Ok(());
        };
        self.retire(&key, rev);
        let txn = close_key(keys, key, rev);
        if let Err(e) = self.txn("withdraw", txn.clone()).await {
            self.leave(Left::Close(txn));
            return Err(e);
        }
        Ok(())
    }

    pub(crate) async fn snapshot(&self, keys: &Keys, operation: &'static str) -> Result<Snapshot> {
        let resp = self
            .read_txn(operation, Txn::new().and_then(Snapshot::reads(keys)))
            .await?;
        Snapshot::parse(keys, &resp.op_responses(), 0)
    }
}

/// Deletes the candidate key `key` if it is still the one created at `rev`, and ends a term
/// granted to it (if any, and not ended yet) as expired: a withdrawal, and what is sent again
/// for a deletion that failed (see [`Inner::leave`]). A term granted to this key whose answer
/// never reached the engine ends here too.
fn close_key(keys: &Keys, key: String, rev: i64) -> Txn {
    let close = Txn::new()
        .when([
            Compare::create_revision(keys.started(rev), CompareOp::Greater, 0),
            Compare::create_revision(keys.ended(rev), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(keys.ended(rev), ended_value(EndReason::Expired), None)]);
    Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None), TxnOp::txn(close)])
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
    /// Whether that lease is one of a one-shot grant.
    private: bool,
    /// Whether this store had begun to delete the key before the acquire began (see
    /// `Inner::retire`): a deletion that failed or whose outcome is unknown, its key still there.
    retired: bool,
}

impl Queued {
    /// A key that may be granted: bound to this store's session (or a one-shot lease of it) and
    /// not granted before. A key of another session is an earlier incarnation of this
    /// candidate (its leadership has ended) or another process using the same id; a key
    /// granted before means that leadership ended (the engine asks again only then). Either
    /// must go, and the candidate queue afresh with a new term.
    fn is_stale(&self) -> bool {
        let foreign = self.lease != self.session && !self.private;
        foreign || self.retired || self.granted_before()
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
        inner.place(&own, |p| {
            p.acquires += 1;
            p.asked = request.ttl;
        });
        let queued = (*inner.position(&own).borrow()).filter(|p| !p.granted && p.ttl_secs == ttl_secs);
        if let Some(position) = queued
            && let Some(grant) = self.grant_in_one_shot(&keys, &own, request, position).await?
        {
            return Ok(Acquired::Granted(grant));
        }
        let mut queued = self.enqueue(&keys, &own, request).await?;
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
                Box::pin(self.hand_over_key(&term, &request.candidate)).await?;
            } else {
                let clear = end_term(&keys, &own, queued.rev, &queued.snapshot, EndReason::Expired);
                inner.retire(&own, queued.rev);
                inner.txn("acquire (requeue)", clear).await?;
            }
            queued = self.enqueue(&keys, &own, request).await?;
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
                ahead = self.keys_ahead(&keys, queued.rev).await?;
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
        // keepalive sent after `started` must be confirmed.
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
            let again = self.keys_ahead(&keys, rev).await?;
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
        let resp = match self.inner.txn("release", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                self.inner.leave(Left::Close(close_key(&keys, own, term)));
                return Err(e);
            }
        };
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

    // `EtcdStore::hand_over_key`; when it fails, the key is ended later (see `Inner::leave`).
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let handed = self.hand_over_key(grant, to).await;
        if handed.is_err()
            && let Ok(term) = i64::try_from(grant.term.0)
        {
            let keys = self.keys(&grant.lease);
            let own = keys.candidate(&grant.holder);
            self.inner.retire(&own, term);
            self.inner.leave(Left::Close(close_key(&keys, own, term)));
        }
        handed
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let keys = self.keys(lease);
        let key = keys.candidate(candidate);
        self.inner.place(&key, |p| p.records_due = None);
        self.inner.publish(&key, None);
        let acquires = self.inner.place(&key, |p| p.acquires);
        self.inner.withdraw_key(&keys, key, acquires).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let keys = self.keys(lease);
        let snapshot = self.inner.snapshot(&keys, "inspect").await?;
        Ok(self.inner.unretired(&keys, lease, snapshot)?.observation(lease))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.list_leases(prefix).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.queued_candidates(lease).await
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
        let snapshot = self.inner.snapshot(&keys, "break_lease").await?;
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
