//! The change stream of one waiting candidate: a watch on its predecessor's key only.
//!
//! A candidate queued behind others needs to hear of exactly one event: its immediate
//! predecessor (the key with the greatest `create_revision` below its own) going away. Watching
//! only that key makes a release wake one candidate, not all of them (no thundering herd). When
//! the predecessor goes, the stream looks again: if another key is still ahead, it watches that
//! one silently; if none is, it yields and the engine asks for the lease. The same watch stream
//! also watches the lease's `granted` key, for the release marker naming the predecessor (see
//! `EtcdStore::grant_on_release`): it comes with the deletion, so the successor is granted
//! without a request. Other puts there (a grant per transition) are read and skipped.
//!
//! A handed-over lease goes to its named successor, wherever it waits: so the stream also
//! watches the lease's reservation key, and yields when a reservation naming its candidate is
//! put (or found when the watch is set), and, for the candidate first in the queue, when a
//! reservation ends (taken or expired).
//!
//! Where the candidate stands in the queue is learnt from the store's own `acquire` answers (an
//! in-process channel), not from etcd: a leader's stream and a stream whose candidate has not
//! queued yet cost no request at all.
//!
//! While its candidate waits, the stream also keeps the candidate's session alive (a keepalive
//! every third of the session TTL, coalesced with every other keepalive of the store), so a
//! waiting candidate keeps its place as long as it is waiting, and loses it within a TTL of its
//! process dying. Any trouble (an error, a timeout) ends the stream: the engine then polls,
//! which is always safe.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use futures::FutureExt;
use leasehold_core::{CandidateId, Changes, Result};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::record::Keys;
use crate::session::third_of;
use crate::store::Inner;

/// The change stream's decision whether its predecessor's key went by a release while first
/// (`Some(true)`), or otherwise or unknown (`Some(false)`); `None` until decided. A sender
/// dropped undecided means "no".
pub(crate) type Decision = watch::Receiver<Option<bool>>;

/// Where a candidate's key stands, as its last `acquire` saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// The key's create_revision.
    pub(crate) rev: i64,
    /// The session (etcd lease) the key is bound to.
    pub(crate) lease: i64,
    /// The session's TTL in seconds.
    pub(crate) ttl_secs: i64,
    /// Whether it was granted (first in the queue).
    pub(crate) granted: bool,
}

struct Waiter {
    inner: Arc<Inner>,
    keys: Keys,
    candidate: CandidateId,
    position: watch::Receiver<Option<Position>>,
    /// The watch on the reservation key, while waiting.
    reservation: Option<Box<WatchStream>>,
    /// The predecessor watch, for the position it was set up for.
    watch: Option<Box<(WatchStream, Position)>>,
    /// The position for which "first" was announced, and whether the engine acted on it.
    announced: Option<Position>,
    tick: Option<(tokio::time::Interval, i64)>,
    /// The release markers the store's announcement watch sees (see `announce::released`).
    released: Option<watch::Receiver<Option<i64>>>,
    /// The position whose predecessor was released while first in the queue (its marker was
    /// seen): the candidate is first, no look-up is needed.
    first_by_release: Option<Position>,
    /// The decision on the predecessor's deletion at this position, while it is made (see
    /// [`Waiter::decide`]): no look-up meanwhile, since a release needs none.
    deciding: Option<(Position, Decision)>,
}

pub(crate) fn changes(
    inner: Arc<Inner>,
    keys: Keys,
    candidate: CandidateId,
    position: watch::Receiver<Option<Position>>,
) -> Changes {
    let waiter = Waiter {
        inner,
        keys,
        candidate,
        position,
        reservation: None,
        watch: None,
        announced: None,
        tick: None,
        released: None,
        first_by_release: None,
        deciding: None,
    };
    Box::pin(futures::stream::unfold(waiter, |mut waiter| async move {
        waiter.next().await.map(|()| ((), waiter))
    }))
}

