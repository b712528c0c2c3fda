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
//! read-back adopts it. A task of the session's (one per session that left a znode, ended with
//! the session or the store) sends the withdrawal again whenever the session is connected after
//! one of three events: the failure itself (connected still, or again by the time it is
//! noted), the client reconnecting to the session (a deletion fails when its connection is lost,
//! and the client's reconnect is the first moment it can get through), and each renewal round
//! trip on the session. The withdrawal deletes the znode if it is still that one (`czxid`, owner
//! session), ending a term granted to it as released. No timer of its own: a failure the events
//! do not follow waits for the next one.

use std::sync::{Arc, Weak};

use leasehold_core::{LeaseName, Result};
use tokio::sync::Notify;
use tracing::debug;
use zookeeper_client as zk;

use crate::error::map;
use crate::state::{AbortOnDrop, Inner, LeftNode, Resender, lock};

/// At most this many left znodes are remembered; the oldest is forgotten first.
const MAX_LEFT: usize = 1024;

impl Inner {
    /// A deletion of `node` (on `client`'s session) failed: retire it (uncached, never shown as
    /// holder by this store) and send the deletion again (see the module docs).
    pub(crate) fn leave(self: &Arc<Self>, node: LeftNode, client: &zk::Client) {
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
        let session = node.session;
        {
            let mut left = lock(&self.left);
            if !left.iter().any(|l| l.lease == node.lease && l.name == node.name) {
                if left.len() >= MAX_LEFT {
                    left.remove(0);
                }
                left.push(node);
            }
        }
        if client.session_id().0 != session || client.state().is_terminated() {
            return; // gone with its session (forget_left), or never on this one
        }
        lock(&self.resenders)
            .entry(session)
            .or_insert_with(|| resender(Arc::downgrade(self), client.clone()))
            .kick
            .notify_one();
    }

    /// Whether `name` of `lease` is a znode this store left (see [`Inner::leave`]).
    pub(crate) fn is_left(&self, lease: &LeaseName, name: &str) -> bool {
        lock(&self.left).iter().any(|l| &l.lease == lease && l.name == name)
    }

    /// Forgets the left znodes of an ended session, and its resender: they are gone with it.
    pub(crate) fn forget_left(&self, session: i64) {
        lock(&self.left).retain(|l| l.session != session);
        lock(&self.resenders).remove(&session);
    }

    /// After a renewal round trip on `session`: wakes its resender, if it has one.
    pub(crate) fn kick_left(&self, session: i64) {
        if let Some(resender) = lock(&self.resenders).get(&session) {
            resender.kick.notify_one();
        }
    }

    /// Sends the deletions of the znodes `client`'s session left again, one after the other.
    /// Each stays left (retired) until its deletion is answered; one that fails again, or whose
    /// candidate is acquiring or withdrawing right now, waits for the next event.
    async fn delete_left_on(&self, client: &zk::Client) {
        let session = client.session_id().0;
        let mine: Vec<LeftNode> = lock(&self.left)
            .iter()
            .filter(|l| l.session == session)
            .cloned()
            .collect();
        for node in mine {
            // Serialised with the candidate's acquires and withdrawals; never waits for one.
            let ops = self.ops(&node.lease, &node.candidate);
            let Ok(_serial) = ops.try_lock() else { continue };
            match self.delete_left(client, &node).await {
                Ok(()) => lock(&self.left).retain(|l| !(l.lease == node.lease && l.name == node.name)),
                Err(error) => {
                    debug!(%error, lease = %node.lease, node = %node.name, "deleting a znode left by a failed deletion failed; again at the session's next renewal or reconnect");
                }
            }
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
        let Some(stat) = client.check_stat(&path).await.map_err(map)? else {
            return Ok(());
        };
        if stat.czxid != node.czxid || stat.ephemeral_owner != client.session_id().0 {
            return Ok(());
        }
        self.withdraw_node(client, &node.lease, &node.name).await
    }
}

/// The resender of `client`'s session: whenever it is kicked or the session's state changes,
/// and the session is connected, it sends the session's left deletions again. It ends with the
/// session (a terminal state) or the store (`inner` gone, or the resender dropped).
fn resender(inner: Weak<Inner>, client: zk::Client) -> Resender {
    let kick = Arc::new(Notify::new());
    let kicked = kick.clone();
    let mut states = client.state_watcher();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = kicked.notified() => {}
                state = states.changed() => {
                    if state.is_terminated() {
                        break;
                    }
                }
            }
            if client.state() != zk::SessionState::SyncConnected {
                continue;
            }
            let Some(store) = inner.upgrade() else { break };
            store.delete_left_on(&client).await;
        }
    });
    Resender {
        kick,
        _task: AbortOnDrop(task),
    }
}
