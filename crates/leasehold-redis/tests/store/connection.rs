//! The connection: a blackholed leader, lost and slow replies, change streams that end with the
//! connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, SafetyChecker};
use leasehold_core::{Error, LeaseStore};
use leasehold_redis::RedisStore;

use super::{backend, lease, next};
use crate::common::{TTL, elector, grant, id, request};

/// A leader whose network goes silent (no FIN, no reset) steps down before its `valid_until`,
/// the server lets the key expire within a TTL, and a second candidate takes over within
/// `ttl + slack`. Three rounds; the takeover times are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_leader_steps_down_and_the_key_expires() {
    let Some(backend) = backend() else { return };
    let observer = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let mut takeovers = Vec::new();
    for round in 1..=3 {
        let lease = lease("blackhole");
        let checker = SafetyChecker::new();
        let (store_a, faults_a) = backend.faulty().await.unwrap();
        let a = elector(Arc::new(store_a), &lease, "A");
        let b = elector(
            Arc::new(RedisStore::from_config(backend.config.clone()).await.unwrap()),
            &lease,
            "B",
        );
        checker.watch(&a);
        checker.watch(&b);
        let leader_a = tokio::time::timeout(TTL * 3, a.campaign()).await.unwrap().unwrap();
        let b_task = tokio::spawn({
            let b = b.clone();
            async move { b.campaign().await.unwrap() }
        });
        tokio::time::sleep(TTL + TTL / 7 * round).await;

        let cut = Instant::now();
        faults_a.set(Direction::Both, Fault::Blackhole);
        tokio::time::timeout(TTL * 2, leader_a.cancelled())
            .await
            .expect("A is cancelled");
        let cancelled = Instant::now();
        let valid_until = leader_a.valid_until();
        assert!(
            cancelled < valid_until,
            "round {round}: A was cancelled after its valid_until"
        );

        // The server forgets the silent holder within a TTL of the cut (its last renewal came
        // before the cut).
        let expired = loop {
            let seen = observer.inspect(&lease).await.unwrap();
            match seen.holder {
                Some(h) if h.id.as_str() == "A" => {
                    assert!(
                        cut.elapsed() < TTL + Duration::from_millis(100),
                        "round {round}: A's key outlived its TTL"
                    );
                    assert!(h.store_remaining.unwrap() <= TTL);
                }
                _ => break cut.elapsed(),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let leader_b = tokio::time::timeout(TTL * 3, b_task)
            .await
            .expect("B takes over")
            .unwrap();
        let takeover = leader_b.elected_at() - cut;
        assert!(leader_b.term() > leader_a.term());
        assert!(
            leader_b.elected_at() >= valid_until,
            "round {round}: B elected before A's valid_until"
        );
        assert!(
            takeover <= TTL + Duration::from_millis(500),
            "round {round}: takeover took {takeover:?}"
        );
        println!(
            "round {round}: A cancelled {:?} after the cut ({:?} before valid_until); key gone after {expired:?}; \
             B elected after {takeover:?} at term {}",
            cancelled - cut,
            valid_until - cancelled,
            leader_b.term()
        );
        takeovers.push(takeover);
        leader_b.resign().await;
        drop(leader_a);
        checker.check().await.unwrap();
    }
    takeovers.sort();
    println!("takeover after a silent cut, TTL {TTL:?}: {takeovers:?}");
}

/// A reply lost on a live connection (the network drops it, the connection stays) does not
/// make later replies answer the wrong requests: the next reply is handed to its own request,
/// and the connection is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_does_not_mix_up_later_replies() {
    let Some(backend) = backend() else { return };
    let lease = lease("lost-reply");
    let (store, faults) = backend.faulty().await.unwrap();
    let store = Arc::new(store);
    // Load the scripts first: a script the server does not know takes a second round trip.
    store.acquire(&request(&lease, "warm-up", TTL)).await.unwrap();
    store.inspect(&lease).await.unwrap();
    store.break_lease(&lease).await.unwrap();
    faults.set(Direction::Reply, Fault::Blackhole);
    let lost = tokio::spawn({
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.acquire(&request(&lease, "lost", TTL * 10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    faults.heal();
    let started = Instant::now();
    let seen = store.inspect(&lease).await.expect("inspect after the lost reply");
    let holder = seen.holder.expect("the acquire was applied");
    assert_eq!(holder.id.as_str(), "lost");
    assert!(
        started.elapsed() < store.config().timeout,
        "the inspect's reply reached it without waiting for a timeout ({:?})",
        started.elapsed()
    );
    match lost.await.unwrap() {
        Err(e) if e.is_transient() => println!("the acquire whose reply was lost: {e}"),
        other => panic!("the lost reply must be an ambiguous outcome, got {other:?}"),
    }
    // Afterwards all is well on a new connection.
    let again = store.inspect(&lease).await.unwrap();
    assert_eq!(again.holder.map(|h| h.term), Some(holder.term));
}

/// A server that answers too slowly: the request fails as a transient timeout after the
/// configured timeout, and the next request (on a new connection) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_replies_time_out_and_the_store_recovers() {
    let Some(backend) = backend() else { return };
    let lease = lease("slow");
    let (store, faults) = backend.faulty().await.unwrap();
    faults.set(Direction::Reply, Fault::Delay(store.config().timeout * 2));
    let started = Instant::now();
    let err = store.inspect(&lease).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            err,
            Error::Timeout {
                store: "redis",
                operation: "inspect",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert!(
        took >= store.config().timeout && took < store.config().timeout * 2,
        "{took:?}"
    );
    faults.heal();
    store.inspect(&lease).await.expect("a new connection after the timeout");

    // Nothing listens: refused at once, transient.
    let mut closed = backend.config.clone();
    closed.host = "127.0.0.1".into();
    closed.port = 1;
    let started = Instant::now();
    let err = RedisStore::from_config(closed.clone()).await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { store: "redis", .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    let lazy = RedisStore::lazy(closed).unwrap();
    let err = lazy.acquire(&request(&lease, "a", TTL)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}

/// Releases, breaks and expiries reach `changes` streams of a follower that is not queued (with
/// no waiter queued, every follower is woken); a connection that breaks or goes silent ends them
/// (the engine then polls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_announce_releases_and_end_with_the_connection() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("changes");
    let me = id("watcher");
    let mut changes = store.changes(&lease, &me).await.unwrap().unwrap();
    let mut again = store.changes(&lease, &me).await.unwrap().unwrap();

    let g = grant(&store, &lease, "a", TTL).await;
    store.release(&g).await.unwrap();
    assert_eq!(
        next(&mut changes).await,
        Ok(Some(leasehold_core::Change::Changed)),
        "a release is announced"
    );
    assert_eq!(
        next(&mut again).await,
        Ok(Some(leasehold_core::Change::Changed)),
        "to every stream of the lease"
    );
    grant(&store, &lease, "b", TTL).await;
    assert!(store.break_lease(&lease).await.unwrap().is_some());
    assert_eq!(
        next(&mut changes).await,
        Ok(Some(leasehold_core::Change::Changed)),
        "a break is announced"
    );
    drop(again);
    grant(&store, &lease, "c", Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let d = grant(&store, &lease, "d", TTL).await;
    assert_eq!(
        next(&mut changes).await,
        Ok(Some(leasehold_core::Change::Changed)),
        "the expiry of the record wakes the follower (expiry events)"
    );
    store.release(&d).await.unwrap();

    // A reset connection ends the streams; a silent one too (it stops answering pings).
    for fault in [Fault::Reset, Fault::Blackhole] {
        let (faulty, faults) = backend.faulty().await.unwrap();
        let mut changes = faulty.changes(&lease, &me).await.unwrap().unwrap();
        faults.set(Direction::Both, fault);
        let started = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
        assert_eq!(end, Ok(None), "{fault:?}: the stream ends");
        println!("{fault:?}: changes ended after {:?}", started.elapsed());
        // While the network is down, asking for changes fails within about two timeouts.
        let started = Instant::now();
        let err = faulty
            .changes(&lease, &me)
            .await
            .err()
            .expect("no changes through a broken network");
        assert!(err.is_transient(), "{err:?}");
        assert!(
            started.elapsed() < faulty.config().timeout * 3,
            "{:?}",
            started.elapsed()
        );
        faults.heal();
        let mut healed = faulty.changes(&lease, &me).await.unwrap().unwrap();
        store.release(&grant(&store, &lease, "e", TTL).await).await.unwrap();
        assert_eq!(
            next(&mut healed).await,
            Ok(Some(leasehold_core::Change::Changed)),
            "{fault:?}: a new connection after healing"
        );
    }
}
