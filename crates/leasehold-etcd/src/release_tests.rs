//! The successor's decision on its predecessor's deletion (`Waiter::decide`), by its third way:
//! the serializable read of `granted` at the deletion's revision. The release marker comes on the
//! change stream's own watch of `granted` with the deletion, so `tests/on_release.rs` never sees
//! the read decide a release; here the stream does not see the marker (the test hook
//! `changes::HIDDEN_MARKERS`) and the store has no announcement watch, so only the read can find
//! it.
//!
//! Round trips are counted as in `tests/on_release.rs`: the successor's store talks to etcd
//! through a fault proxy that delays every reply by `DELAY`, so an acquire that asks etcd anything
//! takes at least `DELAY`, and one that asks nothing answers at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, FaultProxy, require_server};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore};

use crate::EtcdStore;
use crate::changes::HIDDEN_MARKERS;
use crate::record::Keys;

const TTL: Duration = Duration::from_secs(10);
const DELAY: Duration = Duration::from_millis(300);

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

/// How many release markers in `granted` the change streams did not see (see `HIDDEN_MARKERS`).
fn hidden(granted: &str) -> Option<usize> {
    let hidden = HIDDEN_MARKERS.lock().expect("hidden markers lock");
    hidden
        .iter()
        .find(|(key, _)| key.as_slice() == granted.as_bytes())
        .map(|(_, n)| *n)
}

/// `b`, queued behind the holder `a` and woken by `a`'s release, with its change stream blind to
/// the release marker on its own watch and no announcement watch in its store: the read of
/// `granted` at the deletion's revision finds the marker, and `b`'s acquire is granted on release
/// with no request of its own (it answers well within one delayed reply), valid since its last
/// keepalive (a TTL shorter than asked; the ordinary path's grant has the whole TTL). With the
/// read answering "no", `b` takes the ordinary path: a request at least, and the whole TTL.
#[tokio::test]
async fn the_read_at_the_deletions_revision_alone_grants_on_release() {
    let Some(url) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let address = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .expect("host")
        .to_string();
    let upstream: SocketAddr = tokio::net::lookup_host(address.as_str())
        .await
        .expect("etcd address resolves")
        .next()
        .expect("an address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let prefix = format!("leasehold-release-tests/{}", leasehold_core::random_u64());
    let a = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("a connects");
    let b = EtcdStore::connect(&format!("etcd://{}/{prefix}", proxy.addr()))
        .await
        .expect("b connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let granted = Keys::new(&b.inner.config.prefix, &lease).granted();
    HIDDEN_MARKERS
        .lock()
        .expect("hidden markers lock")
        .push((granted.clone().into_bytes(), 0));

    let Acquired::Granted(grant_a) = a.acquire(&request(&lease, "a")).await.expect("a acquires") else {
        panic!("a is first and must be granted");
    };
    assert!(matches!(
        b.acquire(&request(&lease, "b")).await.expect("b queues"),
        Acquired::Held(_)
    ));
    let mut changes = b.changes(&lease, &id("b")).await.expect("changes").expect("a stream");
    let woken = tokio::spawn(async move {
        let yielded = changes.next().await;
        (yielded, changes)
    });
    // The stream finds `a` and watches it (and `granted`).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!woken.is_finished(), "the stream yielded before anything changed");
    proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
    a.release(&grant_a).await.expect("a releases");
    let (yielded, _changes) = tokio::time::timeout(DELAY * 10, woken)
        .await
        .expect("b is woken")
        .expect("the stream's task");
    assert_eq!(yielded, Some(()), "the stream ended instead of waking b");
    // The read is one delayed reply; a whole second one of margin for a loaded machine.
    tokio::time::sleep(DELAY * 2).await;
    let asked = Instant::now();
    let answer = b.acquire(&request(&lease, "b")).await.expect("b acquires");
    let took = asked.elapsed();
    proxy.faults().heal();
    let hidden = hidden(&granted);
    let mut raw = etcd_client::Client::connect([address.as_str()], None)
        .await
        .expect("raw client");
    let cleanup = |raw: &mut etcd_client::Client| {
        let mut raw = raw.clone();
        let prefix = prefix.clone();
        async move {
            let _ = raw
                .delete(
                    format!("{prefix}/"),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                )
                .await;
        }
    };
    let Acquired::Granted(grant) = answer else {
        cleanup(&mut raw).await;
        panic!("b is first after a's release and must be granted: {answer:?}");
    };
    assert!(
        hidden.is_some_and(|n| n > 0),
        "the marker never came on b's stream, so it did not show that the stream missed it ({hidden:?})"
    );
    assert!(grant.term > grant_a.term, "{grant:?}");
    assert!(
        grant.ttl < TTL && grant.ttl > TTL / 2,
        "granted by the ordinary path, not on release (valid since the last keepalive): {grant:?} after {took:?}"
    );
    assert!(
        took < DELAY / 2,
        "b's acquire took {took:?}: it asked etcd (every reply is delayed {DELAY:?})"
    );
    b.release(&grant).await.expect("b releases");
    cleanup(&mut raw).await;
}
