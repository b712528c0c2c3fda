//! Who leads, from notifications alone ([`ZookeeperStore::announcements`]): A leads, B, C and D
//! wait in that order (four stores, four sessions). A's term is ended from outside (as its
//! session's expiry would: no word from A); B takes over, and the announcement streams of C's
//! and D's stores (neither next in the queue when A went) show B, as `inspect` shows it, within
//! moments of B's grant, without a request on their connections (counted by the server). Then B
//! resigns: C takes over, announced likewise. Against the ZooKeeper test server
//! (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_conformance::require_server;
use leasehold_core::{Elector, LeaseName, LeaseStore, Observation, random_u64};
use leasehold_zookeeper::ZookeeperStore;

const TTL: Duration = Duration::from_secs(4);

/// Waits until `elector` observes `holder` leading.
async fn sees(elector: &Elector, holder: &str) {
    let mut observed = elector.observe();
    tokio::time::timeout(TTL, async {
        while observed
            .borrow_and_update()
            .as_ref()
            .is_none_or(|l| l.holder.as_str() != holder)
        {
            observed.changed().await.expect("elector runs");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} does not see {holder} lead", elector.id()));
}

/// The next announcement, within a TTL.
async fn next(stream: &mut BoxStream<'static, Observation>, whose: &str) -> Observation {
    tokio::time::timeout(TTL, stream.next())
        .await
        .unwrap_or_else(|_| panic!("no announcement on {whose}'s stream within {TTL:?}"))
        .expect("the stream ended")
}

/// The packets the server received on the connections in `ports` between two counts.
fn sent(ports: &HashSet<u16>, before: &HashMap<u16, u64>, after: &HashMap<u16, u64>) -> u64 {
    let mine = |m: &HashMap<u16, u64>| -> HashMap<u16, u64> {
        m.iter()
            .filter(|(p, _)| ports.contains(p))
            .map(|(p, n)| (*p, *n))
            .collect()
    };
    common::since(&mine(before), &mine(after))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_learn_each_new_holder_from_its_announcement_without_a_request() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let url = format!(
        "{}/leasehold-announcements-{:016x}",
        server.trim_end_matches('/'),
        random_u64()
    );
    let addr = common::address(&server);
    let operator = ZookeeperStore::connect(&url).await.expect("connect");
    let lease = LeaseName::new("jobs").expect("lease");
    let (mut stores, mut electors, mut ports, mut campaigns) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for id in ["a", "b", "c", "d"] {
        let before = common::connections(&addr);
        let store = Arc::new(ZookeeperStore::connect(&url).await.expect("connect"));
        let elector = Elector::builder(store.clone(), lease.as_str())
            .ttl(TTL)
            .candidate_id(id)
            .build()
            .expect("elector");
        let campaigning = elector.clone();
        campaigns.push(tokio::spawn(async move { campaigning.campaign().await }));
        sees(&elector, "a").await;
        tokio::time::sleep(Duration::from_millis(300)).await; // queued, its stream waiting
        let own: HashSet<u16> = common::connections(&addr).difference(&before).copied().collect();
        assert!(!own.is_empty(), "{id}'s connection was not found");
        ports.push(own);
        stores.push(store);
        electors.push(elector);
    }
    let mut c_hears = stores[2]
        .announcements(&lease)
        .await
        .expect("announcements")
        .expect("ZooKeeper announces");
    let mut d_hears = stores[3]
        .announcements(&lease)
        .await
        .expect("announcements")
        .expect("ZooKeeper announces");
    let a_term = operator.inspect(&lease).await.expect("inspect").last_term;
    // Each stream starts with the holder a read shows once its watch is set.
    for (stream, whose) in [(&mut c_hears, "c"), (&mut d_hears, "d")] {
        let first = next(stream, whose).await;
        assert_eq!(
            first.holder.map(|h| (h.id.to_string(), h.term)),
            Some(("a".to_string(), a_term))
        );
    }

    // A's term ends from outside; B is granted and announced.
    let before = common::requests_by_connection(&addr);
    let broken = Instant::now();
    operator.break_lease(&lease).await.expect("break").expect("a held it");
    let c_heard = next(&mut c_hears, "c").await;
    let c_after = broken.elapsed();
    let d_heard = next(&mut d_hears, "d").await;
    let d_after = broken.elapsed();
    let after = common::requests_by_connection(&addr);
    sees(&electors[1], "b").await;
    let inspected = operator.inspect(&lease).await.expect("inspect");
    assert_eq!(c_heard, inspected, "C heard B's grant as inspect shows it");
    assert_eq!(d_heard, inspected);
    assert!(inspected.last_term > a_term);
    println!("A's term broken: C heard of B after {c_after:?}, D after {d_after:?}");
    if let Some((before, after)) = before.zip(after) {
        for (i, id) in [(2, "c"), (3, "d")] {
            let requests = sent(&ports[i], &before, &after);
            println!("{id}'s store sent {requests} ZooKeeper requests meanwhile");
            // A ping may fall in the window; reading who leads would be two or more.
            assert!(requests <= 1, "{id} sent {requests} requests");
        }
    }

    // B resigns: C (waiting next) is granted in the release's transaction, announced too.
    let b_term = inspected.last_term;
    let leader_b = campaigns
        .remove(1)
        .await
        .expect("campaign task")
        .expect("b was elected");
    leader_b.resign().await;
    let d_heard = next(&mut d_hears, "d").await;
    let holder = d_heard.holder.as_ref().expect("a holder");
    assert_eq!(holder.id.as_str(), "c");
    assert!(holder.term > b_term, "{} > {b_term}", holder.term);
    sees(&electors[2], "c").await;
    assert_eq!(d_heard, operator.inspect(&lease).await.expect("inspect"));
    for campaign in campaigns {
        campaign.abort();
    }
}

/// A lease made before grants were announced has no `leader/` znode: its next grant makes it
/// (and is announced), and nothing else changes.
#[tokio::test]
async fn a_lease_without_a_leader_znode_gets_one_at_its_next_grant() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let chroot = format!("/leasehold-announcements-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let store = ZookeeperStore::connect(&url).await.expect("connect");
    let lease = LeaseName::new("old").expect("lease");
    let request = |candidate: &str| leasehold_core::AcquireRequest {
        lease: lease.clone(),
        candidate: leasehold_core::CandidateId::new(candidate).expect("id"),
        ttl: TTL,
        takeover: None,
    };
    let granted = |answer: leasehold_core::Acquired| match answer {
        leasehold_core::Acquired::Granted(grant) => grant,
        other => panic!("expected a grant, got {other:?}"),
    };
    let first = granted(store.acquire(&request("a")).await.expect("acquire"));
    store.release(&first).await.expect("release");
    let raw = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&common::address(&server))
        .await
        .expect("raw client");
    raw.delete(&format!("{chroot}/old/leader"), None)
        .await
        .expect("the lease's leader znode, made with it");

    let mut hears = store
        .announcements(&lease)
        .await
        .expect("announcements")
        .expect("ZooKeeper announces");
    let second = granted(store.acquire(&request("b")).await.expect("acquire"));
    assert!(second.term > first.term);
    let heard = next(&mut hears, "the store").await;
    assert_eq!(heard, store.inspect(&lease).await.expect("inspect"));
    assert_eq!(heard.holder.map(|h| h.id.to_string()), Some("b".to_string()));
    assert!(
        raw.check_stat(&format!("{chroot}/old/leader"))
            .await
            .expect("stat")
            .is_some()
    );
}
