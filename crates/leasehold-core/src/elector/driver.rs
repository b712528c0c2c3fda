//! The driver: runs one [`Machine`] for one campaign, carries out its outputs (store calls in
//! their own tasks, events, the leader's status) and feeds it inputs.
//! The store calls under way are in `call.rs`, the outputs carried out in `outputs.rs`.

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use super::*;

mod call;
mod outputs;

use call::{Call, call_bound, ended};

/// A store call under way. The engine never drops a store future half-way (a store need not be
/// cancel safe for the engine's sake): the driver polls it until it is done, and when the
/// machine gives up on it (its outcome is then unknown) it runs on in a task of its own to
/// completion, or until [`call_bound`] after it was sent, and its reply still reaches the
/// machine (which releases a grant it no longer waited for).
struct PendingOp {
    id: OpId,
    /// When it was sent.
    sent: Instant,
    /// The reply the machine gets if the call ends without one.
    failed: fn(Error) -> Reply,
    task: Call,
    /// An acquire: a late reply may carry a grant.
    acquire: bool,
}

/// Runs one [`Machine`] for one campaign and its leadership.
pub(super) struct Driver {
    inner: Arc<Inner>,
    machine: Machine,
    op: Option<PendingOp>,
    /// Calls the machine stopped waiting for, still running: their replies come late.
    late: FuturesUnordered<BoxFuture<'static, (OpId, Reply)>>,
    /// How many of them are acquires (each may still come back with a grant).
    late_acquires: u16,
    changes: Option<Changes>,
    /// The store's announcements of new holders, while this candidate follows another one.
    announcements: Option<Announcements>,
    /// Asking the store for them (in a task of its own, like every store call).
    announcements_asked: Option<JoinHandle<Result<Option<Announcements>>>>,
    /// The store said it does not announce.
    announcements_unsupported: bool,
    /// The announcements ended (or asking for them failed) while this candidate followed: ask
    /// again with the next reply that shows another holder.
    announcements_ended: bool,
    /// While elected: the leadership shared with the handles (its mailbox carries their commands).
    leader: Option<LeaderControl>,
    resign_acks: Vec<oneshot::Sender<()>>,
    deposed: Option<(Term, DeposedReason, Instant)>,
    campaign_started: Instant,
    /// The campaign() future was dropped and the machine told to shut down.
    campaign_dropped: bool,
    /// What this campaign saw of another holder, for the failover and handover histograms.
    previous: PreviousHolder,
    /// When the request whose reply the driver took last was sent.
    replied_sent: Option<Instant>,
    /// When the acquire that was granted last was sent.
    won_at: Option<Instant>,
    /// The term of the last reservation seen (a hand-over's successor not in office yet).
    reserved_term: Option<Term>,
    /// Told once the campaign has settled (see [`campaign`]).
    settled: Option<oneshot::Sender<()>>,
}

struct LeaderControl {
    shared: Arc<Shared>,
    status: watch::Sender<Status>,
    heartbeat_seen: u64,
    work_stopped: bool,
}

/// Runs one campaign of `inner`'s candidate, and its leadership, to the end. `settled` is sent
/// (or dropped) once the campaign has ended and every acquire it gave up on has come back; the
/// driver may run on after it, sending again deletions whose outcome was unknown, until they are
/// answered or a new campaign of the elector takes them over.
///
/// The driver is made here and run by reference: its task holds it once (a driver moved into
/// the future of a method taking `self` is held twice, once as the moved-from binding).
pub(super) async fn campaign(inner: Arc<Inner>, elected: oneshot::Sender<Leader>, settled: oneshot::Sender<()>) {
    // Not `match Driver::new(..) { Ok(d) => d.run(..).await, .. }`: the matched temporary would
    // live across the await, a second driver's worth of bytes in the task.
    let mut driver = match Driver::new(inner, settled) {
        Ok(driver) => driver,
        Err(e) => return warn!(error = %e, "the election cannot run"),
    };
    driver.run(elected).await;
}

