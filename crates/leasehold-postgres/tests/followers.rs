//! Idle followers (issue 8): an idle follower makes no requests (it learns the holder's renewals
//! from notifications), and is woken without polling when the holder's session ends, as fast as
//! polling took over before.
//!
//! The `#[ignore]`d tests are measurements (run them with `--ignored --nocapture`): what an idle
//! follower costs and how fast it takes over from a crashed leader at TTL 2 s, and what a
//! follower that only blocked on the leader's advisory lock would learn and when.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, Faults, FaultyStore};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Elector, Leader, LeaseStore};
use leasehold_postgres::PostgresStore;
use sqlx::Connection;

use common::{lock_holder, server};

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

/// The design not taken, by hand: a follower's connection blocks on the leader's advisory lock
/// with `pg_advisory_lock_shared` while the leader renews for 3 TTLs; then the leader is
/// blackholed. B has no change stream here, so its store records no announced renewals: this is
/// what the waiter alone gives. Prints when the waiter wakes and what the follower's next acquire
/// says: the row still names the silent leader, at a version this follower has never seen (the
/// leader renewed while the follower made no request), so the store makes it wait a whole TTL
/// from the wake (`store_remaining`), about two TTLs after the crash in all (polling: one).
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

/// The TTL of the checks.
const SHORT: Duration = Duration::from_secs(1);

/// A leader A (its store behind a fault proxy, so it can be silenced) and a follower B whose
/// requests are counted, on a fresh lease, with the engine's default timings at TTL `SHORT`.
struct Pair {
    server: common::PostgresBackend,
    lease: leasehold_core::LeaseName,
    leader_a: Leader,
    faults_a: Faults,
    counts: Faults,
    campaign_b: tokio::task::JoinHandle<leasehold_core::Result<Leader>>,
}

async fn pair(tag: &str) -> Option<Pair> {
    let server = server()?;
    let lease = common::lease(tag);
    let (store_a, faults_a) = server.faulty_store().await.expect("store A");
    let a = Elector::builder(Arc::new(store_a), lease.as_str())
        .candidate_id("A")
        .ttl(SHORT)
        .build()
        .expect("elector A");
    let leader_a = a.campaign().await.expect("A leads");
    let store_b = PostgresStore::connect(&server.url).await.expect("store B");
    let counts = Faults::new();
    let b = Elector::builder(
        Arc::new(FaultyStore::counting(Arc::new(store_b), counts.clone())),
        lease.as_str(),
    )
    .candidate_id("B")
    .ttl(SHORT)
    .build()
    .expect("elector B");
    let campaign_b = tokio::spawn(async move { b.campaign().await });
    // B's first acquire, its interest key, the listener.
    tokio::time::sleep(SHORT / 2).await;
    counts.reset_counts();
    Some(Pair {
        server,
        lease,
        leader_a,
        faults_a,
        counts,
        campaign_b,
    })
}

