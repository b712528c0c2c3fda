//! How many requests a second the Azurite emulator serves on this machine, by kind and by
//! concurrency. A measurement, not a test: `cargo test -p leasehold-azure --test azurite_rate --
//! --ignored --nocapture`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use leasehold_azure::AzureBlobStore;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, Renewed, random_u64};

const TTL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement against Azurite"]
async fn azurite_request_rate() {
    let Some(config) = common::azurite() else { return };
    let store = Arc::new(AzureBlobStore::connect_with(config).await.unwrap());
    let leases = 64;
    let who = CandidateId::new("rate").unwrap();
    let mut grants = Vec::new();
    let started = Instant::now();
    for i in 0..leases {
        let lease = LeaseName::new(format!("rate-{i}-{:x}", random_u64())).unwrap();
        let request = AcquireRequest {
            lease,
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
        "acquire, one at a time: {:.1}/s ({:.1} ms each)",
        leases as f64 / took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / leases as f64
    );
    let grants = Arc::new(grants);
    for (k, concurrency) in [64usize, 64, 64, 64, 64, 64].into_iter().enumerate() {
        if k == 3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let done = Arc::new(AtomicUsize::new(0));
        let worst = Arc::new(std::sync::Mutex::new(Vec::new()));
        let until = Instant::now() + Duration::from_secs(5);
        let tasks: Vec<_> = (0..concurrency)
            .map(|w| {
                let (store, grants, done, worst) = (store.clone(), grants.clone(), done.clone(), worst.clone());
                tokio::spawn(async move {
                    let mut i = w;
                    while Instant::now() < until {
                        let sent = Instant::now();
                        match store.renew(&grants[i % grants.len()]).await.unwrap() {
                            Renewed::Renewed(_) => {}
                            lost => panic!("{lost:?}"),
                        }
                        let took = sent.elapsed();
                        worst.lock().unwrap().push((took, sent));
                        done.fetch_add(1, Ordering::Relaxed);
                        i += concurrency;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let n = done.load(Ordering::Relaxed);
        let mut lat = worst.lock().unwrap().clone();
        lat.sort();
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize].0;
        let slow: Vec<_> = lat
            .iter()
            .rev()
            .take(5)
            .map(|(d, at)| {
                format!(
                    "{:?}@{:.2}s",
                    d,
                    (*at + Duration::from_secs(5))
                        .saturating_duration_since(until)
                        .as_secs_f64()
                )
            })
            .collect();
        eprintln!(
            "renew, {concurrency:>3} at a time: {:.1}/s p50 {:?} p99 {:?} slowest {slow:?}",
            n as f64 / 5.0,
            q(0.5),
            q(0.99),
        );
    }
    for g in grants.iter() {
        store.release(g).await.unwrap();
    }
}
