//! Announcements: every grant creates, and deletes again in the same transaction, a znode under
//! `{lease}/leader/` whose name says who holds the lease now (term, holder's znode, TTL,
//! candidate id). A session with a persistent recursive watch there learns of each new holder
//! from the notification alone (its path), with no read: one request to set the watch, none per
//! transition, however many watch.

use futures::stream::BoxStream;
use leasehold_core::{LeaseName, Observation, Operation, Result};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::error::{during, zk_error};
use crate::record::parse_announcement;
use crate::store::{AbortOnDrop, Inner, ZookeeperStore, lock};

/// One session's persistent recursive watch on one lease's `leader/` znode, shared by everyone
/// of this store that follows the lease on that session; it lives as long as the session.
pub(crate) struct LeaderWatch {
    /// Never read from: subscribers clone it. Its sender is the watch's task's, so every
    /// subscriber's stream ends when the task does (the session ended).
    announced: watch::Receiver<Option<Observation>>,
    _task: AbortOnDrop,
}

/// A receiver of the announcements made from now on.
fn from_now(announced: &watch::Receiver<Option<Observation>>) -> watch::Receiver<Option<Observation>> {
    let mut rx = announced.clone();
    rx.borrow_and_update();
    rx
}

impl ZookeeperStore {
    /// [`LeaseStore::announcements`](leasehold_core::LeaseStore::announcements): the holders of
    /// `lease` as its grants announce them, each as
    /// [`inspect`](leasehold_core::LeaseStore::inspect) would show it right after the grant,
    /// from ZooKeeper's notifications alone: the first call per lease sets one persistent watch
    /// (one request), and no transition costs a request, however many processes follow the
    /// lease this way. Only grants are announced (a release or an expiry is not: the next grant
    /// is). Announcements made while the session is disconnected may be lost
    /// ([ZOOKEEPER-4698](https://issues.apache.org/jira/browse/ZOOKEEPER-4698)); the stream
    /// ends when the session does (ask again for a new one).
    ///
    /// # Errors
    ///
    /// Those of opening a session; [`leasehold_core::Error::Store`] from a server before 3.6,
    /// which has no persistent watches.
    pub(crate) async fn announced(&self, lease: &LeaseName) -> Result<BoxStream<'static, Observation>> {
        let inner = &self.inner;
        let subscribed = async {
            let client = inner.reader().await?;
            inner.leader_watch(&client, lease).await
        };
        let rx = subscribed.await.map_err(|e| {
            during(
                e,
                Operation::Changes,
                &format_args!("the announcements of lease {lease}"),
            )
        })?;
        Ok(leasehold_core::watched_announcements(rx))
    }
}

impl Inner {
    /// A receiver of the announcements of `lease` on this session: the persistent watch on its
    /// `leader/` znode, set now (one request) unless this session watches it already.
    pub(crate) async fn leader_watch(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
    ) -> Result<watch::Receiver<Option<Observation>>> {
        let key = (client.session_id().0, lease.clone());
        if let Some(watching) = lock(&self.leader_watches).get(&key) {
            return Ok(from_now(&watching.announced));
        }
        let mut watcher = client
            .watch(&self.leader_dir(lease), zk::AddWatchMode::PersistentRecursive)
            .await
            .map_err(zk_error)?;
        let (sender, announced) = watch::channel(None);
        let lease_name = lease.clone();
        // The client panics in a watcher whose session is dropped: keep that panic in a task
        // of its own (and stop at a terminal state before it can).
        let task = AbortOnDrop(tokio::spawn(async move {
            loop {
                let event = watcher.changed().await;
                match event.event_type {
                    zk::EventType::NodeCreated => {
                        let name = event.path.rsplit('/').next().unwrap_or_default();
                        if let Some(seen) = parse_announcement(&lease_name, name) {
                            sender.send_if_modified(|current: &mut Option<Observation>| {
                                let newer = current.as_ref().is_none_or(|c| c.last_term < seen.last_term);
                                if newer {
                                    *current = Some(seen);
                                }
                                newer
                            });
                        }
                    }
                    zk::EventType::Session if event.session_state.is_terminated() => break,
                    _ => {}
                }
            }
        }));
        let mut watches = lock(&self.leader_watches);
        let watching = watches.entry(key).or_insert(LeaderWatch { announced, _task: task });
        Ok(from_now(&watching.announced))
    }
}
