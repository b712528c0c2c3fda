//! `LeaseStore::renew_many` on SQLite: the grants go to the writer as one request and are renewed
//! in one transaction per 256 grants. (Each answer is what `renew` answers: the shared scenario
//! `renew_many_answers_as_renew_does`.)

use std::time::Duration;

use leasehold_core::{Grant, LeaseName, LeaseStore, Renewed};
use leasehold_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(30);

fn name(i: usize) -> LeaseName {
    LeaseName::new(format!("many-{i:05}")).unwrap()
}

async fn grant(store: &SqliteStore, lease: &LeaseName, who: &str) -> Grant {
    leasehold_conformance::must_grant(store, lease.as_str(), who, TTL).await
}

/// More grants than one transaction takes (256), twice in one call (the same lease renewed
/// twice in order: the second sees the first's write and is renewed too): every answer in order.
#[tokio::test]
async fn more_grants_than_one_transaction_takes_are_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("leases.db")).await.unwrap();
    let mut grants = Vec::new();
    for i in 0..300 {
        grants.push(grant(&store, &name(i), "member").await);
    }
    let twice: Vec<Grant> = grants.iter().chain(&grants).cloned().collect();
    let answers = store.renew_many(&twice).await.unwrap();
    assert_eq!(answers.len(), twice.len());
    for (held, answer) in twice.iter().zip(&answers) {
        match answer {
            Ok(Renewed::Renewed(renewed)) => assert_eq!((&renewed.lease, renewed.term), (&held.lease, held.term)),
            other => panic!("{}: {other:?}", held.lease),
        }
    }
    // The row holds the version of the later renewal.
    let last = match &answers[300] {
        Ok(Renewed::Renewed(renewed)) => renewed.token.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(store.inspect(&name(0)).await.unwrap().holder.unwrap().version, last);
}
