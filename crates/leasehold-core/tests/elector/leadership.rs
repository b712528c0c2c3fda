//! Campaigns, runs and the leader's handle: elections and their events, observing, a task's end,
//! `ensure_valid`, dropped runs and a starved driver.

use super::*;

#[tokio::test(start_paused = true)]
async fn campaign_resign_and_the_successor_gets_a_higher_term() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let b = builder(&store, "b").build().unwrap();
        let la = a.campaign().await.unwrap();
        assert_eq!(la.term(), Term(1), "{kind}");
        assert_eq!(la.holder().as_str(), "a");
        assert_eq!(la.lease(), &lease());

        let follower = tokio::spawn({
            let b = b.clone();
            async move { b.campaign().await }
        });
        // a renews for 10 TTLs; b keeps campaigning.
        sleep(TTL * 10).await;
        assert!(!follower.is_finished(), "{kind}: b elected while a leads");
        assert!(la.ensure_valid(ms(1)).is_ok(), "{kind}");

        let resigned_at = now();
        la.resign().await;
        let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
        assert_eq!(lb.term(), Term(2), "{kind}");
        // Release notifications: no waiting for a poll.
        assert_eq!(tokio_instant(lb.elected_at()), resigned_at, "{kind}");

        let history = store.history(&lease(), 10).await.unwrap();
        let terms: Vec<_> = history
            .iter()
            .map(|t| (t.term.0, t.holder.as_str().to_string()))
            .collect();
        assert_eq!(terms, [(1, "a".to_string()), (2, "b".to_string())], "{kind}");
        assert_eq!(
            history[0].ended.map(|(_, how)| how),
            Some(EndReason::Released),
            "{kind}"
        );
        lb.resign().await;
    }
}

/// A new leader's `Elected` event comes before the `LeaderChanged` that names it (the driver
/// applies what a handover waits for first, and what only tells after), on election at once and
/// after a handover.
#[tokio::test(start_paused = true)]
async fn elected_comes_before_the_leader_changed_that_names_the_new_leader() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let b = builder(&store, "b").build().unwrap();
        let (mut a_events, mut b_events) = (a.events(), b.events());
        let la = a.campaign().await.unwrap();
        let follower = tokio::spawn(async move { b.campaign().await });
        sleep(TTL).await;
        la.resign().await;
        let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
        for (who, events) in [("a", &mut a_events), ("b", &mut b_events)] {
            let order = drain(events, |e| match e {
                Event::Elected { .. } => Some("Elected"),
                Event::LeaderChanged(Some(info)) if info.holder.as_str() == who => Some("LeaderChanged(self)"),
                _ => None,
            });
            assert_eq!(order, ["Elected", "LeaderChanged(self)"], "{kind}: {who}");
        }
        lb.resign().await;
    }
}

#[tokio::test(start_paused = true)]
async fn observe_shows_the_leader_to_a_follower() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let b = builder(&store, "b").build().unwrap();
        let la = a.campaign().await.unwrap();
        let mut seen_by_b = b.observe();
        assert_eq!(*seen_by_b.borrow(), None);
        let mut b_events = b.events();
        let follower = tokio::spawn(async move { b.campaign().await });

        let info: LeaderInfo = timeout(PATIENCE, seen_by_b.wait_for(Option::is_some))
            .await
            .unwrap()
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!((info.holder.as_str(), info.term), ("a", Term(1)), "{kind}");
        let (changed, _) = wait_for(&mut b_events, |e| match e {
            Event::LeaderChanged(l) => Some(l.clone()),
            _ => None,
        })
        .await;
        assert_eq!(changed, Some(info), "{kind}");
        // The leader sees itself.
        assert_eq!(
            a.observe().borrow().as_ref().map(|l| l.holder.as_str().to_string()),
            Some("a".to_string())
        );

        la.resign().await;
        let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
        let info = seen_by_b.borrow().clone().unwrap();
        assert_eq!((info.holder.as_str(), info.term), ("b", Term(2)), "{kind}");
        lb.resign().await;
    }
}

