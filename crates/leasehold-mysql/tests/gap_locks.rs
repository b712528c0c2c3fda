//! InnoDB's own trap: at its default isolation (REPEATABLE READ), an acquire that reads a row not
//! yet written `FOR UPDATE` locks the gap of the index where it would go, and two acquires of
//! different new leases in one gap then deadlock on their inserts (error 1213, the transaction
//! rolled back). The lock session runs at READ COMMITTED, which takes no gap locks: many clients
//! acquiring new leases at once are all granted. (With the isolation line taken out, every round
//! of this test saw deadlocks; the suite found it in CI as a failed grant.)

use std::time::Duration;

use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, random_u64};
use leasehold_mysql::MysqlStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_of_new_leases_at_once_never_deadlock() {
    let Some(url) = leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL") else {
        return;
    };
    let mut stores = Vec::new();
    for _ in 0..40 {
        stores.push(MysqlStore::connect(&url).await.unwrap());
    }
    let run = random_u64();
    let mut failed = Vec::new();
    for round in 0..5 {
        let acquires = stores.iter().enumerate().map(|(i, store)| {
            let request = AcquireRequest {
                lease: LeaseName::new(format!("gap-{run:x}-{round}-{i:02}")).unwrap(),
                candidate: CandidateId::new(format!("c{i}")).unwrap(),
                ttl: Duration::from_secs(30),
                takeover: None,
            };
            async move { (store, request.lease.clone(), store.acquire(&request).await) }
        });
        for (store, lease, answer) in futures::future::join_all(acquires).await {
            match answer {
                Ok(Acquired::Granted(grant)) => store.release(&grant).await.unwrap(),
                other => failed.push(format!("{lease}: {other:?}")),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 200 acquires not granted: {failed:?}",
        failed.len()
    );
}
