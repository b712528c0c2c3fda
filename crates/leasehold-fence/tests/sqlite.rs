//! `leasehold_fence::sqlite` against a SQLite file in a temporary directory, with fenced
//! transactions begun by `BEGIN IMMEDIATE`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{FenceDb, random_lease};
use leasehold_core::{LeaseName, Term};
use leasehold_fence::sqlite::Fence;
use leasehold_fence::{FenceError, FenceKey};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Connection, Sqlite, SqlitePool, Transaction};
use tempfile::TempDir;

/// An application database (`app.db`) with a fence table and a data table.
struct Db {
    dir: TempDir,
    pool: SqlitePool,
    fence: Fence,
}

impl Db {
    async fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("app.db"))
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE data (writer TEXT NOT NULL, term INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let fence = Fence::new("fence").unwrap();
        fence.ensure_table(&mut pool.acquire().await.unwrap()).await.unwrap();
        Db { dir, pool, fence }
    }
}

impl FenceDb for Db {
    type Open = Transaction<'static, Sqlite>;

    async fn fenced_write(&self, key: &FenceKey, writer: &str, term: Term) -> Result<(), FenceError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        self.fence.check_and_advance(&mut tx, key, term).await?;
        insert(&mut tx, writer, term).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn check_and_hold(&self, key: &FenceKey, term: Term) -> Self::Open {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        self.fence.check_and_advance(&mut tx, key, term).await.unwrap();
        tx
    }

    async fn write_and_commit(&self, mut open: Self::Open, writer: &str, term: Term) {
        insert(&mut open, writer, term).await.unwrap();
        open.commit().await.unwrap();
    }

    async fn writers(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT writer FROM data ORDER BY term, rowid")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn highest(&self, key: &FenceKey) -> Option<Term> {
        let mut conn = self.pool.acquire().await.unwrap();
        self.fence.highest(&mut conn, key).await.unwrap()
    }
}

async fn insert(tx: &mut Transaction<'static, Sqlite>, writer: &str, term: Term) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO data (writer, term) VALUES (?1, ?2)")
        .bind(writer)
        .bind(i64::try_from(term.0).unwrap())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Leader A, a real lease in a leasehold SQLite store beside the application database, is
/// deposed and its late write refused (see `common`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_write_is_rejected_and_the_successors_accepted() {
    let db = Db::new().await;
    let url = format!("sqlite://{}/leases.db", db.dir.path().display());
    let key = FenceKey::from_url(&url, &LeaseName::new("x").unwrap()).unwrap();
    assert!(key.as_str().ends_with("leases.db#x"), "{key}");
    common::deposed_leaders_late_write_is_rejected(&db, &url).await;
}

#[tokio::test]
async fn equal_terms_are_accepted_lower_refused_higher_advance() {
    common::equal_terms_are_accepted_lower_refused_higher_advance(&Db::new().await).await;
}

/// Fenced transactions begun with `BEGIN IMMEDIATE` wait for each other's write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_transactions_are_serialised_by_the_write_lock() {
    common::racing_transactions_are_serialised(Arc::new(Db::new().await)).await;
}

#[tokio::test]
async fn terms_above_i64_max_are_refused_with_a_typed_error() {
    common::terms_above_i64_max_are_refused_with_a_typed_error(&Db::new().await).await;
}

/// The free functions use `leasehold_fence`; a value the table should never hold (a negative
/// number, written by something else into a table without the CHECK) reads back as a
/// `CorruptRecord`, and the next check replaces it (it is below every term).
#[tokio::test]
async fn the_default_table_works_and_a_negative_stored_value_is_corrupt() {
    let db = Db::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let key = FenceKey::new("test-store", &random_lease());
    leasehold_fence::sqlite::ensure_table(&mut conn).await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    leasehold_fence::sqlite::check_and_advance(&mut tx, &key, Term(2))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let err = leasehold_fence::sqlite::check_and_advance(&mut conn, &key, Term(1))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Stale { highest: Term(2), .. }), "{err:?}");
    let stored: i64 = sqlx::query_scalar("SELECT term FROM leasehold_fence WHERE fence_key = ?1")
        .bind(key.as_str())
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(stored, 2);

    sqlx::query("CREATE TABLE loose (fence_key TEXT PRIMARY KEY, term INTEGER NOT NULL)")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO loose VALUES (?1, -5)")
        .bind(key.as_str())
        .execute(&mut *conn)
        .await
        .unwrap();
    let loose = Fence::new("loose").unwrap();
    let err = loose.highest(&mut conn, &key).await.unwrap_err();
    assert!(matches!(err, FenceError::CorruptRecord { stored: -5, .. }), "{err:?}");
    loose.check_and_advance(&mut conn, &key, Term(1)).await.unwrap();
    assert_eq!(loose.highest(&mut conn, &key).await.unwrap(), Some(Term(1)));
}
