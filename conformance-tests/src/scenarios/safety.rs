//! Never two leaders: races, a crashed leader, a stalled task.

use std::sync::atomic::{AtomicBool, Ordering};

use leasehold_core::DeposedReason;

use super::*;
use crate::faults::{Direction, Fault};

/// 16 candidates, each with its own client, race for the lease in 5 rounds: exactly one wins
/// each round and the others stay followers for at least a TTL.
///
/// # Panics
///
/// When a round has no winner or two.
pub async fn race_has_one_winner(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "race_has_one_winner").await;
    let p = &scene.prefix;
    let mut electors = Vec::new();
    for i in 0..16 {
        electors.push(scene.elector(scene.connect().await, &format!("racer-{i:02}")));
    }
    let mut last_term = Term(0);
    for round in 1..=5 {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let tasks: Vec<JoinHandle<()>> = electors
            .iter()
            .map(|elector| {
                let (elector, tx) = (elector.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(leader) = elector.campaign().await {
                        let _ = tx.send(leader);
                    }
                })
            })
            .collect();
        drop(tx);
        let started = Instant::now();
        let what = format!("round {round}: a winner");
        let winner = scene
            .within(&what, scene.ttl * 3, rx.recv())
            .await
            .expect("the campaigns hold senders");
        let won_after = started.elapsed();
        tokio::time::sleep(scene.ttl).await;
        if let Ok(second) = rx.try_recv() {
            panic!(
                "{p}: round {round}: {} was elected while {} led",
                second.holder(),
                winner.holder()
            );
        }
        if let Err(e) = winner.ensure_valid(Duration::ZERO) {
            panic!("{p}: round {round}: the winner lost the lease without competition: {e}");
        }
        assert!(
            winner.term() > last_term,
            "{p}: round {round}: term {} after {last_term}",
            winner.term()
        );
        last_term = winner.term();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        if let Ok(second) = rx.try_recv() {
            panic!(
                "{p}: round {round}: {} was elected while {} led",
                second.holder(),
                winner.holder()
            );
        }
        scene.log(format_args!(
            "round {round}: {} won at term {} after {}",
            winner.holder(),
            winner.term(),
            secs(won_after)
        ));
        winner.resign().await;
    }
    scene.finish().await;
}

/// The leader crashes (stops renewing, no release): the successor is elected only after the old
/// leader's `valid_until`, and within `ttl + retry_every + slack`.
///
/// # Panics
///
/// When the successor comes too early (unsafe) or too late.
pub async fn crash_successor_after_valid_until(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "crash_successor_after_valid_until").await;
    let p = &scene.prefix;
    let (store_a, faults_a) = scene.connect_faulty().await;
    let a = scene.elector(store_a, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let (campaign_b, elected_b) = spawn_campaign(&b);
    tokio::time::sleep(scene.ttl).await;

    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let leader_b = scene
        .within("B taking over from the crashed leader", scene.ttl * 4, elected_b)
        .await
        .expect("B campaigns");
    let a_valid_until = leader_a.valid_until();
    let b_at = leader_b.elected_at();
    assert!(
        b_at >= a_valid_until,
        "{p}: B was elected {} BEFORE the crashed leader's valid_until",
        secs(a_valid_until - b_at)
    );
    assert!(
        leader_b.term() > leader_a.term(),
        "{p}: term {} after {}",
        leader_b.term(),
        leader_a.term()
    );
    let failover = b_at - crashed;
    let slack = scene.ttl / 2 + Duration::from_millis(500);
    let bound = scene.ttl + scene.retry_bound() + slack;
    scene.log(format_args!(
        "failover {} ({:.2} TTL; {} after the old valid_until; bound {})",
        secs(failover),
        failover.as_secs_f64() / scene.ttl.as_secs_f64(),
        secs(b_at - a_valid_until),
        secs(bound)
    ));
    assert!(
        failover <= bound,
        "{p}: failover took {} > ttl + retry + slack = {}",
        secs(failover),
        secs(bound)
    );
    leader_b.resign().await;
    drop(leader_a);
    campaign_b.abort();
    scene.finish().await;
}

/// The leader's task stops heartbeating (and ignores cancellation for a while): with
/// `stall_timeout` it steps down, and a healthy candidate takes over with a higher term.
///
/// # Panics
///
/// When the stalled leader stays or nobody takes over.
pub async fn stalled_task_steps_down(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "stalled_task_steps_down").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let stall_timeout = ttl / 2;
    let beat = ttl / 10;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();

    let first_time = Arc::new(AtomicBool::new(true));
    let mut steady = steady_task("A", beat, notes_tx.clone());
    let stalling_notes = notes_tx.clone();
    let stalling: Task = Box::new(move |leader: Leader| {
        if !first_time.swap(false, Ordering::SeqCst) {
            return steady(leader);
        }
        let notes = stalling_notes.clone();
        Box::pin(async move {
            let term = leader.term();
            let _ = notes.send(Note::Started {
                who: "A".into(),
                term,
                at: leader.elected_at(),
            });
            let healthy_until = Instant::now() + ttl;
            while Instant::now() < healthy_until {
                leader.heartbeat();
                tokio::time::sleep(beat).await;
            }
            // Stuck: no more heartbeats, and slow to notice cancellation.
            leader.cancelled().await;
            let at = Instant::now();
            let _ = notes.send(Note::Cancelled {
                who: "A".into(),
                term,
                at,
                valid_until: leader.valid_until(),
            });
            tokio::time::sleep(ttl / 5).await;
            Ok(())
        })
    });
    let a = Runner::spawn(
        scene.watched(
            scene
                .builder(scene.connect().await, &scene.lease, "A")
                .stall_timeout(stall_timeout),
        ),
        stalling,
    );
    let (who, a_term, a_at) = next_start(&scene, &mut notes, "A being elected", ttl * 3).await;
    assert_eq!(who, "A");
    let b_builder = scene
        .builder(scene.connect().await, &scene.lease, "B")
        .stall_timeout(stall_timeout);
    let b = Runner::spawn(scene.watched(b_builder), steady_task("B", beat, notes_tx));

    let note = next_note(&scene, &mut notes, "the stalled leader being cancelled", ttl * 3).await;
    let Note::Cancelled { who, at: cancelled, .. } = note else {
        panic!("{p}: expected the stalled leader to be cancelled first, got {note:?}");
    };
    assert_eq!(who, "A");
    let (who, b_term, b_at) = next_start(&scene, &mut notes, "B taking over from the stalled leader", ttl * 3).await;
    assert_eq!(who, "B", "{p}: the healthy candidate takes over");
    assert!(b_term > a_term, "{p}: B's term {b_term} must exceed A's {a_term}");
    scene.log(format_args!(
        "A cancelled {} after its election (stall_timeout {}), B elected {} later at term {b_term}",
        secs(cancelled - a_at),
        secs(stall_timeout),
        secs(b_at.saturating_duration_since(cancelled))
    ));
    tokio::time::sleep(ttl).await;
    a.stop(&scene).await;
    b.stop(&scene).await;
    let reason = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .find_map(|(who, e)| match e {
            Event::Deposed { term, reason, .. } if who.as_str() == "A" && term == a_term => Some(reason),
            _ => None,
        });
    assert_eq!(
        reason,
        Some(DeposedReason::Stalled),
        "{p}: the stalled leader is deposed as Stalled"
    );
    scene.finish().await;
}
