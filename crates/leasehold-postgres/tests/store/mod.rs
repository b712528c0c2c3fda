//! Postgres-specific behaviour against a real server: the lock session, expiry when the holder
//! goes silent, locks that outlive their rows and rows that outlive their locks, notifications,
//! breaking, the schema, and secrets. Each test skips (loudly) when the server is down.

use crate::common;
mod lock;
mod notify;
mod schema;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::SafetyChecker;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, DeposedReason, Elector, Event, LeaseName, LeaseStore};
use leasehold_postgres::PostgresStore;

use common::server;

fn candidate(id: &str) -> CandidateId {
    CandidateId::new(id).expect("a valid candidate id")
}

fn request(lease: &LeaseName, who: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: candidate(who),
        ttl,
        takeover: None,
    }
}

async fn acquire(store: &PostgresStore, lease: &LeaseName, who: &str, ttl: Duration) -> Acquired {
    store
        .acquire(&request(lease, who, ttl))
        .await
        .unwrap_or_else(|e| panic!("acquire by {who}: {e}"))
}

fn granted(acquired: Acquired) -> leasehold_core::Grant {
    match acquired {
        Acquired::Granted(grant) => grant,
        Acquired::Held(observation) => panic!("expected a grant, the lease is held: {observation:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_leads_and_hands_over() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(1);
    let lease = common::lease("elector");
    let checker = SafetyChecker::new();
    let mut electors = vec![];
    for id in ["A", "B"] {
        let store = Arc::new(PostgresStore::connect(&pg.url).await.unwrap());
        let elector = Elector::builder(store, lease.as_str())
            .candidate_id(id)
            .ttl(ttl)
            .build()
            .unwrap();
        checker.watch(&elector);
        electors.push(elector);
    }
    let first = electors[0].campaign().await.unwrap();
    let waiting = tokio::spawn({
        let b = electors[1].clone();
        async move { b.campaign().await.unwrap() }
    });
    tokio::time::sleep(ttl).await;
    let first_term = first.term();
    let resigned = Instant::now();
    first.resign().await;
    let second = waiting.await.unwrap();
    let handover = second.elected_at().duration_since(resigned);
    eprintln!("handover after a release: {handover:?}");
    assert!(
        handover < ttl / 5,
        "{handover:?}: a release is notified, no poll needed"
    );
    assert!(second.term() > first_term);
    second.resign().await;
    let events = checker.records().await;
    assert!(events.iter().any(|r| matches!(
        &r.event,
        Event::Deposed {
            reason: DeposedReason::Resigned,
            ..
        }
    )));
    checker.assert_safe().await;
}
