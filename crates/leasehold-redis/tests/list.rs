//! `LeaseStore::list` against a real server: every lease under the store's key prefix whose name
//! starts with a prefix, as `inspect` shows it, in name order; the prefix is literal (no glob
//! wildcards); internal and foreign keys are never listed. Each test uses a key prefix of its own
//! (with glob characters in it), deleted at the end.

mod common;

use std::time::Duration;

use leasehold_core::{EndReason, LeaseName, LeaseStore, Observation, Term, random_u64};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_each_lease_of_a_prefix_as_inspect_does() {
    let Some(backend) = fresh_backend("list") else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "a new prefix lists nothing");

    // Created out of order: the listing is sorted by name.
    let held = grant(&store, &name("a-3-held"), "x", TTL).await;
    let released = grant(&store, &name("a-1-released"), "y", TTL).await;
    store.release(&released).await.unwrap();
    let broken = grant(&store, &name("a-2-broken"), "z", TTL).await;
    assert_eq!(store.break_lease(&name("a-2-broken")).await.unwrap(), Some(broken.term));
    let expired = grant(&store, &name("a-4-expired"), "w", Duration::from_millis(20)).await;
    let other = grant(&store, &name("b-1"), "x", TTL).await;
    // Names a glob wildcard would match, and another case.
    grant(&store, &name("a_1"), "x", TTL).await;
    grant(&store, &name("ab-1"), "x", TTL).await;
    grant(&store, &name("A-1"), "x", TTL).await;
    // Keys under the prefix that are not leases: never listed.
    let prefix = backend.config.prefix.clone();
    raw_cmd(&backend, &["SET", &format!("{prefix}lease:{{a-5}}x"), "foreign"]).await;
    raw_cmd(&backend, &["SET", &format!("{prefix}leases:{{a-6}}"), "foreign"]).await;
    raw_cmd(&backend, &["SET", &format!("{prefix}lease:{{a-/7}}"), "foreign"]).await;
    raw_cmd(&backend, &["XADD", &format!("{prefix}history:{{a-8}}"), "*", "f", "v"]).await;
    tokio::time::sleep(Duration::from_millis(60)).await;

    let listed = store.list("a-").await.unwrap();
    assert_eq!(
        names(&listed),
        ["a-1-released", "a-2-broken", "a-3-held", "a-4-expired"]
    );
    for observation in &listed {
        let inspected = store.inspect(&observation.lease).await.unwrap();
        assert_eq!(timeless(observation.clone()), timeless(inspected));
    }
    let [released_now, broken_now, held_now, expired_now] = listed.as_slice() else {
        unreachable!()
    };
    assert_eq!(
        (
            released_now.holder.as_ref(),
            released_now.last_term,
            released_now.previous_end
        ),
        (None, released.term, Some(EndReason::Released))
    );
    assert!(released_now.last_term > Term(0));
    assert_eq!(
        (
            broken_now.holder.as_ref(),
            broken_now.last_term,
            broken_now.previous_end
        ),
        (None, broken.term, Some(EndReason::Broken))
    );
    assert_eq!(
        (
            expired_now.holder.as_ref(),
            expired_now.last_term,
            expired_now.previous_end
        ),
        (None, expired.term, Some(EndReason::Expired))
    );
    let holder = held_now.holder.as_ref().expect("a-3-held is held");
    assert_eq!((holder.id.as_str(), holder.term, holder.ttl), ("x", held.term, TTL));
    assert_eq!(holder.version, held.token);
    let remaining = holder.store_remaining.expect("Redis has a clock");
    assert!(remaining <= TTL && remaining > TTL / 2, "{remaining:?}");

    let all = store.list("").await.unwrap();
    assert_eq!(
        names(&all),
        [
            "A-1",
            "a-1-released",
            "a-2-broken",
            "a-3-held",
            "a-4-expired",
            "a_1",
            "ab-1",
            "b-1"
        ]
    );
    assert_eq!(all[7].holder.as_ref().map(|h| h.term), Some(other.term));
    assert_eq!(names(&store.list("b").await.unwrap()), ["b-1"]);
    assert_eq!(names(&store.list("a-3-held").await.unwrap()), ["a-3-held"]);

    // The prefix is literal: `*`, `?`, `[`, `]`, `\` and `%` match only themselves (no lease
    // name contains them), `_` is a character like any other, and case counts.
    assert_eq!(names(&store.list("a_").await.unwrap()), ["a_1"]);
    for literal in [
        "a*", "*", "?", "a?-1", "[", "[a]", "a[_]", "]", "\\", "a\\-", "%", "A-1*",
    ] {
        assert_eq!(store.list(literal).await.unwrap(), Vec::new(), "list({literal:?})");
    }
    assert_eq!(names(&store.list("A").await.unwrap()), ["A-1"]);

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
