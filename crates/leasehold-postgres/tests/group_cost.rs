//! What one member of a lease group with 1,000 shards (TTL 10 s) costs the server: statements
//! per second (every statement of the store's connections, counted by a proxy: the lock
//! session, the pool, the listener) and store calls per second by operation (core's
//! `CountingStore`, under the group's `RenewBatcher`), over a minute once every shard is owned.
//! A measurement, not a check:
//! `cargo test -p leasehold-postgres --test integration -- group_cost:: --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::SoleMember;
use leasehold_core::{CountingStore, Operation};
use leasehold_postgres::PostgresStore;

const SHARDS: u32 = 1000;
const TTL: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn one_member_with_a_thousand_shards() {
    let Some(backend) = common::server() else { return };
    let counter = common::StatementCounter::start(backend.upstream()).await;
    let url = common::with_option(&backend.url_via(counter.addr()), "sslmode=disable");
    let store = Arc::new(CountingStore::new(PostgresStore::connect(&url).await.unwrap()));
    let group_name = format!("cost-{:x}", leasehold_core::random_u64() & 0xffff_ffff);
    let member = SoleMember::lead_every_shard(store.clone(), &group_name, SHARDS, TTL, TTL * 6).await;
    let group = &member.group;
    tokio::time::sleep(TTL).await;

    let (calls_before, statements_before) = (store.counts(), counter.statements());
    tokio::time::sleep(WINDOW).await;
    let calls = store.counts().since(&calls_before);
    let statements = counter.statements() - statements_before;
    let per_second = |n: u64| n as f64 / WINDOW.as_secs_f64();
    println!(
        "postgres, one member, {SHARDS} shards, ttl {TTL:?}, over {WINDOW:?}: statements {:.2}/s; store calls \
         {:.2}/s: renew_many {:.2}/s, renew {:.2}/s, list {:.2}/s, inspect {:.2}/s, acquire {:.2}/s, failed {}; \
         {} shards owned at the end",
        per_second(statements),
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
