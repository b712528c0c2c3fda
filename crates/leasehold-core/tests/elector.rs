//! Tests of the tokio driver ([`Elector`], [`Leader`], [`Event`]) on [`MemoryStore`], under
//! paused time: every timing assertion is exact and the whole file runs in well under a second.
//!
//! Timing unless a test says otherwise: TTL 10 s, renew every 3 s (tokio's timers have 1 ms
//! resolution, so the default `ttl / 3` would land on the next millisecond), retry every 2 s
//! without jitter, drift 1% (a grant is believed for 9.9 s after its request was sent), step-down
//! margin 1 s.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, DeposedReason, Elector, ElectorBuilder, EndReason, Error, Event, Grant,
    Leader, LeaderInfo, LeaseName, LeaseStore, MemoryStore, RunError, Term,
};
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(10);
/// Longer than anything a test waits for; a test that waits this long has failed.
const PATIENCE: Duration = Duration::from_secs(600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `ttl * (1 - drift)` with the default drift of 1%.
fn believed() -> Duration {
    TTL.mul_f64(1.0 - 0.01)
}

fn renew_every() -> Duration {
    ms(3_000)
}

/// Both kinds of memory store: one with a clock, one where contenders observe expiry.
fn stores() -> [(&'static str, MemoryStore); 2] {
    [
        ("server-clock", MemoryStore::new()),
        ("observed-expiry", MemoryStore::observed_expiry()),
    ]
}

fn builder(store: &MemoryStore, id: &str) -> ElectorBuilder {
    Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id(id)
        .ttl(TTL)
        .renew_every(renew_every())
        .jitter(0.0)
}

fn lease() -> LeaseName {
    LeaseName::new("jobs").unwrap()
}

fn now() -> Instant {
    Instant::now()
}

fn tokio_instant(at: std::time::Instant) -> Instant {
    Instant::from_std(at)
}

/// Waits for the first event that `pick` accepts, and returns it with when it arrived.
async fn wait_for<T>(
    events: &mut broadcast::Receiver<Event>,
    mut pick: impl FnMut(&Event) -> Option<T>,
) -> (T, Instant) {
    let found = timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.expect("event stream");
            if let Some(found) = pick(&event) {
                return found;
            }
        }
    })
    .await
    .expect("the event did not come");
    (found, now())
}

async fn elected(events: &mut broadcast::Receiver<Event>) -> (Term, Instant, Instant) {
    let ((term, at, valid_until), arrived) = wait_for(events, |e| match e {
        Event::Elected { term, at, valid_until } => Some((*term, tokio_instant(*at), tokio_instant(*valid_until))),
        _ => None,
    })
    .await;
    assert_eq!(at, arrived);
    (term, at, valid_until)
}

#[derive(Debug, PartialEq)]
struct Deposed {
    term: Term,
    reason: DeposedReason,
    believed_until: Instant,
    work_stopped_after: Option<Duration>,
    aborted: bool,
}

async fn deposed(events: &mut broadcast::Receiver<Event>) -> (Deposed, Instant) {
    wait_for(events, |e| match e {
        Event::Deposed {
            term,
            reason,
            believed_until,
            work_stopped_after,
            aborted,
        } => Some(Deposed {
            term: *term,
            reason: reason.clone(),
            believed_until: tokio_instant(*believed_until),
            work_stopped_after: *work_stopped_after,
            aborted: *aborted,
        }),
        _ => None,
    })
    .await
}

/// Events received so far that `pick` accepts, without waiting.
fn drain<T>(events: &mut broadcast::Receiver<Event>, mut pick: impl FnMut(&Event) -> Option<T>) -> Vec<T> {
    let mut found = Vec::new();
    while let Ok(event) = events.try_recv() {
        found.extend(pick(&event));
    }
    found
}

