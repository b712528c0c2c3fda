//! Announcements: every grant rewrites the lease's `granted` key in the grant's own transaction
//! (`leasehold1 g {term} {ttl_ms} {holder}`), and a store whose candidates follow the lease
//! watches that one key: each grant reaches it as one watch event carrying the new holder as
//! `inspect` shows it, with no read, however many candidates follow.
//!
//! One watch per store and lease, shared by every follower of the lease in the store: the first
//! subscriber sets it up (one request, answered before `announcements` returns, so no grant
//! after that is missed); the watch ends when the last subscriber drops its stream (a follower
//! that becomes leader drops it), or when etcd ends it (then every stream of it ends, and the
//! engine asks for a new one the next time it follows).
//!
//! The same watch carries the release markers a release of the first key in the queue writes
//! there (`record::released_value`): the store keeps the term the latest one names, for its
//! queued candidates (see `changes`: the successor's turn), and announces the lease free and
//! released (for the engine's metrics: a release, not a failover).

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchStream};
use leasehold_core::{Announcements, EndReason, Error, LeaseName, Observation, Result, Term};
use tokio::sync::watch;

use crate::error::STORE;
use crate::record::Keys;
use crate::state::{Announcer, Inner};

/// The new holders of the lease of `keys` from now on, from this store's watch on its `granted`
/// key (set up now unless the store watches it already).
pub(crate) async fn announcements(inner: &Arc<Inner>, keys: Keys) -> Result<Announcements> {
    let rx = match subscribe(inner, &keys.lease) {
        Some(rx) => rx,
        None => {
            let stream = Box::pin(open(inner, &keys)).await?;
            let mut announcers = inner.announcers.lock().expect("announcers lock");
            if let Some(other) = announcers.get(&keys.lease) {
                // Another follower set one up meanwhile: this one is dropped unused.
                other.sender.subscribe()
            } else {
                let (sender, rx) = watch::channel(None);
                let id = leasehold_core::random_u64();
                let released = watch::Sender::new(None);
                announcers.insert(
                    keys.lease.clone(),
                    Announcer {
                        sender: sender.clone(),
                        released: released.clone(),
                        id,
                    },
                );
                tokio::spawn(run(Arc::downgrade(inner), keys, stream, sender, released, id));
                rx
            }
        }
    };
    Ok(leasehold_core::watched_announcements(rx))
}

/// A receiver of the store's announcements of `lease`, if it watches it.
fn subscribe(inner: &Inner, lease: &LeaseName) -> Option<watch::Receiver<Option<Observation>>> {
    let announcers = inner.announcers.lock().expect("announcers lock");
    announcers.get(lease).map(|a| a.sender.subscribe())
}

/// The release markers of `lease` this store sees, while it watches the lease (some follower of
/// it in this store takes its announcements).
pub(crate) fn released(inner: &Inner, lease: &LeaseName) -> Option<watch::Receiver<Option<i64>>> {
    let announcers = inner.announcers.lock().expect("announcers lock");
    announcers.get(lease).map(|a| a.released.subscribe())
}

/// Watches the `granted` key from the current revision on, and waits until etcd says the watch
/// is set.
async fn open(inner: &Inner, keys: &Keys) -> Result<WatchStream> {
    let limit = inner.config.timeout;
    let mut client = inner.client();
    let key = keys.granted();
    let options = WatchOptions::new().with_filters([WatchFilterType::NoDelete]);
    let set_up = async {
        let mut stream = inner
            .call("announcements", async move { client.watch(key, Some(options)).await })
            .await?;
        let first = inner.call("announcements", stream.message()).await?;
        match first {
            Some(resp) if resp.created() && !resp.canceled() => Ok(stream),
            _ => Err(Error::store(STORE, "etcd did not set up the announcements' watch")),
        }
    };
    within(limit, set_up).await
}

/// Passes each grant the watch sees to the subscribers, while there are any and the watch lasts.
async fn run(
    inner: Weak<Inner>,
    keys: Keys,
    mut stream: WatchStream,
    sender: watch::Sender<Option<Observation>>,
    released: watch::Sender<Option<i64>>,
    id: u64,
) {
    loop {
        tokio::select! {
            () = sender.closed() => {
                let Some(inner) = inner.upgrade() else { return };
                let mut announcers = inner.announcers.lock().expect("announcers lock");
                // Someone may have subscribed since: then it goes on.
                if sender.receiver_count() == 0 {
                    if announcers.get(&keys.lease).is_some_and(|a| a.id == id) {
                        announcers.remove(&keys.lease);
                    }
                    return;
                }
            }
            message = stream.message() => match message {
                Ok(Some(resp)) if !resp.canceled() => {
                    for event in resp.events() {
                        let Some(kv) = event.kv().filter(|_| event.event_type() == EventType::Put) else {
                            continue;
                        };
                        if let Some(term) = crate::record::parse_released(kv.value()) {
                            released.send_replace(Some(term));
                            announce_end(&sender, &keys.lease, term, EndReason::Released);
                            continue;
                        }
                        match keys.parse_granted(kv.value()) {
                            Ok(seen) => {
                                sender.send_if_modified(|current| {
                                    let newer = current.as_ref().is_none_or(|c| c.last_term < seen.last_term);
                                    if newer {
                                        *current = Some(seen);
                                    }
                                    newer
                                });
                            }
                            Err(e) => tracing::debug!(error = %e, "an unreadable grant announcement"),
                        }
                    }
                }
                other => {
                    if let Err(e) = &other {
                        tracing::debug!(error = %e, lease = %keys.lease, "etcd announcement watch ends");
                    }
                    // Ended by etcd (or the connection): every stream of it ends with the sender.
                    if let Some(inner) = inner.upgrade() {
                        let mut announcers = inner.announcers.lock().expect("announcers lock");
                        if announcers.get(&keys.lease).is_some_and(|a| a.id == id) {
                            announcers.remove(&keys.lease);
                        }
                    }
                    return;
                }
            }
        }
    }
}

/// Announces the end of the lease's term `term` (`reason`) to this store's followers of it, if
/// it watches the lease: the lease free, as `inspect` would show it then, unless a later grant
/// was announced already. The engine takes it to tell a hand-over from a failover in its
/// metrics; it decides nothing.
pub(crate) fn announce_ended(inner: &Inner, lease: &LeaseName, term: i64, reason: EndReason) {
    let announcers = inner.announcers.lock().expect("announcers lock");
    if let Some(announcer) = announcers.get(lease) {
        announce_end(&announcer.sender, lease, term, reason);
    }
}

fn announce_end(sender: &watch::Sender<Option<Observation>>, lease: &LeaseName, term: i64, reason: EndReason) {
    let term = Term(u64::try_from(term).unwrap_or(0));
    sender.send_if_modified(|current| {
        let later = current.as_ref().is_some_and(|c| c.last_term > term);
        if !later {
            *current = Some(Observation::free(lease.clone(), term, Some(reason)));
        }
        !later
    });
}

async fn within<T>(limit: Duration, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, fut).await.unwrap_or(Err(Error::Timeout {
        store: STORE,
        operation: "announcements",
        after: limit,
    }))
}

#[cfg(test)]
mod tests;
