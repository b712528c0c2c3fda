//! Announcements: every grant reaches the followers' streams as `inspect` shows the new holder
//! right after it (holder, term, TTL, version), from the store's one watch on the lease's
//! `granted` key, including the grant that takes a handed-over lease; a store watches again
//! after its last stream was dropped.

use std::time::Duration;

use futures::StreamExt;
use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, Announcements, CandidateId, Grant, LeaseName, LeaseStore, Observation};
use leasehold_etcd::EtcdStore;

const TTL: Duration = Duration::from_millis(2500);

fn request(lease: &LeaseName, candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(candidate).expect("candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

async fn granted(store: &EtcdStore, lease: &LeaseName, candidate: &str) -> Grant {
    match store.acquire(&request(lease, candidate)).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("{candidate} must be granted; held: {seen:?}"),
    }
}

async fn next(stream: &mut Announcements, what: &str) -> Observation {
    tokio::time::timeout(Duration::from_secs(2), stream.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: no announcement within 2 s"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
}

#[tokio::test]
async fn grants_are_announced_as_inspect_shows_them() {
    let Some(url) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let prefix = format!("leasehold-announce-tests/{}", leasehold_core::random_u64());
    let url = format!("{}/{prefix}", url.trim_end_matches('/'));
    let writer = EtcdStore::connect(&url).await.expect("writer connects");
    let follower = EtcdStore::connect(&url).await.expect("follower connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let other = LeaseName::new("other").expect("lease name");

    let mut first = follower
        .announcements(&lease)
        .await
        .expect("subscribing")
        .expect("etcd announces");
    let mut second = follower
        .announcements(&lease)
        .await
        .expect("subscribing again")
        .expect("etcd announces");
    let mut elsewhere = follower
        .announcements(&other)
        .await
        .expect("subscribing")
        .expect("etcd announces");

    let a = granted(&writer, &lease, "a one").await;
    let inspected = follower.inspect(&lease).await.expect("inspect");
    assert_eq!(inspected.holder.as_ref().map(|h| h.term), Some(a.term));
    assert_eq!(next(&mut first, "a's grant").await, inspected);
    assert_eq!(next(&mut second, "a's grant, second stream").await, inspected);

    // The successor of a hand-over takes the reservation with a grant of its own: announced.
    assert!(matches!(
        writer.acquire(&request(&lease, "b")).await.expect("b queues"),
        Acquired::Held(_)
    ));
    writer
        .hand_over(&a, &CandidateId::new("b").expect("id"))
        .await
        .expect("hand over");
    let b = granted(&writer, &lease, "b").await;
    assert!(b.term > a.term);
    let inspected = follower.inspect(&lease).await.expect("inspect");
    assert_eq!(next(&mut first, "b's grant").await, inspected);
    assert_eq!(next(&mut second, "b's grant, second stream").await, inspected);

    // Nothing of `jobs` reaches the other lease's stream.
    let quiet = tokio::time::timeout(Duration::from_millis(300), elsewhere.next()).await;
    assert!(quiet.is_err(), "another lease's stream heard {quiet:?}");

    // Every stream dropped (the store's watch goes with the last): a new subscription watches
    // again and hears the next grant.
    drop((first, second, elsewhere));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = follower
        .announcements(&lease)
        .await
        .expect("subscribing after dropping")
        .expect("etcd announces");
    writer.release(&b).await.expect("release");
    let c = granted(&writer, &lease, "c").await;
    let inspected = follower.inspect(&lease).await.expect("inspect");
    assert_eq!(inspected.holder.as_ref().map(|h| h.term), Some(c.term));
    assert_eq!(next(&mut again, "c's grant").await, inspected);
    writer.release(&c).await.expect("release");
}