/// A holder that takes the lease directly from the store and never renews (a crashed process).
async fn crashed_holder(store: &MemoryStore) -> Grant {
    let request = AcquireRequest {
        lease: lease(),
        candidate: CandidateId::new("crashed").unwrap(),
        ttl: TTL,
        takeover: None,
    };
    match store.acquire(&request).await.unwrap() {
        Acquired::Granted(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}

// ---------------------------------------------------------------------------------------------

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

/// Finding 5 of the safety review: `stall_timeout(Duration::MAX)` passed validation and then
/// overflowed `Instant` in the driver (a panic). Every duration now has an upper bound.
#[test]
fn huge_durations_are_config_errors_not_panics() {
    let store = MemoryStore::new();
    let err = builder(&store, "a").stall_timeout(Duration::MAX).build().unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "stall_timeout",
                ..
            }
        ),
        "{err}"
    );
    for b in [
        builder(&store, "a").ttl(Duration::MAX),
        builder(&store, "a").lock_delay(Duration::MAX),
        builder(&store, "a").renew_every(Duration::MAX),
        builder(&store, "a").retry_every(Duration::MAX),
        builder(&store, "a").request_timeout(Duration::MAX),
        builder(&store, "a").step_down_margin(Duration::MAX),
    ] {
        assert!(b.build().is_err());
    }
    let mut t = leasehold_core::Timing::new(Duration::from_secs(10));
    t.ttl = Duration::MAX;
    assert!(t.validate().is_err());
}

#[tokio::test(start_paused = true)]
async fn break_lease_deposes_the_leader_superseded_and_cancels_it() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let b = builder(&store, "b").build().unwrap();
        let mut a_events = a.events();
        let la = a.campaign().await.unwrap();
        let elected_at = tokio_instant(la.elected_at());
        let token = la.cancellation_token();
        let follower = tokio::spawn(async move { b.campaign().await });
        sleep(ms(1_000)).await;

        assert_eq!(store.break_lease(&lease()).await.unwrap(), Some(Term(1)), "{kind}");
        // b is notified and takes the free lease at once.
        let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
        assert_eq!(
            (lb.term(), tokio_instant(lb.elected_at())),
            (Term(2), elected_at + ms(1_000)),
            "{kind}"
        );
        // a finds out at its next renewal and is cancelled then.
        assert!(!la.is_cancelled());
        timeout(PATIENCE, la.cancelled()).await.unwrap();
        assert_eq!(now(), elected_at + renew_every(), "{kind}");
        assert!(token.is_cancelled());

        // Once a's work stops (its handles dropped), the Deposed event names the new holder.
        sleep(ms(250)).await;
        drop(la);
        let (d, _) = deposed(&mut a_events).await;
        assert_eq!(
            d,
            Deposed {
                term: Term(1),
                reason: DeposedReason::Superseded {
                    by: Some(CandidateId::new("b").unwrap()),
                    term: Some(Term(2))
                },
                believed_until: elected_at + renew_every(),
                work_stopped_after: Some(ms(250)),
                aborted: false,
            },
            "{kind}"
        );
        // Losing the lease releases nothing: b still leads.
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(
            obs.holder.map(|h| (h.id.as_str().to_string(), h.term)),
            Some(("b".to_string(), Term(2)))
        );
        lb.resign().await;
    }
}