impl Pair {
    /// Waits for B to lead; checks it comes after A's deadline at a higher term.
    async fn b_leads(self, within: Duration) -> (Leader, Leader) {
        let leader_b = tokio::time::timeout(within, self.campaign_b)
            .await
            .expect("B leads in time")
            .expect("B's campaign task")
            .expect("B leads");
        assert!(
            leader_b.elected_at() >= self.leader_a.valid_until(),
            "B was elected before A's valid_until"
        );
        assert!(leader_b.term() > self.leader_a.term());
        (self.leader_a, leader_b)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_follower_makes_no_requests() {
    let Some(pair) = pair("idle0").await else { return };
    tokio::time::sleep(SHORT * 5).await;
    let counts = pair.counts.counts();
    assert!(counts.total() <= 1, "an idle follower asked {counts:?} in 5 TTLs");
    assert!(!pair.leader_a.is_cancelled(), "A kept leading");
    assert!(!pair.campaign_b.is_finished(), "B kept following");
    pair.campaign_b.abort();
    pair.leader_a.resign().await;
}

/// A silent leader (blackholed: no FIN, no RST) is taken over at about its TTL, as fast as
/// polling took over, with a couple of requests instead of one per `retry_every`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_leader_is_taken_over_without_polling() {
    let Some(pair) = pair("silent").await else { return };
    tokio::time::sleep(SHORT * 2).await;
    let crashed = Instant::now();
    pair.faults_a.set(Direction::Both, Fault::Blackhole);
    let counts = pair.counts.clone();
    let (leader_a, leader_b) = pair.b_leads(SHORT * 4).await;
    let failover = leader_b.elected_at() - crashed;
    let asked = counts.counts();
    println!(
        "silent leader: failover {} ({:.2} TTL), {} requests",
        secs(failover),
        failover.as_secs_f64() / SHORT.as_secs_f64(),
        asked.total()
    );
    // Polling followers took 0.98 TTL at TTL 2 s (`idle_follower_requests_and_crash_failover`
    // before this change) and 1.26 to 1.32 TTL in the conformance suite's crash scenario.
    assert!(failover <= SHORT * 3 / 2, "failover took {}", secs(failover));
    assert!(asked.total() <= 3, "{asked:?}");
    leader_b.resign().await;
    drop(leader_a);
}

/// The leader's lock session is ended by an operator while the leader is silent: its lock is
/// free at once, but the row still names it; the follower, which saw its last renewal, takes
/// over once the leader's deadline has passed, without polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_leader_session_is_taken_over_without_polling() {
    let Some(pair) = pair("killed").await else { return };
    tokio::time::sleep(SHORT * 2).await;
    let mut conn = pair.server.raw().await;
    let key = leasehold_postgres::lock_key("leasehold", pair.lease.as_str());
    let pid = lock_holder(&mut conn, key).await.expect("A's session holds the lock");
    let crashed = Instant::now();
    pair.faults_a.set(Direction::Both, Fault::Blackhole);
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut conn)
        .await
        .expect("pg_terminate_backend");
    assert!(ended);
    let counts = pair.counts.clone();
    let (leader_a, leader_b) = pair.b_leads(SHORT * 4).await;
    let failover = leader_b.elected_at() - crashed;
    let asked = counts.counts();
    println!(
        "terminated leader session: failover {} ({:.2} TTL), {} requests",
        secs(failover),
        failover.as_secs_f64() / SHORT.as_secs_f64(),
        asked.total()
    );
    assert!(failover <= SHORT * 3 / 2, "failover took {}", secs(failover));
    assert!(asked.total() <= 3, "{asked:?}");
    let _ = conn.close().await;
    leader_b.resign().await;
    drop(leader_a);
}

/// The follower's own lock session ends (it held the interest key): renewals are no longer
/// announced to it, so it looks once at the holder's expected expiry, takes the key again, and
/// goes on without polling; it still takes over from a silent leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_that_lost_its_interest_key_looks_once_and_follows_again() {
    let Some(pair) = pair("interest").await else { return };
    let mut conn = pair.server.raw().await;
    // The interest key: the FNV-1a hash of `leasehold-follow/<schema>/<lease>` (as `lock_key`).
    let interest = "leasehold-follow/leasehold/"
        .bytes()
        .chain(pair.lease.as_str().bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let followers: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
         AND mode = 'ShareLock'
         AND classid = ((($1::int8) >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(i64::from_ne_bytes(interest.to_ne_bytes()))
    .fetch_all(&mut conn)
    .await
    .expect("pg_locks");
    assert_eq!(followers.len(), 1, "B's session holds the lease's interest key");
    for pid in &followers {
        let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut conn)
            .await
            .expect("pg_terminate_backend");
    }
    tokio::time::sleep(SHORT * 4).await;
    let asked = pair.counts.counts();
    assert!(
        (1..=4).contains(&asked.total()),
        "4 TTLs after losing its interest key: {asked:?}"
    );
    pair.counts.reset_counts();
    tokio::time::sleep(SHORT * 3).await;
    let asked = pair.counts.counts();
    assert!(asked.total() <= 1, "following again: {asked:?}");
    let _ = conn.close().await;
    let crashed = Instant::now();
    pair.faults_a.set(Direction::Both, Fault::Blackhole);
    let (leader_a, leader_b) = pair.b_leads(SHORT * 4).await;
    let failover = leader_b.elected_at() - crashed;
    assert!(failover <= SHORT * 3 / 2, "failover took {}", secs(failover));
    leader_b.resign().await;
    drop(leader_a);
}
