//! A release wakes the candidate queued behind the holder within one notification: its change
//! stream yields on the deletion of its predecessor's key, without reading the queue first (the
//! grant's compare-and-set checks that no key is ahead). Counted in round trips by delaying
//! every reply to the waiting candidate's store by `DELAY` (a fault proxy): the watch event
//! arrives `DELAY` after the release; a look-up before yielding would add another `DELAY`.
//!
//! A predecessor that goes otherwise (withdrawn here) wakes it as soon as etcd shows that no
//! release marker came with the deletion: no timed wait for one.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore};
use leasehold_etcd::EtcdStore;

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
    // The engine takes the lease's announcements beside the stream while it follows: the release
    // marker comes on them.
    let _announcements = b.announcements(&lease).await.expect("announcements");
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

/// How long the store used to wait for a release marker after any deletion of the predecessor
/// (`MARKER_GRACE`): every wake-up that was not a release came at least this late.
const OLD_GRACE: Duration = Duration::from_millis(5);

/// Candidates `x1..x5` queued between the holder `a` and `b` leave one by one (`withdraw`): each
/// time `b`'s predecessor goes without a release marker, and `b`'s stream yields once etcd shows
/// that (the marker is not at the deletion's revision: one loopback read), not after a timed
/// wait for it. Timed from the withdraw's answer (etcd sends it and the deletion's event at
/// once): the fastest of five wake-ups is well under the old 5 ms wait, which the old code
/// waited after every one of them (measured with it: 9-13 ms from the withdraw's call).
#[tokio::test]
async fn a_withdraw_wakes_the_next_candidate_without_a_timed_wait() {
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let prefix = format!("leasehold-wakeup-tests/{}", leasehold_core::random_u64());
    let url = format!("{}/{prefix}", url.trim_end_matches('/'));
    let a = EtcdStore::connect(&url).await.expect("a connects");
    let b = EtcdStore::connect(&url).await.expect("b connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let Acquired::Granted(grant) = a.acquire(&request(&lease, "a")).await.expect("a acquires") else {
        panic!("a is first and must be granted");
    };
    let between = ["x1", "x2", "x3", "x4", "x5"];
    for x in between {
        assert!(matches!(
            a.acquire(&request(&lease, x)).await.expect("x queues"),
            Acquired::Held(_)
        ));
    }
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b queues"),
        Acquired::Held(_)
    ));
    let _announcements = b.announcements(&lease).await.expect("announcements");
    let mut changes = b
        .changes(&lease, &grant_holder("b"))
        .await
        .expect("changes")
        .expect("a stream");
    let (woken, mut wakes) = tokio::sync::mpsc::unbounded_channel();
    let stream = tokio::spawn(async move {
        while changes.next().await.is_some() {
            if woken.send(Instant::now()).is_err() {
                return;
            }
        }
    });
    let mut after = Vec::new();
    for x in between.iter().rev() {
        // The stream finds its predecessor (`x`) and watches it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(wakes.try_recv().is_err(), "the stream yielded before anything changed");
        a.withdraw(&lease, &grant_holder(x)).await.expect("x withdraws");
        let withdrawn = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(5), wakes.recv())
            .await
            .expect("b is woken")
            .expect("the stream goes on");
        after.push(at.saturating_duration_since(withdrawn));
    }
    stream.abort();
    println!("woken after each withdraw: {after:?}");
    let fastest = after.iter().min().copied().expect("five rounds");
    assert!(
        fastest < OLD_GRACE * 4 / 5,
        "b was woken {after:?} after its predecessor's withdraw: a timed wait for a marker?"
    );
    // `b` is not first (a holds): asked, it is told so.
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b asks"),
        Acquired::Held(_)
    ));
    a.release(&grant).await.expect("a releases");
    let mut raw = etcd_client::Client::connect(
        [url.trim_start_matches("etcd://").split('/').next().expect("host")],
        None,
    )
    .await
    .expect("raw client");
    raw.delete(
        format!("{prefix}/"),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("clean up");
}
