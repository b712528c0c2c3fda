//! Whether a store's renewals stall together when it renews many leases at the same instant, as
//! the members of a lease group do (the conformance scenario
//! `lease_group_balances_and_survives_a_crash`). A measurement, not a test: `cargo test -p
//! leasehold-azure --test integration -- renewal_stall:: --ignored --nocapture`.
//!
//! `STALL_STORES` (3) stores, each holding `STALL_LEASES` (22) leases of TTL 15 s, renew all of
//! them at once every `STALL_RENEW_MS` (5,000) ms, each renewal cut off after 3.75 s as the
//! group's electors cut it off, and list the container every `STALL_LIST_MS` (4,000) ms, for
//! `STALL_SECS` (90) s. Prints every round with a renewal slower than 1 s, then the totals.
//!
//! Measured on the busy shared machine (3 stores x 22 leases, 90 s): 836 renewals, p50 299 ms,
//! p99 1.4 s, slowest 1.6 s, none cut off: renewing a member's shards all at once does not
//! stall a store. What does is the emulator itself: Azurite's extent garbage collection (every
//! 10 minutes) removes the extents of deleted blobs one at a time, re-sorting its index after
//! each, with its event loop blocked throughout; every client then waits, for seconds (2,500
//! blobs deleted: 7.7 s) to minutes (8,600 extents: 8.6 minutes). See the crate's docs.md.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_azure::AzureBlobStore;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, Renewed, random_u64};

const TTL: Duration = Duration::from_secs(15);
const CUT_OFF: Duration = Duration::from_millis(3750);

fn number(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement against Azurite"]
async fn renewals_of_one_store_at_once() {
    let Some(mut config) = common::azurite() else { return };
    let (stores, leases) = (number("STALL_STORES", 3), number("STALL_LEASES", 22));
    let renew_every = Duration::from_millis(number("STALL_RENEW_MS", 5000));
    let list_every = Duration::from_millis(number("STALL_LIST_MS", 4000));
    let run_for = Duration::from_secs(number("STALL_SECS", 90));
    let tag = format!("{:x}", random_u64());
    config.prefix = format!("stall-{tag}/");
    let began = Instant::now();
    let at = move || began.elapsed().as_secs_f64();
    let mut members = Vec::new();
    for s in 0..stores {
        let store = Arc::new(AzureBlobStore::from_config(config.clone()).await.unwrap());
        let who = CandidateId::new(format!("member-{s}")).unwrap();
        let mut grants = Vec::new();
        for i in 0..leases {
            let request = AcquireRequest {
                lease: LeaseName::new(format!("shard-{s}-{i}")).unwrap(),
                candidate: who.clone(),
                ttl: TTL,
                takeover: None,
            };
            match store.acquire(&request).await.unwrap() {
                Acquired::Granted(g) => grants.push(g),
                held => panic!("{held:?}"),
            }
        }
        members.push((store, grants));
    }
    eprintln!("{:>7.2}s: {stores} stores hold {leases} leases each", at());
    // (store, round start, latencies, timeouts)
    let rounds = Arc::new(Mutex::new(Vec::<(usize, f64, Vec<Duration>, usize)>::new()));
    let mut tasks = Vec::new();
    for (s, (store, grants)) in members.iter().enumerate() {
        let (store, grants, rounds) = (store.clone(), grants.clone(), rounds.clone());
        // Each store renews at its own phase, as the members of a group do.
        let phase = renew_every.mul_f64(s as f64 / stores as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(phase).await;
            let mut tick = tokio::time::interval(renew_every);
            while began.elapsed() < run_for {
                tick.tick().await;
                let start = at();
                let renewals: Vec<_> = grants
                    .iter()
                    .map(|grant| {
                        let (store, grant) = (store.clone(), grant.clone());
                        tokio::spawn(async move {
                            let sent = Instant::now();
                            match tokio::time::timeout(CUT_OFF, store.renew(&grant)).await {
                                Ok(Ok(Renewed::Renewed(_))) => Some(sent.elapsed()),
                                Ok(other) => panic!("renew: {other:?}"),
                                Err(_) => None,
                            }
                        })
                    })
                    .collect();
                let (mut took, mut timeouts) = (Vec::new(), 0);
                for renewal in renewals {
                    match renewal.await.unwrap() {
                        Some(t) => took.push(t),
                        None => timeouts += 1,
                    }
                }
                took.sort();
                let slowest = took.last().copied().unwrap_or_default();
                if timeouts > 0 || slowest > Duration::from_secs(1) {
                    eprintln!(
                        "{start:>7.2}s: store {s}: {timeouts} of {} renewals past {CUT_OFF:?}, slowest answered {slowest:.2?}",
                        grants.len()
                    );
                }
                rounds.lock().unwrap().push((s, start, took, timeouts));
            }
        }));
        let (store, list_every) = (members[s].0.clone(), list_every);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(list_every);
            while began.elapsed() < run_for {
                tick.tick().await;
                let (start, sent) = (at(), Instant::now());
                let listed = store.list("").await.unwrap();
                if sent.elapsed() > Duration::from_secs(1) {
                    eprintln!(
                        "{start:>7.2}s: store {s}: list of {} leases took {:.2?}",
                        listed.len(),
                        sent.elapsed()
                    );
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let rounds = rounds.lock().unwrap().clone();
    let mut all: Vec<Duration> = rounds.iter().flat_map(|r| r.2.iter().copied()).collect();
    all.sort();
    let timeouts: usize = rounds.iter().map(|r| r.3).sum();
    let stalled = rounds.iter().filter(|r| r.3 > 0).count();
    let q = |p: f64| {
        all.get(((all.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    eprintln!(
        "{} rounds, {} renewals answered (p50 {:.1?}, p99 {:.1?}, slowest {:.1?}), {timeouts} past {CUT_OFF:?} in {stalled} rounds",
        rounds.len(),
        all.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    );
    for (store, grants) in &members {
        for grant in grants {
            let _ = store.release(grant).await;
        }
    }
}
