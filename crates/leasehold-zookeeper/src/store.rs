//! The [`LeaseStore`] over ZooKeeper: a FIFO queue of ephemeral sequential znodes per lease.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant, HolderInfo,
    LeaseName, LeaseStore, Notifications, Observation, Renewed, Result, Term, Transition, random_u64,
};
use tokio::sync::watch;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::record::{CandidateRecord, HistoryRecord, history_name, parse_history_name};

const STORE: &str = "zookeeper";

/// How many terms of history are kept per lease; older `history/` znodes are deleted.
pub const HISTORY_LIMIT: usize = 1000;

/// The longest queue ahead of a candidate for which `acquire` first tries the one-request grant.
const FAST_GRANT_MAX_AHEAD: usize = 8;

/// The session timeout asked for when probing the smallest one the server grants.
const PROBE_MIN: Duration = Duration::from_millis(500);
/// The session timeout asked for when probing the largest one the server grants.
const PROBE_MAX: Duration = Duration::from_secs(24 * 3600);

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

struct Inner {
    config: ZookeeperConfig,
    ttl_range: RangeInclusive<Duration>,
    /// Distinguishes this store's candidate znodes from another process's with the same id.
    nonce: u64,
    /// One session slot per TTL in milliseconds.
    sessions: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Option<zk::Client>>>>>,
    candidates: Mutex<HashMap<(LeaseName, CandidateId), Candidate>>,
    /// Candidate znodes of this store's sessions that have expired on the client's side: the
    /// server may keep them for up to a session timeout more, and nobody may adopt them.
    dead: Mutex<HashSet<String>>,
}

/// What this store knows about one candidate's place in one lease's queue.
struct Candidate {
    node: Option<OwnNode>,
    /// Whether a change stream was asked for: the candidate then waits to be handed the lease.
    waiting: bool,
    /// Bumped whenever `node` changes, so a change stream re-reads it.
    changed: watch::Sender<u64>,
    /// Serialises `acquire` and `withdraw`: the withdrawal of a dropped campaign may run while
    /// the same candidate campaigns again, and must not delete the new campaign's grant.
    ops: Arc<tokio::sync::Mutex<()>>,
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
struct OwnNode {
    name: String,
    czxid: i64,
    session: i64,
    client: zk::Client,
    /// The znodes ahead of it in the last listing that showed it (for the one-request grant).
    ahead: Vec<String>,
    /// Whether `acquire` has answered `Granted` on this znode: a later acquire means that
    /// leadership ended, and a new term needs a new znode.
    granted: bool,
}

/// One child of `candidates/`.
#[derive(Clone, Debug)]
struct Child {
    name: String,
    seq: i64,
}

impl fmt::Debug for ZookeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperStore")
            .field("config", &self.inner.config)
            .field("ttl_range", &self.inner.ttl_range)
            .finish_non_exhaustive()
    }
}

/// Maps a client error: the server's definite answers are [`Error::Store`]; everything about the
/// connection or session (the request may or may not have been applied) is transient.
fn zk_error(error: zk::Error) -> Error {
    use zk::Error as E;
    match error {
        E::NoNode
        | E::NoAuth
        | E::BadVersion
        | E::NoChildrenForEphemerals
        | E::NodeExists
        | E::NotEmpty
        | E::InvalidAcl
        | E::AuthFailed
        | E::BadArguments(_)
        | E::Unimplemented
        | E::QuotaExceeded
        | E::NoWatcher
        | E::ReconfigDisabled
        | E::UnmarshalError { .. }
        | E::MarshallingError => Error::store(STORE, error),
        other => Error::unreachable(STORE, other),
    }
}

