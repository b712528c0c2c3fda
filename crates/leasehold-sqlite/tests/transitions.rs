//! Requests per leadership transition with many followers, each in a store of its own on one
//! database file (as many processes on one machine would be): a resignation wakes exactly one
//! follower, and the transition costs the old leader's release and re-subscription and the
//! successor's one acquire, whatever the number of followers.
//!
//! The TTL is long (60 s) and polls are 30 s apart: no follower's timer fires during the test,
//! so any other request comes from a wake-up it should not have had.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::{Faults, FaultyStore, RequestCounts};
use leasehold_core::{Elector, Leader, LeaseStore};
use leasehold_sqlite::SqliteStore;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

const TTL: Duration = Duration::from_secs(60);
/// Far longer than a wake-up takes, far shorter than a follower's poll interval.
const WAKE: Duration = Duration::from_secs(10);

/// `n` candidates on one file, each through its own store; `transitions` resignations, each
/// followed by the old leader's new campaign. Answers each transition's requests per candidate,
/// with who was the old leader and who the successor.
async fn transitions(n: usize, transitions: usize) -> Vec<(usize, usize, Vec<RequestCounts>)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let faults = Faults::new();
    let mut stores = Vec::new();
    for _ in 0..n {
        let store: Arc<dyn LeaseStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        stores.push(Arc::new(FaultyStore::new(store, faults.clone())));
    }
    let electors: Vec<Elector> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            Elector::builder(store.clone(), "jobs")
                .ttl(TTL)
                .retry_every(TTL / 2)
                .jitter(0.0)
                .candidate_id(format!("c{i}"))
                .build()
                .unwrap()
        })
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Leader)>();
    let mut campaigns = JoinSet::new();
    let spawn = |campaigns: &mut JoinSet<()>, i: usize| {
        let (elector, tx) = (electors[i].clone(), tx.clone());
        campaigns.spawn(async move {
            if let Ok(leader) = elector.campaign().await {
                let _ = tx.send((i, leader));
            }
        });
    };
    for i in 0..n {
        spawn(&mut campaigns, i);
    }
    let mut current = tokio::time::timeout(WAKE, rx.recv())
        .await
        .expect("a first leader")
        .unwrap();
    // Every follower makes its first attempt and subscribes: wait until each has asked once and
    // the requests stop. (Waiting for the requests to stop alone was not enough: on a loaded
    // machine a follower's first acquire came after a quiet 300 ms, inside the first transition.)
    let mut last = faults.counts().total();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = faults.counts().total();
        let everyone_asked = stores.iter().all(|s| s.counts().acquire >= 1);
        if everyone_asked && now == last {
            break;
        }
        last = now;
    }
    let mut seen = Vec::new();
    for _ in 0..transitions {
        let before: Vec<RequestCounts> = stores.iter().map(|s| s.counts()).collect();
        let (old, leader) = current;
        leader.resign().await;
        spawn(&mut campaigns, old);
        current = tokio::time::timeout(WAKE, rx.recv())
            .await
            .expect("a successor, woken long before any poll")
            .unwrap();
        // Whoever else was woken has time to make its request.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let delta = stores.iter().zip(&before).map(|(s, b)| s.counts().since(b)).collect();
        seen.push((old, current.0, delta));
    }
    current.1.resign().await;
    campaigns.shutdown().await;
    seen
}

/// With 60 followers in 60 stores, each of 8 resignations wakes one follower, which takes the
/// lease with one acquire; nobody else makes a request; the transition costs 3 requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resignation_wakes_exactly_one_of_many_followers() {
    let seen = transitions(60, 8).await;
    for (k, (old, new, delta)) in seen.into_iter().enumerate() {
        assert_ne!(
            old, new,
            "transition {k}: the old leader re-campaigned behind 59 followers"
        );
        let others: Vec<String> = delta
            .iter()
            .enumerate()
            .filter(|(i, d)| *i != old && *i != new && d.total() > 0)
            .map(|(i, d)| format!("c{i}: {d}"))
            .collect();
        assert!(
            others.is_empty(),
            "transition {k} (c{old} -> c{new}): followers other than the successor made requests: {others:?}"
        );
        assert_eq!(
            delta[new].acquire, 1,
            "transition {k}: the successor's acquires: {}",
            delta[new]
        );
        assert_eq!(
            delta[new].total(),
            1,
            "transition {k}: the successor's requests: {}",
            delta[new]
        );
        assert_eq!(
            delta[old].release, 1,
            "transition {k}: the old leader's requests: {}",
            delta[old]
        );
        let total: u64 = delta.iter().map(RequestCounts::total).sum();
        assert!(total <= 3, "transition {k}: {total} requests (at most 3)");
    }
}
