//! `LeaseStore::list` on SQLite's own file: an empty file, and a garbled row.

use std::path::Path;
use std::time::Duration;

use leasehold_core::{Error, Grant, LeaseStore, Observation};
use leasehold_sqlite::SqliteStore;
use sqlx::{Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(5);

async fn grant(store: &SqliteStore, lease: &str, candidate: &str) -> Grant {
    leasehold_conformance::must_grant(store, lease, candidate, TTL).await
}

fn names(listed: &[Observation]) -> Vec<&str> {
    listed.iter().map(|o| o.lease.as_str()).collect()
}

async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// An empty file lists nothing; a garbled row fails a listing that takes it in with an error
/// naming the lease and the column, and leaves other prefixes alone. (What a listing shows of
/// each lease, in which order, and literal prefixes: the shared scenario `list_by_prefix`.)
#[tokio::test]
async fn list_names_a_corrupt_lease_and_leaves_other_prefixes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "an empty file lists nothing");
    grant(&store, "good-1", "x").await;
    grant(&store, "bad-1", "x").await;
    sqlx::query("UPDATE leasehold_leases SET version = 'not a version' WHERE name = 'bad-1'")
        .execute(&mut raw(&path).await)
        .await
        .unwrap();
    for prefix in ["", "bad"] {
        match store.list(prefix).await {
            Err(Error::CorruptRecord { lease, detail, .. }) => {
                assert_eq!(lease, "bad-1");
                assert!(detail.contains("version"), "{detail}");
            }
            other => panic!("list({prefix:?}): expected CorruptRecord, got {other:?}"),
        }
    }
    assert_eq!(names(&store.list("good").await.unwrap()), ["good-1"]);
}
