//! Candidates: services and their work, the probe and the event recorder.

use super::*;

/// Removes a leader from the probe's list and records when its work ended.
pub(crate) struct Registration {
    pub(crate) world: Shared,
    pub(crate) slot: u64,
    pub(crate) c: usize,
    pub(crate) term: Term,
}

impl Registration {
    /// The work has stopped (it returned, was aborted, or calls `resign`, which the engine takes
    /// as "the work has stopped" and which then waits for the release).
    pub(crate) fn end(&self, how: &str) {
        let mut w = lock(&self.world);
        if w.finished || w.leaders.remove(&self.slot).is_none() {
            return;
        }
        w.task_ends.insert((self.c, self.term), Instant::now());
        let (c, term) = (self.c, self.term);
        w.log(format!("c{c} work of term {term} {how}"));
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.end("ended");
    }
}

pub(crate) fn register(world: &Shared, c: usize, leader: &Leader) -> Registration {
    let mut w = lock(world);
    let slot = w.next_slot;
    w.next_slot += 1;
    let term = leader.term();
    w.leaders.insert(
        slot,
        Held {
            c,
            term,
            leader: leader.clone(),
        },
    );
    w.log(format!("c{c} work of term {term} started"));
    Registration {
        world: world.clone(),
        slot,
        c,
        term,
    }
}

/// Checks finding 6: past `valid_until - step_down_margin`, the leader is cancelled whatever the
/// driver is doing.
pub(crate) fn check_cancelled(w: &mut World, c: usize, leader: &Leader, when: &str) {
    let now = Instant::now();
    let cancel_at = Instant::from_std(leader.valid_until()) - STEP_DOWN_MARGIN;
    if now > cancel_at && !leader.is_cancelled() {
        let term = leader.term();
        let detail = format!(
            "c{c} term {term}: is_cancelled() is false {:?} after valid_until - step_down_margin ({}), {when}",
            now - cancel_at,
            w.t(cancel_at)
        );
        w.violation_once(Kind::Cancel, format!("cancel {c} {term}"), detail);
    }
}

/// A blocking section: the whole runtime (every candidate, the store) stops while time passes,
/// as a blocking call on a current-thread runtime does.
pub(crate) fn block(world: &Shared, c: usize, leader: &Leader, duration: Duration) {
    lock(world).log(format!("c{c} work blocks the runtime for {duration:?}"));
    let from = Instant::now();
    // The first poll of `advance` moves the clock; the rest is a yield, which is not wanted here.
    let _ = tokio::time::advance(duration).now_or_never();
    let mut w = lock(world);
    w.stats.blocks += 1;
    w.blocked
        .entry((c, leader.term()))
        .or_default()
        .push((from, Instant::now()));
    check_cancelled(&mut w, c, leader, "right after a blocking section");
}

