//! Measurements for issue 8 (idle followers): what an idle follower costs and how fast it takes
//! over from a crashed leader, and what a follower that blocks on the leader's advisory lock
//! (the proposed change stream for `Notifications::ReleaseAndExpiry`) would learn and when.
//!
//! Both are measurements, not checks of the contract (the conformance suite does that): run them
//! with `--ignored --nocapture` against the test server.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, Faults, FaultyStore};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Elector, LeaseStore};
use sqlx::Connection;

use common::server;

const TTL: Duration = Duration::from_secs(2);

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// A follower with the engine's default timings (TTL 2 s) next to a leader for 5 TTLs: its
/// requests per second; then the leader is blackholed (no FIN, no RST): the failover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn idle_follower_requests_and_crash_failover() {
    let Some(server) = server() else { return };
    let lease = common::lease("idle");
    let (store_a, faults_a) = server.faulty_store().await.expect("store A");
    let a = Elector::builder(Arc::new(store_a), lease.as_str())
        .candidate_id("A")
        .ttl(TTL)
        .build()
        .expect("elector A");
    let leader_a = a.campaign().await.expect("A leads");

    let counts = Faults::new();
    let store_b = PostgresStoreHandle::connect(&server.url).await;
    let b = Elector::builder(
        Arc::new(FaultyStore::counting(store_b.0.clone(), counts.clone())),
        lease.as_str(),
    )
    .candidate_id("B")
    .ttl(TTL)
    .build()
    .expect("elector B");
    let campaign_b = tokio::spawn(async move { b.campaign().await });
    // Let B settle (first acquire, change stream), then count over 5 TTLs.
    tokio::time::sleep(TTL / 2).await;
    counts.reset_counts();
    let window = TTL * 5;
    tokio::time::sleep(window).await;
    let idle = counts.counts();
    println!(
        "postgres idle follower (TTL {}): {} requests in {} = {:.2} requests/s ({idle:?})",
        secs(TTL),
        idle.total(),
        secs(window),
        idle.total() as f64 / window.as_secs_f64()
    );

    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let leader_b = tokio::time::timeout(TTL * 6, campaign_b)
        .await
        .expect("B takes over within 6 TTLs")
        .expect("B's campaign task")
        .expect("B leads");
    let failover = leader_b.elected_at() - crashed;
    println!(
        "postgres crash failover (leader blackholed, TTL {}): {} = {:.2} TTL; B elected {} after A's valid_until",
        secs(TTL),
        secs(failover),
        failover.as_secs_f64() / TTL.as_secs_f64(),
        secs(leader_b.elected_at().saturating_duration_since(leader_a.valid_until()))
    );
    assert!(leader_b.elected_at() >= leader_a.valid_until());
    assert!(leader_b.term() > leader_a.term());
    leader_b.resign().await;
    drop(leader_a);
}

/// The proposed change stream, by hand: a follower's connection blocks on the leader's advisory
/// lock with `pg_advisory_lock_shared` while the leader renews for 3 TTLs; then the leader is
/// blackholed. Prints when the waiter wakes and what the follower's next acquire says: the
/// row still names the silent leader, at a version this follower has never seen (the leader
/// renewed while the follower made no request), so the store makes it wait a whole TTL from
/// the wake (`store_remaining`), about two TTLs after the crash in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn lock_waiter_wakes_at_session_end() {
    let Some(server) = server() else { return };
    let lease = common::lease("waiter");
    let (store_a, faults_a) = server.faulty_store().await.expect("store A");
    let a = Elector::builder(Arc::new(store_a), lease.as_str())
        .candidate_id("A")
        .ttl(TTL)
        .build()
        .expect("elector A");
    let leader_a = a.campaign().await.expect("A leads");

    let store_b = PostgresStoreHandle::connect(&server.url).await;
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new("B").expect("a candidate id"),
        ttl: TTL,
        takeover: None,
    };
    let first = store_b.0.acquire(&request).await.expect("B's first acquire");
    assert!(matches!(first, Acquired::Held(_)), "{first:?}");

    let key = leasehold_postgres::lock_key("leasehold", lease.as_str());
    let mut waiter = server.raw().await;
    let armed = Instant::now();
    let wait = tokio::spawn(async move {
        let outcome: Result<(bool, bool), sqlx::Error> =
            sqlx::query_as("SELECT true, pg_advisory_unlock_shared($1) FROM pg_advisory_lock_shared($1)")
                .bind(key)
                .fetch_one(&mut waiter)
                .await;
        let woke = Instant::now();
        let _ = waiter.close().await;
        (outcome, woke)
    });
    tokio::time::sleep(TTL * 3).await;
    assert!(!wait.is_finished(), "the waiter woke while the leader renewed");
    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let (outcome, woke) = tokio::time::timeout(TTL * 3, wait)
        .await
        .expect("the waiter wakes within 3 TTLs")
        .expect("the waiter task");
    outcome.expect("the waiter's statement");
    let after = store_b.0.acquire(&request).await.expect("B's acquire after the wake");
    let store_remaining = match &after {
        Acquired::Held(o) => o.holder.as_ref().and_then(|h| h.store_remaining),
        Acquired::Granted(_) => Some(Duration::ZERO),
    };
    println!(
        "postgres lock waiter (TTL {}): armed {} before the crash, woke {} after it ({} after A's valid_until); \
         B's acquire then: {}; earliest takeover {} after the crash",
        secs(TTL),
        secs(crashed - armed),
        secs(woke - crashed),
        secs(woke.saturating_duration_since(leader_a.valid_until())),
        match &after {
            Acquired::Granted(g) => format!("granted at term {}", g.term),
            Acquired::Held(o) => format!(
                "held by {:?}, store_remaining {:?}",
                o.holder.as_ref().map(|h| h.id.as_str()),
                store_remaining
            ),
        },
        store_remaining.map_or_else(|| "unknown".into(), |r| secs(woke - crashed + r)),
    );
    drop(leader_a);
}

/// A store behind an `Arc<dyn LeaseStore>`.
struct PostgresStoreHandle(Arc<dyn LeaseStore>);

impl PostgresStoreHandle {
    async fn connect(url: &str) -> Self {
        PostgresStoreHandle(Arc::new(
            leasehold_postgres::PostgresStore::connect(url).await.expect("a store"),
        ))
    }
}
