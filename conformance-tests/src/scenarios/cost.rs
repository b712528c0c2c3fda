//! What leadership costs: 1,000 leases in one process, store requests per transition, an idle
//! follower's requests.

use futures::future::join_all;
use leasehold_core::{Announces, Notifications};

use super::*;
use crate::faults::{Direction, Fault};
use crate::faulty::FaultyStore;

/// One process (one client) holds 1,000 leases at once, renews them for 3 TTLs and loses none;
/// one `list` gives all 1,000, in name order, with their holder.
///
/// # Panics
///
/// When a lease is not granted or is lost, or the listing misses or misorders one.
pub async fn thousand_leases(backend: Arc<dyn Backend>) {
    const LEASES: usize = 1000;
    let ttl = backend.many_leases_ttl().unwrap_or(Duration::from_secs(2));
    let scene = Scene::with_ttl(backend, "thousand_leases", ttl).await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| scene.watched(scene.builder(store.clone(), &scene.other_lease(&i.to_string()), "holder")))
        .collect();
    let started = Instant::now();
    let leaders = scene
        .within(
            "1,000 elections",
            scene.ttl * 5,
            join_all(electors.iter().map(Elector::campaign)),
        )
        .await;
    let leaders: Vec<Leader> = leaders
        .into_iter()
        .map(|l| l.unwrap_or_else(|e| panic!("{p}: campaign: {e}")))
        .collect();
    scene.log(format_args!("{LEASES} leases granted in {}", secs(started.elapsed())));
    tokio::time::sleep(scene.ttl * 3).await;
    let lost: Vec<_> = leaders
        .iter()
        .filter(|l| l.ensure_valid(Duration::ZERO).is_err())
        .map(|l| l.lease().clone())
        .collect();
    assert!(
        lost.is_empty(),
        "{p}: {} of {LEASES} leases lost within 3 TTLs, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    // One listing pages through all of them (stores list in pages of 1,000 or fewer), in name
    // order, each with its holder.
    let under = format!("{}-", scene.lease);
    let listed = scene
        .within("listing 1,000 leases", scene.ttl * 5, store.list(&under))
        .await
        .unwrap_or_else(|e| panic!("{p}: list: {e}"));
    let mut expected: Vec<String> = (0..LEASES).map(|i| scene.other_lease(&i.to_string())).collect();
    expected.sort();
    let listed_names: Vec<&str> = listed.iter().map(|o| o.lease.as_str()).collect();
    assert!(
        listed_names == expected,
        "{p}: list({under:?}) must give the {LEASES} leases in name order: {} listed, first {:?}",
        listed.len(),
        listed_names.first()
    );
    let unheld = listed
        .iter()
        .filter(|o| o.holder.as_ref().is_none_or(|h| h.id.as_str() != "holder"))
        .count();
    assert_eq!(unheld, 0, "{p}: every listed lease shows its holder");
    let records = scene.checker.records().await;
    let elected = records
        .iter()
        .filter(|r| matches!(r.event, Event::Elected { .. }))
        .count();
    let deposed = records
        .iter()
        .filter(|r| matches!(r.event, Event::Deposed { .. }))
        .count();
    assert_eq!(
        (elected, deposed),
        (LEASES, 0),
        "{p}: one election per lease and no deposition"
    );
    let started = Instant::now();
    join_all(leaders.into_iter().map(Leader::resign)).await;
    scene.log(format_args!(
        "{LEASES} leases held for 3 TTLs; released in {}",
        secs(started.elapsed())
    ));
    scene.finish().await;
}

