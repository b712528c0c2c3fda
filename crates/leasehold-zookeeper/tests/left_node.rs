//! A release whose requests never reach ZooKeeper, while the candidate's session survives (the
//! client reconnects within the session timeout) and the store makes no request at all: the
//! client's own pings keep the session, and the znode on it, alive. ZooKeeper's own: the
//! contract (a failed release, hand-over or withdrawal never keeps the lease, nor the queue
//! behind it, while the store leads other leases) is the shared scenario
//! `a_failed_release_does_not_keep_the_lease`, on every backend.
//!
//! The requests fail through a fault proxy in front of the candidate's store: requests are held
//! back, then the proxy's connections are reset, so that the held-back request is never
//! forwarded; the proxy heals and the client reconnects to the same session.
//! Against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, FaultProxy, require_server};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, Renewed, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(2);
const DELAY: Duration = Duration::from_millis(300);

fn lease(name: &str) -> LeaseName {
    LeaseName::new(name).expect("valid lease name")
}

fn request(name: &str, id: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease(name),
        candidate: CandidateId::new(id).expect("valid candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

/// The candidate's acquire, asked again after an error as the engine does (the first request
/// after the proxy's reset may fail on the broken connection).
async fn acquire(store: &ZookeeperStore, name: &str, id: &str) -> Acquired {
    let mut attempt = 0;
    loop {
        match store.acquire(&request(name, id)).await {
            Ok(answer) => return answer,
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, "acquire failed; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{id}'s acquire keeps failing: {e}"),
        }
    }
}

/// The znodes queued for `jobs`, in queue order.
async fn queued(raw: &zk::Client, chroot: &str) -> Vec<String> {
    let mut names = raw
        .list_children(&format!("{chroot}/jobs/candidates"))
        .await
        .expect("list candidates");
    names.sort_by_key(|n| n.rsplit_once('-').map(|(_, seq)| seq.to_string()));
    names
}

/// Fails `operation` of the store behind `proxy`: its requests are held back `DELAY` in the
/// proxy, and after `DELAY / 2` the proxy's connections are reset, so that the held-back request
/// never reaches ZooKeeper; then the proxy heals (the client reconnects to its session).
async fn fail<T: Send + 'static>(
    proxy: &FaultProxy,
    operation: impl std::future::Future<Output = leasehold_core::Result<T>> + Send + 'static,
) -> leasehold_core::Result<T> {
    proxy.faults().set(Direction::Request, Fault::Delay(DELAY));
    let running = tokio::spawn(operation);
    tokio::time::sleep(DELAY / 2).await;
    proxy.faults().set(Direction::Request, Fault::Reset);
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the failed operation answers")
        .expect("the operation's task");
    proxy.faults().heal();
    outcome
}

/// The holder `h` of `jobs` also holds `other` (same TTL, so the same session of `h`'s store),
/// and its release of `jobs` fails; then `h`'s store makes no request at all (`other` is held,
/// not renewed: its engine is between renewals, or the store has nothing else of that TTL). The
/// client pings the session by itself, so the left znode would stay while the store keeps the
/// session: the store sends the deletion again once the client has reconnected to the session,
/// and `c`, queued next on another store, is granted within 3 TTLs. Meanwhile `h`'s own store
/// never shows the left znode as holder (nothing of `h`'s may adopt it again).
#[tokio::test]
async fn a_granted_znode_left_by_a_failed_release_goes_while_the_store_is_idle() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let address = server
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
    let chroot = format!("/leasehold-left-node-{:016x}", random_u64());
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&address)
        .await
        .expect("raw client");
    let h = ZookeeperStore::connect(&format!("zk://{}{chroot}", proxy.addr()))
        .await
        .expect("h connects");
    let direct = format!("zk://{address}{chroot}");
    let c = ZookeeperStore::connect(&direct).await.expect("c connects");

    let Acquired::Granted(grant_other) = acquire(&h, "other", "h").await else {
        panic!("h is first for other and must be granted");
    };
    let Acquired::Granted(grant_h) = acquire(&h, "jobs", "h").await else {
        panic!("h is first for jobs and must be granted");
    };
    let h_node = queued(&raw, &chroot).await.last().cloned().expect("h's znode");
    assert!(matches!(acquire(&c, "jobs", "c").await, Acquired::Held(_)));
    let h_session = {
        let (_, stat) = raw
            .get_data(&format!("{chroot}/jobs/candidates/{h_node}"))
            .await
            .expect("h's znode");
        stat.ephemeral_owner
    };

    let failed = {
        let (h, grant_h) = (h.clone(), grant_h.clone());
        fail(&proxy, async move { h.release(&grant_h).await }).await
    };
    assert!(failed.is_err(), "the release was not failed: {failed:?}");
    assert!(
        queued(&raw, &chroot).await.contains(&h_node),
        "h's znode {h_node} is left as it was"
    );
    // h's own store never shows its left znode as holder (nothing of h's may adopt it again).
    let seen_by_h = h.inspect(&lease("jobs")).await;
    assert!(
        seen_by_h
            .as_ref()
            .map_or(true, |seen| seen.holder.as_ref().is_none_or(|x| x.id.as_str() != "h")),
        "{seen_by_h:?}"
    );

    // The lease is free within a TTL of the failure, and a margin for the server's expiry.
    let deadline = Instant::now() + TTL * 3;
    let granted = loop {
        match acquire(&c, "jobs", "c").await {
            Acquired::Granted(g) => break Ok(g),
            Acquired::Held(seen) if Instant::now() > deadline => break Err(seen),
            Acquired::Held(seen) => {
                let holder = seen.holder.as_ref().map(|x| x.id.to_string());
                assert!(
                    holder.is_none() || holder.as_deref() == Some("h") || holder.as_deref() == Some("a"),
                    "{seen:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let left_now = queued(&raw, &chroot).await;
    // Also after idling: the client pinged the session meanwhile.
    let h_session_now = h.renew(&grant_other).await.map(|r| matches!(r, Renewed::Renewed(_)));
    if let Ok(g) = &granted {
        // No two holders: h's left znode is gone, and c heads the queue.
        assert!(
            !left_now.contains(&h_node),
            "c granted beside h's {h_node}: {left_now:?}"
        );
        assert_eq!(left_now.first(), Some(&g.token), "{left_now:?}");
        let seen = c.inspect(&lease("jobs")).await.expect("inspect");
        assert_eq!(
            seen.holder.map(|x| (x.id.to_string(), x.term)),
            Some(("c".into(), g.term))
        );
        c.release(g).await.expect("c releases");
    }
    let grant_c = granted.unwrap_or_else(|seen| {
        panic!(
            "c is still answered Held {:?} after h's release of its znode {h_node} failed: the left znode (queue now {left_now:?}) lives on h's session {h_session:#x}, kept alive by its client's pings; {seen:?}",
            TTL * 3,
        )
    });
    assert!(
        matches!(h_session_now, Ok(true)),
        "h's session survived the failure: {h_session_now:?}"
    );
    assert!(grant_c.term > grant_h.term, "{grant_c:?}");
}