#[tokio::test(start_paused = true)]
async fn stall_timeout_deposes_a_stalled_leader_and_a_heartbeating_one_keeps_leading() {
    for (kind, store) in stores() {
        let stall = ms(2_000);
        let a = builder(&store, "a").stall_timeout(stall).build().unwrap();
        let b = builder(&store, "b").stall_timeout(stall).build().unwrap();
        let (mut a_events, mut b_events) = (a.events(), b.events());

        // a's work heartbeats for 2 s, then hangs (but honours cancellation).
        let a_runner = tokio::spawn(async move {
            a.run(|leader: Leader| async move {
                for _ in 0..4 {
                    sleep(ms(500)).await;
                    leader.heartbeat();
                }
                leader.cancelled().await;
                Ok::<(), String>(())
            })
            .await
        });
        let (term, a_elected, _) = elected(&mut a_events).await;
        assert_eq!(term, Term(1));

        // b's work heartbeats every 500 ms for as long as it leads.
        let b_runner = tokio::spawn(async move {
            b.run(|leader: Leader| async move {
                while !leader.is_cancelled() {
                    leader.heartbeat();
                    sleep(ms(500)).await;
                }
                Ok::<(), String>(())
            })
            .await
        });

        // Last heartbeat at 2 s: a is deposed at 4 s, stops at once and releases; b takes over.
        let (d, _) = deposed(&mut a_events).await;
        assert_eq!(
            d,
            Deposed {
                term: Term(1),
                reason: DeposedReason::Stalled,
                believed_until: a_elected + ms(4_000),
                work_stopped_after: Some(Duration::ZERO),
                aborted: false,
            },
            "{kind}"
        );
        let (term, b_elected, _) = elected(&mut b_events).await;
        assert_eq!((term, b_elected), (Term(2), a_elected + ms(4_000)), "{kind}");

        // b's work keeps heartbeating: it leads for 10 TTLs without a transition, renewing.
        sleep(TTL * 10).await;
        let b_deposed = drain(&mut b_events, |e| matches!(e, Event::Deposed { .. }).then_some(()));
        let a_elected_again = drain(&mut a_events, |e| matches!(e, Event::Elected { .. }).then_some(()));
        assert!(b_deposed.is_empty() && a_elected_again.is_empty(), "{kind}");
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(
            obs.holder.map(|h| (h.id.as_str().to_string(), h.term)),
            Some(("b".to_string(), Term(2)))
        );
        assert_eq!(obs.last_term, Term(2), "{kind}");
        assert!(!a_runner.is_finished() && !b_runner.is_finished());
        a_runner.abort();
        b_runner.abort();
    }
}

/// Time from a holder's end to a lock-delayed candidate's election: after expiry and after release.
async fn lock_delay_takeover(store: &MemoryStore, release: bool) -> Duration {
    let lock_delay = ms(3_000);
    let start = now();
    let grant = crashed_holder(store).await;
    let b = builder(store, "b").lock_delay(lock_delay).build().unwrap();
    let follower = tokio::spawn(async move { b.campaign().await });
    let ended = if release {
        sleep(ms(4_000)).await;
        store.release(&grant).await.unwrap();
        now()
    } else {
        start + TTL // the crashed holder's grant runs out
    };
    let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
    assert_eq!(lb.term(), Term(grant.term.0 + 1));
    let elected = tokio_instant(lb.elected_at());
    lb.resign().await;
    elected - ended
}

#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_release_not_at_all() {
    for (kind, store) in stores() {
        assert_eq!(lock_delay_takeover(&store, true).await, Duration::ZERO, "{kind}");
    }
}

#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_expiry_observed_by_contenders() {
    let store = MemoryStore::observed_expiry();
    assert_eq!(lock_delay_takeover(&store, false).await, ms(3_000));
}

/// On the server-clock store the follower learns of the expiry from an Inspect (which makes
/// MemoryStore end the lease and notify); the notification then makes it acquire at once.
#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_expiry_on_a_server_clock() {
    let store = MemoryStore::new();
    assert_eq!(lock_delay_takeover(&store, false).await, ms(3_000));
}

