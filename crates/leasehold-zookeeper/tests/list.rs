//! `LeaseStore::list` against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), where
//! ZooKeeper's own znode layout matters: leases under a chroot of their own, so the listing is
//! exactly what this test made.

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Error, Grant, LeaseName, LeaseStore, Observation, random_u64,
};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(4);

fn name(text: &str) -> LeaseName {
    LeaseName::new(text).expect("valid lease name")
}

fn request(lease: &str, candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: name(lease),
        candidate: CandidateId::new(candidate).expect("valid candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

async fn grant(store: &ZookeeperStore, lease: &str, candidate: &str) -> Grant {
    match store.acquire(&request(lease, candidate)).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("{lease} should be free: {seen:?}"),
    }
}

fn names(listed: &[Observation]) -> Vec<&str> {
    listed.iter().map(|o| o.lease.as_str()).collect()
}

/// A raw client on the test server (no chroot), for what leasehold would never write.
async fn raw(server: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(server.trim_start_matches("zk://").trim_end_matches('/'))
        .await
        .expect("raw client")
}

/// ZooKeeper's own znode layout: a missing chroot lists nothing; a queued candidate's znode and
/// children of the chroot that are no lease (a znode without a queue, a name that is no lease
/// name) are never listed; garbage in a holder's candidate znode is an error naming its lease.
/// (What a listing shows of each lease, in which order, and literal prefixes: the shared
/// scenario `list_by_prefix`.)
#[tokio::test]
async fn znodes_that_are_no_lease_are_never_listed() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let chroot = format!("/leasehold-list-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let store = ZookeeperStore::connect(&url).await.expect("connect");
    let other = ZookeeperStore::connect(&url).await.expect("connect a second store");

    // Nothing made yet: the chroot does not even exist.
    assert_eq!(store.list("").await.expect("list of a missing chroot"), []);

    grant(&store, "a-held", "one").await;
    // A second candidate queued behind the holder: its znode is not a lease.
    match other.acquire(&request("a-held", "two")).await.expect("acquire") {
        Acquired::Held(seen) => assert_eq!(seen.holder.map(|h| h.id.to_string()).as_deref(), Some("one")),
        Acquired::Granted(grant) => panic!("a held lease was granted: {grant:?}"),
    }
    let literal = grant(&store, "abx", "one").await;
    let raw = raw(&server).await;
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for stray in ["not-a-lease", "bad name!"] {
        raw.create(&format!("{chroot}/{stray}"), b"", &options)
            .await
            .expect("stray znode");
    }
    assert_eq!(names(&store.list("").await.expect("list all")), ["a-held", "abx"]);
    assert_eq!(other.list("not").await.expect("list not"), []);

    // Garbage in a holder's candidate znode: an error naming that lease, not a skipped entry.
    let node = format!("{chroot}/abx/candidates/{}", literal.token);
    raw.set_data(&node, b"\x00garbage from someone else", None)
        .await
        .expect("garbage");
    match store.list("").await {
        Err(Error::CorruptRecord { lease, .. }) => assert_eq!(lease, "abx"),
        other => panic!("a garbage record must be a corrupt-record error, got {other:?}"),
    }
    assert_eq!(
        names(&store.list("a-").await.expect("the other leases still list")),
        ["a-held"]
    );
    remove_tree(&raw, &chroot).await;
}

/// Deletes a znode and everything under it (best effort: the test's own chroot).
async fn remove_tree(raw: &zk::Client, path: &str) {
    let mut stack = vec![(path.to_string(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            let _ = raw.delete(&node, None).await;
            continue;
        }
        stack.push((node.clone(), true));
        for child in raw.list_children(&node).await.unwrap_or_default() {
            stack.push((format!("{node}/{child}"), false));
        }
    }
}
