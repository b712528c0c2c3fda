//! The change stream of one waiting candidate: a watch on its predecessor's key only.
//!
//! A candidate queued behind others needs to hear of exactly one event: its immediate
//! predecessor (the key with the greatest `create_revision` below its own) going away. Watching
//! only that key makes a release wake one candidate, not all of them (no thundering herd). When
//! the predecessor goes by a release while first, the candidate is first and holds the lease:
//! the stream says so ([`Change::YourTurn`]), valid from its session's last confirmed keepalive,
//! with no request (the engine confirms it with its next renewal, which writes the term's
//! records). Whether the deletion was such a release is a fact the release wrote in the same
//! transaction: a marker naming the predecessor in the lease's `granted` key, which the same
//! watch stream also watches (etcd sends one revision's events of one stream back to back), or
//! which the store's announcement watch saw. Anything else (another key still ahead, an expiry,
//! a withdrawal, a hand-over, a marker not seen with the deletion): the stream says
//! [`Change::Changed`] and the engine asks, which is always safe.
//!
//! A handed-over lease goes to its named successor, wherever it waits: so the stream also
//! watches the lease's reservation key, and notifies when a reservation naming its candidate is
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
use leasehold_core::{CandidateId, Change, Changes, EndReason, Result, Turn};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::record::Keys;
use crate::session::third_of;
use crate::state::{Inner, Position};

struct Waiter {
    inner: Arc<Inner>,
    keys: Keys,
    candidate: CandidateId,
    position: watch::Receiver<Option<Position>>,
    /// The watch on the reservation key, while waiting.
    reservation: Option<Box<WatchStream>>,
    /// The predecessor watch, for the position it was set up for.
    watch: Option<Box<(WatchStream, Position)>>,
    /// The predecessor last watched at a position (its create_revision), kept after it went:
    /// its release marker, seen later on the store's announcement watch, is still our turn.
    behind: Option<(Position, i64)>,
    /// The position for which "first" was said, so that it is said once.
    announced: Option<Position>,
    tick: Option<(tokio::time::Interval, i64)>,
    /// The release markers the store's announcement watch sees (see `announce::released`).
    released: Option<watch::Receiver<Option<i64>>>,
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
        behind: None,
        announced: None,
        tick: None,
        released: None,
    };
    Box::pin(futures::stream::unfold(waiter, |mut waiter| async move {
        waiter.next().await.map(|change| (change, waiter))
    }))
}

