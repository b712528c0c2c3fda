//! What a leadership transition costs with many waiting candidates, as `leasehold-bench`
//! measures it (TTL 2 s, each candidate its own `RedisStore`, the engine's default timings):
//! store requests of all candidates from the leader's `resign()` until the successor is elected
//! (plus 50 ms), the requests of idle followers while the leader renews, and the graceful
//! handover (from `resign()`'s return to the follower's election), and what a crashed leader's
//! expiry costs 100 followers. A measurement, not a check:
//! `cargo test -p leasehold-redis --release --test integration -- herd:: --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, Faults, FaultyStore};
use leasehold_core::{Elector, Event, Leader, LeaseStore, random_u64};
use leasehold_redis::RedisStore;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

const TTL: Duration = Duration::from_secs(2);

async fn stores(config: &leasehold_redis::RedisConfig, n: usize, faults: &Faults) -> Vec<Arc<dyn LeaseStore>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let store = RedisStore::from_config(config.clone()).await.unwrap();
        out.push(Arc::new(FaultyStore::counting(Arc::new(store), faults.clone())) as Arc<dyn LeaseStore>);
    }
    out
}

fn elector(store: Arc<dyn LeaseStore>, lease: &str, who: &str) -> Elector {
    Elector::builder(store, lease)
        .ttl(TTL)
        .candidate_id(who)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn requests_per_transition_idle_and_handover() {
    let Some(url) = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let mut config = common::config(&url);
    config.prefix = format!("lh-herd-{:x}:", random_u64());
    let backend = common::RedisBackend::with_config(config.clone());

    // Requests per transition, 100 candidates, 5 transitions.
    let faults = Faults::new();
    let n = 100;
    let electors: Vec<Elector> = stores(&config, n, &faults)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, s)| elector(s, "transitions", &format!("c{i}")))
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Leader)>();
    let mut campaigns = JoinSet::new();
    let spawn = |campaigns: &mut JoinSet<()>, i: usize| {
        let (e, tx) = (electors[i].clone(), tx.clone());
        campaigns.spawn(async move {
            if let Ok(leader) = e.campaign().await {
                let _ = tx.send((i, leader));
            }
        });
    };
    for i in 0..n {
        spawn(&mut campaigns, i);
    }
    let mut current = rx.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut counts = Vec::new();
    for _ in 0..5 {
        faults.reset_counts();
        let (i, leader) = current;
        leader.resign().await;
        spawn(&mut campaigns, i);
        current = tokio::time::timeout(TTL * 3, rx.recv()).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        counts.push(faults.counts().total());
    }
    current.1.resign().await;
    campaigns.shutdown().await;
    println!("redis: store requests per transition with {n} candidates: {counts:?}");

    // A crash: a leader cut off (blackholed, its record expires on the server's clock) and
    // 100 followers; their requests from the cut until one is elected (plus 50 ms).
    let leader_faults = Faults::new();
    let crashing = RedisStore::from_config(config.clone()).await.unwrap();
    let crashing = Arc::new(FaultyStore::new(Arc::new(crashing), leader_faults.clone()));
    let leader = elector(crashing, "crash", "crashing").campaign().await.unwrap();
    let faults = Faults::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<Leader>();
    let mut campaigns = JoinSet::new();
    for (i, s) in stores(&config, n, &faults).await.into_iter().enumerate() {
        let (e, tx) = (elector(s, "crash", &format!("c{i}")), tx.clone());
        campaigns.spawn(async move {
            if let Ok(leader) = e.campaign().await {
                let _ = tx.send(leader);
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    faults.reset_counts();
    leader_faults.set(Direction::Both, Fault::Blackhole);
    let cut = Instant::now();
    let next = tokio::time::timeout(TTL * 5, rx.recv()).await.unwrap().unwrap();
    let took = next.elected_at().saturating_duration_since(cut);
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!(
        "redis: a crash with {n} followers: elected {took:?} after the cut, {} requests ({})",
        faults.counts().total(),
        faults.counts()
    );
    next.resign().await;
    campaigns.shutdown().await;
    drop(leader);

    // Idle: a leader and 3 followers, a 5 s window.
    let leader_faults = Faults::new();
    let follower_faults = Faults::new();
    let a = elector(stores(&config, 1, &leader_faults).await.remove(0), "idle", "leader");
    let leader = a.campaign().await.unwrap();
    let mut campaigns = JoinSet::new();
    for (i, s) in stores(&config, 3, &follower_faults).await.into_iter().enumerate() {
        let e = elector(s, "idle", &format!("follower{i}"));
        campaigns.spawn(async move {
            let _ = e.campaign().await;
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    follower_faults.reset_counts();
    leader_faults.reset_counts();
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    println!(
        "redis: idle: 3 followers {} requests, leader {} requests in {window:?}",
        follower_faults.counts().total(),
        leader_faults.counts().total()
    );
    campaigns.shutdown().await;
    leader.resign().await;

    // Graceful handover, 20 times.
    let two = stores(&config, 2, &Faults::new()).await;
    let mut samples = Vec::new();
    for i in 0..20 {
        let lease = format!("handover-{i}");
        let a = elector(two[0].clone(), &lease, "a");
        let b = elector(two[1].clone(), &lease, "b");
        let la = a.campaign().await.unwrap();
        let mut events = b.events();
        let waiting = tokio::spawn(async move { b.campaign().await });
        loop {
            if let Ok(Event::LeaderChanged(Some(_))) = events.recv().await {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        la.resign().await;
        let returned = Instant::now();
        let lb = waiting.await.unwrap().unwrap();
        samples.push(lb.elected_at().saturating_duration_since(returned));
        lb.resign().await;
    }
    samples.sort();
    println!(
        "redis: graceful handover p50 {:?}, max {:?}",
        samples[samples.len() / 2],
        samples[samples.len() - 1]
    );

    let mut raw = backend.raw().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", config.prefix))
        .query_async(&mut raw)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut raw).await.unwrap();
    }
}
