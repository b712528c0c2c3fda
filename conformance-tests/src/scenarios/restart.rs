//! The store's server restarts: afterwards a crashed leader is replaced as fast as before.

use leasehold_core::Announces;

use super::*;
use crate::faults::{Direction, Fault};

/// How long the server stays down, in TTLs: every session, connection and lease of the
/// candidates outlives its TTL meanwhile, so everyone has to find the store again.
const DOWN_TTLS: f64 = 2.5;

/// The bound on the takeover after the crash, in TTLs.
const TAKEOVER_TTLS: f64 = 1.5;

/// Three candidates (TTL 2 s, raised to the store's minimum); the store's server goes down for
/// 2.5 TTLs and comes back ([`Backend::restart`]); a leader is elected again at a higher term;
/// then that leader crashes (stops renewing, no release): a successor leads within 1.5 x TTL of
/// the crash, at a higher term. The crash comes as soon as the leader after the restart is
/// elected. On a store that announces grants, every follower sees that leader within TTL/2 of
/// its election. Also logs how much store trouble each candidate reported while the server was
/// down.
///
/// Passes with a note on a backend whose server the suite cannot restart
/// ([`Backend::can_restart`]). Runs alone (see the [module docs](self)).
///
/// # Panics
///
/// When nobody leads after the restart, the successor comes late, a follower of a store that
/// announces grants does not hear of the leader after the restart, or two lead at once.
pub async fn store_restart_then_leader_crash(backend: Arc<dyn Backend>) {
    let name = "store_restart_then_leader_crash";
    let ttl = Duration::from_secs(2);
    if !backend.can_restart() {
        Scene::with_ttl(backend, name, ttl)
            .await
            .not_applicable("the suite cannot restart this store's server");
        return;
    }
    let scene = Scene::exclusive(backend, name, ttl).await;
    let p = &scene.prefix;
    let beat = scene.ttl / 10;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for who in ["A", "B", "C"] {
        let (store, faults) = scene.connect_faulty().await;
        let runner = Runner::spawn(scene.elector(store, who), steady_task(who, beat, notes_tx.clone()));
        candidates.push((who, runner, faults));
    }
    drop(notes_tx);
    let (first, first_term, _) = next_start(&scene, &mut notes, "a first leader", scene.ttl * 3).await;
    tokio::time::sleep(scene.ttl).await;

    let down = scene.ttl.mul_f64(DOWN_TTLS);
    scene.log(format_args!(
        "{first} leads at term {first_term}; the server goes down for {}",
        secs(down)
    ));
    let restarting = Instant::now();
    let what = "the server restarting";
    scene
        .within(what, down + Duration::from_secs(60), scene.backend.restart(down))
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot restart the server: {e}"));
    let up = Instant::now();
    scene.log(format_args!(
        "the server answers again, {} after it went down",
        secs(up - restarting)
    ));

    let (leader, term, elected) = loop {
        let what = "a leader after the restart";
        let (who, term, at) = next_start(&scene, &mut notes, what, scene.ttl * 8).await;
        if term > first_term {
            break (who, term, at);
        }
    };
    scene.log(format_args!(
        "{leader} leads at term {term}, {} after the server was back",
        secs(elected.saturating_duration_since(up))
    ));
    // When each follower sees this leader (announcements, or its own requests), measured while
    // the scenario goes on: the crash comes at once.
    let sightings: Vec<(&str, JoinHandle<Option<Instant>>)> = candidates
        .iter()
        .filter(|(who, _, _)| *who != leader)
        .map(|(who, runner, _)| {
            let mut seen = runner.elector.observe();
            let limit = scene.ttl * 3;
            let task = tokio::spawn(async move {
                let sees = |l: &Option<leasehold_core::LeaderInfo>| l.as_ref().is_some_and(|l| l.term >= term);
                let waited = tokio::time::timeout(limit, seen.wait_for(sees)).await;
                waited.is_ok_and(|r| r.is_ok()).then(Instant::now)
            });
            (*who, task)
        })
        .collect();
    let crashed_faults = candidates
        .iter()
        .find_map(|(who, _, faults)| (*who == leader).then_some(faults))
        .expect("the leader is a candidate");
    let crashed = Instant::now();
    crashed_faults.set(Direction::Both, Fault::Blackhole);
    // Long enough to measure a late takeover, not only to fail it.
    let limit = scene.ttl * 8;
    let (successor, successor_term, successor_at) = loop {
        let (who, t, at) = next_start(&scene, &mut notes, "a successor of the crashed leader", limit).await;
        if who != leader {
            break (who, t, at);
        }
    };
    let takeover = successor_at.saturating_duration_since(crashed);
    let bound = scene.ttl.mul_f64(TAKEOVER_TTLS);
    scene.log(format_args!(
        "{leader} crashed; {successor} leads at term {successor_term} {} later ({:.2} TTL; bound {})",
        secs(takeover),
        takeover.as_secs_f64() / scene.ttl.as_secs_f64(),
        secs(bound)
    ));
    assert!(
        successor_term > term,
        "{p}: the successor's term {successor_term} must exceed the crashed leader's {term}"
    );
    assert!(
        takeover <= bound,
        "{p}: after the restart, the successor of the crashed leader took {} > {TAKEOVER_TTLS} x TTL = {}",
        secs(takeover),
        secs(bound)
    );
    // A store that announces grants tells every follower of this one, also after a restart.
    let announces = scene.caps.announces != Announces::None;
    let mut deaf = Vec::new();
    for (who, sighting) in sightings {
        let at = sighting
            .await
            .ok()
            .flatten()
            .map(|at| at.saturating_duration_since(elected));
        let seen = at.map_or_else(|| "not within 3 TTL".to_string(), secs);
        scene.log(format_args!(
            "{who} saw {leader} lead at term {term} {seen} after its election"
        ));
        if announces && at.is_none_or(|at| at > scene.ttl / 2) {
            deaf.push(format!("{who} ({seen})"));
        }
    }
    assert!(
        deaf.is_empty(),
        "{p}: the store announces grants, but after the restart {} saw {leader}'s election only later than TTL/2",
        deaf.join(", ")
    );
    let records = scene.checker.records().await;
    let troubles: Vec<String> = candidates
        .iter()
        .map(|(who, _, _)| {
            let n = records
                .iter()
                .filter(|r| r.lease.as_str() == scene.lease && r.candidate.as_str() == *who)
                .filter(|r| r.received >= restarting && r.received <= up)
                .filter(|r| matches!(r.event, Event::StoreTrouble { .. }))
                .count();
            format!("{who} {n}")
        })
        .collect();
    scene.log(format_args!(
        "store trouble reported while the server was down: {}",
        troubles.join(", ")
    ));
    crashed_faults.heal();
    for (_, runner, _) in candidates {
        runner.stop(&scene).await;
    }
    scene.finish().await;
}