impl Waiter {
    /// Runs until the next change; `None` ends the stream (the engine then polls).
    ///
    /// A leader's stream (and one whose candidate has not queued) waits here, for its position
    /// only, in a small future; the watches of a waiting candidate run in a boxed one, made
    /// when it starts waiting and dropped when it stops (10,000 leaders would otherwise each
    /// keep the waiting state's futures, about 1 KB).
    async fn next(&mut self) -> Option<Change> {
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
    async fn next_while_waiting(&mut self) -> Option<Option<Change>> {
        loop {
            let position = *self.position.borrow_and_update();
            let waiting = position.filter(|p| !p.granted);
            if self.watch.as_ref().map(|w| w.1) != waiting {
                self.watch = None;
            }
            self.set_tick(waiting);
            let Some(p) = waiting else {
                self.reservation = None;
                return None;
            };
            if self.reservation.is_none() {
                match Box::pin(self.watch_reservation(p)).await {
                    Ok(true) => return Some(Some(Change::Changed)),
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
            if self.watch.is_none() {
                // Boxed: the look-up's etcd futures are large, and a stream's state lives as
                // long as its candidate (10,000 leaders would otherwise hold ~44 KB each).
                match Box::pin(self.look(p)).await {
                    Ok(true) => {
                        // First: by our last predecessor's release (its marker already seen on
                        // the announcement watch), or otherwise (the engine asks).
                        return Some(Some(match self.predecessor(p).filter(|r| self.marker_seen(*r)) {
                            Some(predecessor) => Box::pin(self.turn(p, predecessor)).await,
                            None => Change::Changed,
                        }));
                    }
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
            tokio::select! {
                changed = async { released.as_mut().expect("guarded").changed().await }, if released.is_some() => {
                    if changed.is_err() {
                        // The store's announcement watch ended: looked for again next time.
                        self.released = None;
                    } else if let Some(predecessor) = self.predecessor(p).filter(|r| self.marker_seen(*r)) {
                        // Our predecessor was released while first (its key's deletion, at the
                        // same revision, may come on the other watch later).
                        return Some(Some(Box::pin(self.turn(p, predecessor)).await));
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
                                return Some(Some(Change::Changed));
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
                            if let Some(change) = Box::pin(self.predecessor_event(p, &resp)).await {
                                return Some(Some(change));
                            }
                        }
                        Ok(None) | Err(_) => return Some(None),
                    }
                }
                _ = async { tick.as_mut().expect("guarded").0.tick().await }, if tick.is_some() => {
                    match Box::pin(self.keep_alive(p)).await {
                        Some(true) => {
                            // We said "first" a tick ago and the engine has not asked since (it
                            // may have missed it while a request was out): say it again.
                            if self.announced == Some(p) {
                                return Some(Some(Change::Changed));
                            }
                        }
                        Some(false) => {
                            // Our session is gone, and our key with it: the engine must queue again.
                            return Some(Some(Change::Changed));
                        }
                        // Unreachable: the watch may be dead too; let the engine poll.
                        None => return Some(None),
                    }
                }
            }
        }
    }

    /// The predecessor this stream watches, or last watched, at `p`.
    fn predecessor(&self, p: Position) -> Option<i64> {
        self.behind.filter(|b| b.0 == p).map(|b| b.1)
    }

    /// Whether the store's announcement watch saw the release marker naming `predecessor`.
    fn marker_seen(&self, predecessor: i64) -> bool {
        self.released.as_ref().is_some_and(|r| *r.borrow() == Some(predecessor))
    }

    /// A message of the predecessor's watch stream (which also watches `granted`): the change
    /// to say, if any. The predecessor gone by a release while first (its marker in this
    /// message or in those already received with it, or seen by the store's announcement watch)
    /// is the candidate's turn; gone otherwise (or its marker not seen yet), or the watch
    /// cancelled (e.g. compacted), the engine is told to ask, which is always safe (the look-up
    /// follows when the engine next polls the stream, and does not say "first" a second time).
    async fn predecessor_event(&mut self, p: Position, resp: &WatchResponse) -> Option<Change> {
        let predecessor = self.predecessor(p)?;
        let gone = resp.events().iter().any(|e| e.event_type() == EventType::Delete);
        let mut marker = marker_naming(resp, predecessor).is_some();
        if gone && !marker {
            // The marker's event usually follows at once: those already received are read
            // without waiting.
            let stream = &mut self.watch.as_mut().expect("watching").0;
            while let Some(Ok(Some(next))) = stream.message().now_or_never() {
                marker |= marker_naming(&next, predecessor).is_some();
            }
        }
        if !(resp.canceled() || gone || marker) {
            return None;
        }
        self.watch = None;
        self.announced = Some(p);
        marker = marker || self.marker_seen(predecessor);
        Some(if marker {
            self.turn(p, predecessor).await
        } else {
            Change::Changed
        })
    }

    /// The candidate's turn at `p`, its predecessor released while first: no key is ahead of
    /// ours (none was ahead of the predecessor, it is gone, and no key can be created before
    /// ours later, since revisions only grow), and no reservation can be there (the release
    /// compared it, and only a holder hands over). Our key is then taken only by its session's
    /// expiry (or by this candidate, or an operator's break), and etcd keeps the session at
    /// least its TTL from a moment after its last confirmed keepalive was sent: the turn is
    /// valid from that send (or from the start of a one-shot grant of the key that may still
    /// bind it to a lease of its own, if earlier). [`Change::Changed`] when the session is another one by now, or the
    /// store has begun to delete our key.
    async fn turn(&mut self, p: Position, predecessor: i64) -> Change {
        self.announced = Some(p);
        let Some(mut valid_from) = self.inner.confirmed_since(p.ttl_secs, p.lease).await else {
            return Change::Changed;
        };
        let own = self.keys.candidate(&self.candidate);
        if let Some(began) = self.inner.one_shot_began(&own, p) {
            valid_from = valid_from.min(began);
        }
        let Some(grant) = self.inner.take_turn(&self.keys, &own, &self.candidate, p) else {
            return Change::Changed;
        };
        crate::announce::announce_ended(&self.inner, &self.keys.lease, predecessor, EndReason::Released);
        Change::YourTurn(Turn {
            grant,
            valid_from: valid_from.into_std(),
        })
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
            // First. Said once, unless our last predecessor's release marker has been seen since
            // (then it is our turn, see `Waiter::next_while_waiting`).
            let released = self.predecessor(position).is_some_and(|r| self.marker_seen(r));
            let news = self.announced != Some(position) || released;
            self.announced = Some(position);
            return Ok(news);
        };
        self.announced = None;
        let predecessor_rev = kv.create_revision();
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
        self.behind = Some((position, predecessor_rev));
        Ok(false)
    }

    /// Keeps the waiting candidate's session alive: `Some(false)` when it has expired, `None`
    /// when etcd did not answer.
    async fn keep_alive(&mut self, p: Position) -> Option<bool> {
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
        .find(|kv| crate::record::parse_released(kv.value()) == Some(predecessor))
        .map(etcd_client::KeyValue::mod_revision)
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
