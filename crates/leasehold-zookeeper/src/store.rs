//! The [`LeaseStore`] over ZooKeeper: a FIFO queue of ephemeral sequential znodes per lease.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, Renewed, Result, Term, Transition, random_u64,
};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::error::{STORE, disconnected, zk_error};
use crate::queue::{Ending, GrantOutcome};
use crate::record::{Child, holder_observation};

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
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZookeeperConfig,
    pub(crate) ttl_range: RangeInclusive<Duration>,
    /// Distinguishes this store's candidate znodes from another process's with the same id.
    pub(crate) nonce: u64,
    /// One session slot per TTL in milliseconds.
    pub(crate) sessions: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Option<zk::Client>>>>>,
    pub(crate) candidates: Mutex<HashMap<(LeaseName, CandidateId), Candidate>>,
    /// Candidate znodes of this store's sessions that have expired on the client's side: the
    /// server may keep them for up to a session timeout more, and nobody may adopt them.
    pub(crate) dead: Mutex<HashSet<String>>,
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
}

impl Candidate {
    fn new() -> Self {
        Candidate {
            node: None,
            waiting: false,
            changed: watch::channel(0).0,
            ops: Arc::default(),
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
    /// [`Error::InvalidUrl`] for a bad URL; [`Error::Unreachable`] when no server answers;
    /// [`Error::Store`] when authentication fails.
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
                candidates: Mutex::default(),
                dead: Mutex::default(),
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
            fifo: true,
        }
    }