impl Driver {
    fn new(inner: Arc<Inner>, settled: oneshot::Sender<()>) -> Result<Self> {
        let now = now();
        let first_attempt = inner
            .not_before
            .lock()
            .expect("not_before lock")
            .map_or(now, |t| t.max(now));
        let mut machine = Machine::new(
            inner.timing,
            inner.caps.expiry,
            inner.caps.notifications,
            inner.lease.clone(),
            inner.id.clone(),
            first_attempt,
            random_u64(),
        )?
        .with_store_name(inner.store.name());
        if let Some(earlier) = inner.earlier.lock().expect("earlier lock").as_ref() {
            machine.continue_from(earlier);
        }
        Ok(Driver {
            inner,
            machine,
            op: None,
            late: FuturesUnordered::new(),
            late_acquires: 0,
            changes: None,
            announcements: None,
            announcements_asked: None,
            announcements_unsupported: false,
            announcements_ended: false,
            leader: None,
            resign_acks: Vec::new(),
            deposed: None,
            campaign_started: now,
            campaign_dropped: false,
            previous: PreviousHolder::default(),
            replied_sent: None,
            won_at: None,
            reserved_term: None,
            settled: Some(settled),
        })
    }

    async fn run(&mut self, elected: oneshot::Sender<Leader>) {
        let mut out = Vec::new();
        if self.inner.caps.notifications != crate::Notifications::None {
            // Bounded like any request: a watch that never answers must not stall the campaign.
            // It runs in a task of its own, never dropped half-way.
            let (store, lease, id) = (
                self.inner.store.clone(),
                self.inner.lease.clone(),
                self.inner.id.clone(),
            );
            let bound = call_bound(&self.inner.timing);
            let timeout = |after| Error::Timeout {
                store: self.inner.store.name(),
                operation: "changes",
                after,
            };
            let subscribe = tokio::spawn(
                async move { tokio::time::timeout(bound, store.changes(&lease, &id)).await }.in_current_span(),
            );
            let subscribed = match tokio::time::timeout(self.inner.timing.request_timeout, subscribe).await {
                Ok(Ok(Ok(subscribed))) => subscribed,
                Ok(Ok(Err(_))) => Err(timeout(bound)),
                Ok(Err(e)) => Err(Error::unreachable(
                    self.inner.store.name(),
                    format!("subscribing to changes ended without a reply: {e}"),
                )),
                Err(_) => Err(timeout(self.inner.timing.request_timeout)),
            };
            match subscribed {
                Ok(Some(changes)) => self.changes = Some(changes),
                Ok(None) => self.machine.handle(now(), Input::NotificationsLost, &mut out),
                Err(e) => {
                    warn!(error = %e, "change notifications unavailable; polling");
                    self.machine.handle(now(), Input::NotificationsLost, &mut out);
                }
            }
        }
        let mut elected = Some(elected);
        let mut elected_tx = None;
        loop {
            if self.apply_step(&mut out, &mut elected_tx) {
                tokio::task::yield_now().await;
                continue;
            }
            if let Some(leader) = elected_tx.take() {
                // A dropped campaign() future drops the leader handle here, which releases.
                if let Some(tx) = elected.take() {
                    let _ = tx.send(leader);
                }
            }
            if self.finished() {
                // The release or hand-over is done.
                for ack in self.resign_acks.drain(..) {
                    let _ = ack.send(());
                }
                // Acquires the machine gave up on may still come back with a grant that nobody
                // would renew or release (and `run_until` returns once this driver is done): the
                // machine stops campaigning (it would ask again otherwise) and gives back what
                // they grant, each within its bound, as after a shutdown.
                // Deletions still to send again go to the next campaign's machine when one waits.
                let left = self.machine.has_deletions_left() && !self.inner.campaign_waiting();
                if self.late_acquires == 0 && self.machine.pending().is_none() && !left {
                    break;
                }
                if self.machine.is_following() {
                    self.machine.handle(now(), Input::Shutdown, &mut out);
                    continue;
                }
            }
            if self.machine.is_stopped() {
                for ack in self.resign_acks.drain(..) {
                    let _ = ack.send(());
                }
                // Stopped for good, but acquires the machine gave up on may still come back with
                // a grant: wait for them (each ends within its bound) and let the machine release
                // what they granted, so that nothing of this campaign lands after it ended. (Other
                // calls given up on are dropped with the driver: their answers change nothing.)
                if self.machine.pending().is_none() && self.late_acquires == 0 {
                    // Settled: whoever waits for this campaign may go on. A release, hand-over
                    // or withdrawal whose outcome is unknown is still sent again until the
                    // store answers it (`Machine::has_deletions_left`), here, or by the next
                    // campaign's machine, which takes them over when it starts
                    // (`Machine::continue_from`).
                    if let Some(settled) = self.settled.take() {
                        let _ = settled.send(());
                    }
                    if !self.machine.has_deletions_left() || self.inner.campaign_waiting() {
                        break;
                    }
                }
            }
            if self.op.as_ref().map(|op| op.id) != self.machine.pending() {
                self.abandon_op();
            }
            let input = self.next_input(elected.as_mut()).await;
            let now = now();
            self.track_previous(now, &input);
            self.feed_heartbeat(now, &mut out);
            self.machine.handle(now, input, &mut out);
        }
        for ack in self.resign_acks.drain(..) {
            let _ = ack.send(());
        }
    }

