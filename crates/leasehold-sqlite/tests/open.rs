//! Opening lease files: bad paths, foreign files and tables, URLs, concurrent opens.

use std::path::Path;
use std::time::Duration;

use leasehold_core::{AcquireRequest, Error, LeaseStore};
use leasehold_sqlite::{OpenError, SqliteConfig, SqliteStore};
use sqlx::{Connection, SqliteConnection};

async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

fn open_error(error: &Error) -> &OpenError {
    match error {
        Error::Store {
            store: "sqlite",
            source,
        } => source
            .downcast_ref::<OpenError>()
            .unwrap_or_else(|| panic!("not an OpenError: {error}")),
        other => panic!("expected Error::Store with an OpenError, got {other:?}"),
    }
}

fn corrupt_table(error: Error, table: &str) -> String {
    match error {
        Error::CorruptRecord {
            store: "sqlite",
            lease,
            detail,
        } => {
            assert!(lease.contains(table), "names {lease}, expected {table}");
            assert!(detail.contains(table), "{detail}");
            detail
        }
        other => panic!("expected CorruptRecord naming {table}, got {other:?}"),
    }
}

async fn tables(path: &Path) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(&mut raw(path).await)
        .await
        .unwrap()
}

#[tokio::test]
async fn creates_the_file_and_tables_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert!(path.exists());
    assert_eq!(
        tables(&path).await,
        [
            "leasehold_leases",
            "leasehold_meta",
            "leasehold_shards",
            "leasehold_terms",
            "leasehold_waiters"
        ]
    );
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut raw(&path).await)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = sqlx::query_scalar("SELECT schema_version FROM leasehold_meta")
        .fetch_one(&mut raw(&path).await)
        .await
        .unwrap();
    assert_eq!(version, 1);
    store.close().await;
    // Opening again finds everything in place and changes nothing.
    SqliteStore::open(&path).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM leasehold_meta")
        .fetch_one(&mut raw(&path).await)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_named_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let garbage = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &garbage).unwrap();
    let error = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(open_error(&error), OpenError::NotADatabase { path: p, .. } if p == &path),
        "{error}"
    );
    assert!(error.to_string().contains("notes.txt"), "{error}");
    assert!(!error.is_transient());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), garbage);
}

#[tokio::test]
async fn a_path_that_cannot_be_written_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    for path in [
        dir.path().join("missing-dir").join("leases.db"), // no such directory
        file.join("leases.db"),                           // a file where a directory should be
        dir.path().to_path_buf(),                         // a directory where the file should be
    ] {
        let error = SqliteStore::open(&path).await.unwrap_err();
        assert!(
            matches!(open_error(&error), OpenError::CannotWrite { path: p, .. } if p == &path),
            "{error}"
        );
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    }
}

#[tokio::test]
async fn a_foreign_table_of_the_same_name_is_reported_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let mut conn = raw(&path).await;
    sqlx::query("CREATE TABLE leasehold_leases (id INTEGER PRIMARY KEY, owner TEXT)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO leasehold_leases (owner) VALUES ('someone else')")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let detail = corrupt_table(SqliteStore::open(&path).await.unwrap_err(), "leasehold_leases");
    assert!(
        detail.contains("owner TEXT") && detail.contains("holder TEXT"),
        "{detail}"
    );
    // Nothing was altered, dropped or added.
    assert_eq!(tables(&path).await, ["leasehold_leases"]);
    let owner: String = sqlx::query_scalar("SELECT owner FROM leasehold_leases")
        .fetch_one(&mut raw(&path).await)
        .await
        .unwrap();
    assert_eq!(owner, "someone else");
}

#[tokio::test]
async fn a_table_with_one_column_changed_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    SqliteStore::open(&path).await.unwrap().close().await;
    let mut conn = raw(&path).await;
    sqlx::query("ALTER TABLE leasehold_terms ADD COLUMN note TEXT")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let detail = corrupt_table(SqliteStore::open(&path).await.unwrap_err(), "leasehold_terms");
    assert!(detail.contains("note TEXT"), "{detail}");
}

#[tokio::test]
async fn a_view_of_the_same_name_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let mut conn = raw(&path).await;
    sqlx::query("CREATE VIEW leasehold_meta AS SELECT 1 AS schema_version")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let detail = corrupt_table(SqliteStore::open(&path).await.unwrap_err(), "leasehold_meta");
    assert!(detail.contains("is a view"), "{detail}");
}

#[tokio::test]
async fn a_newer_schema_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    SqliteStore::open(&path).await.unwrap().close().await;
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE leasehold_meta SET schema_version = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let detail = corrupt_table(SqliteStore::open(&path).await.unwrap_err(), "leasehold_meta");
    assert!(detail.contains("schema_version is 2"), "{detail}");
}

#[tokio::test]
async fn urls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("by url.db");
    let url = format!(
        "sqlite://{}?busy_timeout=250ms&pool_size=2",
        dir.path().join("by%20url.db").display()
    );
    let store = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(store.config().path, path);
    assert_eq!(store.config().busy_timeout, Duration::from_millis(250));
    assert!(path.exists());
    SqliteStore::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();

    for bad in [
        "sqlite::memory:",
        "sqlite://",
        "postgres://localhost/x",
        "sqlite:x.db?busy_timeout=never",
    ] {
        match SqliteStore::connect(bad).await {
            Err(Error::InvalidUrl { url, .. }) => assert_eq!(url, bad),
            other => panic!("{bad}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn invalid_config_names_the_field() {
    let mut config = SqliteConfig::new("unused.db");
    config.pool_size = 0;
    match SqliteStore::from_config(config).await {
        Err(Error::InvalidConfig { field: "pool_size", .. }) => {}
        other => panic!("expected InvalidConfig for pool_size, got {other:?}"),
    }
}

#[tokio::test]
async fn ttl_outside_the_range_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("leases.db")).await.unwrap();
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(24 * 3600 + 1),
    ] {
        let request = AcquireRequest {
            lease: "l".parse().unwrap(),
            candidate: "a".parse().unwrap(),
            ttl,
            takeover: None,
        };
        match store.acquire(&request).await {
            Err(Error::InvalidTtl {
                store: "sqlite",
                ttl: t,
                ..
            }) => assert_eq!(t, ttl),
            other => panic!("{ttl:?}: expected InvalidTtl, got {other:?}"),
        }
    }
}

/// Candidates that start together open a new file together: one creates it, the others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_open_a_new_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let opens: Vec<_> = (0..12).map(|_| tokio::spawn(SqliteStore::open(path.clone()))).collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
    assert_eq!(
        tables(&path).await,
        [
            "leasehold_leases",
            "leasehold_meta",
            "leasehold_shards",
            "leasehold_terms",
            "leasehold_waiters"
        ]
    );
}
