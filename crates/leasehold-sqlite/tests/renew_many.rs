//! `LeaseStore::renew_many` on SQLite: the grants go to the writer as one request and are renewed
//! in one transaction per 256 grants, each answered exactly as `renew` would answer it.

use std::time::Duration;

use leasehold_core::{CandidateId, Error, Grant, LeaseName, LeaseStore, Renewed};
use leasehold_sqlite::SqliteStore;
use sqlx::{Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(30);

fn name(i: usize) -> LeaseName {
    LeaseName::new(format!("many-{i:05}")).unwrap()
}

async fn grant(store: &SqliteStore, lease: &LeaseName, who: &str) -> Grant {
    leasehold_conformance::must_grant(store, lease.as_str(), who, TTL).await
}

/// What an answer says, without the times that pass between two answers.
fn settled(answer: &Result<Renewed, Error>) -> String {
    match answer {
        Ok(Renewed::Renewed(grant)) => format!(
            "renewed {} {} {} {:?}",
            grant.lease, grant.holder, grant.term, grant.ttl
        ),
        Ok(Renewed::Lost(observation)) => {
            let mut observation = observation.clone();
            if let Some(holder) = &mut observation.holder {
                holder.store_remaining = None;
            }
            format!("lost {observation:?}")
        }
        Err(e) => format!("error {e}"),
    }
}

/// 50 grants, 26 of them no longer held (released, taken over by another candidate, handed
/// over, broken, replaced by a newer term of the same holder) or unreadable (a garbled row):
/// each answer of one `renew_many` is what `renew` of that grant answers afterwards, the renewed
/// ones with the version written in the row.
#[tokio::test]
async fn fifty_grants_answer_as_renew_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let mut grants = Vec::new();
    for i in 0..50 {
        grants.push(grant(&store, &name(i), "member").await);
    }
    let heir = CandidateId::new("heir").unwrap();
    for (i, held) in grants.iter().enumerate() {
        match i % 10 {
            1 => store.release(held).await.unwrap(),
            3 => {
                store.release(held).await.unwrap();
                grant(&store, &held.lease, "other").await;
            }
            5 => store.hand_over(held, &heir).await.unwrap(),
            7 => drop(store.break_lease(&held.lease).await.unwrap()),
            9 => drop(grant(&store, &held.lease, "member").await),
            _ => {}
        }
    }
    let mut raw = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("UPDATE leasehold_leases SET holder = '' WHERE name = ?1")
        .bind(name(48).as_str())
        .execute(&mut raw)
        .await
        .unwrap();
    raw.close().await.unwrap();

    let answers = store.renew_many(&grants).await.unwrap();
    assert_eq!(answers.len(), grants.len());
    for (i, (held, answer)) in grants.iter().zip(&answers).enumerate() {
        if let Ok(Renewed::Renewed(renewed)) = answer {
            assert_ne!(renewed.token, held.token, "{i}: a new record version");
            let seen = store.inspect(&held.lease).await.unwrap();
            assert_eq!(seen.holder.unwrap().version, renewed.token, "{i}: the version written");
        }
        let alone = store.renew(held).await;
        assert_eq!(settled(answer), settled(&alone), "grant {i}");
        match i {
            48 => assert!(
                matches!(answer, Err(Error::CorruptRecord { lease, .. }) if lease == name(48).as_str()),
                "{answer:?}"
            ),
            i if i % 2 == 0 => assert!(matches!(answer, Ok(Renewed::Renewed(_))), "{i}: {answer:?}"),
            i => assert!(matches!(answer, Ok(Renewed::Lost(_))), "{i}: {answer:?}"),
        }
    }
    assert!(store.renew_many(&[]).await.unwrap().is_empty());
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
