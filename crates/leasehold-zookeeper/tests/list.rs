//! `LeaseStore::list` against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`): leases under
//! a chroot of their own, so the listing is exactly what this test made.

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Grant, LeaseName, LeaseStore, Observation, random_u64,
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

/// Held, queued-behind, released and broken leases under two prefixes; `list` returns exactly
/// the leases that start with the prefix (taken literally: `a_` is not a pattern), sorted, each
/// as `inspect` shows it; the queue and history znodes and non-lease children of the chroot
/// never appear; a garbage head record is a corrupt-record error naming its lease.
#[tokio::test]
async fn list_shows_each_lease_by_prefix_as_inspect_does() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let chroot = format!("/leasehold-list-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let store = ZookeeperStore::connect(&url).await.expect("connect");
    let other = ZookeeperStore::connect(&url).await.expect("connect a second store");

    // Nothing made yet: the chroot does not even exist.
    assert_eq!(store.list("").await.expect("list of a missing chroot"), []);

    let held = grant(&store, "a-held", "one").await;
    // A second candidate queued behind the holder: its znode is not a lease.
    match other.acquire(&request("a-held", "two")).await.expect("acquire") {
        Acquired::Held(seen) => assert_eq!(seen.holder.map(|h| h.id.to_string()).as_deref(), Some("one")),
        Acquired::Granted(grant) => panic!("a held lease was granted: {grant:?}"),
    }
    let released = grant(&store, "a-released", "one").await;
    store.release(&released).await.expect("release");
    let broken = grant(&store, "a-broken", "one").await;
    assert_eq!(
        other.break_lease(&name("a-broken")).await.expect("break"),
        Some(broken.term)
    );
    let b = grant(&store, "b-held", "one").await;
    let underscore = grant(&store, "a_x", "one").await;
    let literal = grant(&store, "abx", "one").await;

    // Children of the chroot that are not leases: a znode without a queue, and one whose name
    // is no lease name.
    let raw = raw(&server).await;
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for stray in ["not-a-lease", "bad name!"] {
        raw.create(&format!("{chroot}/{stray}"), b"", &options)
            .await
            .expect("stray znode");
    }

    let listed = store.list("a-").await.expect("list a-");
    assert_eq!(names(&listed), ["a-broken", "a-held", "a-released"]);
    for observation in &listed {
        let inspected = store.inspect(&observation.lease).await.expect("inspect");
        assert_eq!(observation, &inspected, "list and inspect disagree");
    }
    let [a_broken, a_held, a_released] = &listed[..] else {
        unreachable!()
    };
    let holder = a_held.holder.as_ref().expect("a-held is held");
    assert_eq!((holder.id.as_str(), holder.term), ("one", held.term));
    assert_eq!(holder.ttl, TTL);
    assert!(a_released.holder.is_none(), "{a_released:?}");
    assert_eq!(
        (a_released.last_term, a_released.previous_end),
        (released.term, Some(EndReason::Released))
    );
    assert!(a_broken.holder.is_none(), "{a_broken:?}");
    assert_eq!(
        (a_broken.last_term, a_broken.previous_end),
        (broken.term, Some(EndReason::Broken))
    );

    let all = store.list("").await.expect("list all");
    assert_eq!(
        names(&all),
        ["a-broken", "a-held", "a-released", "a_x", "abx", "b-held"],
        "every lease, and nothing else"
    );
    assert_eq!(all[5].holder.as_ref().map(|h| h.term), Some(b.term));
    let under = store.list("a_").await.expect("list a_");
    assert_eq!(names(&under), ["a_x"], "the prefix is literal");
    assert_eq!(under[0].holder.as_ref().map(|h| h.term), Some(underscore.term));
    assert_eq!(names(&other.list("ab").await.expect("list ab")), ["abx"]);
    assert_eq!(other.list("c").await.expect("list c"), []);
    assert_eq!(other.list("a-held-not").await.expect("list longer"), []);

    // Garbage in a holder's candidate znode: an error naming that lease, not a skipped entry.
    let candidates = format!("{chroot}/abx/candidates");
    let node = format!("{candidates}/{}", literal.token);
    raw.set_data(&node, b"\x00garbage from someone else", None)
        .await
        .expect("garbage");
    match store.list("").await {
        Err(Error::CorruptRecord { lease, .. }) => assert_eq!(lease, "abx"),
        other => panic!("a garbage record must be a corrupt-record error, got {other:?}"),
    }
    assert_eq!(
        names(&store.list("a-").await.expect("the other leases still list")),
        ["a-broken", "a-held", "a-released"]
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
