//! Carrying out the machine's outputs: store calls started, the leader's handle and status,
//! events and the engine's log lines; and the watch of hand-over requests a new leader starts.

use super::*;

impl Driver {
    /// Carries out one output; returns a new leader handle on election. Its metrics are
    /// recorded in one place, [`telemetry::record_output`].
    pub(super) fn apply(&mut self, output: Output) -> Option<Leader> {
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
                    parent: None,
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
