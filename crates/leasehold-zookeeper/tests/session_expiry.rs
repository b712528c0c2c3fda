//! A waiting candidate whose ZooKeeper session the client gives up (its connection silent for
//! 7/5 of the session timeout, as while the server restarts): its change stream says so at once,
//! and its next request finds the current leader. The client fails the requests queued on the
//! session only after it has marked the session expired; a change stream that then waited for
//! the session's next state change waited forever (followers deaf after a server restart until
//! the engine's safety poll, 10 TTLs later).
//!
//! The silence comes from a fault proxy in front of the follower's store (blackhole, then heal).
//! Against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, FaultProxy, must_grant, require_server};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, random_u64};
use leasehold_zookeeper::ZookeeperStore;

const TTL: Duration = Duration::from_secs(2);

fn request(lease: &LeaseName, id: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(id).expect("valid candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hears_of_its_expired_session_and_finds_the_leader() {
    let Some(url) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let address = url
        .trim_start_matches("zk://")
        .split('/')
        .next()
        .expect("host")
        .to_string();
    let upstream = tokio::net::lookup_host(address.as_str())
        .await
        .expect("ZooKeeper's address resolves")
        .next()
        .expect("an address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let chroot = format!("/leasehold-session-expiry-{:016x}", random_u64());
    let leader = ZookeeperStore::connect(&format!("zk://{address}{chroot}"))
        .await
        .expect("the leader's store connects");
    let follower = ZookeeperStore::connect(&format!("zk://{}{chroot}", proxy.addr()))
        .await
        .expect("the follower's store connects");
    let lease = LeaseName::new("jobs").expect("valid lease name");
    let grant = must_grant(&leader, lease.as_str(), "leader", TTL).await;
    match follower.acquire(&request(&lease, "follower")).await {
        Ok(Acquired::Held(seen)) => assert_eq!(seen.holder.map(|h| h.term), Some(grant.term)),
        other => panic!("the follower must queue behind the leader: {other:?}"),
    }
    let follower_id = CandidateId::new("follower").expect("valid candidate id");
    let mut changes = follower
        .changes(&lease, &follower_id)
        .await
        .expect("a change stream")
        .expect("ZooKeeper notifies");
    // Nothing to say while the follower waits behind a live leader.
    let early = tokio::time::timeout(TTL / 2, changes.next()).await;
    assert!(early.is_err(), "the stream spoke while nothing changed: {early:?}");

    proxy.faults().set(Direction::Both, Fault::Blackhole);
    let cut = Instant::now();
    // The client gives the session up 7/5 of its timeout after its last answer, which came
    // less than a ping interval before the cut.
    let limit = TTL * 7 / 5 + TTL / 2;
    let told = tokio::time::timeout(limit, changes.next()).await;
    let after = cut.elapsed();
    assert!(
        matches!(told, Ok(Some(_))),
        "the follower's stream must say its place is lost within {limit:?} of the silence, got {told:?} after {after:?}"
    );
    eprintln!("the follower's change stream spoke {after:?} after its connection went silent");

    proxy.faults().heal();
    let healed = Instant::now();
    // The engine asks again after an error; so does this test, a few times.
    let mut answer = follower.acquire(&request(&lease, "follower")).await;
    for _ in 0..10 {
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = follower.acquire(&request(&lease, "follower")).await;
    }
    match answer {
        Ok(Acquired::Held(seen)) => {
            let holder = seen.holder.expect("the leader holds the lease");
            assert_eq!(holder.id.as_str(), "leader");
            assert_eq!(holder.term, grant.term);
        }
        other => panic!("the follower's next acquire must show the leader: {other:?}"),
    }
    eprintln!("the follower found the leader {:?} after the heal", healed.elapsed());
    leader.release(&grant).await.expect("the leader releases");
}
