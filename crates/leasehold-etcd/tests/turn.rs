//! A queued candidate's change stream tells it its turn on its predecessor's release, with no
//! request at all, valid from its session's last confirmed keepalive send (`Change::YourTurn`);
//! its first renewal confirms it and writes the term's records. A hand-over, a break or an
//! expiry of the predecessor is no turn: the stream only says something changed.
//!
//! Requests are counted in round trips: the successor's store talks to etcd through a fault
//! proxy that delays every reply by `DELAY`, so a stream that asks etcd anything before it
//! answers takes at least `DELAY` more than the watch event itself.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Change, Changes, EndReason, Grant, LeaseName, LeaseStore,
    Renewed, Turn,
};
use leasehold_etcd::EtcdStore;

use crate::common;

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
        } = common::holder_and_queued("leasehold-turn-tests", TTL).await?;
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
    /// ends `a`'s term. Returns what `b`'s stream said, and how long after `then` began.
    async fn woken_after(&mut self, then: impl std::future::Future<Output = ()>) -> (Change, Duration) {
        let mut changes = std::mem::replace(&mut self.changes, Box::pin(futures::stream::empty()));
        let woken = tokio::spawn(async move {
            let yielded = changes.next().await;
            (yielded, changes)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!woken.is_finished(), "the stream yielded before anything changed");
        self.proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
        let began = Instant::now();
        then.await;
        let (yielded, changes) = tokio::time::timeout(DELAY * 10, woken)
            .await
            .expect("b is woken")
            .expect("the stream's task");
        let took = began.elapsed();
        self.changes = changes;
        (yielded.expect("the stream ended instead of waking b"), took)
    }

    /// `b`'s turn after `a`'s release, checked: `b`'s term, the TTL asked for, valid from before
    /// the release (its last keepalive), told with no request of its own (the watch event is
    /// one delayed reply; a read or a grant would be a second).
    async fn turn_after_release(&mut self) -> Grant {
        let (a, grant_a) = (self.a.clone(), self.grant_a.clone());
        let released = std::time::Instant::now();
        let (change, took) = self
            .woken_after(async move { a.release(&grant_a).await.expect("a releases") })
            .await;
        let Change::YourTurn(Turn { grant, valid_from }) = change else {
            panic!("b is first after a's release and must be told its turn: {change:?}");
        };
        assert!(
            took < DELAY * 2,
            "the turn took {took:?}: the stream asked etcd (replies delayed {DELAY:?})"
        );
        assert_eq!((grant.holder.as_str(), grant.ttl), ("b", TTL), "{grant:?}");
        assert!(grant.term > self.grant_a.term, "{grant:?}");
        assert!(
            valid_from < released,
            "valid from the last keepalive, before the release"
        );
        assert!(
            released - valid_from < TTL,
            "valid from too long ago: {:?}",
            released - valid_from
        );
        grant
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
async fn a_release_tells_the_next_candidate_its_turn_and_its_renewal_confirms_it() {
    let Some(mut q) = Queue::new().await else { return };
    let grant = q.turn_after_release().await;
    q.proxy.faults().heal();
    // The engine's confirmation: a renewal, which writes the term's records.
    let renewed = q.b.renew(&grant).await.expect("b renews");
    assert!(matches!(renewed, Renewed::Renewed(_)), "{renewed:?}");
    let seen = q.a.inspect(&q.lease).await.expect("inspect");
    assert!(
        seen.holder
            .as_ref()
            .is_some_and(|h| h.id == id("b") && h.term == grant.term),
        "{seen:?}"
    );
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

/// With no announcement watch in `b`'s store, the marker on the stream's own watch of its
/// predecessor (which also watches `granted`) makes the turn.
#[tokio::test]
async fn a_turn_is_told_without_announcements() {
    let Some(mut q) = Queue::without_announcements().await else {
        return;
    };
    let grant = q.turn_after_release().await;
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// Released right after its turn, before any renewal: the release writes the turn's records
/// first, so the history shows the term started and released, never an end without a start.
#[tokio::test]
async fn a_release_right_after_a_turn_writes_its_records_first() {
    let Some(mut q) = Queue::new().await else { return };
    let grant = q.turn_after_release().await;
    q.proxy.faults().heal();
    q.b.release(&grant).await.expect("b releases");
    let history = q.a.history(&q.lease, 10).await.expect("history");
    let ours = history.iter().find(|t| t.term == grant.term);
    assert_eq!(
        ours.map(|t| (t.holder.as_str(), t.ended.map(|e| e.1))),
        Some(("b", Some(EndReason::Released))),
        "{history:?}"
    );
    q.finish().await;
}

/// Handed over to a third candidate, `a`'s key goes without a marker: no turn for `b`, whose
/// acquire is told Held by the reservation.
#[tokio::test]
async fn a_hand_over_is_no_turn() {
    let Some(mut q) = Queue::new().await else { return };
    let (a, grant_a) = (q.a.clone(), q.grant_a.clone());
    let (change, _) = q
        .woken_after(async move { a.hand_over(&grant_a, &id("c")).await.expect("a hands over") })
        .await;
    assert_eq!(change, Change::Changed);
    q.proxy.faults().heal();
    let answer = q.b.acquire(&request(&q.lease, "b")).await.expect("b acquires");
    let Acquired::Held(seen) = &answer else {
        panic!("a lease handed over to c must not go to b: {answer:?}");
    };
    assert!(
        seen.holder.as_ref().is_some_and(|h| h.id == id("c") && h.reserved),
        "{seen:?}"
    );
    q.finish().await;
}

/// Broken by an operator, `a`'s key goes without a marker: no turn; `b` is granted by the
/// ordinary path.
#[tokio::test]
async fn a_break_is_no_turn() {
    let Some(mut q) = Queue::new().await else { return };
    let a = q.a.clone();
    let (change, _) = q
        .woken_after(async move {
            a.break_lease(&LeaseName::new("jobs").expect("lease name"))
                .await
                .expect("break");
        })
        .await;
    assert_eq!(change, Change::Changed);
    q.proxy.faults().heal();
    let answer = q.b.acquire(&request(&q.lease, "b")).await.expect("b acquires");
    let Acquired::Granted(grant) = answer else {
        panic!("b is first after the break and must be granted: {answer:?}");
    };
    q.b.release(&grant).await.expect("b releases");
    q.finish().await;
}

/// `a`'s session expires (its store never renews; TTL 2 s): its key goes with no marker, and
/// `b`'s stream says only that something changed, whether or not its store watches the
/// announcements; its acquire is granted by the ordinary path.
#[tokio::test]
async fn an_expiry_is_no_turn() {
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let prefix = format!("leasehold-turn-tests/{}", leasehold_core::random_u64());
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
    assert_eq!(woken, Some(Change::Changed));
    let Acquired::Granted(grant) = b.acquire(&request(&lease, "b")).await.expect("b acquires") else {
        panic!("b is first after a's expiry and must be granted");
    };
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
