//! A queued candidate is granted on its predecessor's release with no request at all, valid
//! since its session's last confirmed keepalive send (`EtcdStore::grant_on_release`); a
//! hand-over or a break of the predecessor does not take that path.
//!
//! Requests are counted in round trips: the successor's store talks to etcd through a fault
//! proxy that delays every reply by `DELAY`, so an acquire that asks etcd anything takes at
//! least `DELAY`, and one that asks nothing answers at once.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Changes, EndReason, Grant, LeaseName, LeaseStore,
};
use leasehold_etcd::EtcdStore;

mod common;

const DELAY: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(10);

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("candidate id")
}

fn request(lease: &LeaseName, candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: id(candidate),
        ttl: TTL,
        takeover: None,
    }
}

/// A holder `a` on a direct connection; a successor `b` queued behind it, through a proxy, with
/// its change stream set on `a`'s key and its store watching the lease's announcements (as the
/// engine has them while it follows).
struct Queue {
    address: String,
    prefix: String,
    proxy: FaultProxy,
    a: EtcdStore,
    b: EtcdStore,
    lease: LeaseName,
    grant_a: Grant,
    announcements: Option<Announcements>,
    changes: Changes,
}

impl Queue {
    async fn new() -> Option<Queue> {
        let mut q = Queue::without_announcements().await?;
        q.announce().await;
        Some(q)
    }

    /// `b`'s store watches the lease's announcements from now on (the engine asks for them
    /// beside the change stream, so they may come after it).
    async fn announce(&mut self) {
        let announcements = self
            .b
            .announcements(&self.lease)
            .await
            .expect("announcements")
            .expect("etcd announces");
        self.announcements = Some(announcements);
    }

    async fn without_announcements() -> Option<Queue> {
        let common::HolderAndQueued {
            address,
            prefix,
            proxy,
            a,
            b,
            lease,
            grant_a,
        } = common::holder_and_queued("leasehold-on-release-tests", TTL).await?;
        let changes = b.changes(&lease, &id("b")).await.expect("changes").expect("a stream");
        Some(Queue {
            address,
            prefix,
            proxy,
            a,
            b,
            lease,
            grant_a,
            announcements: None,
            changes,
        })
    }

