//! `LeaseStore::list` of many leases on ZooKeeper: 200 held leases listed in a handful of
//! requests (the chroot's listing and three multi-reads, counted by the server), and, once some
//! are free, reserved, held by another store, headed by a polling candidate that has not taken
//! the lease (free) or by a waiting one (held: its change stream takes the lease by a read, see
//! `turn`), each listed lease exactly as `inspect` shows it. Against the ZooKeeper test server
//! (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use crate::common;

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Grant, LeaseName, LeaseStore, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(4);
const LEASES: usize = 200;

fn lease(i: usize) -> LeaseName {
    LeaseName::new(format!("lease-{i:03}")).expect("valid lease name")
}

async fn acquire(store: &ZookeeperStore, i: usize, candidate: &str) -> Grant {
    let request = AcquireRequest {
        lease: lease(i),
        candidate: CandidateId::new(candidate).expect("valid candidate id"),
        ttl: TTL,
        takeover: None,
    };
    match store.acquire(&request).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("lease {i}: expected a grant, got Held({seen:?})"),
    }
}

/// `list("")` equals `inspect` of every lease, in order; returns what each shows, in short.
async fn list_equals_inspect(store: &ZookeeperStore) -> Vec<String> {
    let listed = store.list("").await.expect("list");
    assert_eq!(listed.len(), LEASES);
    let mut shown = Vec::with_capacity(LEASES);
    for (i, seen) in listed.iter().enumerate() {
        assert_eq!(seen.lease, lease(i));
        let inspected = store.inspect(&lease(i)).await.expect("inspect");
        assert_eq!(*seen, inspected, "lease {i}");
        shown.push(match &seen.holder {
            Some(h) if h.reserved => format!("reserved for {}", h.id),
            Some(h) => format!("held by {}", h.id),
            None => format!("free, {:?}", seen.previous_end),
        });
    }
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_are_listed_in_a_few_requests_each_as_inspect_shows_it() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let chroot = format!("/leasehold-list-many-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let addr = common::address(&server);
    let (a, b) = (
        ZookeeperStore::connect(&url).await.expect("connect"),
        ZookeeperStore::connect(&url).await.expect("connect"),
    );
    let mut grants = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        grants.push(acquire(&a, i, "holder").await);
    }
    // Let the grants' history tidying (tasks of their own) finish before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = common::requests_by_connection(&addr);
    let listed = a.list("").await.expect("list");
    let after = common::requests_by_connection(&addr);
    assert_eq!(listed.len(), LEASES);
    assert!(
        listed
            .iter()
            .all(|o| o.holder.as_ref().is_some_and(|h| h.id.as_str() == "holder"))
    );
    match before.zip(after) {
        Some((before, after)) => {
            let requests = common::since(&before, &after);
            println!("list of {LEASES} held leases: {requests} ZooKeeper requests");
            // The chroot's listing and three multi-reads; one more if a ping fell in between.
            // Reading each lease on its own: four per lease.
            assert!(requests <= 5, "{requests} requests to list {LEASES} held leases");
        }
        None => println!("the server does not answer `stat`: requests not counted"),
    }
    assert_eq!(
        list_equals_inspect(&a).await,
        vec!["held by holder".to_string(); LEASES]
    );

    // Free, taken by another store, reserved, and headed by a candidate that has not taken it:
    // one that polls (free) or one that waits (its holder, before its history entry).
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&addr)
        .await
        .expect("raw client");
    let mut expected = vec!["held by holder".to_string(); LEASES];
    for i in 0..10 {
        a.release(&grants[i]).await.expect("release");
        expected[i] = "free, Some(Released)".into();
    }
    for i in 10..15 {
        a.release(&grants[i]).await.expect("release");
        acquire(&b, i, "b").await;
        expected[i] = "held by b".into();
    }
    for i in 20..30 {
        let to = CandidateId::new("c").expect("id");
        a.hand_over(&grants[i], &to).await.expect("hand over");
        expected[i] = "reserved for c".into();
    }
    for i in 30..35 {
        a.release(&grants[i]).await.expect("release");
        let record = "leasehold-candidate/1\ncandidate d\nttl_ms 4000\nwaiting 0\n";
        raw.create(
            &format!("{chroot}/{}/candidates/c-0123456789abcdef-", lease(i)),
            record.as_bytes(),
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("a queued candidate that has not taken the lease");
        expected[i] = "free, Some(Released)".into();
    }
    for i in 35..40 {
        a.release(&grants[i]).await.expect("release");
        let record = "leasehold-candidate/1\ncandidate e\nttl_ms 4000\nwaiting 1\n";
        raw.create(
            &format!("{chroot}/{}/candidates/c-0123456789abcdef-", lease(i)),
            record.as_bytes(),
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("a queued waiting candidate");
        expected[i] = "held by e".into();
    }
    assert_eq!(list_equals_inspect(&a).await, expected);
    assert_eq!(list_equals_inspect(&b).await, expected, "another store lists the same");
}