    /// Carries out the machine's outputs of one step, in `out`: `true` when it stopped after a
    /// release or hand-over, the rest left in `out` for after a yield (so that the client's
    /// tasks put the request on the wire before the rest of the step runs). A handover waits for
    /// these, so the outputs that only tell go after them (in their order; the others keep the
    /// machine's): the machine deposed this leader before (its `Deposed` stays ahead), and a new
    /// leader's `Elected` event comes before the `LeaderChanged` that names it. Not async, so
    /// that nothing of it is held across the yield (the driver's future stays small).
    fn apply_step(&mut self, out: &mut Vec<Output>, elected_tx: &mut Option<Leader>) -> bool {
        // Taken, not drained: the buffer is freed (a few hundred bytes a step, thousands of
        // idle leaders in one process keep none).
        let mut batch = std::mem::take(out);
        let ends = |o: &Output| matches!(o, Output::Send(_, Request::Release(_) | Request::HandOver(..)));
        if batch.iter().any(|o| ends(o) || matches!(o, Output::Elected { .. })) {
            batch.sort_by_key(|o| matches!(o, Output::LeaderChanged(_) | Output::StoreTrouble(_)));
        }
        let mut batch = batch.into_iter();
        while let Some(output) = batch.next() {
            let end = ends(&output);
            if let Some(leader) = self.apply(output) {
                *elected_tx = Some(leader);
            }
            if end {
                out.extend(batch);
                return true;
            }
        }
        false
    }

    /// The machine gave up on the call under way: stop waiting; the call runs on in a task of
    /// its own and its reply, when it comes, is handed to the machine as a late one (a late
    /// grant is released, or adopted from the time the acquire was sent).
    fn abandon_op(&mut self) {
        if let Some(PendingOp {
            id,
            failed,
            task,
            acquire,
            ..
        }) = self.op.take()
        {
            self.late_acquires += u16::from(acquire);
            let task = task.detach();
            let store = self.inner.store.name();
            self.late.push(Box::pin(async move {
                (id, task.await.unwrap_or_else(|e| failed(ended(store, e))))
            }));
        }
    }

    fn finished(&self) -> bool {
        self.leader.as_ref().is_some_and(|l| l.status.borrow().stepped_down)
    }

