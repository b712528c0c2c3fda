//! What one member of a lease group with 1,000 shards (TTL 10 s) costs the server: scripts per
//! second (`INFO commandstats`, server-wide: run it alone) and store calls per second by
//! operation (core's `CountingStore`, under the group's `RenewBatcher`), over a minute once every
//! shard is owned. A measurement, not a check:
//! `cargo test -p leasehold-redis --test integration -- group_cost:: --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::SoleMember;
use leasehold_core::{CountingStore, Operation, random_u64};
use leasehold_redis::RedisStore;

const SHARDS: u32 = 1000;
const TTL: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_secs(60);

/// Calls of every command the server has run, and of `EVALSHA` and `EVAL` alone.
async fn commands(backend: &common::RedisBackend) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut backend.raw().await)
        .await
        .unwrap();
    let calls = |line: &str| -> u64 {
        line.split_once("calls=")
            .and_then(|(_, rest)| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let all = info.lines().filter(|l| l.starts_with("cmdstat_")).map(calls).sum();
    let scripts = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(calls)
        .sum();
    (all, scripts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn one_member_with_a_thousand_shards() {
    let Some(url) = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let mut config = common::config(&url);
    config.prefix = format!("lh-cost-{:x}:", random_u64());
    let backend = common::RedisBackend::with_config(config.clone());
    let store = Arc::new(CountingStore::new(RedisStore::from_config(config).await.unwrap()));
    let member = SoleMember::lead_every_shard(store.clone(), "cost", SHARDS, TTL, TTL * 6).await;
    let group = &member.group;
    tokio::time::sleep(TTL).await;

    let (calls_before, (all_before, scripts_before)) = (store.counts(), commands(&backend).await);
    tokio::time::sleep(WINDOW).await;
    let calls = store.counts().since(&calls_before);
    let (all, scripts) = commands(&backend).await;
    let per_second = |n: u64| n as f64 / WINDOW.as_secs_f64();
    println!(
        "redis, one member, {SHARDS} shards, ttl {TTL:?}, over {WINDOW:?}: server scripts {:.1}/s, commands \
         {:.0}/s (server-wide); store calls {:.1}/s: renew_many {:.2}/s, renew {:.2}/s, list {:.2}/s, \
         inspect {:.2}/s, acquire {:.2}/s, failed {}; {} shards owned at the end",
        per_second(scripts - scripts_before),
        per_second(all - all_before),
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
    let mut raw = backend.raw().await;
    let pattern = format!("{}*", backend.config.prefix);
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut raw).await.unwrap();
    for chunk in keys.chunks(500) {
        let _: redis::Value = redis::cmd("DEL").arg(chunk).query_async(&mut raw).await.unwrap();
    }
}
