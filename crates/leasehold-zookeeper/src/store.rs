//! The [`LeaseStore`] over ZooKeeper: a FIFO queue of ephemeral sequential znodes per lease.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant,
    LeaseName, LeaseStore, Notifications, Observation, Operation, Renewed, Result, Term, Transition, random_u64,
};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::error::{Failed, STORE, during, zk_error};
use crate::queue::{Ahead, Ending, GrantOutcome};
use crate::record::{HistoryRecord, ReservationRecord, history_name, holder_observation};

/// How many terms of history are kept per lease; older `history/` znodes are deleted.
pub const HISTORY_LIMIT: usize = 1000;

/// The longest queue ahead of a candidate for which `acquire` first tries the one-request grant.
const FAST_GRANT_MAX_AHEAD: usize = 8;

/// A lease store on a ZooKeeper ensemble.
///
/// Each lease is a znode `{chroot}/{lease}` with two children: `candidates/`, where every
/// campaigning candidate holds an ephemeral sequential znode (the lowest sequence leads, as in
/// Curator's `LeaderLatch`), and `history/`, one persistent znode per term. The term of a grant is
/// the leader znode's `czxid`, which only grows, also across restarts of the ensemble.
///
/// A store keeps one ZooKeeper session per distinct TTL (the session timeout *is* the TTL: the
/// server deletes a silent holder's znode when its session expires). Sessions are opened on first
/// use and replaced after they expire. See the [crate docs](crate) for the whole design.
///
/// # Cancel safety
///
/// The engine runs every call to completion (or a TTL). A caller that drops one half-way leaves
/// no half-written lease: a grant, an end of term and a handover are each one `multi`
/// transaction. A dropped `acquire` may leave the candidate's znode queued (the next `acquire`
/// of the candidate reuses it, its `withdraw` deletes it) or a grant nobody heard of (a
/// read-back adopts it; the candidate's next `acquire` ends it and queues a new znode). History
/// tidying after a grant runs in a task of its own and is best effort.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_zookeeper::ZookeeperStore;
///
/// # async fn demo() -> leasehold_core::Result<()> {
/// let store = Arc::new(ZookeeperStore::connect("zk://127.0.0.1:2181/myapp").await?);
/// let elector = Elector::builder(store, "invoice-scheduler").ttl(Duration::from_secs(6)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZookeeperStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZookeeperConfig,
    pub(crate) ttl_range: RangeInclusive<Duration>,
    /// Distinguishes this store's candidate znodes from another process's with the same id.
    pub(crate) nonce: u64,
    /// One session slot per TTL in milliseconds.
    pub(crate) sessions: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Option<zk::Client>>>>>,
    /// Bumped whenever a session is opened (announcement streams follow the store's sessions).
    pub(crate) sessions_opened: watch::Sender<u64>,
    pub(crate) candidates: Mutex<HashMap<(LeaseName, CandidateId), Candidate>>,
    /// Candidate znodes of this store's sessions that have expired on the client's side: the
    /// server may keep them for up to a session timeout more, and nobody may adopt them.
    pub(crate) dead: Mutex<HashSet<String>>,
    /// Per session and lease: the persistent watch on the lease's `leader/` announcements, kept
    /// for as long as the session lives once someone asked for the lease's announcements.
    pub(crate) leader_watches: Mutex<HashMap<(i64, LeaseName), crate::announce::LeaderWatch>>,
    /// Znodes left by a deletion that failed, sent again on their session (see [`crate::left`]).
    pub(crate) left: Mutex<Vec<crate::left::LeftNode>>,
    /// Per session that left a znode: the task that sends its deletions again.
    pub(crate) resenders: Mutex<HashMap<i64, crate::left::Resender>>,
}

