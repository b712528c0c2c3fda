//! The store-side queue: a release wakes only the candidate at the head of the queue (not every
//! follower), in the order the stores queued, and the end of a holder's session (which nothing
//! notifies) wakes the head too. Followers here poll only every 10 s (`retry_every` = TTL), so
//! whatever happens within a second is a wake-up, not a poll. Each test skips (loudly) when the
//! server is down.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{CountingStore, Elector, Leader, LeaseName, LeaseStore, Operation};
use leasehold_postgres::PostgresStore;
use tokio::sync::mpsc;

use common::{lock_holder, server};

const TTL: Duration = Duration::from_secs(10);

fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str) -> Elector {
    Elector::builder(store, lease.as_str())
        .ttl(TTL)
        .retry_every(TTL)
        .jitter(0.0)
        .candidate_id(id)
        .build()
        .expect("valid timing")
}

/// How many sessions are in `lease`'s queue (hold its queue key or wait for it): this test's
/// followers' watchers only. (Counting every `leasehold-queue` session of the server, as before,
/// also counted the watchers of the other tests running beside this one, which come and go: the
/// wait below then ended before this test's watcher had queued, or never.)
async fn queued(conn: &mut sqlx::PgConnection, store: &PostgresStore, lease: &LeaseName) -> i64 {
    // The queue key of a lease (the store's `queue_key`): another advisory key than the lease's.
    let key = leasehold_postgres::lock_key(store.config().schema(), &format!("{lease}\u{0}queue"));
    sqlx::query_scalar(
        "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
         AND classid = ((($1::int8) >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(key)
    .fetch_one(conn)
    .await
    .expect("pg_locks is readable")
}

/// Whether the holder's store took `lease`'s lock again on a new session (not `ended`): the row
/// names that session, and it holds the lock.
async fn relocked(conn: &mut sqlx::PgConnection, holder: &PostgresStore, lease: &LeaseName, ended: i32) -> bool {
    let row: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT lock_pid FROM \"{}\".leases WHERE name = $1",
        holder.config().schema()
    )))
    .bind(lease.as_str())
    .fetch_optional(&mut *conn)
    .await
    .expect("the lease row is readable")
    .flatten();
    match row {
        Some(pid) if pid != ended => lock_holder(conn, holder.lock_key(lease)).await == Some(pid),
        _ => false,
    }
}

async fn wait_until_queued(conn: &mut sqlx::PgConnection, store: &PostgresStore, lease: &LeaseName, at_least: i64) {
    let started = Instant::now();
    while queued(conn, store, lease).await < at_least {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the followers' queue watchers never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The head then waits on the lease's lock; give it the instant it takes.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Four followers, each on a store of its own (as four processes), queue behind the leader in
/// the order they came. A release wakes one of them: the first; the others make no request.
/// Then the next release wakes the second. (Before the queue, each release woke all four: four
/// acquires.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_head_of_the_queue_in_order() {
    let Some(pg) = server() else { return };
    let lease = common::lease("queue");
    let mut raw = pg.raw().await;
    let leader_store = Arc::new(PostgresStore::connect(&pg.url).await.unwrap());
    let first = elector(leader_store.clone(), &lease, "leader")
        .campaign()
        .await
        .expect("the leader is elected");

    let (tx, mut elected) = mpsc::unbounded_channel::<(usize, Leader)>();
    let mut counts = Vec::new();
    let mut campaigns = Vec::new();
    for i in 0..4 {
        let store = Arc::new(CountingStore::new(PostgresStore::connect(&pg.url).await.unwrap()));
        counts.push(store.clone());
        let e = elector(store, &lease, &format!("f{i}"));
        let tx = tx.clone();
        campaigns.push(tokio::spawn(async move {
            if let Ok(leader) = e.campaign().await {
                let _ = tx.send((i, leader));
            }
        }));
        // One at a time, so that the order of the queue is known.
        wait_until_queued(&mut raw, &leader_store, &lease, i64::try_from(i).unwrap() + 1).await;
    }
    let acquires = |counts: &[Arc<CountingStore<PostgresStore>>]| -> Vec<u64> {
        counts.iter().map(|c| c.counts().get(Operation::Acquire)).collect()
    };
    let settled = acquires(&counts);
    assert!(settled.iter().all(|&n| n == 1), "each follower asked once: {settled:?}");

    let released = Instant::now();
    first.resign().await;
    let (who, second) = tokio::time::timeout(Duration::from_secs(2), elected.recv())
        .await
        .expect("a follower is elected within a second of the release, long before any poll")
        .expect("a campaign");
    eprintln!("f{who} elected {:?} after the release", released.elapsed());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = acquires(&counts);
    assert_eq!(who, 0, "the first in the queue is elected: {after:?}");
    assert_eq!(after, vec![2, 1, 1, 1], "only the head of the queue asked again");

    second.resign().await;
    let (who, third) = tokio::time::timeout(Duration::from_secs(2), elected.recv())
        .await
        .expect("the next follower is elected")
        .expect("a campaign");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = acquires(&counts);
    assert_eq!(who, 1, "the second in the queue is next: {after:?}");
    assert_eq!(after, vec![2, 2, 1, 1], "only the new head asked again");
    third.resign().await;
    for campaign in campaigns {
        campaign.abort();
    }
}

/// The holder's lock session ends (`pg_terminate_backend`, as a crash or the server's
/// `idle_session_timeout` would end it): the follower at the head of the queue is woken at once
/// and reads the lease (which is orphaned until the holder's store takes the lock again at its
/// next renewal). Without the queue watcher it would not look before its next poll, 10 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_the_holders_session_wakes_the_head() {
    let Some(pg) = server() else { return };
    let lease = common::lease("session-end");
    let mut raw = pg.raw().await;
    let holder = Arc::new(PostgresStore::connect(&pg.url).await.unwrap());
    let key = holder.lock_key(&lease);
    let leader = elector(holder.clone(), &lease, "holder")
        .campaign()
        .await
        .expect("elected");
    let follower = Arc::new(CountingStore::new(PostgresStore::connect(&pg.url).await.unwrap()));
    let e = elector(follower.clone(), &lease, "follower");
    let campaign = tokio::spawn(async move { e.campaign().await });
    wait_until_queued(&mut raw, &holder, &lease, 1).await;
    assert_eq!(follower.counts().get(Operation::Acquire), 1);

    let pid = lock_holder(&mut raw, key)
        .await
        .expect("the holder's session holds the lock");
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(ended);
    let terminated = Instant::now();
    while follower.counts().get(Operation::Acquire) < 2 {
        assert!(
            terminated.elapsed() < Duration::from_secs(2),
            "the end of the holder's session did not wake the follower"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("follower woken {:?} after the session ended", terminated.elapsed());
    // The holder's next renewal takes the lock again: it still leads, and nobody else was elected.
    // (The lock alone is not enough: the follower's acquire and the queue watcher hold it for an
    // instant too, and a release before the holder has a session again fails, to be resent.)
    while !relocked(&mut raw, &holder, &lease, pid).await {
        assert!(
            terminated.elapsed() < TTL - Duration::from_secs(2),
            "the holder never took its lock again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !campaign.is_finished(),
        "the follower must not be elected over an orphaned row"
    );
    assert!(leader.ensure_valid(Duration::ZERO).is_ok());
    // Its release wakes the follower, whose last look found the lock free.
    leader.resign().await;
    let elected = tokio::time::timeout(Duration::from_secs(2), campaign)
        .await
        .expect("the follower is elected after the release")
        .expect("the task")
        .expect("elected");
    elected.resign().await;
}