impl Waiter {
    /// Runs until the next notification; `None` ends the stream (the engine then polls).
    ///
    /// A leader's stream (and one whose candidate has not queued) waits here, for its position
    /// only, in a small future; the watches of a waiting candidate run in a boxed one, made
    /// when it starts waiting and dropped when it stops (10,000 leaders would otherwise each
    /// keep the waiting state's futures, about 1 KB).
    async fn next(&mut self) -> Option<()> {
        loop {
            let waiting = self.position.borrow().is_some_and(|p| !p.granted);
            if waiting || self.watch.is_some() || self.reservation.is_some() || self.tick.is_some() {
                if let Some(answer) = Box::pin(self.next_while_waiting()).await {
                    return answer;
                }
            } else if self.position.changed().await.is_err() {
                return None;
            }
        }
    }

    /// [`Waiter::next`] while the candidate waits in the queue: `None` when it no longer waits
    /// (its watches are dropped), `Some` with the stream's answer.
    async fn next_while_waiting(&mut self) -> Option<Option<()>> {
        loop {
            let position = *self.position.borrow_and_update();
            let waiting = position.filter(|p| !p.granted);
            if self.watch.as_ref().map(|w| w.1) != waiting {
                self.watch = None;
            }
            self.set_tick(waiting);
            if self.deciding.as_ref().map(|d| d.0) != waiting {
                self.deciding = None;
            }
            if waiting.is_none() {
                self.reservation = None;
                return None;
            }
            if let (Some(p), None) = (waiting, &self.reservation) {
                match Box::pin(self.watch_reservation(p)).await {
                    Ok(true) => return Some(Some(())),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd change stream ends; the engine polls");
                        return Some(None);
                    }
                }
            }
            if self.released.as_ref().is_none_or(|r| r.has_changed().is_err()) {
                self.released = crate::announce::released(&self.inner, &self.keys.lease);
            }
            if let (Some(p), None, None) = (waiting, &self.watch, &self.deciding)
                && self.first_by_release != Some(p)
            {
                // Boxed: the look-up's etcd futures are large, and a stream's state lives as
                // long as its candidate (10,000 leaders would otherwise hold ~44 KB each).
                match Box::pin(self.look(p)).await {
                    Ok(true) => return Some(Some(())),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd change stream ends; the engine polls");
                        return Some(None);
                    }
                }
            }
            let watch = &mut self.watch;
            let tick = &mut self.tick;
            let reservation = &mut self.reservation;
            let released = &mut self.released;
            let deciding = &mut self.deciding;
            tokio::select! {
                changed = async { released.as_mut().expect("guarded").changed().await }, if released.is_some() => {
                    if changed.is_err() {
                        // The store's announcement watch ended: looked for again next time.
                        self.released = None;
                    } else if let Some(p) = waiting.filter(|p| self.marker_for(*p)) {
                        // Our predecessor was released while first: we are first (its key's
                        // deletion, at the same revision, may come on the other watch later).
                        self.watch = None;
                        self.deciding = None;
                        self.first_by_release = Some(p);
                        if self.announced != Some(p) {
                            // Not yet said on its deletion.
                            self.announced = Some(p);
                            return Some(Some(()));
                        }
                    }
                }
                decided = async { deciding.as_mut().expect("guarded").1.wait_for(Option::is_some).await.is_ok_and(|d| *d == Some(true)) }, if deciding.is_some() => {
                    // "First" was said on the deletion; a release needs no look-up, anything
                    // else looks again (next time round).
                    let (p, _) = self.deciding.take().expect("guarded");
                    if decided {
                        self.first_by_release = Some(p);
                    }
                }
                message = async { reservation.as_mut().expect("guarded").message().await }, if reservation.is_some() => {
                    match message {
                        Ok(Some(resp)) if !resp.canceled() => {
                            let for_me = resp.events().iter().any(|e| {
                                e.event_type() == EventType::Put
                                    && e.kv().is_some_and(|kv| self.names_me(kv))
                            });
                            let ended = resp.events().iter().any(|e| e.event_type() == EventType::Delete);
                            if for_me || (ended && self.announced.is_some()) {
                                return Some(Some(()));
                            }
                        }
                        Ok(_) | Err(_) => return Some(None),
                    }
                }
                changed = self.position.changed() => {
                    if changed.is_err() {
                        return Some(None);
                    }
                }
                message = async { watch.as_mut().expect("guarded").0.message().await }, if watch.is_some() => {
                    match message {
                        Ok(Some(resp)) => {
                            // The revision of the predecessor's deletion (its event's mod_revision).
                            let gone = resp
                                .events()
                                .iter()
                                .filter(|e| e.event_type() == EventType::Delete)
                                .map(|e| e.kv().map_or(0, etcd_client::KeyValue::mod_revision))
                                .max();
                            let mut marker = waiting.and_then(|p| self.marker_in(p, &resp));
                            if gone.is_some() && marker.is_none() {
                                // The marker's event usually follows at once (etcd sends a
                                // revision's events of one stream's watches back to back): those
                                // already received are read without waiting.
                                let stream = &mut self.watch.as_mut().expect("guarded").0;
                                let mut more = Vec::new();
                                while let Some(Ok(Some(next))) = stream.message().now_or_never() {
                                    more.push(next);
                                }
                                marker = waiting.and_then(|p| more.iter().find_map(|r| self.marker_in(p, r)));
                            }
                            // Gone (or the watch was cancelled, e.g. compacted): look again. The
                            // stream is handed to the decision, for a marker still to come.
                            let stream = if resp.canceled() || gone.is_some() || marker.is_some() {
                                self.watch.take().map(|w| w.0)
                            } else {
                                None
                            };
                            if let Some(revision) = gone.or(marker) {
                                if let Some(p) = waiting {
                                    self.decide(p, revision, marker.is_some(), stream);
                                }
                                // The predecessor left: usually the holder, so we are first. Say so
                                // at once rather than after a look-up (one round trip less between
                                // a release and the successor's grant): the grant's compare-and-set
                                // checks that no key is ahead, and a candidate that is not first
                                // is answered `Held`. The look-up follows when the engine next
                                // polls the stream, and watches the next key ahead if any; it does
                                // not announce "first" a second time.
                                self.announced = waiting;
                                return Some(Some(()));
                            }
                        }
                        Ok(None) | Err(_) => return Some(None),
                    }
                }
                _ = async { tick.as_mut().expect("guarded").0.tick().await }, if tick.is_some() => {
                    match Box::pin(self.keep_alive(waiting)).await {
                        Some(true) => {
                            // We announced "first" a tick ago and the engine has not asked since
                            // (it may have missed it while a request was out): say it again.
                            if waiting.is_some() && self.announced == waiting {
                                return Some(Some(()));
                            }
                        }
                        Some(false) => {
                            // Our session is gone, and our key with it: the engine must queue again.
                            return Some(Some(()));
                        }
                        // Unreachable: the watch may be dead too; let the engine poll.
                        None => return Some(None),
                    }
                }
            }
        }
    }

    /// The revision of the release marker naming the predecessor watched at `p`, if `resp` (a
    /// message of the predecessor's watch stream, which also watches `granted`) has it.
    fn marker_in(&self, p: Position, resp: &WatchResponse) -> Option<i64> {
        let predecessor = self.inner.predecessor(&self.keys.candidate(&self.candidate), p)?;
        marker_naming(resp, predecessor)
    }

    /// Whether the latest release marker names the predecessor this candidate watched at `p`.
    fn marker_for(&self, p: Position) -> bool {
        let own = self.keys.candidate(&self.candidate);
        let predecessor = self.inner.predecessor(&own, p);
        let marker = self.released.as_ref().and_then(|r| *r.borrow());
        predecessor.is_some() && marker == predecessor
    }

    /// After the predecessor's key went at `revision`: decides whether that was a release of it
    /// while first, whose marker the release wrote to the lease's `granted` key at the same
    /// revision, so that the engine's acquire is granted without a request (see
    /// `EtcdStore::grant_on_release`). Decided from facts, never from a timer: the marker seen on
    /// the predecessor's own watch stream (`marker_seen`: it also watches `granted`, and etcd
    /// sends a revision's events of one stream back to back, so the marker usually comes with the
    /// deletion), or on the store's announcement watch (another stream: it may come before or
    /// after the deletion, measured up to 0.3 ms later here), or etcd's `granted` key at
    /// `revision` (one serializable read of that revision's history, which no later write
    /// changes), whichever answers first. Anything
    /// else (no marker there, the read failed, timed out or the revision was compacted): the key
    /// went otherwise (expired, withdrawn, handed over, broken) or we cannot tell, and the engine
    /// takes the ordinary path, which is always safe.
    ///
    /// The predecessor's watch stream (`stream`, if the marker was not among the messages already
    /// received with the deletion) is read on for the marker, and the read is made, in a task of
    /// its own: the stream wakes the engine at once and goes on
    /// serving its keepalives and watches; the engine's acquire waits for the decision (as it
    /// would for the answer of a request of its own).
    fn decide(&mut self, p: Position, revision: i64, marker_seen: bool, stream: Option<WatchStream>) {
        let own = self.keys.candidate(&self.candidate);
        let Some(predecessor) = self.inner.predecessor(&own, p) else {
            return;
        };
        if self.released.is_none() {
            // The engine asks for announcements beside the stream: the store's watch may have
            // been set up after this stream last looked for it.
            self.released = crate::announce::released(&self.inner, &self.keys.lease);
        }
        let names_predecessor = move |m: &Option<i64>| *m == Some(predecessor);
        let seen = marker_seen || self.released.as_ref().is_some_and(|r| names_predecessor(&r.borrow()));
        let (decided, decision) = watch::channel(seen.then_some(true));
        if !self.inner.note_deletion(&own, p, predecessor, decision.clone()) {
            return;
        }
        if seen {
            self.first_by_release = Some(p);
            return;
        }
        self.deciding = Some((p, decision));
        let mut released = self.released.clone();
        let inner = self.inner.clone();
        let key = self.keys.granted();
        // As long as a request the store makes on its own, and never longer than the look-ups
        // of this stream.
        let limit = inner.config.timeout.min(third_of(p.ttl_secs));
        tokio::spawn(async move {
            let announced = async {
                let seen = match released.as_mut() {
                    Some(r) => r.wait_for(names_predecessor).await.is_ok(),
                    None => false,
                };
                if !seen {
                    // No announcement watch (or it ended): the others decide.
                    std::future::pending::<()>().await;
                }
            };
            let on_stream = async {
                if let Some(mut stream) = stream {
                    while let Ok(Some(resp)) = stream.message().await {
                        if marker_naming(&resp, predecessor).is_some() {
                            return;
                        }
                    }
                }
                std::future::pending::<()>().await;
            };
            let mut client = inner.kv();
            let options = GetOptions::new().with_revision(revision).with_serializable();
            let read = within(limit, "changes (release marker)", async {
                inner
                    .call("changes (release marker)", async move {
                        client.get(key, Some(options)).await
                    })
                    .await
            });
            let released = tokio::select! {
                () = announced => true,
                () = on_stream => true,
                read = read => match read {
                    Ok(resp) => resp.kvs().first().is_some_and(|kv| {
                        kv.mod_revision() == revision && crate::record::parse_released(kv.value()) == Some(predecessor)
                    }),
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the release marker failed; the ordinary path");
                        false
                    }
                },
            };
            decided.send_replace(Some(released));
        });
    }

    fn set_tick(&mut self, waiting: Option<Position>) {
        match waiting {
            None => self.tick = None,
            Some(p) if self.tick.as_ref().is_some_and(|(_, secs)| *secs == p.ttl_secs) => {}
            Some(p) => {
                // A third of the session TTL, as etcd's own clients keep leases alive.
                let period = third_of(p.ttl_secs);
                let mut tick = tokio::time::interval_at(Instant::now() + period, period);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                self.tick = Some((tick, p.ttl_secs));
            }
        }
    }

    fn names_me(&self, kv: &etcd_client::KeyValue) -> bool {
        self.keys.parse_reserved(kv).is_ok_and(|r| r.to == self.candidate)
    }

    /// Reads the reservation key and watches it from just after the read. `Ok(true)`: a
    /// reservation names this candidate (notify).
    async fn watch_reservation(&mut self, position: Position) -> Result<bool> {
        let limit = third_of(position.ttl_secs);
        let mut client = self.inner.client();
        let key = self.keys.reserved();
        let read = within(limit, "changes (reservation)", async {
            self.inner
                .call("changes (reservation)", async move { client.get(key, None).await })
                .await
        })
        .await?;
        let revision = read.header().map_or(0, etcd_client::ResponseHeader::revision);
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut client = self.inner.client();
        let key = self.keys.reserved();
        let watch = within(limit, "changes (reservation watch)", async {
            self.inner
                .call("changes (reservation watch)", async move {
                    client.watch(key, Some(options)).await
                })
                .await
        })
        .await?;
        self.reservation = Some(Box::new(watch));
        Ok(read.kvs().first().is_some_and(|kv| self.names_me(kv)))
    }

    /// Finds the predecessor of `position` and watches it. `Ok(true)`: there is none, we are
    /// first (notify).
    async fn look(&mut self, position: Position) -> Result<bool> {
        let before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(position.rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        // A look-up slower than a third of the TTL is of no use (the session needs a keepalive
        // by then): give up and let the engine poll.
        let limit = third_of(position.ttl_secs);
        let mut client = self.inner.client();
        let key = self.keys.candidates();
        let predecessor = within(limit, "changes (predecessor)", async {
            self.inner
                .call(
                    "changes (predecessor)",
                    async move { client.get(key, Some(before)).await },
                )
                .await
        })
        .await?;
        let revision = predecessor.header().map_or(0, etcd_client::ResponseHeader::revision);
        let Some(kv) = predecessor.kvs().first() else {
            let news = self.announced != Some(position);
            self.announced = Some(position);
            return Ok(news);
        };
        self.announced = None;
        let own = self.keys.candidate(&self.candidate);
        self.inner.note_predecessor(&own, position, kv.create_revision());
        // From just after the read, so that nothing since is missed.
        let key = kv.key().to_vec();
        let options = WatchOptions::new()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoPut]);
        // The release marker on the same stream (see `Waiter::decide`), from the same revision:
        // etcd sends the events of one revision to one stream's watches back to back, so a
        // release's marker comes with its deletion, not later on another watch.
        let marker = WatchOptions::new()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoDelete]);
        let granted = self.keys.granted();
        let mut client = self.inner.client();
        let watch = within(limit, "changes (watch)", async {
            self.inner
                .call("changes (watch)", async move {
                    let mut watch = client.watch(key, Some(options)).await?;
                    watch.watch(granted, Some(marker)).await?;
                    Ok(watch)
                })
                .await
        })
        .await?;
        self.watch = Some(Box::new((watch, position)));
        Ok(false)
    }

    /// Keeps the waiting candidate's session alive: `Some(false)` when it has expired, `None`
    /// when etcd did not answer.
    async fn keep_alive(&mut self, waiting: Option<Position>) -> Option<bool> {
        let Some(p) = waiting else { return Some(true) };
        let period = third_of(p.ttl_secs);
        let since = Instant::now().checked_sub(period).unwrap_or_else(Instant::now);
        match self.inner.refreshed_since(p.ttl_secs, since).await {
            Ok(Some(id)) => Some(id == p.lease),
            Ok(None) => Some(false),
            Err(_) => None,
        }
    }
}

