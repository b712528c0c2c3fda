//! What holding many leases costs: one `ZookeeperStore` (one session per TTL) and 1,000
//! electors, each leading its own lease. Prints store requests per second by operation, and
//! the ZooKeeper packets the server received meanwhile (`mntr`, server-wide: other clients of
//! the same server count too). A measurement, not a timed assertion: run it with
//! `cargo test -p leasehold-zookeeper --test integration -- cost:: --ignored --nocapture`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use leasehold_conformance::require_server;
use leasehold_core::{CountingStore, Elector, Leader, Operation, random_u64};
use leasehold_zookeeper::ZookeeperStore;

const LEASES: usize = 1000;
/// The TTL: 2 s, or `LEASEHOLD_COST_TTL_MS`.
fn ttl() -> Duration {
    std::env::var("LEASEHOLD_COST_TTL_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(2), Duration::from_millis)
}
const WINDOW: Duration = Duration::from_secs(10);

/// `zk_packets_received` of the server, from the `mntr` four-letter word.
fn packets_received(addr: &str) -> Option<u64> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"mntr").ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn requests_per_second_holding_a_thousand_leases() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let ttl = ttl();
    let addr = server.trim_start_matches("zk://").trim_end_matches('/').to_string();
    let url = format!("{}/leasehold-cost-{:016x}", server.trim_end_matches('/'), random_u64());
    let store = Arc::new(CountingStore::new(
        ZookeeperStore::connect(&url).await.expect("connect"),
    ));
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| {
            Elector::builder(store.clone(), format!("lease-{i}"))
                .ttl(ttl)
                .candidate_id("holder")
                .build()
                .expect("elector")
        })
        .collect();
    let started = Instant::now();
    let leaders: Vec<Leader> = join_all(electors.iter().map(Elector::campaign))
        .await
        .into_iter()
        .map(|l| l.expect("campaign"))
        .collect();
    let lost = |leaders: &[Leader]| {
        leaders
            .iter()
            .filter(|l| l.ensure_valid(Duration::ZERO).is_err())
            .count()
    };
    println!(
        "{LEASES} leases granted in {:.1?}; {} already lost",
        started.elapsed(),
        lost(&leaders)
    );
    // Settle into the steady state, then count over the window.
    tokio::time::sleep(ttl).await;
    println!("{} lost after one more TTL", lost(&leaders));
    let before = store.counts();
    let packets_before = packets_received(&addr);
    let from = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let elapsed = from.elapsed().as_secs_f64();
    let counts = store.counts().since(&before);
    let packets = packets_received(&addr)
        .zip(packets_before)
        .map(|(after, before)| after.saturating_sub(before));
    let lost = lost(&leaders);
    let per_second = |n: u64| n as f64 / elapsed;
    println!(
        "steady state over {elapsed:.1} s, TTL {ttl:?}, {LEASES} leases on one store: {:.0} store requests/s \
         (renew {:.0}/s, acquire {:.0}/s, inspect {:.0}/s, failed {}), {lost} leases lost",
        per_second(counts.total()),
        per_second(counts.get(Operation::Renew)),
        per_second(counts.get(Operation::Acquire)),
        per_second(counts.get(Operation::Inspect)),
        counts.failed,
    );
    // Each renew is two ZooKeeper requests (sync + getData); the session's pings are a few a
    // second whatever the number of leases.
    println!(
        "ZooKeeper requests from renewals: {:.0}/s; packets the server received (all its clients): {}",
        per_second(counts.get(Operation::Renew) * 2),
        packets.map_or("unknown (mntr not allowed)".to_string(), |p| format!(
            "{:.0}/s",
            per_second(p)
        )),
    );
    join_all(leaders.into_iter().map(Leader::resign)).await;
}
