//! The driver: runs one [`Machine`] for one campaign, carries out its outputs (store calls in
//! their own tasks, events, the leader's status) and feeds it inputs.

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use super::*;

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

/// A store call, polled by the driver: answered at its first poll (a store that needs no
/// request, such as etcd granting a queued candidate on its predecessor's release), running
/// (its request sent, its reply awaited here), or handed to a task of its own once the machine
/// stopped waiting for it. Polled in the driver rather than in a task from the start: a spawn
/// (which may wake another worker thread) and a task hop back with the reply were on the way of
/// every request (a release before the successor's grant, a renewal before the leader's
/// extension).
enum Call {
    Answered(Option<std::result::Result<Reply, String>>),
    Running(BoxFuture<'static, Reply>),
    Detached(JoinHandle<Reply>),
}

impl Call {
    /// Polls `call` once here.
    fn start(call: impl Future<Output = Reply> + Send + 'static) -> Call {
        let mut call = Call::Running(Box::pin(call));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(&mut call).poll(&mut cx) {
            std::task::Poll::Ready(reply) => Call::Answered(Some(reply)),
            // Polled again with the driver's waker when the driver next waits (after the yield
            // that follows a release): the store's waker for it is the no-op one until then.
            std::task::Poll::Pending => call,
        }
    }

    /// The call runs on in a task of its own: the driver no longer polls it.
    fn detach(self) -> Call {
        match self {
            Call::Running(call) => Call::Detached(tokio::spawn(call)),
            other => other,
        }
    }
}

impl Future for Call {
    /// The reply, or why the call ended without one.
    type Output = std::result::Result<Reply, String>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        match this {
            Call::Answered(reply) => std::task::Poll::Ready(reply.take().expect("a call's reply is taken once")),
            Call::Running(call) => {
                // A store that panics fails this call (the request may or may not have been
                // applied), as a panic in its own task would; the driver goes on.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx))) {
                    Ok(std::task::Poll::Ready(reply)) => {
                        *this = Call::Answered(None);
                        std::task::Poll::Ready(Ok(reply))
                    }
                    Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
                    Err(_) => {
                        *this = Call::Answered(None);
                        std::task::Poll::Ready(Err("it panicked".to_string()))
                    }
                }
            }
            Call::Detached(task) => std::pin::Pin::new(task).poll(cx).map(|r| r.map_err(|e| e.to_string())),
        }
    }
}

/// A call that panicked or was cancelled: the request may or may not have been applied, so the
/// error is a transient one (the machine reads back, and remembers an unknown acquire).
fn ended(store: &'static str, why: String) -> Error {
    Error::unreachable(store, format!("the store call ended without a reply: {why}"))
}

/// How long a store call may run: past the lease's TTL its outcome can no longer change what
/// the engine believes (every grant it might carry has expired by the machine's own count), and
/// past `request_timeout` the machine stopped waiting for it.
fn call_bound(timing: &Timing) -> Duration {
    timing.ttl.max(timing.request_timeout)
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
}

struct LeaderControl {
    shared: Arc<Shared>,
    status: watch::Sender<Status>,
    heartbeat_seen: u64,
    work_stopped: bool,
}

/// Runs one campaign of `inner`'s candidate, and its leadership, to the end.
///
/// The driver is made here and run by reference: its task holds it once (a driver moved into
/// the future of a method taking `self` is held twice, once as the moved-from binding).
pub(super) async fn campaign(inner: Arc<Inner>, elected: oneshot::Sender<Leader>) {
    // Not `match Driver::new(..) { Ok(d) => d.run(..).await, .. }`: the matched temporary would
    // live across the await, a second driver's worth of bytes in the task.
    let mut driver = match Driver::new(inner) {
        Ok(driver) => driver,
        Err(e) => return warn!(error = %e, "the election cannot run"),
    };
    driver.run(elected).await;
}

