//! How many requests one store makes while it holds 1,000 leases (TTL 2 s) through 1,000
//! electors: store calls per second by operation (core's `CountingStore`), and the commands the
//! server ran (`INFO commandstats`: every store call is one `EVALSHA`; the delta also counts
//! anything else the server ran meanwhile, so run it alone). A measurement, not a check:
//! `cargo test -p leasehold-redis --test integration -- thousand:: --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{CountingStore, Elector, LeaseStore, Operation, random_u64};
use leasehold_redis::RedisStore;

const LEASES: usize = 1000;
const TTL: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(10);

/// Calls of every command the server has run (`cmdstat_<name>:calls=N,...` lines), summed.
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
async fn requests_per_second_with_a_thousand_leases() {
    let Some(url) = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let mut config = common::config(&url);
    config.prefix = format!("lh-bench-{:x}:", random_u64());
    let backend = common::RedisBackend::with_config(config.clone());
    let store = Arc::new(CountingStore::new(RedisStore::from_config(config).await.unwrap()));
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| {
            Elector::builder(store.clone(), format!("bench-{i:04}"))
                .candidate_id("member")
                .ttl(TTL)
                .build()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let leaders = futures::future::try_join_all(electors.iter().map(Elector::campaign))
        .await
        .unwrap();
    println!("{LEASES} leases taken in {:?}", started.elapsed());

    tokio::time::sleep(TTL).await;
    let (calls_before, (all_before, scripts_before)) = (store.counts(), commands(&backend).await);
    tokio::time::sleep(WINDOW).await;
    let calls = store.counts().since(&calls_before);
    let (all, scripts) = commands(&backend).await;
    let per_second = |n: u64| n as f64 / WINDOW.as_secs_f64();
    let leading = leaders
        .iter()
        .filter(|l| l.ensure_valid(Duration::ZERO).is_ok())
        .count();
    println!(
        "redis, {LEASES} leases, ttl {TTL:?}, renew every ttl/3: store calls {:.0}/s (renew {:.0}/s, \
         acquire {:.0}/s, inspect {:.0}/s, failed {}), server commands {:.0}/s of which scripts {:.0}/s; \
         {leading} of {LEASES} still leading",
        per_second(calls.total()),
        per_second(calls.get(Operation::Renew)),
        per_second(calls.get(Operation::Acquire)),
        per_second(calls.get(Operation::Inspect)),
        calls.failed,
        per_second(all - all_before),
        per_second(scripts - scripts_before),
    );

    futures::future::join_all(leaders.into_iter().map(|l| l.resign())).await;
    let mut raw = backend.raw().await;
    let pattern = format!("{}*", backend.config.prefix);
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut raw).await.unwrap();
    for chunk in keys.chunks(500) {
        let _: redis::Value = redis::cmd("DEL").arg(chunk).query_async(&mut raw).await.unwrap();
    }
}

/// The same 1,000 leases held by one member that renews them all at once every TTL/3 with
/// `LeaseStore::renew_many`: one call per renew interval (1,000 / `RENEW_BATCH` scripts) instead
/// of one script per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn renew_many_renews_a_thousand_leases() {
    let Some(url) = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let mut config = common::config(&url);
    config.prefix = format!("lh-bench-{:x}:", random_u64());
    let backend = common::RedisBackend::with_config(config.clone());
    let store = RedisStore::from_config(config).await.unwrap();
    let names: Vec<leasehold_core::LeaseName> = (0..LEASES).map(|i| format!("bench-{i:04}").parse().unwrap()).collect();
    let mut grants: Vec<leasehold_core::Grant> =
        futures::future::join_all(names.iter().map(|lease| common::grant(&store, lease, "member", TTL))).await;
    let (all_before, scripts_before) = commands(&backend).await;
    let started = Instant::now();
    let mut rounds = Vec::new();
    while started.elapsed() < WINDOW {
        let sent = Instant::now();
        let answers = store.renew_many(&grants).await.unwrap();
        rounds.push(sent.elapsed());
        grants = answers
            .into_iter()
            .map(|answer| match answer {
                Ok(leasehold_core::Renewed::Renewed(grant)) => grant,
                other => panic!("a lease was lost: {other:?}"),
            })
            .collect();
        tokio::time::sleep((TTL / 3).saturating_sub(sent.elapsed())).await;
    }
    let (all, scripts) = commands(&backend).await;
    let seconds = started.elapsed().as_secs_f64();
    rounds.sort();
    println!(
        "redis, {LEASES} leases renewed by one member with renew_many every ttl/3: {} rounds in {seconds:.1} s \
         (one renew_many each), round time p50 {:?} max {:?}; the server ran {:.1} scripts/s and {:.0} commands/s \
         in all (other clients included)",
        rounds.len(),
        rounds[rounds.len() / 2],
        rounds[rounds.len() - 1],
        (scripts - scripts_before) as f64 / seconds,
        (all - all_before) as f64 / seconds,
    );
    for grant in &grants {
        store.release(grant).await.unwrap();
    }
}
