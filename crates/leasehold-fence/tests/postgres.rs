//! `leasehold_fence::postgres` against the Postgres server of the tests (`LEASEHOLD_POSTGRES_URL`,
//! or `target/services/env`; skipped loudly when it is not reachable, a failure under
//! `CI=true`). Each test works in its own schema `fence_test_<random>`, dropped at the end.

use crate::common;

use std::sync::Arc;

use common::{FenceDb, random_lease};
use leasehold_core::Term;
use leasehold_fence::postgres::Fence;
use leasehold_fence::{FenceError, FenceKey};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};

/// A schema of its own on the test server, with a fence table and a data table in it.
struct Db {
    url: String,
    pool: PgPool,
    schema: String,
    fence: Fence,
}

impl Db {
    async fn new() -> Option<Db> {
        let url = leasehold_conformance::require_server("postgres", "LEASEHOLD_POSTGRES_URL")?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connect to postgres");
        let schema = format!("fence_test_{:016x}", rand::random::<u64>());
        let sql =
            format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.data (writer TEXT NOT NULL, term BIGINT NOT NULL)");
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await.unwrap();
        let fence = Fence::new(&format!("{schema}.fence")).unwrap();
        fence.ensure_table(&mut pool.acquire().await.unwrap()).await.unwrap();
        Some(Db {
            url,
            pool,
            schema,
            fence,
        })
    }

    async fn drop_schema(self) {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.schema)))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn insert(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        writer: &str,
        term: Term,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}.data (writer, term) VALUES ($1, $2)",
            self.schema
        )))
        .bind(writer)
        .bind(i64::try_from(term.0).unwrap())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

impl FenceDb for Db {
    type Open = Transaction<'static, Postgres>;

    async fn fenced_write(&self, key: &FenceKey, writer: &str, term: Term) -> Result<(), FenceError> {
        let mut tx = self.pool.begin().await?;
        self.fence.check_and_advance(&mut tx, key, term).await?;
        self.insert(&mut tx, writer, term).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn check_and_hold(&self, key: &FenceKey, term: Term) -> Self::Open {
        let mut tx = self.pool.begin().await.unwrap();
        self.fence.check_and_advance(&mut tx, key, term).await.unwrap();
        tx
    }

    async fn write_and_commit(&self, mut open: Self::Open, writer: &str, term: Term) {
        self.insert(&mut open, writer, term).await.unwrap();
        open.commit().await.unwrap();
    }

    async fn writers(&self) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT writer FROM {}.data ORDER BY term, writer",
            self.schema
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn highest(&self, key: &FenceKey) -> Option<Term> {
        let mut conn = self.pool.acquire().await.unwrap();
        self.fence.highest(&mut conn, key).await.unwrap()
    }
}

/// Leader A, a real lease in the Postgres store, is deposed and its late write refused (see
/// `common`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_write_is_rejected_and_the_successors_accepted() {
    let Some(db) = Db::new().await else { return };
    common::deposed_leaders_late_write_is_rejected(&db, &db.url).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn equal_terms_are_accepted_lower_refused_higher_advance() {
    let Some(db) = Db::new().await else { return };
    common::equal_terms_are_accepted_lower_refused_higher_advance(&db).await;
    db.drop_schema().await;
}

/// Fenced transactions of one key wait for each other's lock on the fence row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_transactions_are_serialised_by_the_fence_row() {
    let Some(db) = Db::new().await else { return };
    let db = Arc::new(db);
    common::racing_transactions_are_serialised(db.clone()).await;
    Arc::into_inner(db).unwrap().drop_schema().await;
}

#[tokio::test]
async fn terms_above_i64_max_are_refused_with_a_typed_error() {
    let Some(db) = Db::new().await else { return };
    common::terms_above_i64_max_are_refused_with_a_typed_error(&db).await;
    db.drop_schema().await;
}

/// The default table through the free functions, and a missing table as a `Database` error
/// rather than an accepted write.
#[tokio::test]
async fn the_default_table_works_and_a_missing_table_is_an_error() {
    let Some(db) = Db::new().await else { return };
    let mut conn = db.pool.acquire().await.unwrap();
    let missing = Fence::new(&format!("{}.no_such_table", db.schema)).unwrap();
    let key = FenceKey::new("test-store", &random_lease());
    let err = missing.check_and_advance(&mut conn, &key, Term(1)).await.unwrap_err();
    assert!(matches!(err, FenceError::Database(_)), "{err:?}");
    // One line that names the cause, without the server's C source position (sqlx's Display
    // appends `at line N` of it).
    let text = err.to_string();
    assert!(text.contains("does not exist") && text.contains("42P01"), "{text}");
    assert!(!text.contains(" at line "), "{text}");

    // The default table lives in the connection's search path: point it at the test schema.
    sqlx::raw_sql(AssertSqlSafe(format!("SET search_path TO {}", db.schema)))
        .execute(&mut *conn)
        .await
        .unwrap();
    leasehold_fence::postgres::ensure_table(&mut conn).await.unwrap();
    leasehold_fence::postgres::check_and_advance(&mut conn, &key, Term(2))
        .await
        .unwrap();
    let err = leasehold_fence::postgres::check_and_advance(&mut conn, &key, Term(1))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Stale { highest: Term(2), .. }), "{err:?}");
    let stored: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT term FROM {}.leasehold_fence WHERE fence_key = $1",
        db.schema
    )))
    .bind(key.as_str())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(stored, 2);
    drop(conn);
    db.drop_schema().await;
}

/// Ten replicas starting together on a fresh database each call `ensure_table` at the same
/// moment, on connections of their own: all succeed, and the table is there once. Five rounds,
/// each on a database of its own (without the advisory lock, most rounds failed some of them
/// with `duplicate key value violates unique constraint "pg_type_typname_nsp_index"`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_replicas_ensure_the_table_at_once_on_a_fresh_database() {
    use sqlx::Connection;
    let Some(url) = leasehold_conformance::require_server("postgres", "LEASEHOLD_POSTGRES_URL") else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect to postgres");
    for round in 0..5 {
        let database = format!("fence_race_{:016x}", rand::random::<u64>());
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let mut fresh = url::Url::parse(&url).unwrap();
        fresh.set_path(&database);
        let mut replicas = Vec::new();
        for _ in 0..10 {
            replicas.push(sqlx::PgConnection::connect(fresh.as_str()).await.expect("connect"));
        }
        let start = Arc::new(tokio::sync::Barrier::new(replicas.len()));
        let calls: Vec<_> = replicas
            .into_iter()
            .map(|mut conn| {
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    let outcome = leasehold_fence::postgres::ensure_table(&mut conn).await;
                    let _ = conn.close().await;
                    outcome
                })
            })
            .collect();
        let mut failed = Vec::new();
        for call in calls {
            if let Err(e) = call.await.unwrap() {
                let cause = std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                failed.push(format!("{e}: {cause}"));
            }
        }
        sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {database} WITH (FORCE)")))
            .execute(&mut admin)
            .await
            .unwrap();
        assert!(
            failed.is_empty(),
            "round {round}: {} of 10 failed: {failed:?}",
            failed.len()
        );
    }
}
