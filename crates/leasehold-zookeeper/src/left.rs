//! Znodes left by a deletion of this store that failed: a `release` or `hand_over` of a grant,
//! or a `withdraw` of a queued candidate, whose requests answered an error (never applied, or
//! the reply lost) while the session lived on. The engine does not ask again (it has stopped
//! campaigning), and the znode is ephemeral on the store's session of its TTL, which the store
//! keeps (the client pings it by itself; the store's other leases of that TTL use it): a released
//! lease would never expire and a withdrawn candidate would stay queued, everyone behind it
//! waiting, for as long as the store keeps that session (`tests/left_node.rs`).
//!
//! So the store remembers the znode, retired: it is no longer cached for its candidate (the
//! candidate's next acquire finds it stale, as a znode whose reply was lost, and ends it
//! itself), and a read of this store that finds it at the head of the queue answers a
//! transient error instead of showing it as holder (as for an expired session's znode), so no
//! read-back adopts it. The next renewal round trip on its session sends the withdrawal again
//! (in a task of its own, not delaying the renewal): delete the znode if it is still that one
//! (`czxid`, owner session), ending a term granted to it as released. No timer of its own.

use leasehold_core::{CandidateId, LeaseName, Result};
use tracing::debug;
use zookeeper_client as zk;

use crate::error::zk_error;
use crate::store::{Inner, lock};

/// At most this many left znodes are remembered; the oldest is forgotten first.
const MAX_LEFT: usize = 1024;

/// A znode whose deletion failed (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct LeftNode {
    pub(crate) lease: LeaseName,
    pub(crate) candidate: CandidateId,
    pub(crate) name: String,
    /// Its `czxid` (a grant's term): only this znode is deleted, never a later one.
    pub(crate) czxid: i64,
    /// The session that owns it: the one whose renewals send the deletion again.
    pub(crate) session: i64,
}

impl Inner {
    /// A deletion of `node` failed: retire it (uncached, never shown as holder by this store)
    /// and send the deletion again on its session's next renewal.
    pub(crate) fn leave(&self, node: LeftNode) {
        {
            let mut candidates = lock(&self.candidates);
            if let Some(c) = candidates.get_mut(&(node.lease.clone(), node.candidate.clone())) {
                if c.node.as_ref().is_some_and(|n| n.name == node.name) {
                    c.node = None;
                    c.changed.send_modify(|n| *n += 1);
                }
                if c.shown.as_ref() == Some(&node.name) {
                    c.shown = None;
                }
            }
        }
        let mut left = lock(&self.left);
        if left.iter().any(|l| l.lease == node.lease && l.name == node.name) {
            return;
        }
        if left.len() >= MAX_LEFT {
            left.remove(0);
        }
        left.push(node);
    }

    /// Whether `name` of `lease` is a znode this store left (see [`Inner::leave`]).
    pub(crate) fn is_left(&self, lease: &LeaseName, name: &str) -> bool {
        lock(&self.left).iter().any(|l| &l.lease == lease && l.name == name)
    }

    /// Forgets the left znodes of an ended session: they are gone with it.
    pub(crate) fn forget_left(&self, session: i64) {
        lock(&self.left).retain(|l| l.session != session);
    }

    /// After a renewal round trip on `client`'s session: sends the left znodes' deletions on it
    /// again, in a task of its own. One that fails again is kept for the next renewal.
    pub(crate) fn delete_left_after_renewal(self: &std::sync::Arc<Self>, client: &zk::Client) {
        let session = client.session_id().0;
        let mine: Vec<LeftNode> = {
            let mut left = lock(&self.left);
            let (mine, rest) = std::mem::take(&mut *left)
                .into_iter()
                .partition(|l| l.session == session);
            *left = rest;
            mine
        };
        if mine.is_empty() {
            return;
        }
        let (inner, client) = (self.clone(), client.clone());
        tokio::spawn(async move {
            for node in mine {
                // Serialised with the candidate's acquires and withdrawals; never waits for one.
                let ops = inner.ops(&node.lease, &node.candidate);
                let outcome = match ops.try_lock() {
                    Ok(_serial) => inner.delete_left(&client, &node).await.map(|()| true),
                    Err(_) => Ok(false),
                };
                match outcome {
                    Ok(true) => {}
                    Ok(false) => inner.keep_left(node),
                    Err(error) => {
                        debug!(%error, lease = %node.lease, node = %node.name, "deleting a znode left by a failed deletion failed; again after the next renewal");
                        inner.keep_left(node);
                    }
                }
            }
        });
    }

    fn keep_left(&self, node: LeftNode) {
        let mut left = lock(&self.left);
        if left.len() < MAX_LEFT {
            left.push(node);
        }
    }

    /// Deletes `node` if it is still that znode of this session, ending a term granted to it as
    /// released (as a withdrawal does).
    async fn delete_left(&self, client: &zk::Client, node: &LeftNode) -> Result<()> {
        if self
            .own(&node.lease, &node.candidate)
            .is_some_and(|n| n.name == node.name)
        {
            return Ok(()); // cached again: a campaign uses it (not expected: it is never shown)
        }
        let path = self.candidate_path(&node.lease, &node.name);
        let Some(stat) = client.check_stat(&path).await.map_err(zk_error)? else {
            return Ok(());
        };
        if stat.czxid != node.czxid || stat.ephemeral_owner != client.session_id().0 {
            return Ok(());
        }
        self.withdraw_node(client, &node.lease, &node.name).await
    }
}
