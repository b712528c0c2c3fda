//! The change stream of one waiting candidate: it watches only the znode just ahead of the
//! candidate's own (no herd), and yields when the candidate may have become first, or lost its
//! place. When the one znode ahead of the candidate's is deleted, the candidate is first: the
//! stream reads that it leads, with no write, and says so ([`Change::YourTurn`]; why a read is
//! enough, and how the term's records are written later: the `turn` module).
//!
//! No timer: a notification is not lost while the session lives (ZooKeeper delivers a
//! session's watch events in order, and the client sets its watches again when it reconnects
//! to the session); anything else is the engine's, whose safety poll backs every notifying
//! store.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use leasehold_core::{Acquired, CandidateId, Change, Changes, LeaseName, Turn};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::queue::GrantOutcome;
use crate::state::{AbortOnDrop, Inner, OwnNode};
use crate::turn::TurnRead;

/// The change stream of `candidate` for `lease`.
pub(crate) fn changes(inner: Arc<Inner>, lease: &LeaseName, candidate: &CandidateId) -> Changes {
    let watching = Watching {
        rx: inner.subscribe(lease, candidate),
        inner,
        lease: lease.clone(),
        candidate: candidate.clone(),
        announced: None,
        doorbell: None,
    };
    futures::stream::unfold(
        watching,
        |mut w| async move { w.next().await.map(|change| (change, w)) },
    )
    .boxed()
}

/// The state of one change stream: it watches only the znode just ahead of the candidate's own
/// (no herd), and yields when the candidate may have become first, or lost its place.
struct Watching {
    inner: Arc<Inner>,
    lease: LeaseName,
    candidate: CandidateId,
    rx: watch::Receiver<u64>,
    /// The own znode (or lost znode, or reservation) last announced, so each is announced once.
    announced: Option<String>,
    /// The watch for a handover to this candidate, kept across waits.
    doorbell: Option<Doorbell>,
}

/// A waiting exists-watch on the candidate's `wake-{hash}` znode, which a handover to it creates
/// (and deletes again in the same transaction).
struct Doorbell {
    session: i64,
    rung: AbortOnDrop,
}

impl Watching {
    async fn next(&mut self) -> Option<Change> {
        loop {
            self.rx.borrow_and_update();
            let Some(own) = self.inner.own(&self.lease, &self.candidate) else {
                self.rx.changed().await.ok()?;
                continue;
            };
            let client = own.client.clone();
            if own.granted && !client.state().is_terminated() {
                // The engine leads on it, or read it back without adopting it (then its next
                // acquire makes a new term): say so once, then nothing to wait for in ZooKeeper
                // (renew notices a loss).
                let granted = format!("granted:{}", own.name);
                if self.announced.as_deref() != Some(granted.as_str()) {
                    self.announced = Some(granted);
                    return Some(Change::Changed);
                }
                self.rx.changed().await.ok()?;
                continue;
            }
            let lost = format!("lost:{}", own.name);
            if client.state().is_terminated() {
                // The session is gone with our place in the queue: campaign again.
                if self.announced.as_deref() != Some(lost.as_str()) {
                    self.announced = Some(lost);
                    return Some(Change::Changed);
                }
                self.rx.changed().await.ok()?;
                continue;
            }
            // Every request of the stream is bounded: a reply lost on the way must not strand it.
            let bound = client.session_timeout() / 2;
            let queue = match tokio::time::timeout(bound, self.inner.queue(&client, &self.lease)).await {
                Ok(Ok(queue)) => queue.unwrap_or_default(),
                Ok(Err(_)) => {
                    self.wait_state_or_local(&client).await?;
                    continue;
                }
                Err(_) => continue,
            };
            let Some(position) = queue.iter().position(|c| c.name == own.name) else {
                if self.announced.as_deref() != Some(lost.as_str()) {
                    self.announced = Some(lost);
                    return Some(Change::Changed);
                }
                self.rx.changed().await.ok()?;
                continue;
            };
            if position == 0 && self.announced.as_deref() != Some(own.name.as_str()) {
                self.announced = Some(own.name.clone());
                return Some(Change::Changed);
            }
            // The doorbell, set once per session; the reservation is read after the watch is set
            // (a session's requests are served in order): a handover to us is seen by the one or
            // the other, though we wait behind other candidates.
            let session = client.session_id().0;
            if self.doorbell.as_ref().is_none_or(|d| d.session != session) {
                let path = self.inner.doorbell_path(&self.lease, &self.candidate);
                let arm = async {
                    tokio::join!(
                        client.check_and_watch_stat(&path),
                        self.inner.read_reservation(&client, &self.lease)
                    )
                };
                let Ok((watched, reservation)) = tokio::time::timeout(bound, arm).await else {
                    continue;
                };
                let Ok((_, watcher)) = watched else {
                    self.wait_state_or_local(&client).await?;
                    continue;
                };
                // The client panics in a watcher whose session is dropped: keep that panic in
                // a task of its own.
                let rung = AbortOnDrop(tokio::spawn(async move {
                    watcher.changed().await;
                }));
                self.doorbell = Some(Doorbell { session, rung });
                if let Ok(Some(reservation)) = reservation {
                    let reserved = format!("reserved:{}", reservation.generation);
                    if reservation.to == self.candidate && self.announced.as_deref() != Some(reserved.as_str()) {
                        self.announced = Some(reserved);
                        return Some(Change::Changed);
                    }
                }
            }
            // Watch the predecessor (or, when first, our own znode) until it changes. (A
            // handover's successor deletes the znodes queued ahead of its own: each of their
            // candidates sees its predecessor, or when first its own znode, go.)
            let target = &queue[position.saturating_sub(1)];
            let path = self.inner.candidate_path(&self.lease, &target.name);
            let Ok(watched) = tokio::time::timeout(bound, client.check_and_watch_stat(&path)).await else {
                continue;
            };
            let (Some(_), watcher) = (match watched {
                Ok(watched) => watched,
                Err(_) => {
                    self.wait_state_or_local(&client).await?;
                    continue;
                }
            }) else {
                continue;
            };
            let mut task = AbortOnDrop(tokio::spawn(async move { watcher.changed().await.event_type }));
            let Some(doorbell) = self.doorbell.as_mut() else {
                continue;
            };
            tokio::select! {
                event = task.wait() => {
                    if position == 1 && event == Some(zk::EventType::NodeDeleted) {
                        // The only znode ahead of ours is gone: ours heads the queue (a znode
                        // queued later sorts after it). Lead now, without listing the queue
                        // again (the turn's read checks that the znode is gone, ours unchanged
                        // and no reservation is there).
                        self.announced = Some(own.name.clone());
                        let ahead = vec![target.name.clone()];
                        return Some(self.turn(&client, own, ahead, bound).await);
                    }
                }
                // The lease was handed over to us: acquire it now.
                _ = doorbell.rung.wait() => {
                    self.doorbell = None;
                    return Some(Change::Changed);
                }
                changed = self.rx.changed() => {
                    changed.ok()?;
                }
            }
        }
    }

