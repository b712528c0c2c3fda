//! The cost of holding many leases on one store, for any backend's tests (the Azure tests
//! include this file too).

#![allow(unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_core::{CountingStore, Elector, LeaseStore, Operation};

/// Measures the requests a second `store` makes while `RATE_LEASES` (1,000) Electors on it each
/// try to hold a lease of TTL `RATE_TTL_MS` (default `least_ttl_ms`) for `RATE_WINDOW_SECS` (10),
/// once every elector has been elected or a minute has passed; prints them by operation, with
/// the leases held and the leaderships lost. Each elector campaigns again when it loses. With
/// `RATE_TRACE` set, prints the events of the first elector as they come.
pub async fn holding_many_leases(store: Arc<dyn LeaseStore>, least_ttl_ms: u64) {
    let number = |key: &str, default: u64| std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let ttl = Duration::from_millis(number("RATE_TTL_MS", least_ttl_ms));
    let leases = number("RATE_LEASES", 1000);
    let window = Duration::from_secs(number("RATE_WINDOW_SECS", 10));
    let name = store.name();
    let store = Arc::new(CountingStore::new(store));
    let tag = format!("{:x}", leasehold_core::random_u64());
    let lost = Arc::new(AtomicU64::new(0));
    let electors: Vec<Arc<Elector>> = (0..leases)
        .map(|i| {
            let elector = Elector::builder(store.clone(), format!("rate-{tag}-{i}"))
                .ttl(ttl)
                .build();
            Arc::new(elector.unwrap())
        })
        .collect();
    let tasks: Vec<_> = electors
        .iter()
        .map(|elector| {
            let (elector, lost) = (elector.clone(), lost.clone());
            tokio::spawn(async move {
                loop {
                    if let Ok(leader) = elector.campaign().await {
                        leader.cancelled().await;
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    if std::env::var_os("RATE_TRACE").is_some() {
        // What the first elector goes through, for a store that cannot keep up.
        let mut events = electors[0].events();
        let since = Instant::now();
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                println!("{:>8.3?} elector 0: {event:?}", since.elapsed());
            }
        });
    }
    let holding = || electors.iter().filter(|e| e.is_leader()).count();
    let started = Instant::now();
    while holding() < electors.len() && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (warm, held_before) = (started.elapsed(), holding());
    let (before, lost_before, measured) = (store.counts(), lost.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(window).await;
    let counts = store.counts().since(&before);
    let secs = measured.elapsed().as_secs_f64();
    let (held_after, lost) = (holding(), lost.load(Ordering::Relaxed) - lost_before);
    for task in tasks {
        task.abort();
    }
    let by_operation: Vec<String> = Operation::ALL
        .iter()
        .filter(|op| counts.get(**op) > 0)
        .map(|op| format!("{op} {:.1}/s", counts.get(*op) as f64 / secs))
        .collect();
    println!(
        "{name}: {leases} electors, TTL {ttl:?}: {held_before} leases held after {warm:.1?}; over the next {secs:.1} s \
         {:.1} requests/s ({}), {:.2} per lease per TTL, {} failed; {lost} leaderships lost, {held_after} held at the end",
        counts.total() as f64 / secs,
        by_operation.join(", "),
        counts.total() as f64 / secs * ttl.as_secs_f64() / leases as f64,
        counts.failed,
    );
}
