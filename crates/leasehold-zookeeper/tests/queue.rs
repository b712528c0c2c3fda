//! The candidate queue when someone else deletes znodes (an operator, another tool): each
//! `acquire` answers in one pass, from one listing, and never loses the candidate's place for
//! good. Against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Grant, LeaseName, LeaseStore, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(4);

fn request(lease: &str, candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: LeaseName::new(lease).expect("valid lease name"),
        candidate: CandidateId::new(candidate).expect("valid candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

fn granted(answer: Acquired) -> Grant {
    match answer {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("expected a grant, got Held({seen:?})"),
    }
}

fn held_by(answer: &Acquired) -> Option<String> {
    match answer {
        Acquired::Held(seen) => seen.holder.as_ref().map(|h| h.id.to_string()),
        Acquired::Granted(grant) => panic!("expected Held, got {grant:?}"),
    }
}

struct Setup {
    raw: zk::Client,
    chroot: String,
    one: ZookeeperStore,
    two: ZookeeperStore,
}

async fn setup() -> Option<Setup> {
    let server = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL")?;
    let chroot = format!("/leasehold-queue-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(server.trim_start_matches("zk://").trim_end_matches('/'))
        .await
        .expect("raw client");
    Some(Setup {
        raw,
        chroot,
        one: ZookeeperStore::connect(&url).await.expect("connect"),
        two: ZookeeperStore::connect(&url).await.expect("connect"),
    })
}

impl Setup {
    async fn candidates(&self, lease: &str) -> Vec<String> {
        let mut names = self
            .raw
            .list_children(&format!("{}/{lease}/candidates", self.chroot))
            .await
            .expect("list candidates");
        names.sort_by_key(|n| n.rsplit_once('-').map(|(_, seq)| seq.to_string()));
        names
    }

    async fn delete(&self, lease: &str, name: &str) {
        self.raw
            .delete(&format!("{}/{lease}/candidates/{name}", self.chroot), None)
            .await
            .expect("delete a candidate znode");
    }
}

/// A waiting candidate whose znode an operator deleted queues again within the same acquire
/// (answering `Held` by the leader, not an error), and is granted after the leader releases.
#[tokio::test]
async fn a_deleted_place_in_the_queue_is_taken_again_in_one_acquire() {
    let Some(s) = setup().await else { return };
    let leader = granted(s.one.acquire(&request("jobs", "one")).await.expect("acquire"));
    let answer = s.two.acquire(&request("jobs", "two")).await.expect("queue");
    assert_eq!(held_by(&answer).as_deref(), Some("one"));
    let queued = s.candidates("jobs").await;
    assert_eq!(queued.len(), 2, "{queued:?}");
    s.delete("jobs", &queued[1]).await;

    let answer = s
        .two
        .acquire(&request("jobs", "two"))
        .await
        .expect("acquire after the delete");
    assert_eq!(held_by(&answer).as_deref(), Some("one"));
    let requeued = s.candidates("jobs").await;
    assert_eq!(requeued.len(), 2, "queued again: {requeued:?}");
    assert_eq!(requeued[0], leader.token);
    assert_ne!(requeued[1], queued[1], "a new znode");

    s.one.release(&leader).await.expect("release");
    let next = granted(s.two.acquire(&request("jobs", "two")).await.expect("acquire"));
    assert!(next.term > leader.term, "{} > {}", next.term, leader.term);
    assert_eq!(next.token, requeued[1]);
}

/// The head gone without a release (an operator deleted the leader's znode): the next
/// candidate is granted by its next acquire, with a higher term.
#[tokio::test]
async fn a_deleted_head_passes_the_lease_on() {
    let Some(s) = setup().await else { return };
    let leader = granted(s.one.acquire(&request("jobs", "one")).await.expect("acquire"));
    let answer = s.two.acquire(&request("jobs", "two")).await.expect("queue");
    assert_eq!(held_by(&answer).as_deref(), Some("one"));
    s.delete("jobs", &leader.token).await;
    let next = granted(s.two.acquire(&request("jobs", "two")).await.expect("acquire"));
    assert!(next.term > leader.term);
    let seen = s.one.inspect(&LeaseName::new("jobs").unwrap()).await.expect("inspect");
    assert_eq!(
        seen.holder.map(|h| (h.id.to_string(), h.term)),
        Some(("two".into(), next.term))
    );
}
