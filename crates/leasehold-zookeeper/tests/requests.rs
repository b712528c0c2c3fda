//! Store requests per leadership transition with 1, 10 and 100 candidates: each candidate waits
//! on its predecessor only (no herd), so the count must not grow with the number of candidates.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Faults, FaultyStore, RequestCounts};
use leasehold_core::{Elector, LeaseStore, Term, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use tokio::sync::mpsc;

const TRANSITIONS: u64 = 10;

/// Runs `candidates` electors (each its own store and session) that resign shortly after being
/// elected, and counts every store request during `TRANSITIONS` transitions.
async fn requests_per_transition(url: &str, candidates: usize) -> (RequestCounts, f64) {
    let ttl = Duration::from_secs(2);
    let faults = Faults::new();
    let lease = format!("requests-{candidates}-{:x}", random_u64());
    let (elected_tx, mut elected) = mpsc::unbounded_channel::<(String, Term)>();
    let mut tasks = Vec::new();
    for i in 0..candidates {
        let store = ZookeeperStore::connect(url).await.expect("connect");
        let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(Arc::new(store), faults.clone()));
        let elector = Elector::builder(store, lease.clone())
            .candidate_id(format!("candidate-{i:03}"))
            .ttl(ttl)
            .build()
            .expect("valid election");
        let tx = elected_tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let leader = elector.campaign().await.expect("the election runs");
                let _ = tx.send((elector.id().to_string(), leader.term()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                leader.resign().await;
            }
        }));
    }
    // Warm up: every candidate has queued once and someone leads.
    let warm = Instant::now();
    while faults.counts().acquire < candidates as u64 || elected.try_recv().is_err() {
        assert!(
            warm.elapsed() < Duration::from_secs(60),
            "{candidates} candidates did not queue up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the first acquires (some time out while 100 sessions open at once) settle.
    tokio::time::sleep(ttl).await;
    while elected.try_recv().is_ok() {}
    let _ = tokio::time::timeout(Duration::from_secs(5), elected.recv()).await;
    faults.reset_counts();
    let started = Instant::now();
    let mut last = Term(0);
    for _ in 0..TRANSITIONS {
        let (_, term) = tokio::time::timeout(ttl * 5, elected.recv())
            .await
            .expect("a transition")
            .expect("open");
        assert!(term > last, "terms increase");
        last = term;
    }
    let counts = faults.counts();
    let secs = started.elapsed().as_secs_f64();
    for task in tasks {
        task.abort();
    }
    (counts, secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_do_not_grow_with_candidates() {
    let Some(backend) = common::single_server() else { return };
    let mut per_transition = Vec::new();
    for candidates in [1, 10, 100] {
        let (counts, secs) = requests_per_transition(&backend.url, candidates).await;
        let t = TRANSITIONS as f64;
        let transition_ops = (counts.acquire + counts.release + counts.inspect + counts.withdraw) as f64 / t;
        eprintln!(
            "zookeeper: {candidates:>3} candidates: {:.1} store requests per transition \
             (acquire {:.1}, release {:.1}, inspect {:.1}, changes {:.1}, renew {:.1}); {:.0} ms per transition",
            counts.total() as f64 / t,
            counts.acquire as f64 / t,
            counts.release as f64 / t,
            counts.inspect as f64 / t,
            counts.changes as f64 / t,
            counts.renew as f64 / t,
            secs * 1000.0 / t
        );
        per_transition.push((candidates, transition_ops, counts.total() as f64 / t));
    }
    // Without a herd, a transition costs a handful of requests whatever the number of waiting
    // candidates (one release, the successor's acquire, the old leader queuing up again); with
    // a herd it would cost one per candidate.
    let (_, ten, _) = per_transition[1];
    for &(candidates, ops, total) in &per_transition {
        assert!(
            ops <= 6.0,
            "{candidates} candidates: {ops:.1} acquire/release/inspect requests per transition"
        );
        assert!(
            total <= 10.0,
            "{candidates} candidates: {total:.1} store requests per transition"
        );
    }
    let (_, hundred, _) = per_transition[2];
    assert!(
        hundred <= ten * 1.5 + 1.0,
        "a herd: {hundred:.1} requests per transition with 100 candidates, {ten:.1} with 10"
    );
}
