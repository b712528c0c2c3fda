//! What one member of a lease group with 1,000 shards costs ZooKeeper: requests per second the
//! server received on this process's connections (the `stat` four-letter word, per connection:
//! pings included, other clients excluded), and store calls per second by operation (core's
//! `CountingStore`, under the group's `RenewBatcher`), once every shard is owned. A measurement,
//! not a check: `cargo test -p leasehold-zookeeper --test integration -- group_cost:: --ignored --nocapture`
//! (TTL 2 s, or `LEASEHOLD_COST_TTL_MS`; window 30 s, or `LEASEHOLD_COST_WINDOW_S`).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::SoleMember;
use leasehold_conformance::require_server;
use leasehold_core::{CountingStore, Operation, random_u64};
use leasehold_zookeeper::ZookeeperStore;

const SHARDS: u32 = 1000;

fn env_or(name: &str, default: Duration, unit: fn(u64) -> Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, unit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn one_member_with_a_thousand_shards() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let ttl = env_or("LEASEHOLD_COST_TTL_MS", Duration::from_secs(2), Duration::from_millis);
    let window = env_or("LEASEHOLD_COST_WINDOW_S", Duration::from_secs(30), Duration::from_secs);
    let addr = common::address(&server);
    let url = format!(
        "{}/leasehold-group-cost-{:016x}",
        server.trim_end_matches('/'),
        random_u64()
    );
    let store = Arc::new(CountingStore::new(
        ZookeeperStore::connect(&url).await.expect("connect"),
    ));
    let member = SoleMember::lead_every_shard(store.clone(), "cost", SHARDS, ttl, ttl * 30).await;
    let group = &member.group;
    tokio::time::sleep(ttl * 2).await;

    let (calls_before, requests_before) = (store.counts(), common::requests_by_connection(&addr));
    let from = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = from.elapsed().as_secs_f64();
    let calls = store.counts().since(&calls_before);
    let requests = common::requests_by_connection(&addr)
        .zip(requests_before)
        .map(|(after, before)| common::since(&before, &after));
    let per_second = |n: u64| n as f64 / elapsed;
    println!(
        "zookeeper, one member, {SHARDS} shards, ttl {ttl:?}, over {elapsed:.1} s: ZooKeeper requests {} \
         (server-counted on this process's connections); store calls {:.1}/s: renew_many {:.2}/s, renew {:.2}/s, \
         list {:.2}/s, inspect {:.2}/s, acquire {:.2}/s, failed {}; {} shards owned at the end",
        requests.map_or(
            "not counted (the server does not answer `stat`)".to_string(),
            |n| format!("{:.1}/s", per_second(n))
        ),
        per_second(calls.total()),
        per_second(calls.get(Operation::RenewMany)),
        per_second(calls.get(Operation::Renew)),
        per_second(calls.get(Operation::List)),
        per_second(calls.get(Operation::Inspect)),
        per_second(calls.get(Operation::Acquire)),
        calls.failed,
        group.owned().len(),
    );

    member.leave().await;
}
