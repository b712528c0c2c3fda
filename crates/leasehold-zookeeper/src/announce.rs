//! Announcements: every grant creates, and deletes again in the same transaction, a znode under
//! `{lease}/leader/` whose name says who holds the lease now (term, holder's znode, TTL,
//! candidate id). A session with a persistent recursive watch there learns of each new holder
//! from the notification alone (its path), with no read: one request to set the watch, none per
//! transition, however many watch.

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
    /// is). Announcements made while the session is disconnected may be lost
    /// ([ZOOKEEPER-4698](https://issues.apache.org/jira/browse/ZOOKEEPER-4698)).
    ///
    /// When the session ends (it expired, e.g. while the server restarted), the stream follows
    /// the store's next session: once this store has one (its candidate's next request opens
    /// it), the stream sets the watch there and first yields the holder one read shows then,
    /// so a grant made while no session watched is not missed. It ends when that fails.
    ///
    /// # Errors
    ///
    /// Those of opening a session; [`leasehold_core::Error::Store`] from a server before 3.6,
    /// which has no persistent watches.
    pub(crate) async fn announced(self: &Arc<Self>, lease: &LeaseName) -> Result<BoxStream<'static, Observation>> {
        let subscribed = async {
            let client = self.reader().await?;
            self.leader_watch(&client, lease).await
        };
        let (session, rx) = subscribed.await.map_err(|e| {
            during(
                e,
                Operation::Changes,
                &format_args!("the announcements of lease {lease}"),
            )
        })?;
        let following = Following {
            inner: self.clone(),
            lease: lease.clone(),
            session,
            current: watched_announcements(rx),
        };
        Ok(Box::pin(futures::stream::unfold(following, |mut f| async move {
            f.next().await.map(|seen| (seen, f))
        })))
    }
}

/// The announcements of one lease, on whichever session of the store is live.
struct Following {
    inner: Arc<Inner>,
    lease: LeaseName,
    /// The session `current` comes from.
    session: i64,
    current: BoxStream<'static, Observation>,
}

impl Following {
    async fn next(&mut self) -> Option<Observation> {
        loop {
            if let Some(seen) = self.current.next().await {
                return Some(seen);
            }
            // The session ended: wait for the store's next one (no request until then), watch
            // there, and catch up with one read.
            let client = self.inner.next_session(self.session).await;
            let (session, rx) = self.inner.leader_watch(&client, &self.lease).await.ok()?;
            let now = self.inner.observe_existing(&client, &self.lease).await.ok()?;
            self.session = session;
            self.current = watched_announcements(rx);
            if let Some(seen) = now.filter(|seen| seen.holder.is_some()) {
                return Some(seen);
            }
        }
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
        if let Some(watching) = lock(&self.leader_watches).get(&key) {
            return Ok((session, from_now(&watching.announced)));
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
                    zk::EventType::Session if event.session_state.is_terminated() => break,
                    _ => {}
                }
            }
        }));
        let mut watches = lock(&self.leader_watches);
        let watching = watches.entry(key).or_insert(LeaderWatch { announced, _task: task });
        Ok((session, from_now(&watching.announced)))
    }
}