#[tokio::test(start_paused = true)]
async fn run_returns_the_task_result_and_releases_the_lease() {
    for (kind, store) in stores() {
        let elector = builder(&store, "a").build().unwrap();
        let mut events = elector.events();
        let started = now();
        // The task outlives a few renewals, then fails.
        let result = elector
            .run(|leader: Leader| async move {
                for _ in 0..5 {
                    leader.ensure_valid(ms(500)).map_err(|e| e.to_string())?;
                    leader.heartbeat();
                    sleep(ms(2_000)).await;
                }
                Err::<(), _>(format!("boom at term {}", leader.term()))
            })
            .await;
        assert!(
            matches!(&result, Err(RunError::Task(m)) if m == "boom at term 1"),
            "{kind}: {result:?}"
        );
        assert_eq!(
            now() - started,
            ms(10_000),
            "{kind}: run returns as soon as the task does"
        );
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(obs.holder, None, "{kind}");
        assert_eq!(obs.previous_end, Some(EndReason::Released), "{kind}");
        let (d, _) = deposed(&mut events).await;
        assert_eq!(d.reason, DeposedReason::WorkFinished, "{kind}");
        assert_eq!(
            (d.work_stopped_after, d.aborted),
            (Some(Duration::ZERO), false),
            "{kind}"
        );

        // A task that succeeds: Ok, and the next campaign has a higher term.
        let result = elector
            .run(|leader: Leader| async move {
                assert_eq!(leader.term(), Term(2));
                Ok::<(), String>(())
            })
            .await;
        assert!(result.is_ok(), "{kind}: {result:?}");
        assert_eq!(store.inspect(&lease()).await.unwrap().holder, None, "{kind}");
    }
}

#[tokio::test(start_paused = true)]
async fn run_reports_a_panicking_task() {
    let store = MemoryStore::new();
    let elector = builder(&store, "a").build().unwrap();
    async fn panics(_leader: Leader) -> Result<(), String> {
        panic!("the task panics on purpose")
    }
    let result = elector.run(panics).await;
    assert!(matches!(result, Err(RunError::Panicked)), "{result:?}");
    assert_eq!(store.inspect(&lease()).await.unwrap().holder, None);
}

