//! What one lease costs in memory while it waits for the store: the futures the engine keeps
//! alive per lease (a renewal in flight, a change stream) must stay small, or 10,000 leases in
//! one process cost more than 100 MB (a renewal waiting for the shared keepalive round used to
//! carry that round's etcd futures inline: about 14 KB each).

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, CandidateId, Grant, LeaseName, LeaseStore, Term};
use leasehold_etcd::EtcdStore;

/// The most a per-lease future may take (bytes): the engine keeps one renewal per leader in
/// flight, and 10,000 of them must fit in a few MB.
const LIMIT: usize = 1_024;

#[tokio::test]
async fn per_lease_futures_are_small() {
    let Some(url) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let store = EtcdStore::connect(&url).await.expect("store connects");
    let lease = LeaseName::new("footprint").expect("lease name");
    let holder = CandidateId::new("a").expect("candidate id");
    let grant = Grant {
        lease: lease.clone(),
        holder: holder.clone(),
        term: Term(7),
        ttl: Duration::from_secs(5),
        token: "7".into(),
    };
    // Made, never polled: only their size matters (a boxed future of async_trait).
    let renew = store.renew(&grant);
    let renew_size = std::mem::size_of_val(&*renew);
    let release = store.release(&grant);
    let release_size = std::mem::size_of_val(&*release);
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: holder.clone(),
        ttl: Duration::from_secs(5),
        takeover: None,
    };
    let acquire = store.acquire(&request);
    let acquire_size = std::mem::size_of_val(&*acquire);
    // A leader's change stream lives as long as its elector.
    let changes = store
        .changes(&lease, &holder)
        .await
        .expect("changes")
        .expect("a stream");
    let changes_size = std::mem::size_of_val(&*changes);
    println!("renew {renew_size} B, release {release_size} B, acquire {acquire_size} B, changes {changes_size} B");
    assert!(renew_size <= LIMIT, "a renewal in flight takes {renew_size} bytes");
    assert!(changes_size <= LIMIT, "a change stream takes {changes_size} bytes");
    assert!(
        acquire_size <= 4 * LIMIT,
        "an acquire in flight takes {acquire_size} bytes"
    );
}
