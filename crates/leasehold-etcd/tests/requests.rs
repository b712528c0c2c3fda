//! Store requests per leadership transition with 1, 10 and 100 candidates: candidates queue by
//! `create_revision` and each watches only its predecessor, so a transition wakes one
//! candidate and costs the same number of requests however many wait (no thundering herd).
//!
//! Every candidate has its own `EtcdStore` (its own session), as separate processes would. The
//! TTL is long (10 min), so session keepalives of the waiting candidates (one per third of the
//! TTL) do not fall into the short measuring windows.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Faults, FaultyStore};
use leasehold_core::{Elector, Leader, LeaseStore};
use leasehold_etcd::EtcdStore;
use tokio::sync::{mpsc, oneshot};

const TRANSITIONS: usize = 5;
const TTL: Duration = Duration::from_secs(600);

/// Requests (summed over every store) per transition, averaged over `TRANSITIONS` handovers
/// among `candidates` candidates, each of which queues again after it resigned.
async fn requests_per_transition(url: &str, candidates: usize) -> f64 {
    let lease = format!("requests-{candidates}-{:x}", leasehold_core::random_u64());
    // One counter over every store's calls.
    let faults = Faults::new();
    let mut stores: Vec<Arc<dyn LeaseStore>> = Vec::new();
    for _ in 0..candidates {
        let store = EtcdStore::connect(url).await.expect("connect");
        stores.push(Arc::new(FaultyStore::new(Arc::new(store), faults.clone())));
    }
    let total = |_: &[Arc<dyn LeaseStore>]| faults.counts().total();
    let (elected_tx, mut elected) = mpsc::unbounded_channel::<(Leader, oneshot::Sender<()>)>();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let elector = Elector::builder(store.clone(), lease.clone())
            .candidate_id(format!("candidate-{i:03}"))
            .ttl(TTL)
            // A resigned leader waits 2.2 x this before it queues again.
            .retry_every(Duration::from_millis(200))
            .build()
            .expect("elector");
        let elected_tx = elected_tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let leader = elector.campaign().await.expect("campaign");
                let (done, resigned) = oneshot::channel();
                if elected_tx.send((leader, done)).is_err() || resigned.await.is_err() {
                    return;
                }
            }
        }));
    }
    let settle = Duration::from_millis(500) + Duration::from_millis(10) * u32::try_from(candidates).unwrap_or(100);
    let mut current = tokio::time::timeout(Duration::from_secs(30), elected.recv())
        .await
        .expect("a first leader")
        .expect("open");
    tokio::time::sleep(settle).await; // everyone queued and watching
    let mut counts = Vec::new();
    let mut handovers = Vec::new();
    for _ in 0..TRANSITIONS {
        let before = total(&stores);
        let (leader, done) = current;
        let resigned = Instant::now();
        leader.resign().await;
        let _ = done.send(()); // the old leader queues again at the end
        current = tokio::time::timeout(Duration::from_secs(10), elected.recv())
            .await
            .expect("a successor within 10 s")
            .expect("open");
        handovers.push(resigned.elapsed());
        tokio::time::sleep(Duration::from_millis(800)).await; // the old leader's re-queueing
        counts.push(total(&stores) - before);
    }
    let per = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
    let mean_handover = handovers.iter().sum::<Duration>() / u32::try_from(handovers.len()).unwrap_or(1);
    println!(
        "etcd: {candidates:>3} candidates: {per:.1} store requests per transition (each: {counts:?}); mean handover {mean_handover:?}"
    );
    drop(current);
    drop(elected);
    for task in tasks {
        task.abort();
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_transition_do_not_grow_with_candidates() {
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let mut figures = Vec::new();
    for candidates in [1, 10, 100] {
        figures.push((candidates, requests_per_transition(&url, candidates).await));
    }
    // A herd would cost at least one request per waiting candidate. Herd-free, a transition costs
    // a constant: the release; the successor's look-up, queue read, keepalive and grant; the old
    // leader's re-queueing, look-up and watch. One candidate alone skips the queue work.
    for (candidates, per) in &figures {
        assert!(
            *per <= 12.0,
            "{candidates} candidates cost {per:.1} requests per transition"
        );
    }
    let (ten, hundred) = (figures[1].1, figures[2].1);
    assert!(
        hundred <= ten + 1.0,
        "100 candidates cost {hundred:.1} requests per transition, 10 cost {ten:.1}"
    );
}
