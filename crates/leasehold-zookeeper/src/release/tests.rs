//! `withdraw` of a candidate whose acquire was applied by ZooKeeper while its reply was lost
//! (the engine gave up on it after `request_timeout`, or the connection dropped after the
//! create): the store caches nothing for it, yet its znode is queued on a session the store
//! keeps alive. Against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot
//! of its own.

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Grant, LeaseName, LeaseStore, Renewed, random_u64};
use zookeeper_client as zk;

use crate::ZookeeperStore;

const TTL: Duration = Duration::from_secs(4);

fn lease(name: &str) -> LeaseName {
    LeaseName::new(name).expect("valid lease name")
}

fn candidate(id: &str) -> CandidateId {
    CandidateId::new(id).expect("valid candidate id")
}

fn request(name: &str, id: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease(name),
        candidate: candidate(id),
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

struct Setup {
    raw: zk::Client,
    chroot: String,
    one: ZookeeperStore,
    two: ZookeeperStore,
}

async fn setup() -> Option<Setup> {
    let server = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL")?;
    let chroot = format!("/leasehold-withdraw-{:016x}", random_u64());
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
        self.raw
            .list_children(&format!("{}/{lease}/candidates", self.chroot))
            .await
            .expect("list candidates")
    }
}

/// What an acquire of `id` does to queue it, on the session acquire uses (the store's session
/// for the TTL), with its reply lost: the znode exists, nothing is cached for the candidate.
async fn queue_with_reply_lost(store: &ZookeeperStore, name: &str, id: &str) -> String {
    let inner = &store.inner;
    let (lease, candidate) = (lease(name), candidate(id));
    let ops = inner.ops(&lease, &candidate);
    let _serial = ops.lock().await;
    let client = inner.session(TTL).await.expect("session");
    let prefix = inner.prefix(&candidate);
    let (own, _) = inner
        .enqueue(&client, &lease, &candidate, TTL, &prefix)
        .await
        .expect("queue");
    inner.set_own(&lease, &candidate, None); // the reply never came
    own.name
}

/// The ghost of an acquire whose create reply was lost is withdrawn: the next candidate is
/// granted once the leader releases, instead of queueing behind it for as long as the store's
/// session lives.
#[tokio::test]
async fn withdraw_deletes_a_queued_znode_whose_create_reply_was_lost() {
    let Some(s) = setup().await else { return };
    let leader = granted(s.one.acquire(&request("jobs", "a")).await.expect("acquire"));
    let ghost = queue_with_reply_lost(&s.one, "jobs", "b").await;
    assert!(s.candidates("jobs").await.contains(&ghost));

    s.one.withdraw(&lease("jobs"), &candidate("b")).await.expect("withdraw");
    let left = s.candidates("jobs").await;
    assert!(!left.contains(&ghost), "the ghost {ghost} is still queued: {left:?}");

    s.one.release(&leader).await.expect("release");
    let next = s.two.acquire(&request("jobs", "c")).await.expect("acquire");
    let next = granted(next);
    assert!(next.term > leader.term);
}

/// A grant whose reply was lost and that nobody read back ends with the withdrawal (as a
/// release), and the lease passes on.
#[tokio::test]
async fn withdraw_ends_a_grant_whose_reply_was_lost() {
    let Some(s) = setup().await else { return };
    let lost = granted(s.one.acquire(&request("jobs", "b")).await.expect("acquire"));
    s.one.inner.set_own(&lease("jobs"), &candidate("b"), None); // the reply never came

    s.one.withdraw(&lease("jobs"), &candidate("b")).await.expect("withdraw");
    assert!(s.candidates("jobs").await.is_empty());
    let next = granted(s.two.acquire(&request("jobs", "c")).await.expect("acquire"));
    assert!(next.term > lost.term);
}

/// Safety: a grant whose reply was lost but that a read of this store showed holding the lease
/// may have been adopted by the campaign's read-back: a withdrawal (of an older campaign of
/// the same candidate) keeps it, and the adopted grant still renews.
#[tokio::test]
async fn withdraw_keeps_a_grant_a_read_back_may_have_adopted() {
    let Some(s) = setup().await else { return };
    let adopted = granted(s.one.acquire(&request("jobs", "b")).await.expect("acquire"));
    s.one.inner.set_own(&lease("jobs"), &candidate("b"), None); // the reply never came
    let seen = s.one.inspect(&lease("jobs")).await.expect("read back");
    assert_eq!(
        seen.holder.as_ref().map(|h| h.version.clone()),
        Some(adopted.token.clone())
    );

    s.one.withdraw(&lease("jobs"), &candidate("b")).await.expect("withdraw");
    assert_eq!(s.candidates("jobs").await, vec![adopted.token.clone()]);
    match s.one.renew(&adopted).await.expect("renew") {
        Renewed::Renewed(_) => {}
        Renewed::Lost(seen) => panic!("the adopted grant was lost: {seen:?}"),
    }
}

/// A store with no live session has nothing to withdraw (ephemeral znodes die with their
/// session) and opens none for it.
#[tokio::test]
async fn withdraw_without_a_session_opens_none() {
    let Some(s) = setup().await else { return };
    s.two.withdraw(&lease("jobs"), &candidate("b")).await.expect("withdraw");
    assert!(crate::state::lock(&s.two.inner.sessions).is_empty());
}
