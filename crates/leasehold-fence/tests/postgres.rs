//! `leasehold_fence::postgres` against the Postgres server of the tests (`LEASEHOLD_POSTGRES_URL`,
//! or `target/services/env`; skipped loudly when it is not reachable, a failure under
//! `CI=true`). Each test works in its own schema `fence_test_<random>`, dropped at the end.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Elector, LeaseName, LeaseStore, Term};
use leasehold_fence::postgres::Fence;
use leasehold_fence::{FenceError, FenceKey};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

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

    /// A fenced write of `writer` at `term`: the check and a row in the data table, committed
    /// only if the check passes.
    async fn fenced_write(&self, key: &FenceKey, writer: &str, term: Term) -> Result<(), FenceError> {
        let mut tx = self.pool.begin().await?;
        self.fence.check_and_advance(&mut tx, key, term).await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}.data (writer, term) VALUES ($1, $2)",
            self.schema
        )))
        .bind(writer)
        .bind(i64::try_from(term.0).unwrap())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The writers in the data table, in the order written.
    async fn writers(&self) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT writer FROM {}.data ORDER BY term, writer",
            self.schema
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn drop_schema(self) {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.schema)))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

fn random_lease() -> LeaseName {
    LeaseName::new(format!("fence-test-{:016x}", rand::random::<u64>())).unwrap()
}

async fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str) -> Elector {
    Elector::builder(store, lease.as_str())
        .candidate_id(id)
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Leader A (a real Postgres lease) writes at its term n; an operator breaks the lease and B is
/// elected at a higher term and writes; A, not yet aware, writes again at n: refused with
/// `Stale { term: n, highest: B's term }`, and A's data row is rolled back with it. B writing
/// again at its own term is accepted. The error names the key but not the URL's password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_write_is_rejected_and_the_successors_accepted() {
    let Some(db) = Db::new().await else { return };
    let lease = random_lease();
    let store_a = leasehold::connect(&db.url).await.unwrap();
    let store_b = leasehold::connect(&db.url).await.unwrap();
    let key = FenceKey::from_url(&db.url, &lease).unwrap();

    let a = elector(store_a, &lease, "A").await;
    let leader_a = tokio::time::timeout(Duration::from_secs(10), a.campaign())
        .await
        .unwrap()
        .unwrap();
    let term_a = leader_a.term();
    db.fenced_write(&key, "A-1", term_a).await.unwrap();

    // Deposed without being told: the operator frees the lease and B takes it.
    assert!(store_b.break_lease(&lease).await.unwrap().is_some());
    let b = elector(store_b, &lease, "B").await;
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
    let url = url::Url::parse(&db.url).unwrap();
    if let Some(password) = url.password().filter(|p| !p.is_empty()) {
        assert!(
            !err.to_string().contains(password),
            "the error shows the password: {err}"
        );
        assert!(!key.as_str().contains(password));
    }

    // The same leader writing again at its term.
    db.fenced_write(&key, "B-2", term_b).await.unwrap();
    assert_eq!(db.writers().await, ["A-1", "B-1", "B-2"]);
    let mut conn = db.pool.acquire().await.unwrap();
    assert_eq!(db.fence.highest(&mut conn, &key).await.unwrap(), Some(term_b));
    drop(conn);

    leader_b.resign().await;
    drop(leader_a);
    db.drop_schema().await;
}

/// Equal terms are accepted, lower ones refused, higher ones raise the fence; a refused
/// transaction leaves the stored term as it was.
#[tokio::test]
async fn equal_terms_are_accepted_lower_refused_higher_advance() {
    let Some(db) = Db::new().await else { return };
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
    assert_eq!(db.writers().await, ["t7", "t7-again", "t8"]);
    // Another key is fenced on its own.
    let other = FenceKey::new("other-store", &random_lease());
    db.fenced_write(&other, "other-1", Term(1)).await.unwrap();
    db.drop_schema().await;
}

/// Terms 5 and 4 race on a row at 3: 5 checks first and holds its transaction open; 4's check
/// waits for the row lock instead of finishing (a plain read would see 3 and let 4 through);
/// when 5 commits, 4 is refused. Then the reverse on a key nobody has written yet: 4 checks
/// first (its insert holds the key), 6 waits, 4 commits (it checked first, so it came first),
/// and 6 is accepted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_transactions_are_serialised_by_the_fence_row() {
    let Some(db) = Db::new().await else { return };
    let db = Arc::new(db);
    let key = FenceKey::new("test-store", &random_lease());
    db.fenced_write(&key, "3", Term(3)).await.unwrap();

    let mut tx5 = db.pool.begin().await.unwrap();
    db.fence.check_and_advance(&mut tx5, &key, Term(5)).await.unwrap();
    let late = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "4", Term(4)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !late.is_finished(),
        "term 4's check finished while term 5 held the fence"
    );
    sqlx::query(AssertSqlSafe(format!("INSERT INTO {}.data VALUES ('5', 5)", db.schema)))
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

    // The reverse: a lower term that checks first is accepted, and the higher one waits for it.
    let key = FenceKey::new("test-store", &random_lease());
    let mut tx4 = db.pool.begin().await.unwrap();
    db.fence.check_and_advance(&mut tx4, &key, Term(4)).await.unwrap();
    let next = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "6", Term(6)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !next.is_finished(),
        "term 6's check finished while term 4 held the fence"
    );
    tx4.commit().await.unwrap();
    next.await.unwrap().unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    assert_eq!(db.fence.highest(&mut conn, &key).await.unwrap(), Some(Term(6)));
    drop(conn);

    Arc::into_inner(db).unwrap().drop_schema().await;
}

/// `i64::MAX` is stored and read back; `i64::MAX + 1` and `u64::MAX` are refused with
/// `TermOutOfRange` naming the term, and nothing is stored for them.
#[tokio::test]
async fn terms_above_i64_max_are_refused_with_a_typed_error() {
    let Some(db) = Db::new().await else { return };
    let key = FenceKey::new("test-store", &random_lease());
    for term in [Term(i64::MAX as u64 + 1), Term(u64::MAX)] {
        let err = db.fenced_write(&key, "too-big", term).await.unwrap_err();
        assert!(
            matches!(err, FenceError::TermOutOfRange { term: t, .. } if t == term),
            "{err:?}"
        );
        assert!(err.to_string().contains(&term.to_string()), "{err}");
    }
    let mut conn = db.pool.acquire().await.unwrap();
    assert_eq!(db.fence.highest(&mut conn, &key).await.unwrap(), None);
    db.fence
        .check_and_advance(&mut conn, &key, Term(i64::MAX as u64))
        .await
        .unwrap();
    assert_eq!(
        db.fence.highest(&mut conn, &key).await.unwrap(),
        Some(Term(i64::MAX as u64))
    );
    drop(conn);
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