/// A leader's work: checks `ensure_valid` before every side effect (a ledger entry).
pub(crate) async fn work(
    c: usize,
    leader: Leader,
    world: Shared,
    mut rng: Rng,
    plan: Plan,
    may_ignore_cancel: bool,
) -> std::result::Result<(), String> {
    let term = leader.term();
    let registration = register(&world, c, &leader);
    let ignores_cancel = may_ignore_cancel && rng.chance(0.15);
    let stalls_after = if plan.stall_timeout.is_some() && rng.chance(0.3) {
        rng.below(100)
    } else {
        u64::MAX
    };
    let steps = match (plan.turbulent, rng.chance(0.5)) {
        (false, true) => u64::MAX,
        (false, false) => rng.below(300),
        (true, _) => rng.below(60),
    };
    let min_remaining = if rng.chance(0.5) {
        Duration::ZERO
    } else {
        rng.ms(1, 150)
    };
    let other = CandidateId::new(format!(
        "c{}",
        (c + 1 + rng.below(plan.candidates as u64 - 1) as usize) % plan.candidates
    ))
    .expect("a candidate id");
    // Stops as the natural shutdown does once `cancelled()` fired: hands over or resigns.
    let on_cancel = rng.below(3);
    // With a clone alive, the work counts as stopped only once that clone is gone too.
    let cloned = rng.chance(0.1);
    if cloned {
        // Another clone of the handle ends the leadership while this work runs on.
        let (clone, to, after, hand_over) = (leader.clone(), other.clone(), rng.ms(0, 800), rng.chance(0.5));
        let world = world.clone();
        tokio::spawn(async move {
            sleep(after).await;
            lock(&world).log(format!(
                "c{c} a clone of term {term}'s handle {}",
                if hand_over { "hands over" } else { "resigns" }
            ));
            if hand_over {
                clone.hand_over(&to).await;
            } else {
                clone.resign().await;
            }
        });
    }
    for step in 0.. {
        let nap = rng.ms(1, 40);
        if ignores_cancel {
            sleep(nap).await;
        } else {
            tokio::select! {
                biased;
                () = leader.cancelled() => {
                    match on_cancel {
                        0 => return Ok(()),
                        1 => {
                            registration.end("hands over after cancellation (its work has stopped)");
                            if !cloned {
                                lock(&world).stopped_work.insert((c, term));
                            }
                            leader.hand_over(&other).await;
                        }
                        _ => {
                            registration.end("resigns after cancellation (its work has stopped)");
                            if !cloned {
                                lock(&world).stopped_work.insert((c, term));
                            }
                            leader.resign().await;
                        }
                    }
                    return Ok(());
                }
                () = sleep(nap) => {}
            }
        }
        if rng.chance(plan.block) && Instant::now() < calm_from(lock(&world).start) {
            block(&world, c, &leader, rng.ms(20, 1_200));
        }
        match leader.ensure_valid(min_remaining) {
            Ok(()) => {
                let mut w = lock(&world);
                let seq = w.trace.len();
                w.ledger.push((c, term, Instant::now(), seq));
                w.stats.work += 1;
                drop(w);
                if step < stalls_after {
                    leader.heartbeat();
                }
            }
            Err(e) if ignores_cancel => {
                if step % 50 == 0 {
                    lock(&world).log(format!("c{c} work of term {term} (ignoring cancellation): {e}"));
                }
            }
            Err(e) => {
                lock(&world).log(format!("c{c} work of term {term} stops: {e}"));
                return Err(e.to_string());
            }
        }
        if step >= steps {
            return match rng.below(4) {
                0 => {
                    lock(&world).log(format!("c{c} work of term {term} returns"));
                    Ok(())
                }
                1 => {
                    registration.end("resigns (its work has stopped)");
                    leader.resign().await;
                    Ok(())
                }
                2 => {
                    registration.end(&format!("hands over to {other} (its work has stopped)"));
                    leader.hand_over(&other).await;
                    Ok(())
                }
                _ => Err(format!("c{c} work of term {term} fails on purpose")),
            };
        }
    }
    Ok(())
}

pub(crate) fn tasks(
    c: usize,
    world: Shared,
    mut rng: Rng,
    plan: Plan,
) -> impl FnMut(Leader) -> futures::future::BoxFuture<'static, std::result::Result<(), String>> {
    move |leader| work(c, leader, world.clone(), rng.fork(), plan, true).boxed()
}