impl Driver {
    fn new(inner: Arc<Inner>) -> Result<Self> {
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
            leader: None,
            resign_acks: Vec::new(),
            deposed: None,
            campaign_started: now,
            campaign_dropped: false,
            previous: PreviousHolder::default(),
            replied_sent: None,
            won_at: None,
            reserved_term: None,
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
                if self.late_acquires == 0 && self.machine.pending().is_none() {
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
                // Stopped for good, but calls the machine gave up on may still come back with a
                // grant: wait for them (each ends within its bound) and let the machine release
                // what they granted, so that nothing of this campaign lands after it ended. The
                // next campaign of this elector starts once this driver is done.
                if self.late.is_empty() && self.machine.pending().is_none() {
                    break;
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
                        Ok(Err(error)) => debug!(%error, "announcements unavailable"),
                        Err(error) => debug!(%error, "asking for announcements ended without a reply"),
                    }
                    continue;
                }
                announced = async { announcements.as_mut().expect("guarded").next().await }, if announcements.is_some() => {
                    match announced {
                        Some(observation) => Input::Announced(observation),
                        None => {
                            self.announcements = None;
                            if self.inner.caps.announces == Announces::GrantsAndRenewals {
                                break Input::RenewalsAnnounced(false);
                            }
                            continue;
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

    /// Carries out one output; returns a new leader handle on election. Its metrics are
    /// recorded in one place, [`telemetry::record_output`].
    fn apply(&mut self, output: Output) -> Option<Leader> {
        let lease = self.inner.lease.as_str().to_string();
        let at = now();
        if matches!(output, Output::Elected { .. }) {
            // What the store already announced counts too (a store may say how the last term
            // ended as it grants: the announcements are dropped here). Before the election's own
            // metrics: a scrape that shows this candidate leading shows the hand-over too.
            while let Some(Some(observation)) = self.announcements.as_mut().and_then(|a| a.next().now_or_never()) {
                self.previous.seen(at, at, &observation, &self.inner.id);
            }
            std::mem::take(&mut self.previous).record(&lease, at, self.won_at.take().unwrap_or(at));
        }
        telemetry::record_output(&lease, self.inner.store.name(), &output, at, self.campaign_started);
        match output {
            Output::Send(id, request) => {
                let store = self.inner.store.clone();
                let lease_name = self.inner.lease.clone();
                let me = self.inner.id.clone();
                let guard = RequestGuard {
                    lease: lease.clone(),
                    store: store.name(),
                    operation: telemetry::operation(&request),
                    done: false,
                };
                let failed: fn(Error) -> Reply = match &request {
                    Request::Acquire(_) => |e| Reply::Acquire(Err(e)),
                    Request::Renew(_) => |e| Reply::Renew(Err(e)),
                    Request::Release(_) | Request::HandOver(..) => |e| Reply::Release(Err(e)),
                    Request::Inspect => |e| Reply::Inspect(Err(e)),
                    Request::Withdraw => |e| Reply::Withdraw(Err(e)),
                };
                let bound = call_bound(&self.inner.timing);
                let operation = telemetry::operation(&request);
                let acquire = matches!(request, Request::Acquire(_));
                let call = async move {
                    let started = now();
                    let reply = match request {
                        Request::Acquire(r) => Reply::Acquire(store.acquire(&r).await),
                        Request::Renew(g) => {
                            let reply = store.renew(&g).await;
                            metrics::histogram!(telemetry::RENEW_SECONDS, "lease" => g.lease.as_str().to_string())
                                .record((now() - started).as_secs_f64());
                            Reply::Renew(reply)
                        }
                        Request::Release(g) => Reply::Release(store.release(&g).await),
                        // Where the store cannot reserve the lease, it opens to everyone.
                        Request::HandOver(g, to) => Reply::Release(match store.hand_over(&g, &to).await {
                            Err(Error::Unsupported { .. }) => store.release(&g).await,
                            other => other,
                        }),
                        Request::Inspect => Reply::Inspect(store.inspect(&lease_name).await),
                        Request::Withdraw => Reply::Withdraw(store.withdraw(&lease_name, &me).await),
                    };
                    guard.finish(&reply);
                    reply
                };
                let store_name = self.inner.store.name();
                let task = Call::start(
                    async move {
                        tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
                            failed(Error::Timeout {
                                store: store_name,
                                operation,
                                after: bound,
                            })
                        })
                    }
                    .in_current_span(),
                );
                // The machine sends its next request in the same step as it gives up on the
                // last one: that one's reply still comes, late.
                self.abandon_op();
                self.op = Some(PendingOp {
                    id,
                    failed,
                    sent: now(),
                    task,
                    acquire,
                });
                None
            }
            Output::Elected { grant, valid_until } => {
                info!(term = %grant.term, "elected");
                // A leader learns of another holder from its renewals: it needs neither the
                // store's change notifications nor its announcements (a watch, a listener's
                // routing or a read per change on some stores). A new campaign asks again.
                self.changes = None;
                self.announcements = None;
                self.announcements_asked = None;
                *self.inner.leading.lock().expect("leading lock") = Some(valid_until);
                let (status_tx, status) = watch::channel(Status {
                    valid_until,
                    deposed: None,
                    stepped_down: false,
                });
                let shared = Arc::new(Shared {
                    lease: self.inner.lease.clone(),
                    holder: self.inner.id.clone(),
                    term: grant.term,
                    elected_at: at,
                    status,
                    token: CancellationToken::new(),
                    heartbeat: AtomicU64::new(0),
                    commands: Mailbox::default(),
                    abort: Mutex::new(None),
                    step_down_margin: self.inner.timing.step_down_margin,
                    believed_ttl: self.inner.timing.believed_ttl(),
                });
                self.leader = Some(LeaderControl {
                    shared: shared.clone(),
                    status: status_tx,
                    heartbeat_seen: 0,
                    work_stopped: false,
                });
                self.emit(Event::Elected {
                    term: grant.term,
                    at,
                    valid_until,
                });
                if let Some(requests) = &self.inner.hand_over_requests {
                    tokio::spawn(watch_hand_over_requests(
                        self.inner.clone(),
                        requests.clone(),
                        shared.clone(),
                    ));
                }
                Some(Leader {
                    _alive: Arc::new(Alive(shared.clone())),
                    shared,
                })
            }
            Output::Extended { valid_until } => {
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.valid_until = valid_until);
                }
                if let Some(leading) = self.inner.leading.lock().expect("leading lock").as_mut() {
                    *leading = valid_until;
                }
                None
            }
            Output::Deposed {
                term,
                reason,
                believed_until,
            } => {
                match reason {
                    DeposedReason::Resigned | DeposedReason::WorkFinished | DeposedReason::HandedOver { .. } => {
                        info!(%term, %reason, "stepped down");
                    }
                    _ => warn!(%term, %reason, "deposed"),
                }
                *self.inner.leading.lock().expect("leading lock") = None;
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.deposed = Some(reason.clone()));
                    l.shared.token.cancel();
                }
                self.deposed = Some((term, reason, believed_until));
                None
            }
            Output::AbortWork => {
                if let Some(l) = &self.leader
                    && let Some(handle) = l.shared.abort.lock().expect("abort lock").take()
                {
                    warn!("the leader's work did not stop by valid_until; aborting it");
                    handle.abort();
                }
                None
            }
            Output::SteppedDown {
                term,
                work_stopped_after,
                aborted,
            } => {
                *self.inner.not_before.lock().expect("not_before lock") =
                    Some(at + self.inner.timing.step_down_backoff());
                if let Some((_, reason, believed_until)) = self.deposed.take() {
                    self.emit(Event::Deposed {
                        term,
                        reason,
                        believed_until,
                        work_stopped_after,
                        aborted,
                    });
                }
                if let Some(l) = &self.leader {
                    l.status.send_modify(|s| s.stepped_down = true);
                }
                None
            }
            Output::LeaderChanged(leader) => {
                if leader.as_ref().is_some_and(|(holder, _)| *holder != self.inner.id) {
                    self.ask_for_announcements();
                }
                let reserved_term = self.reserved_term;
                let info = leader.map(|(holder, term)| LeaderInfo {
                    holder,
                    reserved: reserved_term == Some(term),
                    term,
                    since: at,
                    since_wall: SystemTime::now(),
                });
                {
                    let mut seen = self.inner.leader.lock().expect("leader lock");
                    if let Some(watch) = &seen.watch {
                        watch.send_replace(info.clone());
                    }
                    seen.current = info.clone();
                }
                self.emit(Event::LeaderChanged(info));
                None
            }
            Output::StoreTrouble(error) => {
                if error.is_transient() {
                    debug!(%error, "store trouble");
                } else {
                    // A definite failure (e.g. credentials or permissions) will not go away by
                    // itself: say so at once; the engine keeps retrying at its pace.
                    warn!(%error, "store trouble");
                }
                self.emit(Event::StoreTrouble { error: Arc::new(error) });
                None
            }
            Output::Stopped => None,
        }
    }

    fn emit(&self, event: Event) {
        if let Some(events) = self.inner.events.get() {
            let _ = events.send(event);
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

/// While this candidate leads (until the leadership's token is cancelled): reads the lease of
/// hand-over requests once per `renew_every`, and when another candidate holds it, asks the
/// driver to hand the lease over to that candidate.
async fn watch_hand_over_requests(inner: Arc<Inner>, requests: LeaseName, shared: Arc<Shared>) {
    let leading = &shared.token;
    let every = inner.timing.renew_every;
    loop {
        tokio::select! {
            () = leading.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let read = tokio::time::timeout(inner.timing.request_timeout, inner.store.inspect(&requests));
        let to = match read.await {
            Ok(Ok(observation)) => observation.holder.map(|h| h.id).filter(|to| *to != inner.id),
            Ok(Err(e)) => {
                debug!(error = %e, lease = %requests, "cannot read hand-over requests");
                None
            }
            Err(_) => None,
        };
        if let Some(to) = to {
            if !leading.is_cancelled() {
                info!(%to, "handing the lease over, as asked through {requests}");
                let _ = shared.commands.send(Command::HandOver { to, ack: None });
            }
            return;
        }
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
        let future = campaign(elector.inner.clone(), tx);
        let size = std::mem::size_of_val(&future);
        // 2,624 bytes before the driver was held once and the heartbeat timer merged (1,544
        // after, of which the machine is 624).
        assert!(size <= 1_700, "the driver's future is {size} bytes");
    }
}
