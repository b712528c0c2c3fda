//! A broken network: a partitioned leader, a store outage, a slow store, lost replies, a release
//! or withdrawal that fails.

use leasehold_core::{Acquired, DeposedReason};

use super::*;
use crate::faults::{Direction, Fault};

/// The leader is partitioned from the store: its task is cancelled strictly before its
/// `valid_until`; the follower takes over with a higher term; healed, the old leader rejoins as a
/// follower.
///
/// # Panics
///
/// When the partitioned leader keeps believing too long, nobody takes over, or it leads again.
pub async fn partitioned_leader_steps_down(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "partitioned_leader_steps_down").await;
    let p = &scene.prefix;
    let beat = scene.ttl / 10;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let (store_a, faults_a) = scene.connect_faulty().await;
    let a = Runner::spawn(scene.elector(store_a, "A"), steady_task("A", beat, notes_tx.clone()));
    let (who, a_term, _) = next_start(&scene, &mut notes, "A being elected", scene.ttl * 3).await;
    assert_eq!(who, "A");
    let b = Runner::spawn(
        scene.elector(scene.connect().await, "B"),
        steady_task("B", beat, notes_tx),
    );
    tokio::time::sleep(scene.ttl).await;

    let partitioned = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let note = next_note(&scene, &mut notes, "A's task being cancelled", scene.ttl * 2).await;
    let Note::Cancelled {
        who,
        term,
        at,
        valid_until,
    } = note
    else {
        panic!("{p}: expected A's task to be cancelled first, got {note:?}");
    };
    assert_eq!(
        (who.as_str(), term),
        ("A", a_term),
        "{p}: the partitioned leader is cancelled first"
    );
    assert!(
        at < valid_until,
        "{p}: A's task was cancelled {} AFTER its valid_until",
        secs(at.saturating_duration_since(valid_until))
    );
    let (who, b_term, b_at) = next_start(&scene, &mut notes, "B taking over", scene.ttl * 3).await;
    assert_eq!(who, "B", "{p}: the healthy candidate takes over");
    assert!(b_term > a_term, "{p}: B's term {b_term} must exceed A's {a_term}");
    assert!(b_at >= valid_until, "{p}: B elected before A's valid_until");
    scene.log(format_args!(
        "A cancelled {} after the partition, {} before its valid_until; B elected {} after the partition",
        secs(at - partitioned),
        secs(valid_until - at),
        secs(b_at - partitioned)
    ));

    faults_a.heal();
    let healed = Instant::now();
    let mut seen = a.elector.observe();
    let b_id = b.elector.id().clone();
    let what = "A seeing B as leader after the partition healed";
    scene
        .within(
            what,
            scene.ttl * 3,
            seen.wait_for(|l| l.as_ref().is_some_and(|l| l.holder == b_id && l.term == b_term)),
        )
        .await
        .expect("A's elector lives");
    tokio::time::sleep(scene.ttl).await;
    if let Ok(note) = notes.try_recv() {
        panic!("{p}: nothing may change after the partition healed, got {note:?}");
    }
    scene.log(format_args!(
        "A rejoined as a follower {} after healing",
        secs(healed.elapsed())
    ));
    a.stop(&scene).await;
    b.stop(&scene).await;
    let deposed = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .find_map(|(who, e)| match e {
            Event::Deposed { reason, .. } if who.as_str() == "A" => Some(reason),
            _ => None,
        });
    assert!(
        !matches!(
            deposed,
            None | Some(DeposedReason::Resigned | DeposedReason::WorkFinished)
        ),
        "{p}: A must have been deposed by the partition, got {deposed:?}"
    );
    scene.finish().await;
}