    /// Lets the change stream find `a` and watch it, then delays every reply to `b`; `then`
    /// ends `a`'s term. Returns when `b`'s stream yields.
    async fn woken_after(&mut self, then: impl std::future::Future<Output = ()>) {
        let mut changes = std::mem::replace(&mut self.changes, Box::pin(futures::stream::empty()));
        let woken = tokio::spawn(async move {
            let yielded = changes.next().await;
            (yielded, changes)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!woken.is_finished(), "the stream yielded before anything changed");
        self.proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
        then.await;
        let (yielded, changes) = tokio::time::timeout(DELAY * 10, woken)
            .await
            .expect("b is woken")
            .expect("the stream's task");
        assert_eq!(yielded, Some(()), "the stream ended instead of waking b");
        self.changes = changes;
    }

    /// `b`'s acquire, and how long it took.
    async fn acquire_b(&self) -> (Acquired, Duration) {
        let asked = Instant::now();
        let answer = self.b.acquire(&request(&self.lease, "b")).await.expect("b acquires");
        (answer, asked.elapsed())
    }

    async fn finish(self) {
        let mut raw = etcd_client::Client::connect([self.address.as_str()], None)
            .await
            .expect("raw client");
        raw.delete(
            format!("{}/", self.prefix),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("clean up");
    }
}

/// Released by its holder, `a`'s key goes with a marker; `b`, woken by it, is granted without a
/// single request (its acquire answers well within one delayed reply), valid since its last
/// keepalive (a TTL shorter than asked), and its grant's records follow: the history shows its
/// term and `a`'s release, and `inspect` shows `b` as holder. Without the path on release, the
/// acquire asks etcd (a grant transaction) and takes at least `DELAY`.
#[tokio::test]
async fn a_release_grants_the_next_candidate_with_no_request() {
    let Some(mut q) = Queue::new().await else { return };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    q.woken_after(async move { a.release(&grant_a).await.expect("a releases") })
        .await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b is first after a's release and must be granted: {answer:?}");
    };
    assert!(
        took < DELAY / 2,
        "b's acquire took {took:?}: it asked etcd (every reply is delayed {DELAY:?})"
    );
    assert!(grant.term > q.grant_a.term, "{grant:?}");
    assert!(
        grant.ttl < TTL && grant.ttl > TTL / 2,
        "valid since the last keepalive, not since the acquire: {grant:?}"
    );
    q.proxy.faults().heal();
    // The records follow the grant.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = q.a.inspect(&q.lease).await.expect("inspect");
        if seen
            .holder
            .as_ref()
            .is_some_and(|h| h.id == id("b") && h.term == grant.term)
        {
            break;
        }
        assert!(Instant::now() < deadline, "b's grant was never recorded: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let history = q.a.history(&q.lease, 10).await.expect("history");
    let terms: Vec<_> = history
        .iter()
        .map(|t| (t.term, t.holder.as_str(), t.ended.map(|e| e.1)))
        .collect();
    assert_eq!(
        terms,
        vec![
            (q.grant_a.term, "a", Some(EndReason::Released)),
            (grant.term, "b", None)
        ],
        "{history:?}"
    );
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// The same when `b`'s store began watching the announcements only after its change stream had
/// found and watched `a` (as the engine may have them).
#[tokio::test]
async fn a_release_grants_on_release_when_the_announcements_came_after_the_stream() {
    let Some(mut q) = Queue::without_announcements().await else {
        return;
    };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    let mut changes = std::mem::replace(&mut q.changes, Box::pin(futures::stream::empty()));
    let woken = tokio::spawn(async move {
        let yielded = changes.next().await;
        (yielded, changes)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    q.announce().await;
    q.changes = Box::pin(futures::stream::empty());
    q.proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
    a.release(&grant_a).await.expect("a releases");
    let (yielded, _changes) = tokio::time::timeout(DELAY * 10, woken)
        .await
        .expect("b is woken")
        .expect("the stream's task");
    assert_eq!(yielded, Some(()));
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b must be granted: {answer:?}");
    };
    assert!(took < DELAY / 2, "b's acquire took {took:?}: it asked etcd");
    assert!(grant.ttl < TTL, "{grant:?}");
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// A release right after a grant on release is sent only once the grant's records are written
/// (it takes two delayed replies, the records' and its own): the history shows the term started
/// and released, never an end without a start.
#[tokio::test]
async fn a_release_right_after_a_grant_on_release_follows_its_records() {
    let Some(mut q) = Queue::new().await else { return };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    q.woken_after(async move { a.release(&grant_a).await.expect("a releases") })
        .await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b must be granted: {answer:?}");
    };
    assert!(took < DELAY / 2, "b's acquire took {took:?}");
    let releasing = Instant::now();
    q.b.release(&grant).await.expect("b releases");
    // The records' answer (one delayed reply), then the release's (another).
    let took = releasing.elapsed();
    assert!(
        took >= DELAY * 3 / 2,
        "b's release took {took:?}: it did not wait for the records' write"
    );
    q.proxy.faults().heal();
    let history = q.a.history(&q.lease, 10).await.expect("history");
    let ours = history.iter().find(|t| t.term == grant.term);
    assert_eq!(
        ours.map(|t| (t.holder.as_str(), t.ended.map(|e| e.1))),
        Some(("b", Some(EndReason::Released))),
        "{history:?}"
    );
    q.finish().await;
}

/// Handed over to a third candidate, `a`'s key goes without a marker: `b`, woken all the same,
/// asks etcd (its acquire takes a delayed round trip at least) and is told Held by the
/// reservation.
#[tokio::test]
async fn a_hand_over_does_not_grant_on_release() {
    let Some(mut q) = Queue::new().await else { return };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    q.woken_after(async move { a.hand_over(&grant_a, &id("c")).await.expect("a hands over") })
        .await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Held(seen) = &answer else {
        panic!("a lease handed over to c must not go to b: {answer:?}");
    };
    assert!(
        seen.holder.as_ref().is_some_and(|h| h.id == id("c") && h.reserved),
        "{seen:?}"
    );
    assert!(took >= DELAY, "b's acquire asked etcd nothing ({took:?})");
    q.proxy.faults().heal();
    q.finish().await;
}

/// Broken by an operator, `a`'s key goes without a marker: `b` is granted by the ordinary path
/// (a transaction, valid from its own send: the TTL asked for), not on release.
#[tokio::test]
async fn a_break_does_not_grant_on_release() {
    let Some(mut q) = Queue::new().await else { return };
    let a = q.a.clone();
    q.woken_after(async move {
        a.break_lease(&LeaseName::new("jobs").expect("lease name"))
            .await
            .expect("break");
    })
    .await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b is first after the break and must be granted: {answer:?}");
    };
    assert_eq!(grant.ttl, TTL, "granted on release after a break: {grant:?}");
    assert!(took >= DELAY, "b's acquire asked etcd nothing ({took:?})");
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// With no announcement watch in `b`'s store at all, `b`'s stream, woken by `a`'s deletion,
/// finds `a`'s release marker (on its own watch of the predecessor, which also watches
/// `granted`, or by reading `granted` at the deletion's revision), and `b`'s acquire is granted
/// with no request, valid since its last keepalive. (Before, the stream waited a fixed 5 ms for
/// a marker on the announcements, and without them `b` took the ordinary path: a request at
/// least.) `b` asks a while after it is woken, so that its acquire's own time shows that it
/// sent nothing. Which of the two finds the marker is not observed here: since the stream watches
/// `granted` itself, the read at the deletion's revision no longer decides a release in this test
/// (it still decides everything else, e.g. `an_expiry_does_not_grant_on_release`).
#[tokio::test]
async fn a_release_grants_with_no_request_without_announcements() {
    let Some(mut q) = Queue::without_announcements().await else {
        return;
    };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    q.woken_after(async move { a.release(&grant_a).await.expect("a releases") })
        .await;
    // The read is one delayed reply; a whole second one of margin for a loaded machine.
    tokio::time::sleep(DELAY * 2).await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b is first after a's release and must be granted: {answer:?}");
    };
    assert!(
        took < DELAY / 2,
        "b's acquire took {took:?}: it asked etcd (every reply is delayed {DELAY:?})"
    );
    assert!(
        grant.ttl < TTL && grant.ttl > TTL / 2,
        "valid since the last keepalive: {grant:?}"
    );
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// The same, with `b` asking as soon as its stream wakes it (every reply to `b` is delayed): the
/// marker comes on the stream's own watch with the deletion, so the acquire is granted on
/// release (valid since the last keepalive: a TTL shorter than asked; the ordinary path's grant
/// has the whole TTL) at once, waiting for no read at the deletion's revision. Before the stream
/// watched `granted` too, the marker came only on the announcement watch (another stream) or by
/// that read: with no announcements, one delayed reply.
#[tokio::test]
async fn an_acquire_right_after_the_wake_is_granted_from_the_marker_on_the_stream() {
    let Some(mut q) = Queue::without_announcements().await else {
        return;
    };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    q.woken_after(async move { a.release(&grant_a).await.expect("a releases") })
        .await;
    let (answer, took) = q.acquire_b().await;
    let Acquired::Granted(grant) = answer else {
        panic!("b is first after a's release and must be granted: {answer:?}");
    };
    assert!(
        grant.ttl < TTL && grant.ttl > TTL / 2,
        "granted on release, valid since the last keepalive: {grant:?} (after {took:?})"
    );
    assert!(
        took < DELAY / 2,
        "b's acquire took {took:?}: it waited for a reply ({DELAY:?} each), not for the marker on its stream"
    );
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// `a`'s session expires (its store never renews; TTL 2 s): its key goes with no marker, and `b`,
/// woken by the deletion, is granted by the ordinary path (valid from its own request: the TTL
/// asked for), not on release, whether or not its store watches the announcements.
#[tokio::test]
async fn an_expiry_does_not_grant_on_release() {
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let prefix = format!("leasehold-on-release-tests/{}", leasehold_core::random_u64());
    let url = format!("{}/{prefix}", url.trim_end_matches('/'));
    let a = EtcdStore::connect(&url).await.expect("a connects");
    let b = EtcdStore::connect(&url).await.expect("b connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let short = AcquireRequest {
        ttl: Duration::from_secs(2),
        ..request(&lease, "a")
    };
    let Acquired::Granted(grant_a) = a.acquire(&short).await.expect("a acquires") else {
        panic!("a is first and must be granted");
    };
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b queues"),
        Acquired::Held(_)
    ));
    let _announcements = b.announcements(&lease).await.expect("announcements");
    let mut changes = b.changes(&lease, &id("b")).await.expect("changes").expect("a stream");
    let woken = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("b is woken by a's expiry");
    assert_eq!(woken, Some(()));
    let Acquired::Granted(grant) = b.acquire(&request(&lease, "b")).await.expect("b acquires") else {
        panic!("b is first after a's expiry and must be granted");
    };
    assert_eq!(grant.ttl, TTL, "granted on release after an expiry: {grant:?}");
    let history = b.history(&lease, 10).await.expect("history");
    let ended = history.iter().find(|t| t.term == grant_a.term).and_then(|t| t.ended);
    assert_eq!(ended.map(|e| e.1), Some(EndReason::Expired), "{history:?}");
    b.release(&grant).await.expect("b releases");
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
