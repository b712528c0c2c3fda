//! `LeaseStore::list` against a real server, where Redis's own keys matter: internal and foreign
//! keys are never listed, glob's metacharacters are literal, a large keyspace is scanned in few
//! scripts. Each test uses a key prefix of its own (with glob characters in it), deleted at the
//! end.

use crate::common;

use std::time::Duration;

use leasehold_core::{EndReason, LeaseName, LeaseStore, Observation, random_u64};
use leasehold_redis::RedisStore;

use common::{RedisBackend, grant, raw_cmd};

const TTL: Duration = Duration::from_secs(5);

fn fresh_backend(tag: &str) -> Option<RedisBackend> {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.restart_guard = false;
    // Glob characters in the store's own prefix must not widen the scan either.
    config.prefix = format!("lh-{tag}*?[x]-{:x}:", random_u64());
    Some(RedisBackend::with_config(config))
}

fn name(text: &str) -> LeaseName {
    text.parse().unwrap()
}

fn names(listed: &[Observation]) -> Vec<&str> {
    listed.iter().map(|o| o.lease.as_str()).collect()
}

/// `observation` without the server's remaining time (it changes between two reads).
fn timeless(mut observation: Observation) -> Observation {
    if let Some(holder) = observation.holder.as_mut() {
        holder.store_remaining = None;
    }
    observation
}

/// Deletes every key of the backend's prefix.
async fn clean(backend: &RedisBackend) {
    let mut raw = backend.raw().await;
    let pattern = format!(
        "{}*",
        backend
            .config
            .prefix
            .replace('*', "\\*")
            .replace('?', "\\?")
            .replace('[', "\\[")
    );
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut raw).await.unwrap();
    for key in keys {
        let _: redis::Value = redis::cmd("DEL").arg(key).query_async(&mut raw).await.unwrap();
    }
}

/// Redis's own keys: a new key prefix lists nothing; keys under the prefix that are no lease's
/// (foreign, or shaped like a lease's internal keys) are never listed; a lease whose key the
/// server expired lists as expired; glob's metacharacters in a prefix are literal; another key
/// prefix's leases are not this store's. (What a listing shows of each lease, in which order,
/// and literal prefixes in general: the shared scenario `list_by_prefix`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_no_lease_are_never_listed() {
    let Some(backend) = fresh_backend("list") else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "a new prefix lists nothing");

    let held = grant(&store, &name("a-3-held"), "x", TTL).await;
    let expired = grant(&store, &name("a-4-expired"), "w", Duration::from_millis(20)).await;
    // Keys under the prefix that are not leases: never listed.
    let prefix = backend.config.prefix.clone();
    raw_cmd(&backend, &["SET", &format!("{prefix}lease:{{a-5}}x"), "foreign"]).await;
    raw_cmd(&backend, &["SET", &format!("{prefix}leases:{{a-6}}"), "foreign"]).await;
    raw_cmd(&backend, &["SET", &format!("{prefix}lease:{{a-/7}}"), "foreign"]).await;
    raw_cmd(&backend, &["XADD", &format!("{prefix}history:{{a-8}}"), "*", "f", "v"]).await;
    tokio::time::sleep(Duration::from_millis(60)).await;

    let listed = store.list("a-").await.unwrap();
    assert_eq!(names(&listed), ["a-3-held", "a-4-expired"]);
    for observation in &listed {
        let inspected = store.inspect(&observation.lease).await.unwrap();
        assert_eq!(timeless(observation.clone()), timeless(inspected));
    }
    let holder = listed[0].holder.as_ref().expect("a-3-held is held");
    assert_eq!((holder.id.as_str(), holder.term), ("x", held.term));
    let remaining = holder.store_remaining.expect("Redis has a clock");
    assert!(remaining <= TTL && remaining > TTL / 2, "{remaining:?}");
    assert_eq!(
        (listed[1].holder.as_ref(), listed[1].last_term, listed[1].previous_end),
        (None, expired.term, Some(EndReason::Expired))
    );

    // Glob's metacharacters (and the key prefix's own, `fresh_backend`) match only themselves.
    for literal in ["a*", "*", "?", "a?-3-held", "[", "[a]", "a[-]", "]", "\\", "a\\-"] {
        assert_eq!(store.list(literal).await.unwrap(), Vec::new(), "list({literal:?})");
    }

    // Another prefix's leases are not this store's.
    let Some(elsewhere) = fresh_backend("elsewhere") else {
        return;
    };
    let elsewhere_store = RedisStore::from_config(elsewhere.config.clone()).await.unwrap();
    assert_eq!(elsewhere_store.list("").await.unwrap(), Vec::new());
    clean(&backend).await;
}

/// Enough leases that the scan takes many steps: each is listed once, inspected 250 per script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_a_large_keyspace() {
    let Some(backend) = fresh_backend("listmany") else {
        return;
    };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let leases: Vec<LeaseName> = (0..1500).map(|i| name(&format!("m-{i:04}"))).collect();
    futures::future::join_all(leases.iter().map(|lease| grant(&store, lease, "x", TTL))).await;
    // The scripts of one listing: the scan steps (a few dozen on the shared server: the scan
    // walks every key) and one per 250 leases, not one per lease. The least of a few tries: the
    // count is server-wide.
    let mut scripts = u64::MAX;
    let mut listed = Vec::new();
    for _ in 0..3 {
        let before = common::scripts_run(&backend).await;
        listed = store.list("m-").await.unwrap();
        scripts = scripts.min(common::scripts_run(&backend).await - before);
    }
    assert!(scripts < 150, "{scripts} scripts to list 1,500 leases");
    assert_eq!(names(&listed), leases.iter().map(LeaseName::as_str).collect::<Vec<_>>());
    assert!(
        listed
            .iter()
            .all(|o| o.holder.as_ref().is_some_and(|h| h.id.as_str() == "x"))
    );
    assert_eq!(store.list("m-1").await.unwrap().len(), 500);
    clean(&backend).await;
}