fn disconnected(state: zk::SessionState) -> Error {
    Error::unreachable(STORE, format!("the ZooKeeper session is {state}: not confirmed alive"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The smallest and largest session timeout each ensemble grants, probed once per process.
fn probed_ranges() -> &'static Mutex<HashMap<String, RangeInclusive<Duration>>> {
    static RANGES: OnceLock<Mutex<HashMap<String, RangeInclusive<Duration>>>> = OnceLock::new();
    RANGES.get_or_init(Mutex::default)
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
        ZookeeperStore::with_config(ZookeeperConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration. See [`ZookeeperStore::connect`].
    ///
    /// # Errors
    ///
    /// As [`ZookeeperStore::connect`].
    pub async fn with_config(config: ZookeeperConfig) -> Result<ZookeeperStore> {
        let key = config.connect_string();
        // One probe at a time per process: concurrent connects share its result.
        static PROBING: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
        let _probing = PROBING.get_or_init(tokio::sync::Mutex::default).lock().await;
        let known = lock(probed_ranges()).get(&key).cloned();
        let ttl_range = match known {
            Some(range) => range,
            None => {
                let low = open_session_retrying(&config, PROBE_MIN).await?;
                let high = open_session_retrying(&config, PROBE_MAX).await?;
                let range = low.session_timeout()..=high.session_timeout();
                debug!(?range, "probed the session timeouts the ensemble grants");
                lock(probed_ranges()).insert(key, range.clone());
                range
            }
        };
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

/// [`open_session`], tried three times: a probe's short handshake timeout may be missed on a
/// busy machine.
async fn open_session_retrying(config: &ZookeeperConfig, timeout: Duration) -> Result<zk::Client> {
    let mut last = None;
    for _ in 0..3 {
        match open_session(config, timeout).await {
            Ok(client) => return Ok(client),
            Err(e) if e.is_transient() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("three attempts"))
}

async fn open_session(config: &ZookeeperConfig, timeout: Duration) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(timeout)
        .with_fail_eagerly();
    for (scheme, credential) in config.auth() {
        connector = connector.with_auth(scheme, credential.as_bytes());
    }
    connector.connect(&config.connect_string()).await.map_err(|e| match e {
        zk::Error::AuthFailed | zk::Error::NoAuth => Error::store(STORE, e),
        other => zk_error(other),
    })
}

impl Inner {
    fn lease_dir(&self, lease: &LeaseName) -> String {
        format!("{}/{}", self.config.chroot().trim_end_matches('/'), lease)
    }

    fn candidates_dir(&self, lease: &LeaseName) -> String {
        format!("{}/candidates", self.lease_dir(lease))
    }

    fn history_dir(&self, lease: &LeaseName) -> String {
        format!("{}/history", self.lease_dir(lease))
    }

    fn candidate_path(&self, lease: &LeaseName, name: &str) -> String {
        format!("{}/{name}", self.candidates_dir(lease))
    }

    /// The name prefix of this store's znodes for `candidate` (the server appends a sequence).
    fn prefix(&self, candidate: &CandidateId) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.nonce.hash(&mut hasher);
        candidate.hash(&mut hasher);
        format!("c-{:016x}-", hasher.finish())
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.config.auth().is_empty() {
            zk::Acls::anyone_all()
        } else {
            zk::Acls::creator_all()
        }
    }

    /// The live session for `ttl`, opened (or reopened after expiry) on demand.
    async fn session(&self, ttl: Duration) -> Result<zk::Client> {
        let slot = lock(&self.sessions).entry(ttl.as_millis() as u64).or_default().clone();
        let mut slot = slot.lock().await;
        if let Some(client) = self.live(&mut slot) {
            return Ok(client);
        }
        let client = open_session(&self.config, ttl).await?;
        if client.session_timeout() != ttl {
            let min = *self.ttl_range.start();
            let max = *self.ttl_range.end();
            return Err(Error::InvalidTtl {
                store: STORE,
                ttl,
                min,
                max,
            });
        }
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The live session for `ttl` if there is one, without opening one.
    async fn existing_session(&self, ttl: Duration) -> Option<zk::Client> {
        let slot = lock(&self.sessions).get(&(ttl.as_millis() as u64)).cloned()?;
        let mut slot = slot.lock().await;
        self.live(&mut slot)
    }

    /// The client in a session slot, if its session is not over; an ended one is reaped.
    fn live(&self, slot: &mut Option<zk::Client>) -> Option<zk::Client> {
        let client = slot.as_ref()?;
        if client.state().is_terminated() {
            self.session_ended(client);
            *slot = None;
            return None;
        }
        Some(client.clone())
    }

    /// Any live session, for reads; opens one when there is none.
    async fn reader(&self) -> Result<zk::Client> {
        let slots: Vec<_> = lock(&self.sessions).values().cloned().collect();
        for slot in slots {
            if let Some(client) = self.live(&mut *slot.lock().await) {
                return Ok(client);
            }
        }
        let ttl = Duration::from_secs(10).clamp(*self.ttl_range.start(), *self.ttl_range.end());
        self.session(ttl).await
    }

    /// Forgets the znodes of an expired session: they are gone, or will be within a session
    /// timeout, and must never be adopted.
    fn session_ended(&self, client: &zk::Client) {
        let id = client.session_id().0;
        let mut dead = Vec::new();
        for ((lease, _), candidate) in lock(&self.candidates).iter_mut() {
            if candidate.node.as_ref().is_some_and(|n| n.session == id) {
                let node = candidate.node.take().expect("checked");
                dead.push(self.candidate_path(lease, &node.name));
                candidate.changed.send_modify(|n| *n += 1);
            }
        }
        warn!(session = %client.session_id(), nodes = dead.len(), "ZooKeeper session expired; opening a new one");
        lock(&self.dead).extend(dead);
    }

    fn is_dead(&self, lease: &LeaseName, name: &str) -> bool {
        lock(&self.dead).contains(&self.candidate_path(lease, name))
    }

    fn own(&self, lease: &LeaseName, candidate: &CandidateId) -> Option<OwnNode> {
        lock(&self.candidates)
            .get(&(lease.clone(), candidate.clone()))
            .and_then(|c| c.node.clone())
    }

    fn set_own(&self, lease: &LeaseName, candidate: &CandidateId, node: Option<OwnNode>) {
        let mut candidates = lock(&self.candidates);
        let entry = candidates
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new);
        entry.node = node;
        entry.changed.send_modify(|n| *n += 1);
    }

    fn subscribe(&self, lease: &LeaseName, candidate: &CandidateId) -> watch::Receiver<u64> {
        let mut candidates = lock(&self.candidates);
        let entry = candidates
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new);
        entry.waiting = true;
        entry.changed.subscribe()
    }

    /// The lock that serialises this candidate's acquires and withdrawals.
    fn ops(&self, lease: &LeaseName, candidate: &CandidateId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.candidates)
            .entry((lease.clone(), candidate.clone()))
            .or_insert_with(Candidate::new)
            .ops
            .clone()
    }

    fn is_waiting(&self, lease: &LeaseName, candidate: &CandidateId) -> bool {
        lock(&self.candidates)
            .get(&(lease.clone(), candidate.clone()))
            .is_some_and(|c| c.waiting)
    }

    /// The candidates queue in sequence order; `None` when the lease has no znodes yet.
    async fn queue(&self, client: &zk::Client, lease: &LeaseName) -> Result<Option<Vec<Child>>> {
        let children = match client.list_children(&self.candidates_dir(lease)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(e)),
        };
        let mut queue = Vec::with_capacity(children.len());
        for name in children {
            let seq = name
                .strip_prefix("c-")
                .and_then(|rest| rest.rsplit_once('-'))
                .filter(|(tag, seq)| tag.len() == 16 && seq.len() >= 10)
                .and_then(|(_, seq)| seq.parse::<i64>().ok())
                .ok_or_else(|| Error::corrupt(STORE, lease, format!("foreign znode {name:?} among the candidates")))?;
            queue.push(Child { name, seq });
        }
        queue.sort_by_key(|c| c.seq);
        Ok(Some(queue))
    }

    /// Creates a lease's znodes together with the first candidate's; `None` when the lease
    /// exists already (someone was quicker).
    async fn create_lease(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        ttl: Duration,
        prefix: &str,
    ) -> Result<Option<OwnNode>> {
        let dir = self.lease_dir(lease);
        let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
        let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let waiting = self.is_waiting(lease, candidate);
        let record = CandidateRecord {
            candidate: candidate.clone(),
            ttl,
            waiting,
        }
        .encode();
        let own_path = format!("{}/{prefix}", self.candidates_dir(lease));
        for _ in 0..2 {
            let mut writer = client.new_multi_writer();
            let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
            add(writer.add_create(&dir, &[], &persistent))?;
            add(writer.add_create(&self.candidates_dir(lease), &[], &persistent))?;
            add(writer.add_create(&self.history_dir(lease), &[], &persistent))?;
            add(writer.add_create(&own_path, &record, &ephemeral))?;
            match writer.commit().await {
                Ok(results) => {
                    let Some(zk::MultiWriteResult::Create { path, stat }) = results.into_iter().nth(3) else {
                        return Err(Error::store(
                            STORE,
                            "unexpected reply to the multi that creates a lease",
                        ));
                    };
                    let name = path.rsplit('/').next().unwrap_or_default().to_string();
                    // Some servers answer a create inside a multi without a valid stat.
                    let czxid = if stat.czxid > 0 {
                        stat.czxid
                    } else {
                        match self.read_candidate(client, lease, &name).await? {
                            Some((_, stat)) => stat.czxid,
                            None => return Ok(None),
                        }
                    };
                    let node = OwnNode {
                        name,
                        czxid,
                        session: client.session_id().0,
                        client: client.clone(),
                        ahead: Vec::new(),
                        granted: false,
                    };
                    self.set_own(lease, candidate, Some(node.clone()));
                    return Ok(Some(node));
                }
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                }) => {
                    // The chroot does not exist yet.
                    let options = zk::CreateMode::Persistent.with_acls(self.acls());
                    client.mkdir(self.config.chroot(), &options).await.map_err(zk_error)?;
                }
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NodeExists,
                    ..
                }) => {
                    self.ensure_dirs(client, lease).await?;
                    return Ok(None);
                }
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => return Err(zk_error(source)),
                Err(zk::MultiWriteError::RequestFailed { source }) => return Err(zk_error(source)),
            }
        }
        Ok(None)
    }

    /// Creates this candidate's znode at the end of the queue; `None` when the lease does not
    /// exist yet.
    async fn create_own(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        ttl: Duration,
        prefix: &str,
    ) -> Result<Option<OwnNode>> {
        let waiting = self.is_waiting(lease, candidate);
        let record = CandidateRecord {
            candidate: candidate.clone(),
            ttl,
            waiting,
        };
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let path = format!("{}/{prefix}", self.candidates_dir(lease));
        let (stat, seq) = match client.create(&path, &record.encode(), &options).await {
            Ok(created) => created,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(e)),
        };
        let node = OwnNode {
            name: format!("{prefix}{seq}"),
            czxid: stat.czxid,
            session: client.session_id().0,
            client: client.clone(),
            ahead: Vec::new(),
            granted: false,
        };
        self.set_own(lease, candidate, Some(node.clone()));
        Ok(Some(node))
    }

    /// Takes one of this store's znodes out of the queue. A release may have handed it the lease
    /// already (its term has a history entry): then the term ends as released, and the lease
    /// passes on to the next waiting candidate, as with any release.
    async fn withdraw_node(&self, client: &zk::Client, lease: &LeaseName, name: &str) -> Result<()> {
        let Some((record, stat)) = self.read_candidate(client, lease, name).await? else {
            return Ok(());
        };
        let term = Term(stat.czxid as u64);
        let entry = format!("{}/{}", self.history_dir(lease), history_name(term));
        if client.check_stat(&entry).await.map_err(zk_error)?.is_some() {
            let ending = Ending {
                node: name,
                version: stat.version,
                term,
                holder: &record.candidate,
            };
            self.end_term(client, lease, &ending, EndReason::Released).await?;
            return Ok(());
        }
        self.delete_own(client, lease, name).await
    }

    /// Deletes one of this store's candidate znodes (only if nobody else wrote to it).
    async fn delete_own(&self, client: &zk::Client, lease: &LeaseName, name: &str) -> Result<()> {
        match client.delete(&self.candidate_path(lease, name), Some(0)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(zk::Error::BadVersion) => Err(Error::corrupt(
                STORE,
                lease,
                format!("candidate znode {name} was overwritten by someone else"),
            )),
            Err(e) => Err(zk_error(e)),
        }
    }

    async fn ensure_dirs(&self, client: &zk::Client, lease: &LeaseName) -> Result<()> {
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        client
            .mkdir(&self.candidates_dir(lease), &options)
            .await
            .map_err(zk_error)?;
        client.mkdir(&self.history_dir(lease), &options).await.map_err(zk_error)
    }

    /// Reads a candidate znode: its record and stat; `None` if it is gone.
    async fn read_candidate(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        name: &str,
    ) -> Result<Option<(CandidateRecord, zk::Stat)>> {
        match client.get_data(&self.candidate_path(lease, name)).await {
            Ok((data, stat)) => {
                let record = CandidateRecord::decode(&data)
                    .map_err(|detail| Error::corrupt(STORE, lease, format!("candidate znode {name}: {detail}")))?;
                Ok(Some((record, stat)))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error(e)),
        }
    }

    /// The newest history entry: its term and how it ended.
    async fn last_history(&self, client: &zk::Client, lease: &LeaseName) -> Result<Option<(Term, HistoryRecord)>> {
        let terms = self.history_terms(client, lease).await?;
        let Some(&term) = terms.last() else { return Ok(None) };
        Ok(self
            .read_history(client, lease, term)
            .await?
            .map(|record| (term, record)))
    }

    async fn history_terms(&self, client: &zk::Client, lease: &LeaseName) -> Result<Vec<Term>> {
        let names = match client.list_children(&self.history_dir(lease)).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(zk_error(e)),
        };
        let mut terms = names
            .iter()
            .map(|name| {
                parse_history_name(name)
                    .ok_or_else(|| Error::corrupt(STORE, lease, format!("foreign znode {name:?} in the history")))
            })
            .collect::<Result<Vec<_>>>()?;
        terms.sort();
        Ok(terms)
    }

    async fn read_history(&self, client: &zk::Client, lease: &LeaseName, term: Term) -> Result<Option<HistoryRecord>> {
        let path = format!("{}/{}", self.history_dir(lease), history_name(term));
        match client.get_data(&path).await {
            Ok((data, _)) => HistoryRecord::decode(&data)
                .map(Some)
                .map_err(|detail| Error::corrupt(STORE, lease, format!("history of term {term}: {detail}"))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error(e)),
        }
    }

    /// What anyone would observe: the first znode of the queue is the holder.
    async fn observe(&self, client: &zk::Client, lease: &LeaseName) -> Result<Observation> {
        for _ in 0..4 {
            let queue = self.queue(client, lease).await?.unwrap_or_default();
            let Some(first) = queue.first() else {
                let last = self.last_history(client, lease).await?;
                let last_term = last.as_ref().map_or(Term(0), |(t, _)| *t);
                let previous_end = last.and_then(|(_, r)| r.ended.map(|(_, reason)| reason));
                return Ok(Observation::free(lease.clone(), last_term, previous_end));
            };
            if self.is_dead(lease, &first.name) {
                // This store's own expired session still leads on the server: nobody may adopt
                // it, and the server frees it within a session timeout.
                return Err(Error::unreachable(
                    STORE,
                    format!("the holder of {lease} is this store's expired session; the server has not removed it yet"),
                ));
            }
            if let Some((record, stat)) = self.read_candidate(client, lease, &first.name).await? {
                let term = Term(stat.czxid as u64);
                let entry = format!("{}/{}", self.history_dir(lease), history_name(term));
                if client.check_stat(&entry).await.map_err(zk_error)?.is_none() {
                    // Next in line, but its candidate has not taken the lease yet.
                    let last = self.last_history(client, lease).await?;
                    let last_term = last.as_ref().map_or(Term(0), |(t, _)| *t);
                    let previous_end = last.and_then(|(_, r)| r.ended.map(|(_, reason)| reason));
                    return Ok(Observation::free(lease.clone(), last_term, previous_end));
                }
                self.may_be_adopted(lease, &record.candidate, &first.name);
                return Ok(holder_observation(lease, &first.name, &record, &stat));
            }
        }
        Err(Error::unreachable(
            STORE,
            format!("the candidates of {lease} kept changing while being read"),
        ))
    }

    /// The engine adopts a grant it reads back (after an acquire with an unknown outcome), so a
    /// znode of ours that a read shows first counts as granted: leadership on it may end without
    /// this store hearing of it, and the next acquire must then make a new term.
    fn may_be_adopted(&self, lease: &LeaseName, candidate: &CandidateId, name: &str) {
        let mut candidates = lock(&self.candidates);
        if let Some(c) = candidates.get_mut(&(lease.clone(), candidate.clone())) {
            if let Some(node) = c.node.as_mut().filter(|n| n.name == name && !n.granted) {
                node.granted = true;
                c.changed.send_modify(|n| *n += 1);
            }
        }
    }

    /// Grants the lease to `own` in one transaction: every znode that was ahead of it is gone
    /// (each is created and deleted again, which fails if it still exists), our znode is
    /// unchanged, and the term's history entry is created. That entry is what makes the head of
    /// the queue the holder.
    async fn grant(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        own: &OwnNode,
        candidate: &CandidateId,
        version: i32,
    ) -> Result<GrantOutcome> {
        let term = Term(own.czxid as u64);
        let history = format!("{}/{}", self.history_dir(lease), history_name(term));
        let record = HistoryRecord::new(candidate.clone()).encode();
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
        for name in &own.ahead {
            let path = self.candidate_path(lease, name);
            add(writer.add_create(&path, &[], &options))?;
            add(writer.add_delete(&path, None))?;
        }
        add(writer.add_check_version(&self.candidate_path(lease, &own.name), version))?;
        add(writer.add_create(&history, &record, &options))?;
        let checks = own.ahead.len() * 2;
        match writer.commit().await {
            Ok(_) => Ok(GrantOutcome::Granted),
            Err(zk::MultiWriteError::OperationFailed { index, source }) => match source {
                zk::Error::NodeExists if index < checks => Ok(GrantOutcome::NotFirst),
                // An earlier acquire of ours was applied but its reply was lost.
                zk::Error::NodeExists if index == checks + 1 => Ok(GrantOutcome::Granted),
                zk::Error::NoNode if index == checks => Ok(GrantOutcome::Gone),
                zk::Error::BadVersion if index == checks => Err(Error::corrupt(
                    STORE,
                    lease,
                    format!("candidate znode {} was overwritten", own.name),
                )),
                zk::Error::NoNode => Ok(GrantOutcome::Gone),
                other => Err(zk_error(other)),
            },
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(zk_error(source)),
        }
    }

    /// Records a grant this store answers: from here on, a new acquire means a new term.
    async fn granted(
        self: &Arc<Self>,
        lease: &LeaseName,
        candidate: &CandidateId,
        own: OwnNode,
        ttl: Duration,
        client: &zk::Client,
        fresh: bool,
    ) -> Acquired {
        let term = Term(own.czxid as u64);
        let token = own.name.clone();
        self.set_own(
            lease,
            candidate,
            Some(OwnNode {
                granted: true,
                ahead: Vec::new(),
                ..own.clone()
            }),
        );
        // Tidying the history needs no answer: the grant does not wait for it. A lease created
        // by this grant has nothing to tidy.
        if !own.ahead.is_empty() || !fresh {
            let (inner, client, tidy) = (Arc::clone(self), client.clone(), lease.clone());
            tokio::spawn(async move { inner.record_grant(&client, &tidy, term).await });
        }
        Acquired::Granted(Grant {
            lease: lease.clone(),
            holder: candidate.clone(),
            term,
            ttl,
            token,
        })
    }

    /// Ends the previous term as expired if its holder did not record an end, and trims old
    /// entries. Best effort: the grant stands regardless.
    async fn record_grant(&self, client: &zk::Client, lease: &LeaseName, term: Term) {
        if let Err(e) = self.try_record_grant(client, lease, term).await {
            warn!(%lease, %term, error = %e, "could not tidy the history");
        }
    }

    async fn try_record_grant(&self, client: &zk::Client, lease: &LeaseName, term: Term) -> Result<()> {
        let dir = self.history_dir(lease);
        let terms = self.history_terms(client, lease).await?;
        if let Some(&previous) = terms.iter().rev().find(|t| **t < term) {
            let path = format!("{dir}/{}", history_name(previous));
            if let Ok((data, stat)) = client.get_data(&path).await {
                if let Ok(record) = HistoryRecord::decode(&data) {
                    if record.ended.is_none() {
                        let ended = record.ended(EndReason::Expired).encode();
                        let _ = client.set_data(&path, &ended, Some(stat.version)).await;
                    }
                }
            }
        }
        if terms.len() > HISTORY_LIMIT {
            let old = &terms[..terms.len() - HISTORY_LIMIT];
            let deletes: Vec<String> = old.iter().map(|t| format!("{dir}/{}", history_name(*t))).collect();
            join_all(deletes.iter().map(|path| client.delete(path, None))).await;
        }
        Ok(())
    }

    /// Ends a term in the history and deletes its znode, in one transaction.
    async fn end_term(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        term: &Ending<'_>,
        reason: EndReason,
    ) -> Result<bool> {
        let Ending {
            node,
            version: node_version,
            term,
            holder,
        } = *term;
        let history_path = format!("{}/{}", self.history_dir(lease), history_name(term));
        let history = match self.read_history(client, lease, term).await {
            Ok(Some(record)) => Some(record),
            Ok(None) => None,
            Err(Error::CorruptRecord { .. }) => None,
            Err(e) => return Err(e),
        };
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        // A release hands the lease to the next candidate in the same transaction when that
        // candidate is waiting for it (it campaigns with change notifications).
        let mut handover = None;
        if reason == EndReason::Released {
            let queue = self.queue(client, lease).await?.unwrap_or_default();
            if let Some(next) = queue.iter().skip_while(|c| c.name != node).nth(1) {
                if let Ok(Some((record, stat))) = self.read_candidate(client, lease, &next.name).await {
                    if record.waiting {
                        handover = Some((next.name.clone(), stat, record.candidate));
                    }
                }
            }
        }
        if let Some((next, stat, candidate)) = &handover {
            let mut writer = client.new_multi_writer();
            let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
            match &history {
                Some(record) => add(writer.add_set_data(&history_path, &record.clone().ended(reason).encode(), None))?,
                None => add(writer.add_create(
                    &history_path,
                    &HistoryRecord::new(holder.clone()).ended(reason).encode(),
                    &options,
                ))?,
            }
            add(writer.add_delete(&self.candidate_path(lease, node), Some(node_version)))?;
            add(writer.add_check_version(&self.candidate_path(lease, next), stat.version))?;
            let next_history = format!("{}/{}", self.history_dir(lease), history_name(Term(stat.czxid as u64)));
            add(writer.add_create(&next_history, &HistoryRecord::new(candidate.clone()).encode(), &options))?;
            match writer.commit().await {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::RequestFailed { source }) => return Err(zk_error(source)),
                Err(zk::MultiWriteError::OperationFailed { .. }) => {} // end the term without handing over
            }
        }
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(zk_error);
        match &history {
            Some(record) => add(writer.add_set_data(&history_path, &record.clone().ended(reason).encode(), None))?,
            None => add(writer.add_create(
                &history_path,
                &HistoryRecord::new(holder.clone()).ended(reason).encode(),
                &options,
            ))?,
        }
        add(writer.add_delete(&self.candidate_path(lease, node), Some(node_version)))?;
        match writer.commit().await {
            Ok(_) => Ok(true),
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoNode,
            }) => Ok(false),
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::BadVersion,
            }) => Err(Error::corrupt(
                STORE,
                lease,
                format!("candidate znode {node} was changed by someone else"),
            )),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NodeExists | zk::Error::NoNode,
            }) => {
                // The history entry appeared or vanished meanwhile: end the term without it.
                match client
                    .delete(&self.candidate_path(lease, node), Some(node_version))
                    .await
                {
                    Ok(()) => Ok(true),
                    Err(zk::Error::NoNode) => Ok(false),
                    Err(e) => Err(zk_error(e)),
                }
            }
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => Err(zk_error(source)),
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(zk_error(source)),
        }
    }
}