/// What this store knows about one candidate's place in one lease's queue.
pub(crate) struct Candidate {
    pub(crate) node: Option<OwnNode>,
    /// Whether a change stream was asked for: the candidate then waits to be handed the lease.
    pub(crate) waiting: bool,
    /// Bumped whenever `node` changes, so a change stream re-reads it.
    pub(crate) changed: watch::Sender<u64>,
    /// Serialises `acquire` and `withdraw`: the withdrawal of a dropped campaign may run while
    /// the same candidate campaigns again, and must not delete the new campaign's grant.
    pub(crate) ops: Arc<tokio::sync::Mutex<()>>,
    /// A znode of this candidate, not in `node`, that a read of this store showed holding the
    /// lease: a read-back may have adopted it (an acquire whose reply was lost was granted), so
    /// a withdrawal keeps it; the adopting campaign releases it.
    pub(crate) shown: Option<String>,
}

impl Candidate {
    fn new() -> Self {
        Candidate {
            node: None,
            waiting: false,
            changed: watch::channel(0).0,
            ops: Arc::default(),
            shown: None,
        }
    }
}

#[derive(Clone)]
pub(crate) struct OwnNode {
    pub(crate) name: String,
    pub(crate) czxid: i64,
    pub(crate) session: i64,
    pub(crate) client: zk::Client,
    /// The znodes ahead of it in the last listing that showed it (for the one-request grant).
    pub(crate) ahead: Vec<String>,
    /// Whether `acquire` has answered `Granted` on this znode: a later acquire means that
    /// leadership ended, and a new term needs a new znode.
    pub(crate) granted: bool,
}

impl fmt::Debug for ZookeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperStore")
            .field("config", &self.inner.config)
            .field("ttl_range", &self.inner.ttl_range)
            .finish_non_exhaustive()
    }
}

/// A task that is aborted when its handle is dropped.
pub(crate) struct AbortOnDrop<T = ()>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Waits until the task ends: its output, or `None` when it panicked.
    pub(crate) async fn wait(&mut self) -> Option<T> {
        (&mut self.0).await.ok()
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ZookeeperStore {
    /// Connects to the ensemble named by a `zk://` URL (see [`ZookeeperConfig`]).
    ///
    /// Probes (once per process and ensemble) the session timeouts the server grants, which
    /// become [`Capabilities::ttl`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a bad URL (an unknown option is named); [`Error::Unreachable`]
    /// when no server opens a session, saying for each host whether it does not resolve,
    /// refused the connection or did not answer; [`Error::Refused`] when ZooKeeper refuses the
    /// credentials or a host answers another protocol.
    pub async fn connect(url: &str) -> Result<ZookeeperStore> {
        ZookeeperStore::from_config(ZookeeperConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration. See [`ZookeeperStore::connect`].
    ///
    /// # Errors
    ///
    /// As [`ZookeeperStore::connect`].
    pub async fn from_config(config: ZookeeperConfig) -> Result<ZookeeperStore> {
        let ttl_range = crate::session::ttl_range(&config).await?;
        Ok(ZookeeperStore {
            inner: Arc::new(Inner {
                config,
                ttl_range,
                nonce: random_u64(),
                sessions: Mutex::default(),
                sessions_opened: watch::channel(0).0,
                candidates: Mutex::default(),
                dead: Mutex::default(),
                leader_watches: Mutex::default(),
                left: Mutex::default(),
                resenders: Mutex::default(),
            }),
        })
    }

    /// The configuration (its `Debug` and `Display` redact passwords).
    pub fn config(&self) -> &ZookeeperConfig {
        &self.inner.config
    }

    /// The session timeouts the ensemble grants: the TTLs this store accepts.
    pub fn ttl_range(&self) -> RangeInclusive<Duration> {
        self.inner.ttl_range.clone()
    }
}

impl Inner {
    pub(crate) fn own(&self, lease: &LeaseName, candidate: &CandidateId) -> Option<OwnNode> {
        lock(&self.candidates)
            .get(&(lease.clone(), candidate.clone()))
            .and_then(|c| c.node.clone())
    }

    pub(crate) fn set_own(&self, lease: &LeaseName, candidate: &CandidateId, node: Option<OwnNode>) {
        let mut candidates = lock(&self.candidates);
        let entry = candidates
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new);
        entry.node = node;
        entry.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn subscribe(&self, lease: &LeaseName, candidate: &CandidateId) -> watch::Receiver<u64> {
        let mut candidates = lock(&self.candidates);
        let entry = candidates
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new);
        entry.waiting = true;
        entry.changed.subscribe()
    }

    /// The lock that serialises this candidate's acquires and withdrawals.
    pub(crate) fn ops(&self, lease: &LeaseName, candidate: &CandidateId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.candidates)
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new)
            .ops
            .clone()
    }

    /// The znode of this candidate, not cached, that a read showed holding the lease.
    pub(crate) fn shown(&self, lease: &LeaseName, candidate: &CandidateId) -> Option<String> {
        lock(&self.candidates)
            .get(&(lease.clone(), candidate.clone()))
            .and_then(|c| c.shown.clone())
    }

    pub(crate) fn is_waiting(&self, lease: &LeaseName, candidate: &CandidateId) -> bool {
        lock(&self.candidates)
            .get(&(lease.clone(), candidate.clone()))
            .is_some_and(|c| c.waiting)
    }
}

