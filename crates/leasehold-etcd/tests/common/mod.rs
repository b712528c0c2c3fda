//! Set-up shared by the tests that count round trips to a queued candidate's store.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_conformance::{FaultProxy, require_server};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Grant, LeaseName, LeaseStore};
use leasehold_etcd::EtcdStore;

/// A holder `a` of lease `jobs` on a direct connection, and `b` queued behind it through a
/// fault proxy, both under a fresh prefix.
pub(crate) struct HolderAndQueued {
    pub(crate) address: String,
    pub(crate) prefix: String,
    pub(crate) proxy: FaultProxy,
    pub(crate) a: EtcdStore,
    pub(crate) b: EtcdStore,
    pub(crate) lease: LeaseName,
    pub(crate) grant_a: Grant,
}

pub(crate) fn request(lease: &LeaseName, candidate: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(candidate).expect("candidate id"),
        ttl,
        takeover: None,
    }
}

/// `None` when no etcd is configured (the test is skipped).
pub(crate) async fn holder_and_queued(tests: &str, ttl: Duration) -> Option<HolderAndQueued> {
    let url = require_server("etcd", "LEASEHOLD_ETCD_URL")?;
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
    let prefix = format!("{tests}/{}", leasehold_core::random_u64());
    let a = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("a connects");
    let b = EtcdStore::connect(&format!("etcd://{}/{prefix}", proxy.addr()))
        .await
        .expect("b connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let Acquired::Granted(grant_a) = a.acquire(&request(&lease, "a", ttl)).await.expect("a acquires") else {
        panic!("a is first and must be granted");
    };
    assert!(matches!(
        b.acquire(&request(&lease, "b", ttl)).await.expect("b queues"),
        Acquired::Held(_)
    ));
    Some(HolderAndQueued {
        address,
        prefix,
        proxy,
        a,
        b,
        lease,
        grant_a,
    })
}