#[tokio::test(start_paused = true)]
async fn task_ignoring_cancellation_is_aborted_at_valid_until() {
    for (kind, store) in stores() {
        let elector = builder(&store, "a").build().unwrap();
        let mut events = elector.events();
        let runner = tokio::spawn({
            let elector = elector.clone();
            async move {
                elector
                    .run(|leader: Leader| async move {
                        let _leader = leader; // held, never looked at again
                        std::future::pending::<()>().await;
                        Ok::<(), String>(())
                    })
                    .await
            }
        });
        let (term, at, valid_until) = elected(&mut events).await;
        assert_eq!((term, valid_until - at), (Term(1), believed()), "{kind}");
        // An operator breaks the lease; the leader finds out at its next renewal.
        assert_eq!(store.break_lease(&lease()).await.unwrap(), Some(Term(1)));
        let (d, arrived) = deposed(&mut events).await;
        assert_eq!(
            d,
            Deposed {
                term: Term(1),
                reason: DeposedReason::Superseded { by: None, term: None },
                believed_until: at + renew_every(),
                work_stopped_after: None,
                aborted: true,
            },
            "{kind}"
        );
        // The work was cancelled at the renewal and dropped at valid_until.
        assert_eq!(arrived, valid_until, "{kind}");

        // Losing the lease does not end run(): it campaigns again after the step-down backoff.
        let (term, at, _) = elected(&mut events).await;
        let backoff = elector.timing().step_down_backoff();
        assert_eq!((term, at), (Term(2), valid_until + backoff), "{kind}");
        assert!(!runner.is_finished());
        runner.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn ensure_valid_fails_when_too_little_time_is_left_and_after_deposition() {
    for (kind, store) in stores() {
        let elector = builder(&store, "a").build().unwrap();
        let leader = elector.campaign().await.unwrap();
        assert_eq!(leader.remaining(), believed(), "{kind}");
        assert_eq!(
            tokio_instant(leader.valid_until()),
            tokio_instant(leader.elected_at()) + believed()
        );
        leader.ensure_valid(ms(9_000)).unwrap();
        // Time passes before the first renewal (at 3 s): less is left.
        sleep(ms(2_000)).await;
        assert_eq!(leader.remaining(), believed() - ms(2_000), "{kind}");
        leader.ensure_valid(ms(7_800)).unwrap();
        // The renewal sent at 3 s moves the deadline to 3 s + 9.9 s.
        sleep(ms(2_000)).await;
        assert_eq!(leader.remaining(), renew_every() + believed() - ms(4_000), "{kind}");

        // Deposed: every check fails, whatever the time left.
        store.break_lease(&lease()).await.unwrap();
        timeout(PATIENCE, leader.cancelled()).await.unwrap();
        assert!(leader.is_cancelled());
        assert_eq!(leader.remaining(), Duration::ZERO, "{kind}");
        match leader.ensure_valid(Duration::ZERO) {
            Err(Error::NotLeader { reason, .. }) => {
                assert!(reason.starts_with("deposed"), "{kind}: {reason}")
            }
            other => panic!("{kind}: expected NotLeader, got {other:?}"),
        }
        drop(leader);
    }
}

/// Finding 3 of the safety review: `leader.ensure_valid(d)?` (the README's pattern) with too
/// little time left ended `run` with `RunError::Task("not the leader ...")`: one slow renewal
/// ended the candidacy forever. Now too little time is a step-down: the task's token is
/// cancelled, the lease released, and `run` campaigns again; the error says what happened.
#[tokio::test(start_paused = true)]
async fn ensure_valid_with_too_little_time_steps_down_and_run_campaigns_again() {
    for (kind, store) in stores() {
        let elector = builder(&store, "a").build().unwrap();
        let mut events = elector.events();
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let result = timeout(PATIENCE, {
            let errors = errors.clone();
            elector.run(move |leader: Leader| {
                let errors = errors.clone();
                async move {
                    if leader.term() == Term(1) {
                        // More than is left: the leadership ends here.
                        if let Err(e) = leader.ensure_valid(ms(9_950)) {
                            assert!(leader.is_cancelled(), "the work is cancelled at once");
                            errors.lock().unwrap().push(e.to_string());
                            return Err(e);
                        }
                    }
                    leader.ensure_valid(ms(500))?;
                    Ok::<(), Error>(())
                }
            })
        })
        .await
        .expect("run returned");
        assert!(result.is_ok(), "{kind}: run must campaign again, got {result:?}");
        let errors = errors.lock().unwrap().clone();
        assert_eq!(errors.len(), 1, "{kind}: {errors:?}");
        assert!(
            errors[0].contains("has only") && errors[0].contains("campaign again"),
            "{kind}: {}",
            errors[0]
        );
        let (d, _) = deposed(&mut events).await;
        assert!(
            matches!(d.reason, DeposedReason::TooLittleTime { required, .. } if required == ms(9_950)),
            "{kind}: {d:?}"
        );
        let (term, _, _) = elected(&mut events).await;
        assert_eq!(term, Term(2), "{kind}");
        assert_eq!(store.inspect(&lease()).await.unwrap().holder, None, "{kind}");
    }
}

/// Finding 2 of the safety review: the obvious service shutdown,
/// `select! { _ = elector.run(task) => .., _ = sigterm => .. }`, dropped `run`'s future but left
/// the task running, leading, renewing and writing; the lease was not released either. Dropping
/// `run` now cancels the task at once and releases the lease as soon as the task has returned.
#[tokio::test(start_paused = true)]
async fn dropping_run_cancels_the_task_and_releases_the_lease() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let writes = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
        let task_writes = writes.clone();
        let run = a.run(move |leader: Leader| {
            let writes = task_writes.clone();
            async move {
                while !leader.is_cancelled() {
                    leader.ensure_valid(ms(100))?;
                    writes.lock().unwrap().push(now());
                    sleep(ms(500)).await;
                }
                Ok::<(), Error>(())
            }
        });
        let sigterm = sleep(ms(2_000));
        tokio::select! {
            _ = run => panic!("{kind}: run returned"),
            () = sigterm => {}
        }
        let dropped_at = now();
        // The task wakes at its next sleep's end, sees the cancellation and returns.
        sleep(ms(600)).await;
        let last = *writes.lock().unwrap().last().expect("the task wrote");
        assert!(
            last < dropped_at,
            "{kind}: a write {:?} after run was dropped",
            last - dropped_at
        );
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(
            obs.holder, None,
            "{kind}: the lease must be released once the task returned"
        );
        assert_eq!(obs.previous_end, Some(EndReason::Released), "{kind}");
        // A successor is elected at once, not a TTL later.
        let b = builder(&store, "b").build().unwrap();
        let started = now();
        let successor = timeout(PATIENCE, b.campaign()).await.unwrap().unwrap();
        assert_eq!(successor.term(), Term(2), "{kind}");
        assert!(
            now() - started < ms(100),
            "{kind}: successor after {:?}",
            now() - started
        );
        successor.resign().await;
    }
}

