//! `leasehold_fence::sqlite` against a SQLite file in a temporary directory, with fenced
//! transactions begun by `BEGIN IMMEDIATE`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Elector, LeaseName, Term};
use leasehold_fence::sqlite::Fence;
use leasehold_fence::{FenceError, FenceKey};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Connection, SqlitePool};
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

    /// A fenced write of `writer` at `term`, committed only if the check passes.
    async fn fenced_write(&self, key: &FenceKey, writer: &str, term: Term) -> Result<(), FenceError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        self.fence.check_and_advance(&mut tx, key, term).await?;
        sqlx::query("INSERT INTO data (writer, term) VALUES (?1, ?2)")
            .bind(writer)
            .bind(i64::try_from(term.0).unwrap())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn writers(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT writer FROM data ORDER BY rowid")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn highest(&self, key: &FenceKey) -> Option<Term> {
        let mut conn = self.pool.acquire().await.unwrap();
        self.fence.highest(&mut conn, key).await.unwrap()
    }
}

fn random_lease() -> LeaseName {
    LeaseName::new(format!("fence-test-{:016x}", rand::random::<u64>())).unwrap()
}

/// Leader A (a real lease in a leasehold SQLite store) writes at its term n; the lease is broken
/// and B is elected at a higher term and writes; A's late write at n is refused with
/// `Stale { term: n, highest: B's term }` and its data row rolled back; B writes again at its
/// own term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_write_is_rejected_and_the_successors_accepted() {
    let db = Db::new().await;
    let url = format!("sqlite://{}/leases.db", db.dir.path().display());
    let lease = random_lease();
    let key = FenceKey::from_url(&url, &lease).unwrap();
    assert!(key.as_str().ends_with(&format!("leases.db#{lease}")), "{key}");
    let store_a = leasehold::connect(&url).await.unwrap();
    let store_b = leasehold::connect(&url).await.unwrap();

    let a = Elector::builder(store_a, lease.as_str())
        .candidate_id("A")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let leader_a = tokio::time::timeout(Duration::from_secs(10), a.campaign())
        .await
        .unwrap()
        .unwrap();
    let term_a = leader_a.term();
    db.fenced_write(&key, "A-1", term_a).await.unwrap();

    assert!(store_b.break_lease(&lease).await.unwrap().is_some());
    let b = Elector::builder(store_b, lease.as_str())
        .candidate_id("B")
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let leader_b = tokio::time::timeout(Duration::from_secs(10), b.campaign())
        .await
        .unwrap()
        .unwrap();
    let term_b = leader_b.term();
    assert!(term_b > term_a, "B's term {term_b} must be above A's {term_a}");
    db.fenced_write(&key, "B-1", term_b).await.unwrap();

    let err = db.fenced_write(&key, "A-late", term_a).await.unwrap_err();
    match &err {
        FenceError::Stale { key: k, term, highest } => {
            assert_eq!((k.as_str(), *term, *highest), (key.as_str(), term_a, term_b));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    db.fenced_write(&key, "B-2", term_b).await.unwrap();
    assert_eq!(db.writers().await, ["A-1", "B-1", "B-2"]);
    assert_eq!(db.highest(&key).await, Some(term_b));

    leader_b.resign().await;
    drop(leader_a);
}

/// Equal terms are accepted, lower ones refused (nothing written), higher ones advance; keys
/// are independent.
#[tokio::test]
async fn equal_terms_are_accepted_lower_refused_higher_advance() {
    let db = Db::new().await;
    let key = FenceKey::new("test-store", &random_lease());
    db.fenced_write(&key, "t7", Term(7)).await.unwrap();
    db.fenced_write(&key, "t7-again", Term(7)).await.unwrap();
    let err = db.fenced_write(&key, "t6", Term(6)).await.unwrap_err();
    assert!(
        matches!(
            err,
            FenceError::Stale {
                term: Term(6),
                highest: Term(7),
                ..
            }
        ),
        "{err:?}"
    );
    db.fenced_write(&key, "t8", Term(8)).await.unwrap();
    let err = db.fenced_write(&key, "t7-late", Term(7)).await.unwrap_err();
    assert!(matches!(err, FenceError::Stale { highest: Term(8), .. }), "{err:?}");
    let other = FenceKey::new("other-store", &random_lease());
    db.fenced_write(&other, "other-1", Term(1)).await.unwrap();
    assert_eq!(db.writers().await, ["t7", "t7-again", "t8", "other-1"]);
    assert_eq!(db.highest(&key).await, Some(Term(8)));
}

/// On a row at 3, term 5's transaction checks first and stays open; term 4's (`BEGIN
/// IMMEDIATE`) waits instead of finishing, and is refused once 5 commits. The reverse on a new
/// key: 4 checks first, 6 waits and is accepted after 4 commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_transactions_are_serialised_by_the_write_lock() {
    let db = Arc::new(Db::new().await);
    let key = FenceKey::new("test-store", &random_lease());
    db.fenced_write(&key, "3", Term(3)).await.unwrap();

    let mut tx5 = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    db.fence.check_and_advance(&mut tx5, &key, Term(5)).await.unwrap();
    let late = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "4", Term(4)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !late.is_finished(),
        "term 4's transaction finished while term 5 held the write lock"
    );
    sqlx::query("INSERT INTO data VALUES ('5', 5)")
        .execute(&mut *tx5)
        .await
        .unwrap();
    tx5.commit().await.unwrap();
    let err = late.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            FenceError::Stale {
                term: Term(4),
                highest: Term(5),
                ..
            }
        ),
        "{err:?}"
    );

    let key = FenceKey::new("test-store", &random_lease());
    let mut tx4 = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    db.fence.check_and_advance(&mut tx4, &key, Term(4)).await.unwrap();
    let next = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "6", Term(6)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !next.is_finished(),
        "term 6's transaction finished while term 4 held the write lock"
    );
    tx4.commit().await.unwrap();
    next.await.unwrap().unwrap();
    assert_eq!(db.highest(&key).await, Some(Term(6)));
    assert_eq!(db.writers().await, ["3", "5", "6"]);
}

/// `i64::MAX` is stored; `i64::MAX + 1` and `u64::MAX` are refused with `TermOutOfRange` and
/// store nothing.
#[tokio::test]
async fn terms_above_i64_max_are_refused_with_a_typed_error() {
    let db = Db::new().await;
    let key = FenceKey::new("test-store", &random_lease());
    for term in [Term(i64::MAX as u64 + 1), Term(u64::MAX)] {
        let err = db.fenced_write(&key, "too-big", term).await.unwrap_err();
        assert!(
            matches!(err, FenceError::TermOutOfRange { term: t, .. } if t == term),
            "{err:?}"
        );
    }
    assert_eq!(db.highest(&key).await, None);
    db.fenced_write(&key, "max", Term(i64::MAX as u64)).await.unwrap();
    assert_eq!(db.highest(&key).await, Some(Term(i64::MAX as u64)));
    assert_eq!(db.writers().await, ["max"]);
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