/// Where candidates queue (`fifo`), each waits on its predecessor only (no herd): with 1, 10 and
/// 100 candidates (each its own client) that resign shortly after being elected, a transition
/// costs a handful of store requests, not one per waiting candidate.
///
/// # Panics
///
/// When a transition costs more than 10 requests (6 acquires, releases, reads and withdrawals),
/// or 100 candidates cost more than 1.5 times what 10 do.
pub async fn requests_per_transition_do_not_grow(backend: Arc<dyn Backend>) {
    const TRANSITIONS: u64 = 10;
    let scene = Scene::with_ttl(backend, "requests_per_transition_do_not_grow", Duration::from_secs(2)).await;
    let p = &scene.prefix;
    if !scene.caps.fifo {
        return scene
            .not_applicable("the store does not queue candidates (fifo: false): a release wakes every follower");
    }
    let ttl = scene.ttl;
    let mut figures = Vec::new();
    for candidates in [1usize, 10, 100] {
        let lease = scene.other_lease(&candidates.to_string());
        let counts = Faults::new();
        let (elected_tx, mut elected) = mpsc::unbounded_channel::<(Instant, Term)>();
        let mut tasks = Vec::new();
        for i in 0..candidates {
            let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::counting(scene.connect().await, counts.clone()));
            let elector = scene.watched(
                Elector::builder(store, lease.clone())
                    .candidate_id(format!("candidate-{i:03}"))
                    .ttl(ttl),
            );
            let tx = elected_tx.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let leader = elector.campaign().await.expect("the election runs");
                    let _ = tx.send((leader.elected_at(), leader.term()));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    leader.resign().await;
                }
            }));
        }
        // Warm up: every candidate has queued once and someone leads; the first acquires (some
        // time out while 100 clients connect at once) settle.
        scene
            .within("every candidate queueing", Duration::from_secs(60), async {
                while counts.counts().acquire < candidates as u64 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                elected.recv().await;
            })
            .await;
        tokio::time::sleep(ttl).await;
        while elected.try_recv().is_ok() {}
        let _ = tokio::time::timeout(Duration::from_secs(5), elected.recv()).await;
        counts.reset_counts();
        let started = Instant::now();
        let mut transitions = Vec::new();
        for _ in 0..TRANSITIONS {
            let transition = scene
                .within("a transition", ttl * 5, elected.recv())
                .await
                .expect("the campaigns hold senders");
            transitions.push(transition);
        }
        // In the order of the elections (a candidate starved for a moment reports its election
        // after a later one's), each term exceeds the one before.
        transitions.sort();
        for pair in transitions.windows(2) {
            let ((_, before), (_, after)) = (pair[0], pair[1]);
            assert!(after > before, "{p}: term {after} elected after term {before}");
        }
        let counts = counts.counts();
        let took = started.elapsed();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        let t = TRANSITIONS as f64;
        let ops = (counts.acquire + counts.release + counts.inspect + counts.withdraw) as f64 / t;
        let total = counts.total() as f64 / t;
        scene.log(format_args!(
            "{candidates:>3} candidates: {total:.1} store requests per transition ({ops:.1} acquire/release/inspect/withdraw; {counts}); {:.0} ms per transition",
            took.as_secs_f64() * 1000.0 / t
        ));
        assert!(
            ops <= 6.0,
            "{p}: {candidates} candidates: {ops:.1} acquire/release/inspect/withdraw per transition"
        );
        assert!(
            total <= 10.0,
            "{p}: {candidates} candidates: {total:.1} store requests per transition"
        );
        figures.push(total);
    }
    let (ten, hundred) = (figures[1], figures[2]);
    assert!(
        hundred <= ten * 1.5 + 1.0,
        "{p}: a herd: {hundred:.1} requests per transition with 100 candidates, {ten:.1} with 10"
    );
    scene.finish().await;
}

/// Where releases and expiries are notified (`Notifications::ReleaseAndExpiry`), or every grant
/// and renewal is announced (`Announces::GrantsAndRenewals`), an idle follower makes no store
/// requests while the leader renews for 5 TTLs (half the engine's safety-poll interval), and
/// the crashed leader's expiry wakes it (or its last renewal, a TTL old): elected within a TTL
/// and a second of the crash, after its `valid_until`, with at most 2 requests.
///
/// # Panics
///
/// When the idle follower polls, or the expiry does not wake it.
pub async fn idle_follower_makes_no_requests(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "idle_follower_makes_no_requests").await;
    let p = &scene.prefix;
    if scene.caps.notifications != Notifications::ReleaseAndExpiry
        && scene.caps.announces != Announces::GrantsAndRenewals
    {
        return scene.not_applicable(format_args!(
            "the store notifies {:?}, not expiries, and announces {:?}, not renewals: idle followers poll",
            scene.caps.notifications, scene.caps.announces
        ));
    }
    let ttl = scene.ttl;
    let (store_a, faults_a) = scene.connect_faulty().await;
    let (store_b, counts) = scene.connect_faulty().await;
    let a = scene.elector(store_a, "A");
    let b = scene.elector(store_b, "B");
    let leader_a = scene.campaign(&a, ttl * 3).await;
    let (_campaign_b, elected_b) = spawn_campaign(&b);
    // B subscribes and finds A holding the lease.
    tokio::time::sleep(ttl / 2).await;
    assert!(
        counts.counts().acquire >= 1,
        "{p}: B has not asked: {}",
        counts.counts()
    );
    counts.reset_counts();
    let idle = ttl * 5;
    tokio::time::sleep(idle).await;
    let during = counts.counts();
    scene.log(format_args!("B while A renews for {}: {during}", secs(idle)));
    assert_eq!(during.total(), 0, "{p}: the idle follower made requests: {during}");

    counts.reset_counts();
    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let leader_b = scene
        .within("B taking over from the crashed leader", ttl * 5, elected_b)
        .await
        .expect("B campaigns");
    let failover = leader_b.elected_at().saturating_duration_since(crashed);
    let requests = counts.counts().total();
    scene.log(format_args!(
        "B elected {} after the crash with {requests} request(s)",
        secs(failover)
    ));
    assert!(
        leader_b.elected_at() >= leader_a.valid_until(),
        "{p}: B elected before A's valid_until"
    );
    assert!(leader_b.term() > leader_a.term(), "{p}");
    assert!(
        failover <= ttl + Duration::from_secs(1),
        "{p}: the expiry did not wake B: failover {}",
        secs(failover)
    );
    assert!(requests <= 2, "{p}: {requests} requests to take over");
    leader_b.resign().await;
    drop(leader_a);
    scene.finish().await;
}