/// The store is unreachable for every candidate for 2 TTLs: after at most one TTL nobody
/// believes it leads; once it is back, exactly one leader within 2 TTLs.
///
/// # Panics
///
/// When someone believes it leads during the outage, or nobody leads after it.
pub async fn store_outage_no_leader_then_one(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "store_outage_no_leader_then_one").await;
    let p = &scene.prefix;
    let lease = scene.lease_name();
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let mut runners = Vec::new();
    let mut faults = Vec::new();
    for who in ["A", "B", "C"] {
        let (store, f) = scene.connect_faulty().await;
        faults.push(f);
        runners.push(Runner::spawn(
            scene.elector(store, who),
            steady_task(who, scene.ttl / 10, notes_tx.clone()),
        ));
    }
    let (first, term, _) = next_start(&scene, &mut notes, "a first leader", scene.ttl * 3).await;
    scene.log(format_args!("{first} leads at term {term}"));
    tokio::time::sleep(scene.ttl / 2).await;

    let outage = Instant::now();
    for f in &faults {
        f.set(Direction::Both, Fault::Blackhole);
    }
    tokio::time::sleep(scene.ttl * 2).await;
    let believed = scene
        .checker
        .believed_between(&lease, outage + scene.ttl, Instant::now())
        .await;
    assert!(
        believed.is_empty(),
        "{p}: more than one TTL into the outage someone still believed it led: {believed:?}"
    );
    let last_end = scene
        .checker
        .intervals_of(&lease)
        .await
        .iter()
        .filter_map(|i| i.end)
        .max();
    if let Some(end) = last_end {
        scene.log(format_args!(
            "nobody leads from {} into the outage",
            secs(end.saturating_duration_since(outage))
        ));
    }
    while notes.try_recv().is_ok() {}

    for f in &faults {
        f.heal();
    }
    let healed = Instant::now();
    let (who, term, at) = next_start(
        &scene,
        &mut notes,
        "a leader after the outage",
        scene.ttl * 2 + scene.ttl / 2,
    )
    .await;
    scene.log(format_args!(
        "{who} leads at term {term}, {} after the store came back",
        secs(at.saturating_duration_since(healed))
    ));
    tokio::time::sleep(scene.ttl).await;
    let now = Instant::now();
    let leading: Vec<_> = scene
        .checker
        .intervals_of(&lease)
        .await
        .into_iter()
        .filter(|i| i.end.is_none())
        .collect();
    assert_eq!(
        leading.len(),
        1,
        "{p}: exactly one leader a TTL after the outage: {leading:?}"
    );
    assert!(leading[0].start <= now);
    for runner in runners {
        runner.stop(&scene).await;
    }
    scene.finish().await;
}

/// Requests and replies delayed by up to most of a TTL, changing over time, with leaders
/// resigning on a timer: never two leaders, and late renewals or acquires visibly lose.
///
/// # Panics
///
/// On double leadership, or when slowness was never noticed (the scenario did not exercise it).
pub async fn slow_store_no_double_leadership(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "slow_store_no_double_leadership").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    // (request delay, reply delay) as fractions of the TTL; rotated over the candidates.
    let profiles = [(0.3, 0.4), (0.1, 0.2), (0.0, 0.0), (0.2, 0.5)];
    let (stop, stopped) = watch::channel(false);
    let mut faults = Vec::new();
    let mut loops = Vec::new();
    for who in ["A", "B", "C"] {
        let (store, f) = scene.connect_faulty().await;
        faults.push(f);
        let elector = scene.elector(store, who);
        let mut stopped = stopped.clone();
        loops.push(tokio::spawn(async move {
            loop {
                let leader = tokio::select! {
                    leader = elector.campaign() => leader.expect("the election runs"),
                    () = until_stopped(&mut stopped) => return,
                };
                let hold = ttl.mul_f64(0.5 + (random_u64() % 1000) as f64 / 1000.0);
                tokio::select! {
                    () = leader.cancelled() => drop(leader),
                    () = tokio::time::sleep(hold) => leader.resign().await,
                    () = until_stopped(&mut stopped) => {
                        leader.resign().await;
                        return;
                    }
                }
            }
        }));
    }
    for step in 0..6 {
        for (i, f) in faults.iter().enumerate() {
            let (request, reply) = profiles[(i + step) % profiles.len()];
            let fault = |fraction: f64| {
                if fraction == 0.0 {
                    Fault::Pass
                } else {
                    Fault::Delay(ttl.mul_f64(fraction))
                }
            };
            f.set(Direction::Request, fault(request));
            f.set(Direction::Reply, fault(reply));
        }
        tokio::time::sleep(ttl).await;
    }
    for f in &faults {
        f.heal();
    }
    let _ = stop.send(true);
    for task in loops {
        let joined = scene.within("the candidates stopping", ttl * 3, task).await;
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let events = scene.events_of(&scene.lease).await;
    let count = |f: fn(&Event) -> bool| events.iter().filter(|(_, e)| f(e)).count();
    let elected = count(|e| matches!(e, Event::Elected { .. }));
    let renew_failed = count(|e| {
        matches!(
            e,
            Event::Deposed {
                reason: DeposedReason::RenewFailed { .. },
                ..
            }
        )
    });
    let superseded = count(|e| {
        matches!(
            e,
            Event::Deposed {
                reason: DeposedReason::Superseded { .. },
                ..
            }
        )
    });
    let trouble = count(|e| matches!(e, Event::StoreTrouble { .. }));
    scene.log(format_args!(
        "{elected} elections, {renew_failed} deposed by late renewals, {superseded} superseded, {trouble} store troubles"
    ));
    assert!(elected >= 1, "{p}: nobody was ever elected in 6 TTLs");
    assert!(
        renew_failed + superseded + trouble > 0,
        "{p}: no late request was ever refused or noticed: the scenario did not exercise slowness"
    );
    scene.finish().await;
}

