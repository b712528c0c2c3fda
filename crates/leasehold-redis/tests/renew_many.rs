//! `LeaseStore::renew_many` on Redis: one script renews many grants (each answered as `renew`
//! would: the shared scenario `renew_many_answers_as_renew_does`), pushing the server's expiry
//! out and naming the garbled key, with answers in the order asked.

use crate::common;

use std::time::Duration;

use leasehold_core::{Error, Grant, LeaseName, LeaseStore, Renewed, random_u64};
use leasehold_redis::{RENEW_BATCH, RedisStore};

use common::{RedisBackend, grant};

const TTL: Duration = Duration::from_secs(2);

fn fresh_backend() -> Option<RedisBackend> {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.restart_guard = false;
    config.prefix = format!("lh-many-{:x}:", random_u64());
    Some(RedisBackend::with_config(config))
}

fn name(i: usize) -> LeaseName {
    LeaseName::new(format!("many-{i:05}")).unwrap()
}

async fn clean(backend: &RedisBackend) {
    let mut raw = backend.raw().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", backend.config.prefix))
        .query_async(&mut raw)
        .await
        .unwrap();
    for chunk in keys.chunks(500) {
        let _: redis::Value = redis::cmd("DEL").arg(chunk).query_async(&mut raw).await.unwrap();
    }
}

fn renewed(answer: &Result<Renewed, Error>) -> &Grant {
    match answer {
        Ok(Renewed::Renewed(grant)) => grant,
        other => panic!("expected a renewal, got {other:?}"),
    }
}

/// The renewed grants' keys get the server's expiry pushed out; a garbled state key fails its own
/// grant with an error naming that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_push_the_expiry_out_and_a_garbled_key_is_named() {
    let Some(backend) = fresh_backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let mut grants = Vec::new();
    for i in 0..5 {
        grants.push(grant(&store, &name(i), "member", TTL).await);
    }
    // 3: its state key overwritten by another program.
    let corrupt = backend.config.keys(&name(3)).state;
    let mut raw = backend.raw().await;
    let _: redis::Value = redis::cmd("SET")
        .arg(&corrupt)
        .arg("7")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(TTL / 2).await;

    let answers = store.renew_many(&grants).await.unwrap();
    assert_eq!(answers.len(), grants.len());
    for i in [0, 1, 2, 4] {
        let renewed = renewed(&answers[i]);
        assert_eq!((&renewed.lease, renewed.term), (&grants[i].lease, grants[i].term));
        assert_ne!(renewed.token, grants[i].token, "a new record version");
        let seen = store.inspect(&grants[i].lease).await.unwrap();
        let holder = seen.holder.expect("still held");
        assert_eq!(holder.version, renewed.token);
        let remaining = holder.store_remaining.unwrap();
        assert!(
            remaining > TTL * 9 / 10,
            "the server's expiry was pushed out: {remaining:?}"
        );
    }
    match &answers[3] {
        Err(Error::CorruptRecord { lease, detail, .. }) => {
            assert_eq!(lease, name(3).as_str());
            assert!(detail.contains(&corrupt), "{detail}");
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    clean(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_grants_than_one_script_takes_are_all_renewed_in_order() {
    let Some(backend) = fresh_backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let count = RENEW_BATCH * 2 + 7;
    let names: Vec<LeaseName> = (0..count).map(name).collect();
    let grants: Vec<Grant> =
        futures::future::join_all(names.iter().map(|lease| grant(&store, lease, "member", TTL))).await;
    let answers = store.renew_many(&grants).await.unwrap();
    assert_eq!(answers.len(), count);
    for (grant, answer) in grants.iter().zip(&answers) {
        assert_eq!(&renewed(answer).lease, &grant.lease);
    }
    clean(&backend).await;
}

/// 50 grants, 25 of them no longer held (released, taken over by another candidate, handed over,
/// broken, or replaced by a newer term of the same holder), renewed through the trait (as a
/// group's `RenewBatcher` does) with one script (each answer is what `renew` answers: the shared
/// scenario `renew_many_answers_as_renew_does`). Fails with the trait's default (one script per
/// grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_grants_answer_as_renew_does_with_one_script() {
    let Some(backend) = fresh_backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let dyn_store: &dyn LeaseStore = &store;
    let mut grants = Vec::new();
    for i in 0..50 {
        grants.push(grant(&store, &name(i), "member", TTL).await);
    }
    let heir = leasehold_core::CandidateId::new("heir").unwrap();
    for (i, held) in grants.iter().enumerate() {
        match i % 10 {
            1 => store.release(held).await.unwrap(),
            3 => {
                store.release(held).await.unwrap();
                grant(&store, &held.lease, "other", TTL).await;
            }
            5 => store.hand_over(held, &heir).await.unwrap(),
            7 => drop(store.break_lease(&held.lease).await.unwrap()),
            9 => drop(grant(&store, &held.lease, "member", TTL).await),
            _ => {}
        }
    }

    // The least of a few tries: the count is server-wide.
    let mut scripts = u64::MAX;
    let mut answers = Vec::new();
    for _ in 0..5 {
        let before = common::scripts_run(&backend).await;
        answers = dyn_store.renew_many(&grants).await.unwrap();
        scripts = scripts.min(common::scripts_run(&backend).await - before);
        if scripts <= 1 {
            break;
        }
    }
    assert_eq!(scripts, 1, "50 grants (fewer than RENEW_BATCH) renewed with one script");
    assert_eq!(answers.len(), grants.len());
    for (i, answer) in answers.iter().enumerate() {
        let expect_renewed = [0, 2, 4, 6, 8].contains(&(i % 10));
        assert_eq!(
            matches!(answer, Ok(Renewed::Renewed(_))),
            expect_renewed,
            "{i}: {answer:?}"
        );
    }
    clean(&backend).await;
}