/// Finding 2, a task that ignores cancellation: dropping `run` aborts it at `valid_until`.
#[tokio::test(start_paused = true)]
async fn dropping_run_aborts_a_task_that_ignores_cancellation_by_valid_until() {
    let store = MemoryStore::new();
    let a = builder(&store, "a").build().unwrap();
    let mut events = a.events();
    let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = alive.clone();
    let started = Arc::new(tokio::sync::Notify::new());
    let task_started = started.clone();
    let run = a.run(move |leader: Leader| {
        let flag = flag.clone();
        let started = task_started.clone();
        async move {
            started.notify_one();
            struct Clear(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Clear {
                fn drop(&mut self) {
                    self.0.store(false, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _clear = Clear(flag);
            let _leader = leader;
            std::future::pending::<()>().await;
            Ok::<(), Error>(())
        }
    });
    // Dropped once the task runs (dropped before, it is a dropped campaign: see campaign()).
    tokio::select! {
        _ = run => panic!("run returned"),
        () = started.notified() => {}
    };
    let (_, _, valid_until) = elected(&mut events).await;
    let (d, arrived) = deposed(&mut events).await;
    assert_eq!(d.reason, DeposedReason::Resigned);
    assert!(d.aborted, "{d:?}");
    assert_eq!(arrived, valid_until);
    assert!(!alive.load(std::sync::atomic::Ordering::SeqCst), "the task was dropped");
}

/// Finding 6 of the safety review: with blocking work starving the runtime, the driver cannot
/// run, and `is_cancelled()` stayed false long after `valid_until`. It now reads the clock itself
/// from the step-down point on. Real time, on purpose: the runtime is blocked for real.
#[tokio::test(flavor = "current_thread")]
async fn is_cancelled_follows_the_clock_when_the_driver_is_starved() {
    let store = MemoryStore::new();
    let elector = Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id("a")
        .ttl(ms(300))
        .build()
        .unwrap();
    let leader = elector.campaign().await.unwrap();
    assert!(!leader.is_cancelled());
    // Blocking work: the driver (on this same thread) cannot renew or cancel.
    std::thread::sleep(ms(400));
    assert!(leader.ensure_valid(Duration::ZERO).is_err(), "past valid_until");
    assert!(
        leader.is_cancelled(),
        "past the step-down point, whatever the driver did"
    );
    use futures::FutureExt;
    assert!(
        leader.cancelled().now_or_never().is_some(),
        "cancelled() completes at once"
    );
}
