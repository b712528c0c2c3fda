//! Followers queue behind the holder: a release wakes the longest waiter that still listens
//! on its own channel, not every follower; a dead waiter is skipped, a woken one that does not
//! take the lease passes the wake-up on (withdrawal) or lets its expiry wake everyone, and the
//! queue stays bounded.

use crate::common;

use std::time::Duration;

use common::{RedisBackend, grant, id, raw_cmd, request, unguarded as backend};
use futures::StreamExt;
use leasehold_core::{Acquired, Changes, LeaseName, LeaseStore, random_u64};
use leasehold_redis::RedisStore;

const TTL: Duration = Duration::from_secs(1);

fn lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("queue-{tag}-{:x}", random_u64())).unwrap()
}

/// Whether the stream yields within `within`.
async fn woken(changes: &mut Changes, within: Duration) -> bool {
    matches!(tokio::time::timeout(within, changes.next()).await, Ok(Some(_)))
}

/// Whether the stream yields within 2 s.
async fn wakes(changes: &mut Changes) -> bool {
    woken(changes, Duration::from_secs(2)).await
}

/// Whether the stream stays quiet for 300 ms.
async fn quiet(changes: &mut Changes) -> bool {
    !woken(changes, Duration::from_millis(300)).await
}

/// Acquires for `who`, which must be answered `Held` (and so queued).
async fn queue(store: &RedisStore, lease: &LeaseName, who: &str) {
    match store.acquire(&request(lease, who, TTL)).await.unwrap() {
        Acquired::Held(_) => {}
        other => panic!("{who}: {other:?}"),
    }
}

/// The queue's members, first first.
async fn members(backend: &RedisBackend, lease: &LeaseName) -> Vec<String> {
    let keys = backend.config.keys(lease);
    match raw_cmd(backend, &["ZRANGE", &keys.queue, "0", "-1"]).await {
        redis::Value::Array(values) => values
            .into_iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

async fn woken_key(backend: &RedisBackend, lease: &LeaseName) -> redis::Value {
    raw_cmd(backend, &["GET", &backend.config.keys(lease).woken]).await
}

/// B, C and D queue in that order behind A (C without listening, as a waiter whose process died
/// or that polls); W listens without queueing. A's release wakes B alone; B's grant takes it out
/// of the queue and clears the wake-up; B's release skips C (dropped from the queue) and wakes D;
/// D's release finds nobody queued and wakes every follower (W).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_longest_live_waiter() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("next");
    let mut b = store.changes(&lease, &id("b")).await.unwrap().unwrap();
    let mut d = store.changes(&lease, &id("d")).await.unwrap().unwrap();
    let mut w = store.changes(&lease, &id("w")).await.unwrap().unwrap();

    let a = grant(&store, &lease, "a", TTL).await;
    for who in ["b", "c", "d"] {
        queue(&store, &lease, who).await;
    }
    // A second look keeps the place.
    queue(&store, &lease, "b").await;
    assert_eq!(members(&backend, &lease).await, ["b", "c", "d"]);

    store.release(&a).await.unwrap();
    assert!(wakes(&mut b).await, "the longest waiter is woken");
    assert!(quiet(&mut d).await, "the others are not");
    assert!(quiet(&mut w).await, "nor is a follower that has not queued");
    assert_eq!(
        woken_key(&backend, &lease).await,
        redis::Value::BulkString(b"b".to_vec())
    );

    let b_grant = grant(&store, &lease, "b", TTL).await;
    assert_eq!(members(&backend, &lease).await, ["c", "d"]);
    assert_eq!(woken_key(&backend, &lease).await, redis::Value::Nil);

    store.release(&b_grant).await.unwrap();
    assert!(wakes(&mut d).await, "C does not listen: D is next");
    assert!(quiet(&mut w).await);
    assert_eq!(members(&backend, &lease).await, ["d"], "C is dropped from the queue");

    // A follower that was not woken learns of the new holder from the announcement.
    let mut announced = store.announcements(&lease).await.unwrap().unwrap();
    let d_grant = grant(&store, &lease, "d", TTL).await;
    let seen = tokio::time::timeout(Duration::from_secs(2), announced.next())
        .await
        .unwrap()
        .unwrap();
    let holder = seen.holder.unwrap();
    assert_eq!(
        (holder.id, holder.term, holder.version),
        (id("d"), d_grant.term, d_grant.token.clone())
    );
    assert!(quiet(&mut w).await, "an announcement wakes nobody");
    assert!(members(&backend, &lease).await.is_empty());
    store.release(&d_grant).await.unwrap();
    assert!(wakes(&mut w).await, "nobody queued: every follower is woken");
    assert!(wakes(&mut b).await);
}

/// A break wakes the next waiter as a release does; a handover wakes its successor alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_wakes_the_next_waiter_and_a_handover_its_successor() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("handover");
    let mut b = store.changes(&lease, &id("b")).await.unwrap().unwrap();
    let mut c = store.changes(&lease, &id("c")).await.unwrap().unwrap();

    let a = grant(&store, &lease, "a", TTL).await;
    queue(&store, &lease, "b").await;
    queue(&store, &lease, "c").await;
    store.hand_over(&a, &id("c")).await.unwrap();
    assert!(wakes(&mut c).await, "the successor is woken");
    assert!(
        quiet(&mut b).await,
        "the longest waiter is not: the lease is reserved for C"
    );

    let c_grant = grant(&store, &lease, "c", TTL).await;
    assert_eq!(members(&backend, &lease).await, ["b"]);
    assert!(store.break_lease(&lease).await.unwrap().is_some());
    assert!(wakes(&mut b).await, "a break wakes the next waiter");
    assert!(quiet(&mut c).await);
    drop(c_grant);
}