#[tokio::test(start_paused = true)]
async fn without_lock_delay_takeover_follows_expiry_at_once() {
    for (kind, store) in stores() {
        let start = now();
        let grant = crashed_holder(&store).await;
        let b = builder(&store, "b").build().unwrap();
        let lb = timeout(PATIENCE, b.campaign()).await.unwrap().unwrap();
        assert_eq!(lb.term(), Term(grant.term.0 + 1));
        // Server clock: at the store's deadline. Observed expiry: a TTL after b first saw the
        // record (at the start), at b's next poll.
        assert_eq!(tokio_instant(lb.elected_at()) - start, TTL, "{kind}");
        lb.resign().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

fn config_error(b: ElectorBuilder) -> (&'static str, String) {
    match b.build() {
        Err(e @ Error::InvalidConfig { field, .. }) => (field, e.to_string()),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn every_builder_invariant_gives_a_config_error_naming_the_field() {
    let store = MemoryStore::new();
    let b = || builder(&store, "a");
    let s = Duration::from_secs;
    let cases: Vec<(&str, ElectorBuilder, &str)> = vec![
        ("renew_every = ttl", b().renew_every(TTL), "renew_every"),
        ("renew_every > ttl", b().renew_every(s(30)), "renew_every"),
        ("renew_every = 0", b().renew_every(Duration::ZERO), "renew_every"),
        ("drift 0.5", b().drift(0.5), "drift"),
        ("drift 0.7", b().drift(0.7), "drift"),
        ("negative drift", b().drift(-0.01), "drift"),
        ("NaN drift", b().drift(f64::NAN), "drift"),
        ("infinite drift", b().drift(f64::INFINITY), "drift"),
        ("negative jitter", b().jitter(-0.1), "jitter"),
        ("NaN jitter", b().jitter(f64::NAN), "jitter"),
        ("jitter above 1", b().jitter(1.5), "jitter"),
        (
            "margin = believed ttl",
            b().step_down_margin(believed()),
            "step_down_margin",
        ),
        ("margin > ttl", b().step_down_margin(s(11)), "step_down_margin"),
        // The margin fits alone but leaves no room for a renewal before it.
        (
            "margin + renew_every too big",
            b().step_down_margin(s(7)),
            "renew_every",
        ),
        ("retry_every = 0", b().retry_every(Duration::ZERO), "retry_every"),
        ("retry_every > ttl", b().retry_every(s(11)), "retry_every"),
        (
            "request_timeout = 0",
            b().request_timeout(Duration::ZERO),
            "request_timeout",
        ),
        ("request_timeout > ttl", b().request_timeout(s(11)), "request_timeout"),
        ("stall_timeout = 0", b().stall_timeout(Duration::ZERO), "stall_timeout"),
        ("lock_delay > 60 s", b().lock_delay(s(61)), "lock_delay"),
    ];
    for (case, builder, field) in cases {
        let (got, message) = config_error(builder);
        assert_eq!(got, field, "{case}: {message}");
        assert!(
            message.contains(field) && message.contains("allowed"),
            "{case}: {message}"
        );
    }
    let (_, message) = config_error(b().drift(f64::NAN));
    assert!(message.contains("NaN"), "{message}");
    let (_, message) = config_error(b().step_down_margin(s(7)));
    assert!(
        message.contains("step_down_margin"),
        "the message explains the margin's part: {message}"
    );

    // Boundaries that are allowed.
    b().drift(0.0).jitter(0.0).build().unwrap();
    b().drift(0.49)
        .step_down_margin(Duration::ZERO)
        .renew_every(s(4))
        .build()
        .unwrap();
    b().jitter(1.0)
        .retry_every(TTL)
        .request_timeout(TTL)
        .lock_delay(s(60))
        .build()
        .unwrap();
}

#[test]
fn invalid_names_and_ttls_give_their_typed_errors() {
    let store = Arc::new(MemoryStore::new());
    for name in ["", "a/b", ".hidden", "-x", "spaces are bad", &"x".repeat(129)] {
        match Elector::builder(store.clone(), name).ttl(TTL).build() {
            Err(Error::InvalidLeaseName { name: got, reason }) => {
                assert_eq!(got, name);
                assert!(!reason.is_empty());
            }
            other => panic!("{name:?}: expected InvalidLeaseName, got {other:?}"),
        }
    }
    for id in ["", "tab\there", &"x".repeat(257)] {
        match Elector::builder(store.clone(), "jobs").candidate_id(id).build() {
            Err(Error::InvalidCandidateId { id: got, .. }) => assert_eq!(got, id),
            other => panic!("{id:?}: expected InvalidCandidateId, got {other:?}"),
        }
    }
    // MemoryStore accepts 1 ms ..= 24 h.
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(24 * 3600 + 1),
    ] {
        match Elector::builder(store.clone(), "jobs").ttl(ttl).build() {
            Err(e @ Error::InvalidTtl { store: "memory", .. }) => {
                assert!(matches!(e, Error::InvalidTtl { ttl: got, .. } if got == ttl));
                assert!(e.to_string().contains("1ms..=86400s"), "{e}");
            }
            other => panic!("{ttl:?}: expected InvalidTtl, got {other:?}"),
        }
    }
    // A valid configuration, for contrast; the defaults derive from the TTL.
    let elector = Elector::builder(store, "jobs").ttl(TTL).build().unwrap();
    assert_eq!(elector.timing().renew_every, TTL / 3);
    assert_eq!(elector.lease().as_str(), "jobs");
}
