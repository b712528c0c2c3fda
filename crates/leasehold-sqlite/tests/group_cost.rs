//! What one member of a lease group with 1,000 shards (TTL 10 s) costs its SQLite file: store
//! calls per second by operation (core's `CountingStore`, under the group's `RenewBatcher`; a
//! `renew_many` of up to 256 grants is one write transaction), over a minute once every shard is
//! owned. A measurement, not a check:
//! `cargo test -p leasehold-sqlite --test integration -- group_cost:: --ignored --nocapture`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::SoleMember;
use leasehold_core::{CountingStore, Operation};
use leasehold_sqlite::SqliteStore;

const SHARDS: u32 = 1000;
const TTL: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn one_member_with_a_thousand_shards() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CountingStore::new(
        SqliteStore::open(dir.path().join("leases.db")).await.unwrap(),
    ));
    let member = SoleMember::lead_every_shard(store.clone(), "cost", SHARDS, TTL, TTL * 6).await;
    let group = &member.group;
    tokio::time::sleep(TTL).await;

    let before = store.counts();
    tokio::time::sleep(WINDOW).await;
    let calls = store.counts().since(&before);
    let per_second = |n: u64| n as f64 / WINDOW.as_secs_f64();
    // Writes: one transaction per renew_many of up to 256 grants, and per other write unless
    // several share one.
    println!(
        "sqlite, one member, {SHARDS} shards, ttl {TTL:?}, over {WINDOW:?}: store calls {:.2}/s: renew_many \
         {:.2}/s, renew {:.2}/s, list {:.2}/s, inspect {:.2}/s, acquire {:.2}/s, failed {}; {} shards owned \
         at the end",
        per_second(calls.total()),
        per_second(calls.get(Operation::RenewMany)),
        per_second(calls.get(Operation::Renew)),
        per_second(calls.get(Operation::List)),
        per_second(calls.get(Operation::Inspect)),
        per_second(calls.get(Operation::Acquire)),
        calls.failed,
        group.owned().len(),
    );
    member.leave().await;
}