/// A woken waiter that withdraws passes the wake-up to the next one; one that neither takes the
/// lease nor withdraws (a process that died just after it was woken) lets the wake-up expire
/// after the lease's TTL, and its expiry event wakes every follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untaken_wake_up_is_passed_on_or_expires() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("untaken");
    let mut b = store.changes(&lease, &id("b")).await.unwrap().unwrap();
    let mut c = store.changes(&lease, &id("c")).await.unwrap().unwrap();
    let mut w = store.changes(&lease, &id("w")).await.unwrap().unwrap();

    let a = grant(&store, &lease, "a", TTL).await;
    queue(&store, &lease, "b").await;
    queue(&store, &lease, "c").await;
    store.release(&a).await.unwrap();
    assert!(wakes(&mut b).await);
    store.withdraw(&lease, &id("b")).await.unwrap();
    assert!(wakes(&mut c).await, "B withdrew: C is woken");
    assert!(quiet(&mut w).await);
    assert_eq!(members(&backend, &lease).await, ["c"]);
    assert_eq!(
        woken_key(&backend, &lease).await,
        redis::Value::BulkString(b"c".to_vec())
    );
    // A withdrawal of a waiter that was not woken wakes nobody.
    store.withdraw(&lease, &id("x")).await.unwrap();
    assert!(quiet(&mut c).await);

    if store.capabilities().notifications == leasehold_core::Notifications::ReleaseAndExpiry {
        // C does not take it: the wake-up expires (a TTL after the release) and wakes everyone.
        assert!(woken(&mut w, TTL * 3).await, "the expired wake-up wakes every follower");
        assert_eq!(woken_key(&backend, &lease).await, redis::Value::Nil);
    }
    let c_grant = grant(&store, &lease, "c", TTL).await;
    store.release(&c_grant).await.unwrap();
}

/// The queue holds at most 1,000 waiters: a candidate that finds it full sweeps out the waiters
/// nobody listens for (a `probe` on each one's channel, which wakes nobody) and queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_swept_of_waiters_nobody_listens_for() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("full");
    let keys = backend.config.keys(&lease);
    let mut b = store.changes(&lease, &id("b")).await.unwrap().unwrap();
    let mut c = store.changes(&lease, &id("c")).await.unwrap().unwrap();
    let a = grant(&store, &lease, "a", TTL).await;
    queue(&store, &lease, "b").await;
    let mut zadd = vec!["ZADD".to_string(), keys.queue.clone()];
    for i in 0..999 {
        zadd.extend([format!("{}", 2_000_000_000_000_000u64 + i), format!("gone-{i}")]);
    }
    let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
    raw_cmd(&backend, &zadd).await;
    assert_eq!(members(&backend, &lease).await.len(), 1000);

    queue(&store, &lease, "c").await;
    assert_eq!(members(&backend, &lease).await, ["b", "c"], "the dead are swept out");
    assert!(quiet(&mut b).await, "a probe wakes nobody");
    assert!(quiet(&mut c).await);
    store.release(&a).await.unwrap();
    assert!(wakes(&mut b).await);
}