/// Replies lost after the store applied the request: a leader's renewals (reply reset, then
/// reply blackhole, each for less than TTL/2), and a candidate's acquire. Read-back settles
/// them: never two leaders, and the candidate whose acquire was applied becomes leader at the
/// term the store granted, within a couple of retry intervals.
///
/// # Panics
///
/// On double leadership, or when the applied acquire is not recognised.
pub async fn lost_reply_resolved_by_read_back(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "lost_reply_resolved_by_read_back").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;

    // Renewals whose replies are lost: the fault covers the next renewal (and its read-back)
    // and lifts before the deadline, so the leader may survive by read-back and a later renewal,
    // or step down; never may two lead.
    for fault in [Fault::Reset, Fault::Blackhole] {
        let lease = scene.other_lease(&format!("renew-{fault:?}").to_lowercase());
        let (store_a, faults_a) = scene.connect_faulty().await;
        let a = scene.watched(scene.builder(store_a, &lease, "A"));
        let b = scene.watched(scene.builder(scene.connect().await, &lease, "B"));
        let leader_a = scene.campaign(&a, ttl * 3).await;
        let (campaign_b, mut elected_b) = spawn_campaign(&b);
        let renewed = leader_a.valid_until();
        scene
            .within("A's first renewal", ttl * 2, async {
                while leader_a.valid_until() == renewed {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        tokio::time::sleep(ttl / 10).await;
        let before = faults_a.counts();
        faults_a.set(Direction::Reply, fault);
        tokio::time::sleep(ttl.mul_f64(0.35)).await;
        faults_a.heal();
        let during = faults_a.counts();
        tokio::time::sleep(ttl.mul_f64(1.5)).await;
        let outcome = match leader_a.ensure_valid(Duration::ZERO) {
            Ok(()) => "A still leads".to_string(),
            Err(e) => format!("A stepped down ({e})"),
        };
        let b_won = elected_b.try_recv().ok();
        scene.log(format_args!(
            "reply {fault:?} for 0.35 TTL: {} renewals and {} read-backs lost; {outcome}; B {}",
            during.renew - before.renew,
            during.inspect - before.inspect,
            b_won
                .as_ref()
                .map_or("follows".to_string(), |l| format!("took over at term {}", l.term()))
        ));
        assert!(
            during.renew > before.renew,
            "{p}: no renewal was sent while its reply was lost"
        );
        if leader_a.ensure_valid(Duration::ZERO).is_ok() {
            let seen = scene
                .connect()
                .await
                .inspect(&LeaseName::new(lease).expect("valid"))
                .await;
            let holder = seen.ok().and_then(|o| o.holder).map(|h| (h.id, h.term));
            assert_eq!(
                holder,
                Some((a.id().clone(), leader_a.term())),
                "{p}: A leads, so the store must say so"
            );
        }
        campaign_b.abort();
        drop(b_won);
        leader_a.resign().await;
    }

    // An acquire whose reply is lost.
    let lease = scene.other_lease("acquire");
    let lease_name = LeaseName::new(lease.clone()).expect("valid lease name");
    let observer = scene.connect().await;
    let blocker = CandidateId::new("blocker").expect("valid id");
    let Ok(Acquired::Granted(blocking)) = observer.acquire(&request(&lease_name, &blocker, ttl)).await else {
        panic!("{p}: cannot take a fresh lease");
    };
    let (store_c, faults_c) = scene.connect_faulty().await;
    let c = scene.watched(scene.builder(store_c, &lease, "C"));
    let (_campaign_c, elected_c) = spawn_campaign(&c);
    // Wait until C's first acquire was *answered* (C has seen the blocker), not merely sent.
    scene.sees(&c, &blocker, ttl * 2).await;
    // A store whose acquire reads first would never send its write while every reply is lost:
    // its replies come half a TTL late instead, twice the request timeout (and before the
    // engine gives up polling the call, a TTL after it was sent).
    let lost = if scene.backend.acquire_reads_first() {
        Fault::Delay(ttl / 2)
    } else {
        Fault::Blackhole
    };
    faults_c.set(Direction::Reply, lost);
    tokio::time::sleep(ttl / 20).await;
    observer
        .release(&blocking)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let applied = scene
        .within("C's acquire being applied", ttl * 3, async {
            loop {
                if let Ok(seen) = observer.inspect(&lease_name).await
                    && let Some(h) = seen.holder.filter(|h| &h.id == c.id())
                {
                    return h.term;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    faults_c.heal();
    let healed = Instant::now();
    let d = scene.watched(scene.builder(scene.connect().await, &lease, "D"));
    let (campaign_d, mut elected_d) = spawn_campaign(&d);
    let bound = scene.request_timeout() + scene.retry_bound() * 2 + Duration::from_millis(250);
    let leader_c = scene
        .within("C recognising its applied acquire", ttl * 3, elected_c)
        .await
        .expect("C campaigns");
    let after = leader_c.elected_at().saturating_duration_since(healed);
    scene.log(format_args!(
        "C leads at term {} {} after its lost reply was healed (bound {})",
        leader_c.term(),
        secs(after),
        secs(bound)
    ));
    if scene.backend.acquire_reads_first() {
        // C's acquires sent while the replies were late may still land after the first one (each
        // grants C a new term, as the holder's own acquire does): C leads at the applied term
        // or a later one of its own, with nobody else in between.
        assert!(
            leader_c.term() >= applied,
            "{p}: C leads at term {} below the applied {applied}",
            leader_c.term()
        );
        let history = observer
            .history(&lease_name, 100)
            .await
            .unwrap_or_else(|e| panic!("{p}: history: {e}"));
        for entry in history
            .iter()
            .filter(|t| t.term >= applied && t.term <= leader_c.term())
        {
            assert_eq!(
                &entry.holder,
                c.id(),
                "{p}: term {} between C's terms: {entry:?}",
                entry.term
            );
        }
    } else {
        assert_eq!(
            leader_c.term(),
            applied,
            "{p}: C must lead at the term the store granted, not a new one"
        );
    }
    assert!(
        after <= bound,
        "{p}: C took {} > {} to recognise its applied acquire",
        secs(after),
        secs(bound)
    );
    tokio::time::sleep(ttl).await;
    assert!(elected_d.try_recv().is_err(), "{p}: D was elected while C led");
    campaign_d.abort();
    leader_c.resign().await;
    scene.finish().await;
}

/// Deletions that fail while the same store lives on: a leader's release, and a follower's
/// withdrawal when it stops campaigning, whose requests never reach the store (its connections
/// are reset), while the store keeps leading another lease all along (so a session it shares
/// between its leases, where it has one, stays in use). The engine does not ask again once a
/// candidate has stopped, so nothing of the stopped candidates may stay behind for longer than a
/// TTL would keep it:
///
/// - A released, its release failed: B, campaigning on another store, takes the lease with a
///   higher term.
/// - E released, its release failed, nobody else campaigns: E, campaigning again on the same
///   store, leads again with a higher term (the failed release's term is over).
/// - C, queued behind H, stopped and its withdrawal failed: when H resigns, D, queued after C,
///   leads; C does not. C, campaigning again on the same store, leads after D with a higher
///   term.
///
/// # Panics
///
/// When the fault did not fail A's release, when a lease stays with a stopped candidate (or its
/// queue place keeps the next waiting) for `4 * ttl`, or on double leadership.
pub async fn a_failed_release_does_not_keep_the_lease(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "a_failed_release_does_not_keep_the_lease").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let bound = ttl * 4;
    let (store, faults) = scene.connect_faulty().await;
    let keep = scene.other_lease("keep");
    let k = scene.watched(scene.builder(store.clone(), &keep, "K"));
    let keeping = scene.campaign(&k, ttl * 3).await;

    let released = scene.other_lease("released");
    let a = scene.watched(scene.builder(store.clone(), &released, "A"));
    let leader_a = scene.campaign(&a, ttl * 3).await;
    let b = scene.watched(scene.builder(scene.connect().await, &released, "B"));
    let (campaign_b, elected_b) = spawn_campaign(&b);
    let again = scene.other_lease("again");
    let e = scene.watched(scene.builder(store.clone(), &again, "E"));
    let leader_e = scene.campaign(&e, ttl * 3).await;
    let withdrawn = scene.other_lease("withdrawn");
    let h = scene.watched(scene.builder(scene.connect().await, &withdrawn, "H"));
    let leader_h = scene.campaign(&h, ttl * 3).await;
    let c = scene.watched(scene.builder(store.clone(), &withdrawn, "C"));
    let (campaign_c, _elected_c) = spawn_campaign(&c);
    scene.sees(&b, a.id(), ttl * 3).await;
    scene.sees(&c, h.id(), ttl * 3).await;
    let d = scene.watched(scene.builder(scene.connect().await, &withdrawn, "D"));
    let (campaign_d, elected_d) = spawn_campaign(&d);
    scene.sees(&d, h.id(), ttl * 3).await;

    let (mut troubles_a, mut troubles_c) = (a.events(), c.events());
    let (term_a, term_e) = (leader_a.term(), leader_e.term());
    // The deletions are sent into a delay, and their connections reset while they wait there:
    // never forwarded, and not sent again by a client that reconnects (a request queued while
    // the connection is down may be).
    let before = faults.counts();
    faults.set(Direction::Request, Fault::Delay(FAILED_DELAY));
    let resigned = tokio::spawn(async move { tokio::join!(leader_a.resign(), leader_e.resign()) });
    campaign_c.abort();
    scene
        .within("the releases and C's withdrawal being sent", ttl * 2, async {
            loop {
                let now = faults.counts();
                if now.release >= before.release + 2 && now.withdraw > before.withdraw {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    tokio::time::sleep(FAILED_DELAY / 2).await;
    faults.set(Direction::Request, Fault::Reset);
    scene
        .within("A's and E's resignations", ttl * 2, resigned)
        .await
        .expect("the resignations' task");
    // The withdrawal's failure (where the store sends one) reaches C's events: give it the
    // request timeout to come.
    let c_failed = tokio::time::timeout(scene.request_timeout() * 2, failure(&mut troubles_c))
        .await
        .is_ok();
    faults.heal();
    let healed = Instant::now();
    let a_failed = tokio::time::timeout(Duration::from_millis(100), failure(&mut troubles_a))
        .await
        .is_ok();
    assert!(a_failed, "{p}: the reset did not fail A's release: nothing was tested");
    scene.log(format_args!(
        "A's and E's releases failed; C's withdrawal {}",
        if c_failed {
            "failed"
        } else {
            "needed no request, or got through"
        }
    ));

    let leader_b = scene
        .within("B taking the lease A's failed release left", bound, elected_b)
        .await
        .expect("B campaigns");
    assert!(
        leader_b.term() > term_a,
        "{p}: B leads at term {} <= A's {term_a}",
        leader_b.term()
    );
    scene.log(format_args!("B leads {} after the heal", secs(healed.elapsed())));
    let leader_e = scene.campaign(&e, bound).await;
    assert!(
        leader_e.term() > term_e,
        "{p}: E leads again at term {} <= {term_e}",
        leader_e.term()
    );
    leader_h.resign().await;
    let leader_d = scene
        .within("D leading after H, with C's withdrawal failed", bound, elected_d)
        .await
        .expect("D campaigns");
    scene.log(format_args!("D leads {} after the heal", secs(healed.elapsed())));
    assert!(!c.is_leader(), "{p}: C leads after it stopped");
    // C campaigns again: it waits behind D (whatever its failed withdrawal left), and leads
    // after D with a higher term.
    let (campaign_c, elected_c) = spawn_campaign(&c);
    scene.sees(&c, d.id(), ttl * 3).await;
    let term_d = leader_d.term();
    leader_d.resign().await;
    let leader_c = scene
        .within("C leading after D, campaigning again", bound, elected_c)
        .await
        .expect("C campaigns");
    assert!(
        leader_c.term() > term_d,
        "{p}: C leads at term {} <= D's {term_d}",
        leader_c.term()
    );

    for leader in [leader_b, leader_e, leader_c, keeping] {
        leader.resign().await;
    }
    drop((campaign_b, campaign_c, campaign_d));
    scene.finish().await;
}

/// How long the requests of `a_failed_release_does_not_keep_the_lease` wait in the fault proxy
/// before its connections are reset.
const FAILED_DELAY: Duration = Duration::from_millis(300);

/// The next store failure among an elector's events.
async fn failure(events: &mut tokio::sync::broadcast::Receiver<Event>) {
    loop {
        match events.recv().await {
            Ok(Event::StoreTrouble { .. }) => return,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