/// A service that embeds the elector: starts, is shut down, restarts, until the end.
pub(crate) async fn service(c: usize, elector: Elector, world: Shared, mut rng: Rng, plan: Plan, end: Instant) {
    let calm = calm_from(lock(&world).start);
    while Instant::now() < end {
        lock(&world).returned[c] = None;
        let started = Instant::now();
        if started >= calm {
            lock(&world).log(format!("c{c} service runs (calm)"));
            let task = tasks(c, world.clone(), rng.fork(), plan);
            tokio::select! {
                result = elector.run(task) => lock(&world).log(format!("c{c} run returned {result:?}")),
                () = sleep_until(end) => return,
            }
            continue;
        }
        let life = if plan.turbulent {
            rng.ms(100, 4_000)
        } else {
            rng.ms(300, 15_000)
        };
        match rng.below(10) {
            0..=3 => {
                lock(&world).log(format!("c{c} service starts run (shut down after {life:?})"));
                let task = tasks(c, world.clone(), rng.fork(), plan);
                tokio::select! {
                    biased;
                    result = elector.run(task) => {
                        let mut w = lock(&world);
                        w.log(format!("c{c} run returned {result:?}"));
                        w.returned[c] = Some((started, Instant::now()));
                    }
                    () = sleep(life) => dropped_run(&world, c),
                }
            }
            4..=6 => {
                lock(&world).log(format!("c{c} service starts run_until (shutdown after {life:?})"));
                let task = tasks(c, world.clone(), rng.fork(), plan);
                let result = elector.run_until(task, sleep(life)).await;
                let mut w = lock(&world);
                w.log(format!("c{c} run_until returned {result:?}"));
                w.returned[c] = Some((started, Instant::now()));
            }
            _ => {
                lock(&world).log(format!("c{c} campaigns (gives up after {life:?})"));
                match timeout(life, elector.campaign()).await {
                    Err(_) => lock(&world).log(format!("c{c} campaign dropped")),
                    Ok(Err(e)) => lock(&world).log(format!("c{c} campaign failed: {e}")),
                    Ok(Ok(leader)) => {
                        let result = work(c, leader.clone(), world.clone(), rng.fork(), plan, false).await;
                        let resign = rng.chance(0.5);
                        lock(&world).log(format!(
                            "c{c} inline work returned {result:?}; {}",
                            if resign { "resigns" } else { "drops the handle" }
                        ));
                        if resign {
                            leader.resign().await;
                        } else {
                            drop(leader);
                        }
                    }
                }
            }
        }
        sleep(if plan.turbulent {
            rng.ms(0, 300)
        } else {
            rng.ms(0, 2_000)
        })
        .await;
    }
}

/// Records a dropped `run` future and the leaders its task held then.
pub(crate) fn dropped_run(world: &Shared, c: usize) {
    let mut w = lock(world);
    w.stats.dropped_runs += 1;
    let now = Instant::now();
    let held: Vec<_> = w
        .leaders
        .values()
        .filter(|h| h.c == c)
        .map(|h| {
            (
                h.term,
                Instant::from_std(h.leader.valid_until()),
                h.leader.is_cancelled(),
            )
        })
        .collect();
    if held.is_empty() {
        w.log(format!("c{c} run future dropped (not leading)"));
    }
    for (term, valid_until, cancelled) in held {
        w.stats.dropped_while_leading += 1;
        let until = w.t(valid_until);
        w.log(format!(
            "c{c} run future dropped while its task of term {term} runs (valid until {until}, cancelled {cancelled})"
        ));
        w.drops.push(DroppedRun {
            c,
            at: now,
            term,
            valid_until,
        });
    }
}

/// Every few ms: at most one live `Leader` passes `ensure_valid(0)`.
pub(crate) async fn probe(world: Shared, end: Instant, progress: Arc<AtomicU64>) {
    while Instant::now() < end {
        sleep(PROBE_EVERY).await;
        progress.fetch_add(1, Ordering::Relaxed);
        let mut w = lock(&world);
        let mut believing: Vec<_> = w
            .leaders
            .values()
            .filter(|h| h.leader.ensure_valid(Duration::ZERO).is_ok())
            .map(|h| (h.c, h.term))
            .collect();
        let now = Instant::now();
        for key in &believing {
            w.last_valid.insert(*key, now);
        }
        believing.sort();
        believing.dedup();
        if believing.len() > 1 {
            let who: Vec<_> = believing.iter().map(|(c, t)| format!("c{c} term {t}")).collect();
            let detail = format!("ensure_valid(0) is Ok for {} at once", who.join(" and "));
            w.violation_once(Kind::Probe, format!("probe {believing:?}"), detail);
        }
        let leaders: Vec<_> = w.leaders.values().map(|h| (h.c, h.leader.clone())).collect();
        for (c, leader) in leaders {
            check_cancelled(&mut w, c, &leader, "seen by the probe");
        }
    }
}

pub(crate) async fn record_events(c: usize, mut events: broadcast::Receiver<Event>, world: Shared) {
    loop {
        match events.recv().await {
            Ok(event) => lock(&world).on_event(c, event),
            Err(broadcast::error::RecvError::Lagged(n)) => lock(&world).lagged += n,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