    async fn next_input(&mut self, mut elected: Option<&mut oneshot::Sender<Leader>>) -> Input {
        let mut wake = self.machine.next_wake().map(tokio::time::Instant::from_std);
        let work_running = self.leader.as_ref().is_some_and(|l| !l.work_stopped);
        let left = self.machine.has_deletions_left();
        if work_running && self.inner.timing.stall_timeout.is_some() {
            // Wake up now and then so heartbeats are seen before a stall deadline (one timer for
            // both: each is a hundred bytes of the driver's future).
            let beat = tokio::time::Instant::now() + self.inner.timing.ttl / 20;
            wake = Some(wake.map_or(beat, |at| at.min(beat)));
        }
        loop {
            let elected = elected.as_deref_mut();
            let mailbox = self.leader.as_ref().map(|l| &l.shared.commands);
            let op = &mut self.op;
            let changes = &mut self.changes;
            let asked = &mut self.announcements_asked;
            let announcements = &mut self.announcements;
            return tokio::select! {
                // Commands before the work's end: a handle that asks to step down and then returns
                // must be seen stepping down, not finishing.
                biased;
                command = async { mailbox.expect("guarded").recv().await }, if mailbox.is_some() => match command {
                    Command::Resign(ack) => {
                        self.resign_acks.push(ack);
                        Input::Resign
                    }
                    Command::HandOver { to, ack } => {
                        let work_stopped = ack.is_some();
                        self.resign_acks.extend(ack);
                        Input::HandOver { to, work_stopped }
                    }
                    Command::Shutdown => Input::Shutdown,
                    Command::StepDown(reason) => Input::StepDown(reason),
                    Command::WorkStopped => {
                        if let Some(l) = &mut self.leader {
                            l.work_stopped = true;
                        }
                        Input::WorkStopped
                    }
                },
                joined = async { (&mut op.as_mut().expect("guarded").task).await }, if op.is_some() => {
                    let PendingOp { id, failed, sent, .. } = self.op.take().expect("guarded");
                    self.replied_sent = Some(sent);
                    Input::Reply(id, joined.unwrap_or_else(|e| failed(ended(self.inner.store.name(), e))))
                }
                Some((id, reply)) = self.late.next(), if !self.late.is_empty() => {
                    if matches!(reply, Reply::Acquire(_)) {
                        self.late_acquires -= 1;
                    }
                    Input::Reply(id, reply)
                }
                () = async { tokio::time::sleep_until(wake.expect("guarded")).await }, if wake.is_some() => Input::Tick,
                // A new campaign waits while deletions are left to send again: look again (the
                // run loop hands them over). A wake-up missed here comes with the next resend.
                // (Boxed: the driver's future stays small.)
                () = async { Box::pin(self.inner.campaign_wanted.notified()).await }, if left => Input::Tick,
                change = async { changes.as_mut().expect("guarded").next().await }, if changes.is_some() => match change {
                    Some(crate::store::Change::Changed) => Input::Notified,
                    Some(crate::store::Change::YourTurn(turn)) => Input::YourTurn(turn),
                    None => {
                        self.changes = None;
                        Input::NotificationsLost
                    }
                },
                // The campaign() future was dropped: shut down once (its closed channel stays ready,
                // and answering it again and again would spin while the withdraw is under way).
                () = async { elected.expect("guarded").closed().await }, if elected.is_some() && !self.campaign_dropped => {
                    self.campaign_dropped = true;
                    Input::Shutdown
                }
                answer = async { asked.as_mut().expect("guarded").await }, if asked.is_some() => {
                    self.announcements_asked = None;
                    match answer {
                        Ok(Ok(Some(stream))) => {
                            self.announcements = Some(stream);
                            if self.inner.caps.announces == Announces::GrantsAndRenewals {
                                break Input::RenewalsAnnounced(true);
                            }
                        }
                        Ok(Ok(None)) => self.announcements_unsupported = true,
                        Ok(Err(error)) => {
                            debug!(%error, "announcements unavailable");
                            self.announcements_ended = true;
                        }
                        Err(error) => {
                            debug!(%error, "asking for announcements ended without a reply");
                            self.announcements_ended = true;
                        }
                    }
                    continue;
                }
                announced = async { announcements.as_mut().expect("guarded").next().await }, if announcements.is_some() => {
                    match announced {
                        Some(observation) => Input::Announced(observation),
                        // Whatever the stream announced, its end may hide grants the store
                        // lost (a session that ended, a server restart): read soon, and ask
                        // again once the store answers (`track_previous`).
                        None => {
                            self.announcements = None;
                            self.announcements_ended = true;
                            break Input::RenewalsAnnounced(false);
                        }
                    }
                }
            };
        }
    }

