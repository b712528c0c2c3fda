//! How many requests one store makes while it holds 1,000 leases (TTL 2 s) through 1,000
//! electors: store calls per second by operation (core's `CountingStore`), and the statements
//! the server ran for them (the lock session sends queued renewals in one statement), from the
//! transactions `pg_stat_database` counts in a database of its own. A measurement, not a check:
//! `cargo test -p leasehold-postgres --test integration -- thousand:: --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{AcquireRequest, Acquired, CountingStore, Elector, Grant, LeaseStore, Operation, Renewed};
use leasehold_postgres::PostgresStore;
use sqlx::{Connection, PgConnection};

const LEASES: usize = 1000;
const TTL: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(10);

/// Transactions committed and rolled back in `database` so far, as the statistics collector
/// has them (each backend reports at most once a second, and when it goes idle).
async fn transactions(raw: &mut PgConnection, database: &str) -> i64 {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *raw)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1")
        .bind(database)
        .fetch_one(raw)
        .await
        .unwrap()
}

/// A database of its own (so that its transaction count is this test's), its name and URL.
async fn fresh_database(pg: &common::PostgresBackend, admin: &mut PgConnection) -> (String, url::Url) {
    let database = common::schema("bench");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&pg.url).unwrap();
    url.set_path(&database);
    (database, url)
}

async fn drop_database(admin: &mut PgConnection, database: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {database} WITH (FORCE)")))
        .execute(admin)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn requests_per_second_with_a_thousand_leases() {
    let Some(pg) = common::server() else { return };
    let mut admin = pg.raw().await;
    let (database, url) = fresh_database(&pg, &mut admin).await;
    let store = Arc::new(CountingStore::new(PostgresStore::connect(url.as_str()).await.unwrap()));
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| {
            Elector::builder(store.clone(), format!("bench-{i:04}"))
                .candidate_id("member")
                .ttl(TTL)
                .build()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let leaders = futures::future::try_join_all(electors.iter().map(Elector::campaign))
        .await
        .unwrap();
    println!("{LEASES} leases taken in {:?}", started.elapsed());

    tokio::time::sleep(TTL).await;
    let mut raw = PgConnection::connect(url.as_str()).await.unwrap();
    let (calls_before, statements_before) = (store.counts(), transactions(&mut raw, &database).await);
    tokio::time::sleep(WINDOW).await;
    let (calls, statements) = (
        store.counts().since(&calls_before),
        transactions(&mut raw, &database).await - statements_before,
    );
    let per_second = |n: u64| n as f64 / WINDOW.as_secs_f64();
    let leading = leaders
        .iter()
        .filter(|l| l.ensure_valid(Duration::ZERO).is_ok())
        .count();
    println!(
        "postgres, {LEASES} leases, ttl {TTL:?}, renew every ttl/3: store calls {:.0}/s (renew {:.0}/s, \
         acquire {:.0}/s, inspect {:.0}/s, failed {}), server transactions {:.0}/s (about {:.1} renewals \
         per statement); {leading} of {LEASES} still leading",
        per_second(calls.total()),
        per_second(calls.get(Operation::Renew)),
        per_second(calls.get(Operation::Acquire)),
        per_second(calls.get(Operation::Inspect)),
        calls.failed,
        statements as f64 / WINDOW.as_secs_f64(),
        calls.get(Operation::Renew) as f64 / statements.max(1) as f64,
    );

    futures::future::join_all(leaders.into_iter().map(|l| l.resign())).await;
    drop(electors);
    drop(store);
    raw.close().await.unwrap();
    drop_database(&mut admin, &database).await;
}

/// The same 1,000 leases held by one member that renews them all at the same instant every
/// TTL/3 (what a lease group could do): the lock session sends renewals queued together in one
/// statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn renewals_sent_together_share_a_statement() {
    let Some(pg) = common::server() else { return };
    let mut admin = pg.raw().await;
    let (database, url) = fresh_database(&pg, &mut admin).await;
    let store = PostgresStore::connect(url.as_str()).await.unwrap();
    let requests: Vec<AcquireRequest> = (0..LEASES)
        .map(|i| AcquireRequest {
            lease: format!("bench-{i:04}").parse().unwrap(),
            candidate: "member".parse().unwrap(),
            ttl: TTL,
            takeover: None,
        })
        .collect();
    let mut grants: Vec<Grant> = futures::future::join_all(requests.iter().map(|r| store.acquire(r)))
        .await
        .into_iter()
        .map(|acquired| match acquired.unwrap() {
            Acquired::Granted(grant) => grant,
            held => panic!("{held:?}"),
        })
        .collect();
    let mut raw = PgConnection::connect(url.as_str()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = transactions(&mut raw, &database).await;
    let started = Instant::now();
    let mut rounds = Vec::new();
    while started.elapsed() < WINDOW {
        let sent = Instant::now();
        grants = futures::future::join_all(grants.iter().map(|g| store.renew(g)))
            .await
            .into_iter()
            .map(|renewed| match renewed.unwrap() {
                Renewed::Renewed(grant) => grant,
                lost => panic!("a lease was lost: {lost:?}"),
            })
            .collect();
        rounds.push(sent.elapsed());
        tokio::time::sleep((TTL / 3).saturating_sub(sent.elapsed())).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let every backend report its statistics.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let statements = transactions(&mut raw, &database).await - before;
    rounds.sort();
    println!(
        "postgres, {LEASES} leases renewed together every ttl/3: {} rounds in {seconds:.1} s, {statements} server \
         transactions ({:.1}/s), round time p50 {:?} max {:?}",
        rounds.len(),
        statements as f64 / seconds,
        rounds[rounds.len() / 2],
        rounds[rounds.len() - 1],
    );
    for grant in &grants {
        store.release(grant).await.unwrap();
    }
    drop(store);
    raw.close().await.unwrap();
    drop_database(&mut admin, &database).await;
}
