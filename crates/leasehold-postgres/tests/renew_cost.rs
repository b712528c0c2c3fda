//! What a renewal statement costs with 1 and with 1,000 leases per store while other stores
//! listen to announcements (a measurement, not a check: `cargo test --release -p
//! leasehold-postgres --test integration -- renew_cost:: --ignored --nocapture`).

use crate::common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_core::{LeaseName, LeaseStore};
use leasehold_postgres::PostgresStore;

const TTL: Duration = Duration::from_secs(30);
const LISTENERS: usize = 3;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn renewal_statement_latency_with_listeners() {
    let Some(backend) = common::server() else { return };
    let run = leasehold_core::random_u64() & 0xffff_ffff;
    for (leases, rounds) in [(1_usize, 400_usize), (1_000, 40)] {
        let store = PostgresStore::connect(&backend.url).await.unwrap();
        let mut grants = Vec::new();
        for i in 0..leases {
            let lease = LeaseName::new(format!("cost-{run:x}-{leases}-{i:05}")).unwrap();
            grants.push(leasehold_conformance::must_grant(&store, lease.as_str(), "holder", TTL).await);
        }
        // Other stores, each following the first lease (its listener then runs).
        let mut listeners = Vec::new();
        for _ in 0..LISTENERS {
            let other = PostgresStore::connect(&backend.url).await.unwrap();
            let stream = other.announcements(&grants[0].lease).await.unwrap().unwrap();
            listeners.push((other, stream));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut times = Vec::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let answers = store.renew_many(&grants).await.unwrap();
            times.push(started.elapsed());
            assert!(
                answers
                    .iter()
                    .all(|a| matches!(a, Ok(leasehold_core::Renewed::Renewed(_))))
            );
        }
        times.sort();
        // Renewals announced to a listener within a second of the last round.
        let mut seen = 0;
        let (_, stream) = &mut listeners[0];
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
            seen += 1;
        }
        println!(
            "{leases} leases, {LISTENERS} listening stores: renewal statement p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms ({rounds} rounds); a listener's stream yielded {seen} afterwards",
            percentile(&times, 0.5),
            percentile(&times, 0.9),
            percentile(&times, 1.0),
        );
        for grant in &grants {
            store.release(grant).await.unwrap();
        }
    }
}
