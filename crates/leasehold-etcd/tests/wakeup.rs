//! A release wakes the candidate queued behind the holder within one notification: its change
//! stream yields on the deletion of its predecessor's key, without reading the queue first (the
//! grant's compare-and-set checks that no key is ahead). Counted in round trips by delaying
//! every reply to the waiting candidate's store by `DELAY` (a fault proxy): the watch event
//! arrives `DELAY` after the release; a look-up before yielding would add another `DELAY`.
//!
//! A predecessor that goes otherwise (withdrawn here) wakes it at once too, with no turn: no
//! timed wait for a release marker and no read.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Change, LeaseName, LeaseStore};
use leasehold_etcd::EtcdStore;

use crate::common;

const DELAY: Duration = Duration::from_millis(1000);
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
    assert!(
        matches!(yielded, Some(Change::YourTurn(_))),
        "b is first after a's release: {yielded:?}"
    );
    let after = at - released;
    // One delayed message (the watch event); a look-up first would be a second one.
    assert!(
        after < DELAY * 7 / 4,
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

/// `x`, queued between the holder `a` and `b`, withdraws: its key goes with no release marker,
/// and `b`'s stream, every reply to which is delayed by `DELAY`, yields on the deletion's event
/// (one delayed message), not once the read that decides whether a marker came with it has
/// answered (a second one): that read does not hold up the stream (its keepalives and watches).
/// Asked then, `b` is told that `a` holds.
#[tokio::test]
async fn a_withdraw_wakes_the_next_candidate_before_the_marker_read_answers() {
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let address = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .expect("host")
        .to_string();
    let upstream = tokio::net::lookup_host(address.as_str())
        .await
        .expect("etcd address resolves")
        .next()
        .expect("an address");
    let proxy = leasehold_conformance::FaultProxy::start(upstream)
        .await
        .expect("proxy starts");
    let prefix = format!("leasehold-wakeup-tests/{}", leasehold_core::random_u64());
    let a = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("a connects");
    let b = EtcdStore::connect(&format!("etcd://{}/{prefix}", proxy.addr()))
        .await
        .expect("b connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let Acquired::Granted(grant) = a.acquire(&request(&lease, "a")).await.expect("a acquires") else {
        panic!("a is first and must be granted");
    };
    assert!(matches!(
        a.acquire(&request(&lease, "x")).await.expect("x queues"),
        Acquired::Held(_)
    ));
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
    let woken = tokio::spawn(async move {
        let yielded = changes.next().await;
        (Instant::now(), yielded, changes)
    });
    // The stream finds its predecessor (`x`) and watches it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
    assert!(!woken.is_finished(), "the stream yielded before anything changed");
    let withdrawn = Instant::now();
    a.withdraw(&lease, &grant_holder("x")).await.expect("x withdraws");
    let (at, yielded, _changes) = tokio::time::timeout(DELAY * 10, woken)
        .await
        .expect("b is woken")
        .expect("the stream's task");
    assert_eq!(yielded, Some(Change::Changed), "x's withdrawal is no turn for b");
    let after = at - withdrawn;
    println!("woken {after:?} after the withdraw, replies delayed {DELAY:?}");
    assert!(
        after < DELAY * 7 / 4,
        "b was woken {after:?} after x's withdraw: after a read ({DELAY:?} a reply)?"
    );
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b asks"),
        Acquired::Held(_)
    ));
    proxy.faults().heal();
    a.release(&grant).await.expect("a releases");
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

/// Candidates `x1..x10` queued between the holder `a` and `b` leave one by one (`withdraw`): each
/// time `b`'s predecessor goes without a release marker, and `b`'s stream yields on the deletion,
/// without a timed wait for a marker. Timed against the deletion's event on a watch of the test's
/// own, polled by the same (single-threaded) runtime as `b`'s stream: etcd sends both at once, so
/// neither etcd's write, the round trips nor the machine's load count; the old code's 5 ms wait
/// began after `b`'s event arrived (measured with it: 5.2-13 ms after the withdraw's answer).
/// The fastest of ten counts.
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
    let between: Vec<String> = (1..=10).map(|i| format!("x{i}")).collect();
    for x in &between {
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
    // The test's own watch on the queue's deletions, on a connection of its own.
    let mut raw = etcd_client::Client::connect(
        [url.trim_start_matches("etcd://").split('/').next().expect("host")],
        None,
    )
    .await
    .expect("raw client");
    let options = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_filters([etcd_client::WatchFilterType::NoPut]);
    let mut deletions = raw
        .watch(format!("{prefix}/jobs/c/"), Some(options))
        .await
        .expect("raw watch");
    let (deleted, mut deletes) = tokio::sync::mpsc::unbounded_channel();
    let deletions = tokio::spawn(async move {
        while let Ok(Some(resp)) = deletions.message().await {
            if !resp.events().is_empty() && deleted.send(Instant::now()).is_err() {
                return;
            }
        }
    });
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
    let mut after_answer = Vec::new();
    for x in between.iter().rev() {
        // The stream finds its predecessor (`x`) and watches it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(wakes.try_recv().is_err(), "the stream yielded before anything changed");
        a.withdraw(&lease, &grant_holder(x)).await.expect("x withdraws");
        let answered = Instant::now();
        let at = tokio::time::timeout(Duration::from_secs(5), wakes.recv())
            .await
            .expect("b is woken")
            .expect("the stream goes on");
        let event = tokio::time::timeout(Duration::from_secs(5), deletes.recv())
            .await
            .expect("the test's watch sees the deletion")
            .expect("the test's watch goes on");
        after.push(at.saturating_duration_since(event));
        after_answer.push(at.saturating_duration_since(answered));
    }
    stream.abort();
    deletions.abort();
    println!("woken after the deletion's event: {after:?}; after the withdraw's answer: {after_answer:?}");
    let fastest = after.iter().min().copied().expect("ten rounds");
    assert!(
        fastest < OLD_GRACE * 4 / 5,
        "b was woken {after:?} after its predecessor's deletion: a timed wait for a marker?"
    );
    // `b` is not first (a holds): asked, it is told so.
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b asks"),
        Acquired::Held(_)
    ));
    a.release(&grant).await.expect("a releases");
    raw.delete(
        format!("{prefix}/"),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("clean up");
}