/// The term to end: the holder's znode (at its data version), its term and holder.
#[derive(Clone, Copy)]
struct Ending<'a> {
    node: &'a str,
    version: i32,
    term: Term,
    holder: &'a CandidateId,
}

/// How a one-request grant went.
enum GrantOutcome {
    Granted,
    /// A znode ahead of ours still exists.
    NotFirst,
    /// Our znode is gone.
    Gone,
}

fn holder_observation(lease: &LeaseName, name: &str, record: &CandidateRecord, stat: &zk::Stat) -> Observation {
    let term = Term(stat.czxid as u64);
    Observation {
        lease: lease.clone(),
        holder: Some(HolderInfo {
            id: record.candidate.clone(),
            term,
            ttl: record.ttl,
            version: name.to_string(),
            store_remaining: None,
        }),
        last_term: term,
        previous_end: None,
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
            can_break: true,
        }
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
        let watching = Watching {
            inner: self.inner.clone(),
            lease: lease.clone(),
            rx: self.inner.subscribe(lease, candidate),
            candidate: candidate.clone(),
            announced: None,
        };
        let stream = futures::stream::unfold(watching, |mut w| async move { w.next().await.map(|()| ((), w)) });
        Ok(Some(Box::pin(stream)))
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

/// The state of one change stream: it watches only the znode just ahead of the candidate's own
/// (no herd), and yields when the candidate may have become first, or lost its place.
struct Watching {
    inner: Arc<Inner>,
    lease: LeaseName,
    candidate: CandidateId,
    rx: watch::Receiver<u64>,
    /// The own znode (or lost znode) last announced, so each is announced once.
    announced: Option<String>,
}

impl Watching {
    async fn next(&mut self) -> Option<()> {
        loop {
            self.rx.borrow_and_update();
            let Some(own) = self.inner.own(&self.lease, &self.candidate) else {
                self.rx.changed().await.ok()?;
                continue;
            };
            let client = own.client.clone();
            if own.granted && !client.state().is_terminated() {
                // The engine leads on it, or read it back without adopting it (then its next
                // acquire makes a new term): say so once, then nothing to wait for in ZooKeeper
                // (renew notices a loss).
                let granted = format!("granted:{}", own.name);
                if self.announced.as_deref() != Some(granted.as_str()) {
                    self.announced = Some(granted);
                    return Some(());
                }
                self.rx.changed().await.ok()?;
                continue;
            }
            let lost = format!("lost:{}", own.name);
            if client.state().is_terminated() {
                // The session is gone with our place in the queue: campaign again.
                if self.announced.as_deref() != Some(lost.as_str()) {
                    self.announced = Some(lost);
                    return Some(());
                }
                self.rx.changed().await.ok()?;
                continue;
            }
            // Every request of the stream is bounded: a reply lost on the way must not strand it.
            let bound = client.session_timeout() / 2;
            let queue = match tokio::time::timeout(bound, self.inner.queue(&client, &self.lease)).await {
                Ok(Ok(queue)) => queue.unwrap_or_default(),
                Ok(Err(_)) => {
                    self.wait_state_or_local(&client).await?;
                    continue;
                }
                Err(_) => continue,
            };
            let Some(position) = queue.iter().position(|c| c.name == own.name) else {
                if self.announced.as_deref() != Some(lost.as_str()) {
                    self.announced = Some(lost);
                    return Some(());
                }
                self.rx.changed().await.ok()?;
                continue;
            };
            if position == 0 && self.announced.as_deref() != Some(own.name.as_str()) {
                self.announced = Some(own.name.clone());
                return Some(());
            }
            // Watch the predecessor (or, when first, our own znode) until it changes.
            let target = &queue[position.saturating_sub(1)];
            let path = self.inner.candidate_path(&self.lease, &target.name);
            let Ok(watched) = tokio::time::timeout(bound, client.check_and_watch_stat(&path)).await else {
                continue;
            };
            match watched {
                Ok((None, _)) => continue,
                Ok((Some(_), watcher)) => {
                    // The client panics in a watcher whose session is dropped: keep that panic in
                    // a task of its own.
                    let mut task = AbortOnDrop(tokio::spawn(async move {
                        watcher.changed().await;
                    }));
                    // A notification lost on the way (a middlebox that drops bytes but keeps the
                    // connection) would strand a follower: while waiting, it checks its
                    // predecessor once every half session timeout.
                    let recheck = bound;
                    loop {
                        tokio::select! {
                            _ = task.wait() => break,
                            changed = self.rx.changed() => {
                                changed.ok()?;
                                break;
                            }
                            () = tokio::time::sleep(recheck), if position > 0 => {
                                let check = tokio::time::timeout(bound, client.check_stat(&path)).await;
                                if !matches!(check, Ok(Ok(Some(_)))) {
                                    break;
                                }
                            }
                        }
                    }
                }
                Err(_) => self.wait_state_or_local(&client).await?,
            }
        }
    }

    /// Waits until the session's state or this candidate's own znode changes.
    async fn wait_state_or_local(&mut self, client: &zk::Client) -> Option<()> {
        let mut states = client.state_watcher();
        tokio::select! {
            _ = states.changed() => Some(()),
            changed = self.rx.changed() => changed.ok(),
        }
    }
}

/// A task that is aborted when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    /// Waits until the task ends; a panicked task ends it too.
    async fn wait(&mut self) {
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