    /// Asks the store for its announcements of `lease`'s new holders, unless this candidate
    /// leads, has them or is asking already, or the store does not announce.
    fn ask_for_announcements(&mut self) {
        if self.leader.is_some()
            || self.announcements.is_some()
            || self.announcements_asked.is_some()
            || self.announcements_unsupported
        {
            return;
        }
        let (store, lease) = (self.inner.store.clone(), self.inner.lease.clone());
        let bound = call_bound(&self.inner.timing);
        let name = store.name();
        self.announcements_asked = Some(tokio::spawn(
            async move {
                tokio::time::timeout(bound, store.announcements(&lease))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::Timeout {
                            store: name,
                            operation: "announcements",
                            after: bound,
                        })
                    })
            }
            .in_current_span(),
        ));
    }

    /// Follows what replies and notifications show of another holder (the machine decides;
    /// this only measures).
    fn track_previous(&mut self, now: Instant, input: &Input) {
        let asked = match input {
            Input::Reply(_, reply) => {
                if telemetry::outcome(reply) != "transient" && telemetry::outcome(reply) != "permanent" {
                    self.inner.store_answered();
                }
                self.replied_sent.take().unwrap_or(now)
            }
            _ => now,
        };
        match input {
            Input::Reply(_, Reply::Acquire(Ok(Acquired::Held(o))))
            | Input::Reply(_, Reply::Inspect(Ok(o)))
            | Input::Reply(_, Reply::Renew(Ok(Renewed::Lost(o))))
            | Input::Announced(o) => {
                if let Some(h) = &o.holder {
                    self.reserved_term = h.reserved.then_some(h.term);
                    if self.announcements_ended && h.id != self.inner.id {
                        self.announcements_ended = false;
                        self.ask_for_announcements();
                    }
                }
                self.previous.seen(asked, now, o, &self.inner.id);
            }
            Input::Reply(_, Reply::Acquire(Ok(Acquired::Granted(_)))) => self.won_at = Some(asked),
            Input::Notified => self.previous.notified(now),
            Input::YourTurn(_) => {
                self.previous.notified(now);
                self.won_at = Some(now);
            }
            _ => {}
        }
    }

    fn feed_heartbeat(&mut self, _now: Instant, out: &mut Vec<Output>) {
        let Some(l) = &mut self.leader else { return };
        let beat = l.shared.heartbeat.load(Ordering::Relaxed);
        if beat > l.heartbeat_seen {
            l.heartbeat_seen = beat;
            let at = l.shared.elected_at + Duration::from_nanos(beat);
            self.machine.handle(now(), Input::Heartbeat(at), out);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // A call under way runs on to its end (its reply has nobody left to reach).
        if let Some(op) = self.op.take()
            && let Call::Running(call) = op.task
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            drop(runtime.spawn(call));
        }
        // However the campaign ends, the next one continues from what this one knew.
        *self.inner.earlier.lock().expect("earlier lock") = Some(self.machine.clone());
        if let Some(l) = &self.leader {
            l.shared.commands.close();
        }
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// Every lease of a process keeps one driver task while it campaigns or leads (10,000 leases
    /// in one process are a use case): its future stays small.
    #[test]
    fn the_driver_future_is_small() {
        let elector = Elector::builder(Arc::new(MemoryStore::new()), "size")
            .build()
            .expect("valid");
        let (tx, _rx) = oneshot::channel();
        let (settled, _) = oneshot::channel();
        let future = campaign(elector.inner.clone(), tx, settled);
        let size = std::mem::size_of_val(&future);
        // 2,624 bytes before the driver was held once and the heartbeat timer merged (1,544
        // after, of which the machine is 624); 1,704 since the machine keeps the deletions it
        // sends again (a `Vec`, and the pending deletion boxed).
        assert!(size <= 1_750, "the driver's future is {size} bytes");
    }
}