#[async_trait]
impl LeaseStore for ZookeeperStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: self.inner.ttl_range.clone(),
            expiry: Expiry::ServerSession,
            notifications: Notifications::ReleaseAndExpiry,
            announces: leasehold_core::Announces::Grants,
            fifo: true,
        }
    }

    fn can_break(&self) -> bool {
        true
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.try_acquire(request)
            .await
            .map_err(|e| during(e, Operation::Acquire, &format_args!("lease {}", request.lease)))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.try_renew(grant)
            .await
            .map_err(|e| during(e, Operation::Renew, &format_args!("lease {}", grant.lease)))
    }

    /// One `sync` and one multi-read per session (one session per TTL) for all the grants,
    /// in chunks that fit ZooKeeper's request size; each answer as [`renew`](LeaseStore::renew)
    /// of that grant gives it (a failed request fails each of its grants, as renew would).
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        Ok(self.try_renew_many(grants).await)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let released = self.try_release(grant).await;
        if released.is_err() {
            self.leave_grant(grant).await;
        }
        released.map_err(|e| during(e, Operation::Release, &format_args!("lease {}", grant.lease)))
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        // Not from the acquire's own hand-over to its candidate (`retire_granted`): the engine
        // may lead on that znode; its next acquire retires it again.
        let handed = self.try_hand_over(grant, to).await;
        if handed.is_err() {
            self.leave_grant(grant).await;
        }
        handed.map_err(|e| during(e, Operation::HandOver, &format_args!("lease {}", grant.lease)))
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.try_withdraw(lease, candidate)
            .await
            .map_err(|e| during(e, Operation::Withdraw, &format_args!("lease {lease}")))
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let inspected = async {
            let client = self.inner.reader().await?;
            self.inner.observe(&client, lease).await
        };
        inspected
            .await
            .map_err(|e| during(e, Operation::Inspect, &format_args!("lease {lease}")))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.try_history(lease, limit)
            .await
            .map_err(|e| during(e, Operation::History, &format_args!("lease {lease}")))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.inner
            .list(prefix)
            .await
            .map_err(|e| during(e, Operation::List, &format_args!("the leases starting with {prefix:?}")))
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.inner
            .queued_candidates(lease)
            .await
            .map_err(|e| during(e, Operation::Candidates, &format_args!("lease {lease}")))
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(Some(crate::changes::changes(self.inner.clone(), lease, candidate)))
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.announced(lease).await.map(Some)
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.try_break_lease(lease)
            .await
            .map_err(|e| during(e, Operation::BreakLease, &format_args!("lease {lease}")))
    }
}

impl ZookeeperStore {
    /// A release or hand-over of `grant` answered an error: its znode may be left on the
    /// grant's session, which the store keeps; it is retired and deleted again on that
    /// session (see [`crate::left`]). The engine has stopped leading on it.
    async fn leave_grant(&self, grant: &Grant) {
        let Some(client) = self.inner.existing_session(grant.ttl).await else {
            return; // the session is gone, and the znode with it
        };
        self.inner.leave(
            crate::left::LeftNode {
                lease: grant.lease.clone(),
                candidate: grant.holder.clone(),
                name: grant.token.clone(),
                czxid: grant.term.0 as i64,
                session: client.session_id().0,
            },
            &client,
        );
    }
}

