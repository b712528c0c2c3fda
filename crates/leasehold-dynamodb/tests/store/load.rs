//! Renewal throughput and the request rate of 1000 held leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{LeaseStore, Renewed, random_u64};

use super::{fresh_lease, granted, request};
use crate::common::{self, DynamoBackend, TABLE};

/// CPU seconds (user + system) of a process, from `/proc/PID/stat` (Linux only).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// How many renewals a second one client gets through, and whose CPU they cost (this process,
/// and the server's when `LEASEHOLD_DYNAMODB_PID_FILE` names it). Run by hand:
/// `cargo test -p leasehold-dynamodb --test integration -- --ignored --nocapture renew_throughput`;
/// `PROBE_CONCURRENCY=1,16,64` and `PROBE_SECS=5` choose what to measure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn renew_throughput() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let store = Arc::new(backend.store().await.unwrap());
    for _ in 0..3 {
        let (started, cpu) = (Instant::now(), cpu_seconds("self"));
        let _other = backend.store().await.unwrap();
        println!(
            "a new store (client + DescribeTable): {:?}, CPU {:?} s",
            started.elapsed(),
            cpu_seconds("self").zip(cpu).map(|(b, a)| b - a)
        );
    }
    let server_pid = std::env::var("LEASEHOLD_DYNAMODB_PID_FILE")
        .ok()
        .and_then(|file| std::fs::read_to_string(file).ok())
        .map(|pid| pid.trim().to_string());
    let levels: Vec<usize> = std::env::var("PROBE_CONCURRENCY")
        .unwrap_or_else(|_| "1,16,64,256,1000".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let secs: u64 = std::env::var("PROBE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for concurrency in levels {
        let started = Instant::now();
        let mut grants = Vec::new();
        for chunk in 0..concurrency.div_ceil(100) {
            let batch = (chunk * 100..concurrency.min(chunk * 100 + 100)).map(|i| {
                let store = store.clone();
                async move {
                    let lease = fresh_lease(&format!("probe{i}"));
                    granted(&store, &request(&lease, "probe", Duration::from_secs(60), None)).await
                }
            });
            grants.extend(futures::future::join_all(batch).await);
        }
        let acquire_rate = concurrency as f64 / started.elapsed().as_secs_f64();
        let (client0, server0) = (cpu_seconds("self"), server_pid.as_deref().and_then(cpu_seconds));
        let started = Instant::now();
        let deadline = started + Duration::from_secs(secs);
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let workers = grants.into_iter().map(|mut grant| {
            let (store, done, latencies) = (store.clone(), done.clone(), latencies.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    match store.renew(&grant).await {
                        Ok(Renewed::Renewed(next)) => grant = next,
                        other => panic!("renew: {other:?}"),
                    }
                    latencies.lock().unwrap().push(sent.elapsed());
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        });
        for worker in workers.collect::<Vec<_>>() {
            worker.await.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let n = done.load(std::sync::atomic::Ordering::Relaxed);
        let mut latencies = latencies.lock().unwrap().clone();
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
        let client = cpu_seconds("self")
            .zip(client0)
            .map(|(b, a)| (b - a) * 1000.0 / n as f64);
        let server = server_pid
            .as_deref()
            .and_then(cpu_seconds)
            .zip(server0)
            .map(|(b, a)| (b - a) * 1000.0 / n as f64);
        println!(
            "concurrency {concurrency:5}: acquires {acquire_rate:7.0}/s; renewals {:7.0}/s, p50 {:?} p99 {:?} max {:?}; \
             CPU per renewal: client {client:.2?} ms, server {server:.2?} ms",
            n as f64 / elapsed,
            at(0.5),
            at(0.99),
            at(1.0),
        );
    }
}

/// Requests a second one store makes while 1,000 Electors on it each try to hold a lease, by
/// operation (counted by core's `CountingStore`), and how many leases are held and were lost
/// meanwhile. Each elector campaigns again when its leadership ends. Run by hand:
/// `cargo test -p leasehold-dynamodb --test integration -- --ignored --nocapture holding_1000_leases`;
/// `RATE_TTL_MS` (default: the least the store allows), `RATE_LEASES` (1000) and
/// `RATE_WINDOW_SECS` (10) choose what to measure. Prints; asserts nothing timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn requests_per_second_holding_1000_leases() {
    let Some(endpoint) = common::endpoint() else { return };
    // A table of its own, deleted at the end: thousands of items left in the shared table slow
    // every later scan of it (list, lease groups).
    let table = format!("leasehold-rate-{:x}", random_u64());
    let backend = DynamoBackend::with_table(endpoint, &table);
    let store = backend.store().await.unwrap();
    let least = u64::try_from(leasehold_dynamodb::TTL_RANGE.start().as_millis()).unwrap();
    common::holding_many_leases(Arc::new(store.clone()), least).await;
    store.client().delete_table().table_name(&table).send().await.unwrap();
}
