//! The state a store's parts share, at the bottom of the crate: [`Inner`] (what every clone of
//! a `ZookeeperStore` holds: the configuration, one session per TTL, what this store knows
//! about each candidate's znode, the expired sessions' znodes and the announcement watches) and the types it owns, with the bookkeeping of the
//! candidates' znodes. It imports none of the modules that use it; their operations on it are
//! `impl Inner` blocks of their own.

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{CandidateId, LeaseName, Observation};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;

/// What every clone of a `ZookeeperStore` shares.
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
    /// Per session and lease: the persistent watch on the lease's `leader/` announcements, kept
    /// for as long as the session lives once someone asked for the lease's announcements.
    pub(crate) leader_watches: Mutex<HashMap<(i64, LeaseName), LeaderWatch>>,
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
    /// Granted without its term's history entry and announcement (a turn taken by a read, or a
    /// waiting head a read showed as holder): the next renewal writes them (see `turn`).
    pub(crate) records_due: bool,
}

/// One session's persistent recursive watch on one lease's `leader/` znode, shared by everyone
/// of this store that follows the lease on that session; it lives as long as the session.
pub(crate) struct LeaderWatch {
    /// Never read from: subscribers clone it. Its sender is the watch's task's, so every
    /// subscriber's stream ends when the task does (the session ended).
    pub(crate) announced: watch::Receiver<Option<Observation>>,
    pub(crate) _task: AbortOnDrop,
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