    /// The candidate's turn, its one predecessor gone: one read of what the grant transaction
    /// of an `acquire` would check (the znodes in `ahead` gone, ours unchanged, no reservation;
    /// see [`Inner::read_turn`]), sent under the candidate's operation lock and only if the
    /// store's cached znode is still `own`, waiting. It leads: [`Change::YourTurn`], valid from
    /// the read's send (the server received it on the session, and keeps the session a full
    /// session timeout, the TTL, from then), its znode cached as granted, with the term's
    /// records due when the release before did not write them (the engine's confirming renewal
    /// writes them). A head whose candidate did not wait when it queued is granted by the grant
    /// transaction, sent after the read ([`TurnRead::Unrecorded`]). Anything else (an error, no
    /// answer within `bound`): [`Change::Changed`], and the engine asks, which is always safe
    /// (a read changes nothing; a transaction applied whose reply was lost is found granted by
    /// that acquire).
    async fn turn(
        &mut self,
        client: &zk::Client,
        own: OwnNode,
        ahead: Vec<String>,
        bound: std::time::Duration,
    ) -> Change {
        let ops = self.inner.ops(&self.lease, &self.candidate);
        let _serial = ops.lock().await;
        let current = self.inner.own(&self.lease, &self.candidate);
        if current.is_none_or(|c| c.name != own.name || c.session != own.session || c.granted) {
            return Change::Changed;
        }
        let sent = Instant::now();
        let read = self.inner.read_turn(client, &self.lease, &self.candidate, &own, &ahead);
        let own = match tokio::time::timeout(bound, read).await {
            Ok(Ok(TurnRead::Leads { records_due })) => OwnNode {
                ahead,
                records_due,
                ..own
            },
            Ok(Ok(TurnRead::Unrecorded)) => {
                // The grant transaction an acquire sends (it writes the records).
                let own = OwnNode { ahead, ..own };
                let grant = self.inner.grant(client, &self.lease, &own, &self.candidate, 0);
                let Ok(Ok(GrantOutcome::Granted)) = tokio::time::timeout(bound, grant).await else {
                    return Change::Changed;
                };
                own
            }
            _ => return Change::Changed,
        };
        let ttl = client.session_timeout();
        let Acquired::Granted(grant) = self
            .inner
            .granted(&self.lease, &self.candidate, own, ttl, client, false)
            .await
        else {
            return Change::Changed;
        };
        self.announced = Some(format!("granted:{}", grant.token));
        Change::YourTurn(Turn {
            grant,
            valid_from: sent,
        })
    }

    /// After a request of the stream failed: waits until the session's state or this
    /// candidate's own znode changes, and says what to do next.
    ///
    /// - The session is over (expired, closed): `Some` at once, and the next turn announces the
    ///   lost place. The client marks a session over *before* it fails the requests queued on
    ///   it, and a state watcher made after that never sees a change again: waiting for one
    ///   left a follower deaf after a server restart until the engine's safety poll, 10 TTLs
    ///   later.
    /// - Disconnected: waits; the client reconnects by itself, or gives the session up (at 7/5
    ///   of its timeout), and either change is seen.
    /// - Connected: the server refused the request itself, and nothing the stream waits for
    ///   would change that: `None` ends the stream, and the engine polls (its
    ///   `NotificationsLost`).
    async fn wait_state_or_local(&mut self, client: &zk::Client) -> Option<()> {
        let mut states = client.state_watcher();
        match states.peek_state() {
            state if state.is_terminated() => return Some(()),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => return None,
            _ => {}
        }
        tokio::select! {
            _ = states.changed() => Some(()),
            changed = self.rx.changed() => changed.ok(),
        }
    }
}