/// The operations, each one pass of requests: an answer or an error, never a retry (the engine
/// retries, reading back first). Errors are named by operation in the [`LeaseStore`] impl.
impl ZookeeperStore {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let inner = &self.inner;
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let (lease, candidate, ttl) = (&request.lease, &request.candidate, request.ttl);
        let ops = inner.ops(lease, candidate);
        let _serial = ops.lock().await;
        let client = inner.session(ttl).await?;
        let session = client.session_id().0;
        let prefix = inner.prefix(candidate);
        let mut own = inner.own(lease, candidate).filter(|n| n.session == session);
        if let Some(node) = own
            .as_ref()
            .filter(|n| !n.granted && n.ahead.len() <= FAST_GRANT_MAX_AHEAD)
        {
            // One request that is applied even when its reply is lost: grant if every znode
            // that was ahead of ours is gone.
            if let GrantOutcome::Granted = inner.grant(&client, lease, node, candidate, 0).await? {
                return Ok(inner.granted(lease, candidate, node.clone(), ttl, &client, false).await);
            }
        }
        if let Some(node) = own.take_if(|n| n.granted) {
            // A new term needs a new znode. A garbage record is an error before anything
            // changes, as everywhere.
            if inner.read_candidate(&client, lease, &node.name).await?.is_some() {
                self.retire_granted(request, &node.name, node.czxid).await?;
            }
            inner.set_own(lease, candidate, None);
        }
        // Take a place in the queue first: that request is applied even if its reply is lost,
        // so a release can hand the lease over to us.
        let own = match own {
            Some(own) => own,
            None => {
                let (own, created) = inner.enqueue(&client, lease, candidate, ttl, &prefix).await?;
                if created {
                    // A new lease, with our znode alone in its queue: grant at once.
                    if let GrantOutcome::Granted = inner.grant(&client, lease, &own, candidate, 0).await? {
                        return Ok(inner.granted(lease, candidate, own, ttl, &client, true).await);
                    }
                }
                own
            }
        };
        let mut queue = inner.queue(&client, lease).await?.unwrap_or_default();
        // Other znodes of ours: requests whose replies were lost. One of them may even have been
        // adopted by a read-back; none may be granted again. One that was granted is handed over
        // to this candidate itself (the lease stays ours, reserved); the others are deleted.
        // Either way the rest of this listing stays valid without them.
        let stale: Vec<String> = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && c.name != own.name && !inner.is_dead(lease, &c.name))
            .map(|c| c.name.clone())
            .collect();
        for name in &stale {
            let Some((_, stat)) = inner.read_candidate(&client, lease, name).await? else {
                continue;
            };
            if inner
                .read_history(&client, lease, Term(stat.czxid as u64))
                .await?
                .is_some()
            {
                // Granted: a read-back may have adopted it. Handed over to this candidate (its
                // znode deleted, the lease reserved for us): this acquire takes it below.
                self.retire_granted(request, name, stat.czxid).await?;
            } else {
                inner.delete_own(&client, lease, name).await?;
            }
        }
        queue.retain(|c| !stale.contains(&c.name));
        let (own, queue, position) = match queue.iter().position(|c| c.name == own.name) {
            Some(position) => (own, queue, position),
            None => {
                // Our znode was deleted by someone else (broken by an operator): queue again.
                // The new znode sorts after every listed one, so its place needs a new listing.
                inner.set_own(lease, candidate, None);
                let (own, _) = inner.enqueue(&client, lease, candidate, ttl, &prefix).await?;
                let queue = inner.queue(&client, lease).await?.unwrap_or_default();
                let Some(position) = queue.iter().position(|c| c.name == own.name) else {
                    inner.set_own(lease, candidate, None);
                    return Err(deleted_meanwhile(&own.name));
                };
                (own, queue, position)
            }
        };
        // The head: the first of the znodes up to ours that still exists (a garbage record is an
        // error, whoever's it is); and whether the lease is reserved for a handover's successor.
        let (head, reservation) = tokio::join!(
            inner.head(&client, lease, &queue[..=position]),
            inner.read_reservation(&client, lease)
        );
        let Some((first, record, stat)) = head? else {
            inner.set_own(lease, candidate, None);
            return Err(deleted_meanwhile(&own.name));
        };
        if let Some(reservation) = reservation? {
            let ahead = queue[first..position].iter().map(|c| c.name.clone()).collect();
            let own = OwnNode { ahead, ..own };
            return self
                .acquire_reserved(request, &client, own, first == position, stat.version, &reservation)
                .await;
        }
        if first < position {
            let ahead = queue[first..position].iter().map(|c| c.name.clone()).collect();
            inner.set_own(lease, candidate, Some(OwnNode { ahead, ..own }));
            return Ok(Acquired::Held(holder_observation(
                lease,
                &queue[first].name,
                &record,
                &stat,
            )));
        }
        // Every znode listed ahead of ours was read as gone, and none queued later sorts ahead:
        // ours heads the queue. The grant checks that it is unchanged.
        let own = OwnNode {
            ahead: Vec::new(),
            ..own
        };
        let outcome = inner.grant(&client, lease, &own, candidate, stat.version).await?;
        self.answer(request, &client, own, outcome).await
    }

    /// Ends the term of a granted znode of the candidate's own that its acquire will not use.
    /// The engine asks again once that leadership ended for it, but this may also be an acquire
    /// it gave up on, still running, while it leads on that znode: the lease must stay this
    /// candidate's (`LeaseStore::acquire`), whereas deleting the znode would give it to the next
    /// in the queue. So the term is handed over to the candidate itself, and its acquire takes
    /// the reservation with a new term; nobody else can take it meanwhile.
    /// The caller has read the znode (a garbage record is an error before anything changes).
    async fn retire_granted(&self, request: &AcquireRequest, name: &str, czxid: i64) -> Result<()> {
        let grant = Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(czxid as u64),
            ttl: request.ttl,
            token: name.to_string(),
        };
        self.try_hand_over(&grant, &request.candidate).await
    }

    /// An acquire of a reserved lease (`own.ahead`: the znodes still queued ahead of ours;
    /// `head`: ours heads the queue, at data version `version`). The successor takes it, going
    /// before them; the head of the queue takes it over when the contender names the
    /// reservation's version (it saw it unchanged for its TTL); anyone else is told who it is
    /// reserved for.
    async fn acquire_reserved(
        &self,
        request: &AcquireRequest,
        client: &zk::Client,
        own: OwnNode,
        head: bool,
        version: i32,
        reservation: &ReservationRecord,
    ) -> Result<Acquired> {
        let inner = &self.inner;
        let (lease, candidate) = (&request.lease, &request.candidate);
        if reservation.to == *candidate {
            let outcome = inner
                .take_reservation(client, lease, &own, candidate, reservation)
                .await?;
            return self.answer(request, client, own, outcome).await;
        }
        if head && request.takeover.as_deref() == Some(reservation.version().as_str()) {
            let own = OwnNode {
                ahead: Vec::new(),
                ..own
            };
            let outcome = inner
                .grant_with(
                    client,
                    lease,
                    &own,
                    candidate,
                    version,
                    Some(reservation),
                    Ahead::MustBeGone,
                )
                .await?;
            return self.answer(request, client, own, outcome).await;
        }
        inner.set_own(lease, candidate, Some(own));
        Ok(Acquired::Held(reservation.observation(lease)))
    }

    /// The answer to an acquire whose grant transaction went as `outcome`.
    async fn answer(
        &self,
        request: &AcquireRequest,
        client: &zk::Client,
        own: OwnNode,
        outcome: GrantOutcome,
    ) -> Result<Acquired> {
        let inner = &self.inner;
        let (lease, candidate) = (&request.lease, &request.candidate);
        match outcome {
            GrantOutcome::Granted => Ok(inner.granted(lease, candidate, own, request.ttl, client, false).await),
            GrantOutcome::Reserved => {
                // Reserved since it was read, or no longer the reservation read. If our own
                // earlier acquire ended it (its reply was lost), our znode holds the lease now.
                let seen = inner.observe(client, lease).await?;
                if seen
                    .holder
                    .as_ref()
                    .is_some_and(|h| h.version == own.name && !h.reserved)
                {
                    return Ok(inner.granted(lease, candidate, own, request.ttl, client, false).await);
                }
                inner.set_own(lease, candidate, Some(own));
                Ok(Acquired::Held(seen))
            }
            // grant_with makes the directory and grants again: never answered.
            GrantOutcome::NoLeaderDir => Err(Error::store(
                STORE,
                Failed::new(format!("lease {lease} has no leader/ znode")),
            )),
            GrantOutcome::NotFirst | GrantOutcome::Gone | GrantOutcome::AheadLeft(_) => {
                inner.set_own(lease, candidate, None);
                Err(deleted_meanwhile(&own.name))
            }
        }
    }

    async fn try_hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let inner = &self.inner;
        let lease = &grant.lease;
        let Some(client) = inner.existing_session(grant.ttl).await else {
            return Ok(()); // the session is gone, and the znode with it
        };
        let path = inner.candidate_path(lease, &grant.token);
        let history_path = format!("{}/{}", inner.history_dir(lease), history_name(grant.term));
        let (stat, history, dir) = tokio::join!(
            client.check_stat(&path),
            client.get_data(&history_path),
            client.check_stat(&inner.lease_dir(lease))
        );
        let Some(stat) = stat.map_err(zk_error)? else {
            inner.set_own(lease, &grant.holder, None);
            return Ok(());
        };
        if stat.czxid as u64 != grant.term.0 || stat.ephemeral_owner != client.session_id().0 {
            return Ok(()); // not our znode any more
        }
        let history = match history {
            Ok((data, stat)) => Some((HistoryRecord::decode(&data).ok(), stat.version)),
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(zk_error(e)),
        };
        let Some(dir) = dir.map_err(zk_error)? else {
            return Ok(()); // the lease's znodes are gone, ours with them
        };
        let reservation = ReservationRecord {
            to: to.clone(),
            term: grant.term,
            ttl: grant.ttl,
            generation: dir.version.wrapping_add(1),
        };
        let options = zk::CreateMode::Persistent.with_acls(inner.acls());
        let ended = match &history {
            Some((Some(record), _)) => record.clone().ended(EndReason::HandedOver),
            _ => HistoryRecord::new(grant.holder.clone()).ended(EndReason::HandedOver),
        };
        let doorbell = inner.doorbell_path(lease, to);
        // One transaction: the reservation's generation, the term ended in the history, our
        // znode deleted, the reservation created, and the successor's doorbell rung (created
        // and deleted: its change stream watches for the creation).
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
        add(writer.add_set_data(&inner.lease_dir(lease), &[], Some(dir.version)))?;
        add(writer.add_delete(&path, Some(stat.version)))?;
        match &history {
            Some((_, version)) => add(writer.add_set_data(&history_path, &ended.encode(), Some(*version)))?,
            None => add(writer.add_create(&history_path, &ended.encode(), &options))?,
        }
        add(writer.add_create(&inner.reserved_path(lease), &reservation.encode(), &options))?;
        add(writer.add_create(&doorbell, &[], &options))?;
        add(writer.add_delete(&doorbell, None))?;
        match writer.commit().await {
            Ok(_) => {}
            // Our znode went meanwhile (expired or broken): nothing to hand over.
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoNode,
            }) => {}
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                let what = match index {
                    0 => "the lease's znode changed",
                    1 => "this grant's znode was changed by someone else",
                    2 => "the term's history entry changed",
                    3 => "the lease is reserved already",
                    _ => "the successor's wake-up znode exists",
                };
                return Err(Error::store(
                    STORE,
                    Failed::new(format!(
                        "{what} while being handed over ({source}); nothing was handed over"
                    )),
                ));
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => return Err(zk_error(source)),
        }
        if inner.own(lease, &grant.holder).is_none_or(|n| n.name == grant.token) {
            inner.set_own(lease, &grant.holder, None);
        }
        Ok(())
    }

    async fn try_release(&self, grant: &Grant) -> Result<()> {
        let inner = &self.inner;
        let Some(client) = inner.existing_session(grant.ttl).await else {
            return Ok(()); // the session is gone, and the znode with it
        };
        let own = inner.own(&grant.lease, &grant.holder).filter(|n| n.name == grant.token);
        let path = inner.candidate_path(&grant.lease, &grant.token);
        let stat = match client.check_stat(&path).await.map_err(zk_error)? {
            Some(stat) => stat,
            None => {
                if own.is_some() {
                    inner.set_own(&grant.lease, &grant.holder, None);
                }
                return Ok(());
            }
        };
        if stat.czxid as u64 != grant.term.0 || stat.ephemeral_owner != client.session_id().0 {
            return Ok(()); // not our znode any more
        }
        let ending = Ending {
            node: &grant.token,
            version: 0,
            term: grant.term,
            holder: &grant.holder,
        };
        inner
            .end_term(&client, &grant.lease, &ending, EndReason::Released)
            .await?;
        if own.is_some() || inner.own(&grant.lease, &grant.holder).is_none() {
            inner.set_own(&grant.lease, &grant.holder, None);
        }
        Ok(())
    }

    async fn try_withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let inner = &self.inner;
        let ops = inner.ops(lease, candidate);
        let _serial = ops.lock().await;
        let own = inner.own(lease, candidate);
        let Some(client) = own
            .as_ref()
            .map(|n| n.client.clone())
            .filter(|c| !c.state().is_terminated())
        else {
            return self.withdraw_uncached(lease, candidate).await;
        };
        let withdrawn = self.withdraw_cached(lease, candidate, &client).await;
        if withdrawn.is_err() {
            // The cached znode may be left queued on a session the store keeps: retired, and
            // withdrawn again on that session (crate::left). A granted one is
            // kept by the withdrawal (a campaign's; only its release ends it), and so is one a
            // read showed holding the lease meanwhile (a read-back may have adopted it).
            let still = |n: &OwnNode| {
                inner
                    .own(lease, candidate)
                    .is_some_and(|c| c.name == n.name && !c.granted)
            };
            if let Some(node) = own.filter(|n| !n.granted && still(n)) {
                inner.leave(
                    crate::left::LeftNode {
                        lease: lease.clone(),
                        candidate: candidate.clone(),
                        name: node.name,
                        czxid: node.czxid,
                        session: node.session,
                    },
                    &node.client,
                );
            }
        }
        withdrawn
    }

    /// The withdrawal of a candidate with a znode cached on a live session, `client`.
    async fn withdraw_cached(&self, lease: &LeaseName, candidate: &CandidateId, client: &zk::Client) -> Result<()> {
        let inner = &self.inner;
        let prefix = inner.prefix(candidate);
        let queue = inner.queue(client, lease).await?.unwrap_or_default();
        // A campaign of the same candidate may have started (and been granted) since this one was
        // dropped: a granted znode is that campaign's, and only its release ends it.
        let current = inner.own(lease, candidate);
        let keep = current.as_ref().filter(|n| n.granted).map(|n| n.name.clone());
        let mine: Vec<String> = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && !inner.is_dead(lease, &c.name))
            .filter(|c| Some(&c.name) != keep.as_ref())
            .map(|c| c.name.clone())
            .collect();
        for name in &mine {
            inner.withdraw_node(client, lease, name).await?;
        }
        if keep.is_none() && inner.own(lease, candidate).is_some_and(|n| !n.granted) {
            inner.set_own(lease, candidate, None);
        }
        Ok(())
    }

    /// A withdrawal with no usable znode cached for the candidate. An acquire whose create was
    /// applied while its reply was lost (given up on, or the connection dropped after it) left
    /// its znode queued on one of this store's sessions, which the store keeps alive for its
    /// other leases: every later candidate would queue behind it for as long. So the lease's
    /// queue is listed and this candidate's znodes on a live session of this store are
    /// withdrawn, each on its own session, as `withdraw_node` does with a cached one. Kept: a
    /// znode cached as granted meanwhile (a renewal of an adopted grant records it) and one a
    /// read of this store showed holding the lease (a read-back may have adopted it); skipped:
    /// znodes of ended sessions (dead, or owned by no live session of ours: they go with their
    /// session). With no live session there is nothing to do, and none is opened.
    async fn withdraw_uncached(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let inner = &self.inner;
        let sessions = inner.live_sessions().await;
        let Some(reader) = sessions.first() else {
            return Ok(()); // ephemeral znodes die with their session
        };
        let prefix = inner.prefix(candidate);
        let queue = inner.queue(reader, lease).await?.unwrap_or_default();
        let current = inner.own(lease, candidate);
        let keep = current.as_ref().filter(|n| n.granted).map(|n| n.name.clone());
        let shown = inner.shown(lease, candidate);
        let mine = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && !inner.is_dead(lease, &c.name))
            .filter(|c| Some(&c.name) != keep.as_ref() && Some(&c.name) != shown.as_ref());
        for child in mine {
            let Some(stat) = reader
                .check_stat(&inner.candidate_path(lease, &child.name))
                .await
                .map_err(zk_error)?
            else {
                continue;
            };
            let Some(owner) = sessions.iter().find(|s| s.session_id().0 == stat.ephemeral_owner) else {
                continue; // an ended session's: the server deletes it
            };
            inner.withdraw_node(owner, lease, &child.name).await?;
        }
        if keep.is_none() && inner.own(lease, candidate).is_some_and(|n| !n.granted) {
            inner.set_own(lease, candidate, None);
        }
        Ok(())
    }

    async fn try_history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let inner = &self.inner;
        let client = inner.reader().await?;
        let terms = inner.history_terms(&client, lease).await?;
        let recent = &terms[terms.len().saturating_sub(limit)..];
        let records = join_all(recent.iter().map(|term| inner.read_history(&client, lease, *term))).await;
        let mut out = Vec::with_capacity(recent.len());
        for (term, record) in recent.iter().zip(records) {
            if let Some(record) = record? {
                out.push(record.transition(*term));
            }
        }
        Ok(out)
    }

    async fn try_break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let inner = &self.inner;
        let client = inner.reader().await?;
        if let Some(reservation) = inner.read_reservation(&client, lease).await? {
            // Break the reservation: the lease opens to the queue (the handed-over term ended).
            let mut writer = client.new_multi_writer();
            let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
            add(writer.add_set_data(&inner.lease_dir(lease), &[], Some(reservation.generation)))?;
            add(writer.add_delete(&inner.reserved_path(lease), None))?;
            return match writer.commit().await {
                Ok(_) => Ok(Some(reservation.term)),
                Err(zk::MultiWriteError::OperationFailed { .. }) => Err(Error::store(
                    STORE,
                    Failed::new(format!(
                        "the reservation of term {} ended while being broken, so nothing was broken; look at the lease again",
                        reservation.term
                    )),
                )),
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(zk_error(source)),
            };
        }
        let queue = inner.queue(&client, lease).await?.unwrap_or_default();
        let Some((first, record, stat)) = inner.head(&client, lease, &queue).await? else {
            return Ok(None);
        };
        let term = Term(stat.czxid as u64);
        let ending = Ending {
            node: &queue[first].name,
            version: stat.version,
            term,
            holder: &record.candidate,
        };
        if inner.end_term(&client, lease, &ending, EndReason::Broken).await? {
            return Ok(Some(term));
        }
        // The holder's znode went between the read and the break: its term ended by itself
        // (released, expired, or broken by another operator), and the lease may have passed on.
        Err(Error::store(
            STORE,
            Failed::new(format!(
                "the holder (term {term}) left while being broken, so nothing was broken; look at the lease again"
            )),
        ))
    }
}

/// Our queued znode was deleted by someone else during an acquire (an operator's
/// `break_lease`): nothing was granted; the next acquire queues again.
fn deleted_meanwhile(name: &str) -> Error {
    Error::store(
        STORE,
        Failed::new(format!(
            "this candidate's znode {name} was deleted by someone else meanwhile (a break_lease?); nothing was granted"
        )),
    )
}