    fn can_break(&self) -> bool {
        true
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let inner = &self.inner;
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let (lease, candidate) = (&request.lease, &request.candidate);
        let ops = inner.ops(lease, candidate);
        let _serial = ops.lock().await;
        let client = inner.session(request.ttl).await?;
        let session = client.session_id().0;
        let prefix = inner.prefix(candidate);
        if let Some(own) = inner
            .own(lease, candidate)
            .filter(|n| n.session == session && !n.granted)
        {
            if own.ahead.len() <= FAST_GRANT_MAX_AHEAD {
                // One request that is applied even when its reply is lost: grant if every znode
                // that was ahead of ours is gone.
                if let GrantOutcome::Granted = inner.grant(&client, lease, &own, candidate, 0).await? {
                    return Ok(inner.granted(lease, candidate, own, request.ttl, &client, false).await);
                }
            }
        }
        for _ in 0..6 {
            // Take a place in the queue first: that request is applied even if its reply is lost,
            // so a release can hand the lease over to us.
            let own = match inner.own(lease, candidate).filter(|n| n.session == session) {
                Some(own) => own,
                None => match inner
                    .create_own(&client, lease, candidate, request.ttl, &prefix)
                    .await?
                {
                    Some(own) => own,
                    None => {
                        // A new lease: its znodes and our place at the head, in one request.
                        if let Some(own) = inner
                            .create_lease(&client, lease, candidate, request.ttl, &prefix)
                            .await?
                        {
                            if let GrantOutcome::Granted = inner.grant(&client, lease, &own, candidate, 0).await? {
                                return Ok(inner.granted(lease, candidate, own, request.ttl, &client, true).await);
                            }
                        }
                        continue;
                    }
                },
            };
            let queue = inner.queue(&client, lease).await?.unwrap_or_default();
            // Read the head: a garbage record is an error, whoever's it is.
            let Some(first) = queue.first() else {
                inner.set_own(lease, candidate, None);
                continue;
            };
            let Some((record, stat)) = inner.read_candidate(&client, lease, &first.name).await? else {
                continue;
            };
            let Some(position) = queue.iter().position(|c| c.name == own.name) else {
                inner.set_own(lease, candidate, None); // broken by an operator
                continue;
            };
            if own.granted {
                // The leadership of this znode has ended; a new term needs a new znode.
                inner.delete_own(&client, lease, &own.name).await?;
                inner.set_own(lease, candidate, None);
                continue;
            }
            // Other znodes of ours: requests whose replies were lost. One of them may even have
            // been adopted by a read-back; none may be granted again.
            let stale: Vec<&Child> = queue
                .iter()
                .filter(|c| c.name.starts_with(&prefix) && c.name != own.name && !inner.is_dead(lease, &c.name))
                .collect();
            if !stale.is_empty() {
                for child in stale {
                    inner.withdraw_node(&client, lease, &child.name).await?;
                }
                continue;
            }
            if position > 0 {
                let ahead = queue[..position].iter().map(|c| c.name.clone()).collect();
                inner.set_own(lease, candidate, Some(OwnNode { ahead, ..own }));
                return Ok(Acquired::Held(holder_observation(lease, &first.name, &record, &stat)));
            }
            match inner.grant(&client, lease, &own, candidate, stat.version).await? {
                GrantOutcome::Granted => {
                    return Ok(inner.granted(lease, candidate, own, request.ttl, &client, false).await);
                }
                GrantOutcome::NotFirst | GrantOutcome::Gone => continue,
            }
        }
        Err(Error::unreachable(
            STORE,
            format!("the candidates of {lease} kept changing during acquire"),
        ))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let inner = &self.inner;
        let Some(client) = inner.existing_session(grant.ttl).await else {
            return Err(Error::unreachable(STORE, "the session of this grant has expired"));
        };
        let state = client.state();
        if state != zk::SessionState::SyncConnected {
            return Err(disconnected(state));
        }
        let path = inner.candidate_path(&grant.lease, &grant.token);
        // A round trip sent after this renew began: the server heard from the session after
        // the request was sent, so it keeps the session (and our znode) for a full session
        // timeout from then. `sync` also brings the server up to date before the read.
        // Both requests leave now, in order; the read is served after the sync.
        let (synced, read) = tokio::join!(
            client.sync(&path),
            inner.read_candidate(&client, &grant.lease, &grant.token)
        );
        synced.map_err(zk_error)?;
        let ours = match read? {
            Some((record, stat)) => {
                record.candidate == grant.holder
                    && stat.czxid as u64 == grant.term.0
                    && stat.ephemeral_owner == client.session_id().0
            }
            None => false,
        };
        if ours {
            if inner
                .own(&grant.lease, &grant.holder)
                .is_none_or(|n| n.name != grant.token || !n.granted)
            {
                let node = OwnNode {
                    name: grant.token.clone(),
                    czxid: grant.term.0 as i64,
                    session: client.session_id().0,
                    client: client.clone(),
                    ahead: Vec::new(),
                    granted: true,
                };
                inner.set_own(&grant.lease, &grant.holder, Some(node));
            }
            Ok(Renewed::Renewed(grant.clone()))
        } else {
            Ok(Renewed::Lost(inner.observe(&client, &grant.lease).await?))
        }
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
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

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let inner = &self.inner;
        let ops = inner.ops(lease, candidate);
        let _serial = ops.lock().await;
        let own = inner.own(lease, candidate);
        let Some(client) = own
            .as_ref()
            .map(|n| n.client.clone())
            .filter(|c| !c.state().is_terminated())
        else {
            return Ok(());
        };
        let prefix = inner.prefix(candidate);
        let queue = inner.queue(&client, lease).await?.unwrap_or_default();
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
            inner.withdraw_node(&client, lease, name).await?;
        }
        if keep.is_none() && inner.own(lease, candidate).is_some_and(|n| !n.granted) {
            inner.set_own(lease, candidate, None);
        }
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let client = self.inner.reader().await?;
        self.inner.observe(&client, lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
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

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(Some(crate::changes::changes(self.inner.clone(), lease, candidate)))
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let inner = &self.inner;
        let client = inner.reader().await?;
        for _ in 0..4 {
            let queue = inner.queue(&client, lease).await?.unwrap_or_default();
            let Some(first) = queue.first() else { return Ok(None) };
            let Some((record, stat)) = inner.read_candidate(&client, lease, &first.name).await? else {
                continue;
            };
            let term = Term(stat.czxid as u64);
            if inner
                .end_term(
                    &client,
                    lease,
                    &Ending {
                        node: &first.name,
                        version: stat.version,
                        term,
                        holder: &record.candidate,
                    },
                    EndReason::Broken,
                )
                .await?
            {
                return Ok(Some(term));
            }
        }
        Err(Error::unreachable(
            STORE,
            format!("the candidates of {lease} kept changing while breaking the lease"),
        ))
    }
}
