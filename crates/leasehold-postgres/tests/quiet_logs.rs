//! The store's own waits are not "slow statements": a follower's queue watcher waits in
//! `pg_advisory_lock` for as long as the followers before it (by design), and sqlx logged each
//! such wait over a second as a WARN `slow statement` (target `sqlx::query`), 8 lines in a 22 s
//! run of a three-replica service. The queue connection now logs its slow statements at DEBUG;
//! the application's own connections keep sqlx's default. Skips (loudly) when the server is down.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{Elector, LeaseName, LeaseStore};
use leasehold_postgres::PostgresStore;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Counts WARN (and worse) events of target `sqlx::query`.
struct CountWarnings(Arc<AtomicUsize>);

impl Subscriber for CountWarnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query" && *metadata.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if self.enabled(event.metadata()) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str) -> Elector {
    Elector::builder(store, lease.as_str())
        .ttl(Duration::from_secs(10))
        .candidate_id(id)
        .build()
        .expect("valid timing")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_waiting_in_the_queue_logs_no_slow_statement_warning() {
    let Some(pg) = common::server() else { return };
    let warnings = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::set_global_default(CountWarnings(warnings.clone())).expect("the only subscriber");
    let lease = common::lease("quiet");
    let connect = || async { Arc::new(PostgresStore::connect(&pg.url).await.unwrap()) as Arc<dyn LeaseStore> };
    let first = elector(connect().await, &lease, "a").campaign().await.unwrap();
    // Two followers, each a process of its own: the second waits in pg_advisory_lock behind the
    // first's queue watcher for as long as the first follows.
    let mut campaigns = Vec::new();
    for id in ["b", "c"] {
        let e = elector(connect().await, &lease, id);
        campaigns.push(tokio::spawn(async move { e.campaign().await }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    first.resign().await;
    let second = tokio::time::timeout(Duration::from_secs(5), campaigns.remove(0))
        .await
        .expect("b is elected")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    second.resign().await;
    let third = tokio::time::timeout(Duration::from_secs(5), campaigns.remove(0))
        .await
        .expect("c is elected")
        .unwrap()
        .unwrap();
    third.resign().await;
    assert_eq!(
        warnings.load(Ordering::SeqCst),
        0,
        "sqlx warned about the store's own waits as slow statements"
    );
}
