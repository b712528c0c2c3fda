//! The deletions of this store that failed (a release, hand-over or withdrawal answered an
//! error), kept in [`Inner::left`] and sent again after the next keepalive of any session of
//! this store.

use std::sync::Arc;
use std::time::Duration;

use crate::state::{Inner, Left};

/// At most this many failed deletions are kept to be sent again (see [`Inner::leave`]); the
/// oldest goes first (its key has most likely gone with its session meanwhile).
const MAX_LEFT: usize = 1024;

impl Inner {
    /// A deletion of one of this store's candidate keys failed (`txn` is its `release::close_key`, or
    /// the withdrawal itself when its read failed): the key may be left on a session that the
    /// store's other elections keep alive, where it would hold the lease, or keep the candidates
    /// behind it waiting, for as long (a release that did not free the lease must leave it to
    /// expire after its TTL; a withdrawn candidate must not stay queued). The engine does not ask again (it has stopped), so `txn` is sent
    /// again after the next keepalive of a session of this store, until etcd answers it (a
    /// withdrawal only while its candidate has not campaigned again). Safe at
    /// any later moment: the key was retired (never adopted or granted by this store again, see
    /// [`Inner::retire`]), and the compare of its create_revision leaves a key made later alone.
    /// Without a keepalive there is no session to keep the key either.
    pub(crate) fn leave(&self, txn: Left) {
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
}
