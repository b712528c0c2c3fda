//! Handover, crash failover and an idle follower's requests on the MySQL store, measured in one
//! process (the benchmark, `leasehold-bench --backends mysql`, measures the same across
//! processes). Ignored by default; run with
//! `cargo test --release -p leasehold-mysql --test integration -- measure:: --ignored --nocapture`.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{CountingStore, Elector, LeaseStore, random_u64};
use leasehold_mysql::MysqlStore;

const TTL: Duration = Duration::from_secs(2);

fn elector(store: Arc<dyn LeaseStore>, lease: &str, id: &str) -> Elector {
    Elector::builder(store, lease)
        .candidate_id(id)
        .ttl(TTL)
        .build()
        .expect("valid timing")
}

fn median(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn handover_failover_and_idle_follower() {
    let Some(url) = leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL") else {
        return;
    };
    let connect = || async { Arc::new(MysqlStore::connect(&url).await.unwrap()) as Arc<dyn LeaseStore> };

    // Graceful handover: the successor has followed for a random 0.5-1.5 s (a random phase of
    // its poll), from `resign()` called to the successor's election.
    let mut handovers = Vec::new();
    for _ in 0..20 {
        let lease = format!("measure-handover-{:x}", random_u64());
        let (a, b) = (
            elector(connect().await, &lease, "a"),
            elector(connect().await, &lease, "b"),
        );
        let leader = a.campaign().await.unwrap();
        let follower = tokio::spawn(async move { b.campaign().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(500 + random_u64() % 1000)).await;
        let resigned = Instant::now();
        leader.resign().await;
        let successor = follower.await.unwrap();
        handovers.push(successor.elected_at().duration_since(resigned).as_secs_f64() * 1000.0);
        successor.resign().await;
    }
    let (p50, p10, p90) = median(handovers);
    println!("graceful handover (TTL 2 s, 20 samples): p50 {p50:.1} ms, p10 {p10:.1} ms, p90 {p90:.1} ms");

    // An idle follower's requests while the leader renews.
    let lease = format!("measure-idle-{:x}", random_u64());
    let counting = Arc::new(CountingStore::new(MysqlStore::connect(&url).await.unwrap()));
    let leader = elector(connect().await, &lease, "a").campaign().await.unwrap();
    let b = elector(counting.clone(), &lease, "b");
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(TTL).await;
    let before = counting.counts();
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let during = counting.counts().since(&before);
    println!(
        "idle follower (TTL 2 s): {:.2} requests/s over {window:?} ({during:?})",
        during.total() as f64 / window.as_secs_f64()
    );
    follower.abort();
    leader.resign().await;

    // Crash failover: the leader's connection blackholed (no FIN, no RST), from the blackhole to
    // the successor's election, in TTLs.
    let mut failovers = Vec::new();
    for _ in 0..5 {
        let mut parsed = url::Url::parse(&url).unwrap();
        let upstream = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap())
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap();
        let proxy = FaultProxy::start(upstream).await.unwrap();
        parsed.set_port(Some(proxy.addr().port())).unwrap();
        let lease = format!("measure-crash-{:x}", random_u64());
        let crashed_store = Arc::new(MysqlStore::connect(parsed.as_str()).await.unwrap()) as Arc<dyn LeaseStore>;
        let leader = elector(crashed_store, &lease, "a").campaign().await.unwrap();
        let b = elector(connect().await, &lease, "b");
        let follower = tokio::spawn(async move { b.campaign().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(500 + random_u64() % 1000)).await;
        let crashed = Instant::now();
        proxy.faults().set(Direction::Both, Fault::Blackhole);
        let successor = follower.await.unwrap();
        failovers.push(successor.elected_at().duration_since(crashed).as_secs_f64() / TTL.as_secs_f64());
        drop(leader);
        successor.resign().await;
    }
    let (p50, p10, p90) = median(failovers);
    println!("crash failover (TTL 2 s, 5 samples): p50 {p50:.2} TTL, p10 {p10:.2}, p90 {p90:.2}");
}