/// The revision of the release marker naming `predecessor` in a message of a watch on
/// `granted`, if it has one.
fn marker_naming(resp: &WatchResponse, predecessor: i64) -> Option<i64> {
    resp.events()
        .iter()
        .filter(|e| e.event_type() == EventType::Put)
        .filter_map(etcd_client::Event::kv)
        .find(|kv| crate::record::parse_released(kv.value()) == Some(predecessor) && !hidden_marker(kv))
        .map(etcd_client::KeyValue::mod_revision)
}

/// Test hook: the `granted` keys whose release markers the change streams do not see on their
/// own watch (the marker still reaches etcd, its announcement watchers and the read at the
/// deletion's revision), with how many such markers were hidden; so that a test can show the
/// other ways of deciding. Tests only (see `release_tests`).
#[cfg(test)]
pub(crate) static HIDDEN_MARKERS: std::sync::Mutex<Vec<(Vec<u8>, usize)>> = std::sync::Mutex::new(Vec::new());

#[cfg(test)]
fn hidden_marker(kv: &etcd_client::KeyValue) -> bool {
    let mut hidden = HIDDEN_MARKERS.lock().expect("hidden markers lock");
    hidden
        .iter_mut()
        .find(|(key, _)| key.as_slice() == kv.key())
        .map(|(_, seen)| *seen += 1)
        .is_some()
}

#[cfg(not(test))]
#[inline]
fn hidden_marker(_: &etcd_client::KeyValue) -> bool {
    false
}

async fn within<T>(
    limit: Duration,
    operation: &'static str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or(Err(leasehold_core::Error::Timeout {
            store: crate::error::STORE,
            operation,
            after: limit,
        }))
}
