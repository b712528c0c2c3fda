//! Announcements: every grant creates, and deletes again in the same transaction, a znode under
//! `{lease}/leader/` whose name says who holds the lease now (term, holder's znode, TTL,
//! candidate id). A session with a persistent recursive watch there learns of each new holder
//! from the notification alone (its path), with no read: one request to set the watch, none per
//! transition, however many watch. A stream ends when its session is disconnected or ends.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_core::{LeaseName, Observation, Operation, Result, watched_announcements};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::error::{during, map};
use crate::record::parse_announcement;
use crate::state::{AbortOnDrop, Inner, LeaderWatch, lock};

/// A receiver of the announcements made from now on.
fn from_now(announced: &watch::Receiver<Option<Observation>>) -> watch::Receiver<Option<Observation>> {
    let mut rx = announced.clone();
    rx.borrow_and_update();
    rx
}

impl Inner {
    /// [`LeaseStore::announcements`](leasehold_core::LeaseStore::announcements): the holders of
    /// `lease` as its grants announce them, each as
    /// [`inspect`](leasehold_core::LeaseStore::inspect) would show it right after the grant,
    /// from ZooKeeper's notifications alone: the first call per lease sets one persistent watch
    /// (one request), and no transition costs a request, however many processes follow the
    /// lease this way. Only grants are announced (a release or an expiry is not: the next grant
    /// is).
    ///
    /// The stream first yields the holder one read shows right after the watch is set (when
    /// the lease is held), so a grant made before the watch is not missed. It ends when the
    /// session is disconnected or ends (a server restart): grants made meanwhile may have been
    /// announced to nobody
    /// ([ZOOKEEPER-4698](https://issues.apache.org/jira/browse/ZOOKEEPER-4698)), and the engine
    /// reads and asks again.
    ///
    /// # Errors
    ///
    /// Those of opening a session; [`leasehold_core::Error::Store`] from a server before 3.6,
    /// which has no persistent watches.
    pub(crate) async fn announced(self: &Arc<Self>, lease: &LeaseName) -> Result<BoxStream<'static, Observation>> {
        let subscribed = async {
            let client = self.reader().await?;
            let (_, rx) = self.leader_watch(&client, lease).await?;
            let now = self.observe_existing(&client, lease).await?;
            Ok((rx, now))
        };
        let (rx, now) = subscribed.await.map_err(|e| {
            during(
                e,
                Operation::Changes,
                &format_args!("the announcements of lease {lease}"),
            )
        })?;
        let now = now.filter(|seen| seen.holder.is_some());
        Ok(futures::stream::iter(now).chain(watched_announcements(rx)).boxed())
    }
}

impl Inner {
    /// A receiver of the announcements of `lease` on this session: the persistent watch on its
    /// `leader/` znode, set now (one request) unless this session watches it already.
    pub(crate) async fn leader_watch(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
    ) -> Result<(i64, watch::Receiver<Option<Observation>>)> {
        let session = client.session_id().0;
        let key = (session, lease.clone());
        {
            let mut watches = lock(&self.leader_watches);
            match watches.get(&key) {
                // Its watcher stopped at a disconnection: watch again.
                Some(watching) if watching.announced.has_changed().is_err() => {
                    watches.remove(&key);
                }
                Some(watching) => return Ok((session, from_now(&watching.announced))),
                None => {}
            }
        }
        let mut watcher = client
            .watch(&self.leader_dir(lease), zk::AddWatchMode::PersistentRecursive)
            .await
            .map_err(map)?;
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
                    // A disconnection may hide announcements (a create and delete while no
                    // connection watched are not replayed: ZOOKEEPER-4698): the stream ends.
                    zk::EventType::Session
                        if event.session_state.is_terminated()
                            || event.session_state == zk::SessionState::Disconnected =>
                    {
                        break;
                    }
                    _ => {}
                }
            }
        }));
        let mut watches = lock(&self.leader_watches);
        let watching = watches.entry(key).or_insert(LeaderWatch { announced, _task: task });
        Ok((session, from_now(&watching.announced)))
    }
}
