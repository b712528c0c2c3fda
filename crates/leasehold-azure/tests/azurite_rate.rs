//! How many renewals a second the Azurite emulator serves on this machine, and how long they take,
//! by how many are in flight at once. A measurement, not a test:
//! `cargo test -p leasehold-azure --test integration -- azurite_rate:: --ignored --nocapture`.
//!
//! Each phase runs `concurrency` loops of back-to-back renewals for 5 s on one store. A phase that
//! starts with more loops than the store has open connections opens the rest at once (the store
//! drops connections idle for 2 s, so the phase after the pause starts cold): its first requests
//! show what a burst of new connections costs on a busy emulator.

use crate::common;
// One copy of the measurement for every backend's tests.
#[path = "../../leasehold-dynamodb/tests/common/holding.rs"]
mod holding;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_azure::AzureBlobStore;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, Renewed, random_u64};

const TTL: Duration = Duration::from_secs(60);
const PHASE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement against Azurite"]
async fn azurite_request_rate() {
    let Some(mut config) = common::azurite() else { return };
    config.max_requests = 256;
    let store = Arc::new(AzureBlobStore::from_config(config).await.unwrap());
    let who = CandidateId::new("rate").unwrap();
    let mut grants = Vec::new();
    let started = Instant::now();
    for i in 0..64 {
        let request = AcquireRequest {
            lease: LeaseName::new(format!("rate-{i}-{:x}", random_u64())).unwrap(),
            candidate: who.clone(),
            ttl: TTL,
            takeover: None,
        };
        match store.acquire(&request).await.unwrap() {
            Acquired::Granted(g) => grants.push(g),
            held => panic!("{held:?}"),
        }
    }
    let took = started.elapsed();
    eprintln!(
        "acquire (claim, lease, confirm, history), one at a time: {:.1} ms each",
        took.as_secs_f64() * 1000.0 / grants.len() as f64
    );
    let grants = Arc::new(grants);
    for (phase, concurrency) in [1usize, 4, 16, 64, 64, 0, 64, 128].into_iter().enumerate() {
        if concurrency == 0 {
            eprintln!("(3 s pause: every connection is dropped)");
            tokio::time::sleep(Duration::from_secs(3)).await;
            continue;
        }
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let began = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|w| {
                let (store, grants, latencies) = (store.clone(), grants.clone(), latencies.clone());
                tokio::spawn(async move {
                    let mut i = w;
                    while began.elapsed() < PHASE {
                        let sent = Instant::now();
                        match store.renew(&grants[i % grants.len()]).await.unwrap() {
                            Renewed::Renewed(_) => {}
                            lost => panic!("{lost:?}"),
                        }
                        latencies.lock().unwrap().push((sent.elapsed(), sent - began));
                        i += concurrency;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let mut latencies = latencies.lock().unwrap().clone();
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].0;
        let (slowest, sent) = latencies[latencies.len() - 1];
        eprintln!(
            "phase {phase}: renew, {concurrency:>3} in flight: {:>5.0}/s, p50 {:>6.1} ms, p99 {:>6.1} ms, \
             slowest {:>6.1} ms (sent {:.2}s into the phase)",
            latencies.len() as f64 / PHASE.as_secs_f64(),
            at(0.5).as_secs_f64() * 1000.0,
            at(0.99).as_secs_f64() * 1000.0,
            slowest.as_secs_f64() * 1000.0,
            sent.as_secs_f64()
        );
    }
    for grant in grants.iter() {
        store.release(grant).await.unwrap();
    }
}

/// Requests a second one store makes while 1,000 Electors on it each try to hold a lease (TTL 15
/// s, the least Azure allows), by operation, with the leases held and lost: `cargo test -p
/// leasehold-azure --test integration -- --ignored --nocapture holding_1000_leases`
/// (`RATE_TTL_MS`, `RATE_LEASES`, `RATE_WINDOW_SECS` as in `holding.rs`). Prints; asserts
/// nothing timed. A run writes thousands of extents (one per Put Blob, refused ones included),
/// and deleting its container sets up a long freeze of the emulator's extent GC at its next
/// sweep (see docs.md, "Known limit"): run it on an emulator nothing else uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement against Azurite"]
async fn requests_per_second_holding_1000_leases() {
    let Some(mut config) = common::azurite() else { return };
    // A container of its own, deleted at the end: thousands of blobs left behind slow the
    // emulator down for everyone.
    config.container = format!("leasehold-rate-{:x}", random_u64());
    let store = AzureBlobStore::from_config(config.clone()).await.unwrap();
    let least = u64::try_from(leasehold_azure::TTL_RANGE.start().as_millis()).unwrap();
    holding::holding_many_leases(Arc::new(store), least).await;
    common::raw_delete_container(&config).await.unwrap();
}
