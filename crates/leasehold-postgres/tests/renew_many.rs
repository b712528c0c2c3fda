//! `LeaseStore::renew_many` on Postgres: the grants go to the lock session together, one
//! statement renews those it holds, one gives back the locks of those whose rows no longer name
//! them, one read finds what the store holds for every lost grant; each answer is what `renew`
//! of that grant answers.

use crate::common;

use std::time::Duration;

use leasehold_core::{CandidateId, Error, Grant, LeaseName, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;
use sqlx::{Connection, PgConnection};

const TTL: Duration = Duration::from_secs(30);

fn name(run: u64, i: usize) -> LeaseName {
    LeaseName::new(format!("many-{run:x}-{i:05}")).unwrap()
}

async fn grant(store: &PostgresStore, lease: &LeaseName, who: &str) -> Grant {
    leasehold_conformance::must_grant(store, lease.as_str(), who, TTL).await
}

/// 50 grants, 26 of them no longer held (released, taken over by another candidate, handed
/// over, broken, replaced by a newer term of the same holder) or unreadable (a garbled row of a
/// broken one; each answer is what `renew` answers: the shared scenario
/// `renew_many_answers_as_renew_does`). The call runs 4 statements (counted by a proxy):
/// the renewal, one relock attempt for the 10 grants this session gave up itself (released,
/// handed over), the give-back of the broken leases' locks, one read for all the lost grants.
/// Before, it ran 37 (a relock per given-up grant, a read per lost one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_grants_answer_as_renew_does_in_few_statements() {
    let Some(backend) = common::server() else { return };
    let counter = common::StatementCounter::start(backend.upstream()).await;
    let url = common::with_option(&backend.url_via(counter.addr()), "sslmode=disable");
    let store = PostgresStore::connect(&url).await.unwrap();
    let run = leasehold_core::random_u64() & 0xffff_ffff;
    let mut grants = Vec::new();
    for i in 0..50 {
        grants.push(grant(&store, &name(run, i), "member").await);
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
    let mut raw = PgConnection::connect(&url).await.unwrap();
    // A broken lease's row, garbled: its grant is lost, and what the store holds unreadable.
    sqlx::query("UPDATE leasehold.leases SET previous_end = 'exploded' WHERE name = $1")
        .bind(name(run, 47).as_str())
        .execute(&mut raw)
        .await
        .unwrap();
    raw.close().await.unwrap();

    let before = counter.statements();
    let answers = store.renew_many(&grants).await.unwrap();
    let statements = counter.statements() - before;
    assert_eq!(statements, 4, "renew_many of 50 grants, 26 of them lost");
    assert_eq!(answers.len(), grants.len());
    for (i, answer) in answers.iter().enumerate() {
        match i {
            47 => assert!(
                matches!(answer, Err(Error::CorruptRecord { lease, .. }) if lease == name(run, 47).as_str()),
                "{answer:?}"
            ),
            i if i % 2 == 0 => assert!(matches!(answer, Ok(Renewed::Renewed(_))), "{i}: {answer:?}"),
            i => assert!(matches!(answer, Ok(Renewed::Lost(_))), "{i}: {answer:?}"),
        }
    }
}

/// After the lock session is lost (its backend terminated), the next `renew_many` of 50 grants
/// takes all their locks again on a new session with one statement (`relock_many`), each grant
/// renewed at its term and its lock held by the new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_takes_every_lock_again_in_one_statement() {
    let Some(backend) = common::server() else { return };
    let counter = common::StatementCounter::start(backend.upstream()).await;
    let url = common::with_option(&backend.url_via(counter.addr()), "sslmode=disable");
    let store = PostgresStore::connect(&url).await.unwrap();
    let run = leasehold_core::random_u64() & 0xffff_ffff;
    let mut grants = Vec::new();
    for i in 0..50 {
        grants.push(grant(&store, &name(run, i), "member").await);
    }
    let mut admin = backend.raw().await;
    let old = common::lock_holder(&mut admin, store.lock_key(&grants[0].lease))
        .await
        .expect("the lock session holds the lock");
    let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    // The first statement on the terminated session fails (every grant's outcome unknown); the
    // next call connects again.
    let mut answers = Err(Error::engine("not asked yet"));
    let mut statements = 0;
    for _ in 0..3 {
        let before = counter.statements();
        answers = store.renew_many(&grants).await;
        statements = counter.statements() - before;
        if answers.is_ok() {
            break;
        }
    }
    let answers = answers.unwrap();
    assert_eq!(statements, 1, "one relock_many for 50 grants");
    for (held, answer) in grants.iter().zip(&answers) {
        match answer {
            Ok(Renewed::Renewed(renewed)) => assert_eq!((&renewed.lease, renewed.term), (&held.lease, held.term)),
            other => panic!("{}: {other:?}", held.lease),
        }
        let pid = common::lock_holder(&mut admin, store.lock_key(&held.lease)).await;
        assert!(
            pid.is_some_and(|pid| pid != old),
            "{}: lock held by {pid:?}",
            held.lease
        );
    }
    // And the session renews them as usual: one statement.
    let before = counter.statements();
    let again = store.renew_many(&grants).await.unwrap();
    assert_eq!(counter.statements() - before, 1);
    assert!(again.iter().all(|a| matches!(a, Ok(Renewed::Renewed(_)))));
    for held in &grants {
        store.release(held).await.unwrap();
    }
}
