//! The scenarios the Postgres and SQLite fences share, each run by both test files against
//! their own database.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Elector, LeaseName, LeaseStore, Term};
use leasehold_fence::{FenceError, FenceKey};

/// An application database with a fence table and a data table (`writer`, `term`).
pub(crate) trait FenceDb: Send + Sync + 'static {
    /// A transaction left open after its check.
    type Open: Send;

    /// A fenced write of `writer` at `term`: the check and a row in the data table, committed
    /// only if the check passes.
    fn fenced_write(
        &self,
        key: &FenceKey,
        writer: &str,
        term: Term,
    ) -> impl Future<Output = Result<(), FenceError>> + Send;

    /// Begins a fenced transaction (as [`FenceDb::fenced_write`] does) and checks `term`,
    /// leaving the transaction open.
    fn check_and_hold(&self, key: &FenceKey, term: Term) -> impl Future<Output = Self::Open> + Send;

    /// Writes `writer` at `term` in an open transaction and commits it.
    fn write_and_commit(&self, open: Self::Open, writer: &str, term: Term) -> impl Future<Output = ()> + Send;

    /// The writers in the data table, in the order written.
    fn writers(&self) -> impl Future<Output = Vec<String>> + Send;

    /// The highest term accepted under `key`.
    fn highest(&self, key: &FenceKey) -> impl Future<Output = Option<Term>> + Send;
}

pub(crate) fn random_lease() -> LeaseName {
    LeaseName::new(format!("fence-test-{:016x}", rand::random::<u64>())).unwrap()
}

/// The store at `url` (`sqlite://` or `postgres://`), as `leasehold::connect` opens it, but
/// through the two backends directly: a workspace build gives the facade every backend, and this
/// binary would link them all.
async fn connect(url: &str) -> Arc<dyn LeaseStore> {
    if url.starts_with("sqlite:") {
        Arc::new(leasehold_sqlite::SqliteStore::connect(url).await.unwrap())
    } else {
        Arc::new(leasehold_postgres::PostgresStore::connect(url).await.unwrap())
    }
}

async fn elect(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str) -> leasehold_core::Leader {
    let elector = Elector::builder(store, lease.as_str())
        .candidate_id(id)
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), elector.campaign())
        .await
        .unwrap()
        .unwrap()
}

/// Leader A (a real lease in the store at `store_url`) writes at its term n; an operator breaks
/// the lease and B is elected at a higher term and writes; A, not yet aware, writes again at n:
/// refused with `Stale { term: n, highest: B's term }`, and A's data row is rolled back with it.
/// B writing again at its own term is accepted. The error names the key, never the URL's
/// password.
pub(crate) async fn deposed_leaders_late_write_is_rejected(db: &impl FenceDb, store_url: &str) {
    let lease = random_lease();
    let store_a = connect(store_url).await;
    let store_b = connect(store_url).await;
    let key = FenceKey::from_url(store_url, &lease).unwrap();

    let leader_a = elect(store_a, &lease, "A").await;
    let term_a = leader_a.term();
    db.fenced_write(&key, "A-1", term_a).await.unwrap();

    // Deposed without being told: the operator frees the lease and B takes it.
    assert!(store_b.break_lease(&lease).await.unwrap().is_some());
    let leader_b = elect(store_b, &lease, "B").await;
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
    let url = url::Url::parse(store_url).unwrap();
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
    assert_eq!(db.highest(&key).await, Some(term_b));

    leader_b.resign().await;
    drop(leader_a);
}

/// Equal terms are accepted, lower ones refused (nothing written), higher ones raise the
/// fence; keys are fenced independently.
pub(crate) async fn equal_terms_are_accepted_lower_refused_higher_advance(db: &impl FenceDb) {
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
    let other = FenceKey::new("other-store", &random_lease());
    db.fenced_write(&other, "other-1", Term(1)).await.unwrap();
    assert_eq!(db.highest(&other).await, Some(Term(1)));
    assert_eq!(db.highest(&key).await, Some(Term(8)));
}

/// Terms 5 and 4 race on a row at 3: 5 checks first and holds its transaction open; 4's check
/// waits instead of finishing (a plain read would see 3 and let 4 through); when 5 commits, 4
/// is refused. Then the reverse on a key nobody has written yet: 4 checks first, 6 waits, 4
/// commits (it checked first, so it came first), and 6 is accepted after it.
pub(crate) async fn racing_transactions_are_serialised<D: FenceDb>(db: Arc<D>) {
    let key = FenceKey::new("test-store", &random_lease());
    db.fenced_write(&key, "3", Term(3)).await.unwrap();

    let tx5 = db.check_and_hold(&key, Term(5)).await;
    let late = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "4", Term(4)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !late.is_finished(),
        "term 4's check finished while term 5 held the fence"
    );
    db.write_and_commit(tx5, "5", Term(5)).await;
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
    let tx4 = db.check_and_hold(&key, Term(4)).await;
    let next = tokio::spawn({
        let (db, key) = (db.clone(), key.clone());
        async move { db.fenced_write(&key, "6", Term(6)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !next.is_finished(),
        "term 6's check finished while term 4 held the fence"
    );
    db.write_and_commit(tx4, "4", Term(4)).await;
    next.await.unwrap().unwrap();
    assert_eq!(db.highest(&key).await, Some(Term(6)));
    assert_eq!(db.writers().await, ["3", "4", "5", "6"]);
}

/// `i64::MAX` is stored and read back; `i64::MAX + 1` and `u64::MAX` are refused with
/// `TermOutOfRange` naming the term, and nothing is stored for them.
pub(crate) async fn terms_above_i64_max_are_refused_with_a_typed_error(db: &impl FenceDb) {
    let key = FenceKey::new("test-store", &random_lease());
    for term in [Term(i64::MAX as u64 + 1), Term(u64::MAX)] {
        let err = db.fenced_write(&key, "too-big", term).await.unwrap_err();
        assert!(
            matches!(err, FenceError::TermOutOfRange { term: t, .. } if t == term),
            "{err:?}"
        );
        assert!(err.to_string().contains(&term.to_string()), "{err}");
    }
    assert_eq!(db.highest(&key).await, None);
    db.fenced_write(&key, "max", Term(i64::MAX as u64)).await.unwrap();
    assert_eq!(db.highest(&key).await, Some(Term(i64::MAX as u64)));
    assert_eq!(db.writers().await, ["max"]);
}
