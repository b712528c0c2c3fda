//! A release wakes the candidate queued behind the holder within one notification: its change
//! stream yields on the deletion of its predecessor's key, without reading the queue first (the
//! grant's compare-and-set checks that no key is ahead). Counted in round trips by delaying
//! every reply to the waiting candidate's store by `DELAY` (a fault proxy): the watch event
//! arrives `DELAY` after the release; a look-up before yielding would add another `DELAY`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore};

mod common;

const DELAY: Duration = Duration::from_millis(600);
const TTL: Duration = Duration::from_secs(10);

fn request(lease: &LeaseName, candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(candidate).expect("candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

#[tokio::test]
async fn release_wakes_the_next_candidate_without_a_look_up() {
    let Some(common::HolderAndQueued {
        address,
        prefix,
        proxy,
        a,
        b,
        lease,
        grant_a: grant,
    }) = common::holder_and_queued("leasehold-wakeup-tests", TTL).await
    else {
        return;
    };
    proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
    let mut changes = b
        .changes(&lease, &grant_holder("b"))
        .await
        .expect("changes")
        .expect("a stream");
    let woken = tokio::spawn(async move {
        let yielded = changes.next().await;
        (Instant::now(), yielded)
    });
    // The stream finds its predecessor (a look-up and a watch, each a delayed reply) and waits.
    tokio::time::sleep(DELAY * 4).await;
    assert!(!woken.is_finished(), "the stream yielded before anything changed");
    let released = Instant::now();
    a.release(&grant).await.expect("a releases");
    let (at, yielded) = tokio::time::timeout(DELAY * 10, woken)
        .await
        .expect("b is woken")
        .expect("the stream's task");
    assert_eq!(yielded, Some(()), "the stream ended instead of waking b");
    let after = at - released;
    // One delayed message (the watch event); a look-up first would be a second one.
    assert!(
        after < DELAY * 3 / 2,
        "b was woken {after:?} after the release, more than one notification ({DELAY:?} each)"
    );
    proxy.faults().heal();
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b acquires"),
        Acquired::Granted(_)
    ));
    let mut raw = etcd_client::Client::connect([address.as_str()], None)
        .await
        .expect("raw client");
    raw.delete(
        format!("{prefix}/"),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("clean up");
}

fn grant_holder(id: &str) -> CandidateId {
    CandidateId::new(id).expect("candidate id")
}
