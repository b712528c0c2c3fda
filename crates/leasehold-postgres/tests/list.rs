//! `LeaseStore::list` against a real server, where Postgres's own rows and schemas matter: an
//! orphaned row, `LIKE`'s escape character, one schema per store. Each test uses a schema of its
//! own, dropped at the end.

use crate::common;

use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault};
use leasehold_core::{Grant, LeaseName, LeaseStore, Observation};
use leasehold_postgres::PostgresStore;

use common::{PostgresBackend, lock_holder, server};

const TTL: Duration = Duration::from_secs(5);

fn name(text: &str) -> LeaseName {
    text.parse().unwrap()
}

async fn grant(store: &PostgresStore, lease: &str, candidate: &str) -> Grant {
    leasehold_conformance::must_grant(store, lease, candidate, TTL).await
}

fn names(listed: &[Observation]) -> Vec<&str> {
    listed.iter().map(|o| o.lease.as_str()).collect()
}

/// A URL of the test server on a fresh schema, and that schema.
fn fresh(pg: &PostgresBackend, tag: &str) -> (String, String) {
    let schema = common::schema(tag);
    (common::with_option(&pg.url, &format!("schema={schema}")), schema)
}

async fn drop_schema(pg: &PostgresBackend, schema: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut pg.raw().await)
        .await
        .unwrap();
}

/// Postgres's own: a new schema lists nothing; a row that outlives its holder's session is
/// listed as orphaned, as `inspect` shows it; the `LIKE` escape character is literal; another
/// schema's leases are not this store's. (What a listing shows of each lease, in which order,
/// and literal prefixes in general: the shared scenario `list_by_prefix`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_row_is_listed_and_a_schema_lists_only_its_own() {
    let Some(pg) = server() else { return };
    let (url, schema) = fresh(&pg, "list");
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "a new schema lists nothing");

    let held = grant(&store, "a-3-held", "x").await;
    // A row that outlives its holder's session (reset): listed as orphaned.
    // (The backend owns the proxy: it lives as long as the test.)
    let proxied = PostgresBackend::new(url.clone());
    let (faulty, faults) = proxied.faulty_store().await.unwrap();
    let orphan = grant(&faulty, "a-4-orphaned", "w").await;
    faults.set(Direction::Both, Fault::Reset);
    let reset = Instant::now();
    while lock_holder(&mut pg.raw().await, store.lock_key(&name("a-4-orphaned")))
        .await
        .is_some()
    {
        assert!(reset.elapsed() < TTL, "a reset ends the session at once");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let listed = store.list("a-").await.unwrap();
    assert_eq!(names(&listed), ["a-3-held", "a-4-orphaned"]);
    for observation in &listed {
        assert_eq!(observation, &store.inspect(&observation.lease).await.unwrap());
    }
    let holder = listed[0].holder.as_ref().expect("a-3-held is held");
    assert_eq!(
        (holder.id.as_str(), holder.term, holder.orphaned),
        ("x", held.term, false)
    );
    let holder = listed[1].holder.as_ref().expect("the row still names w");
    assert_eq!((holder.id.as_str(), holder.term), ("w", orphan.term));
    assert!(holder.orphaned, "its session ended: {holder:?}");

    // `LIKE`'s wildcards and its escape character match only themselves.
    for literal in ["a%", "%", "a_", "!", "a!", "a\\", "\\"] {
        assert_eq!(store.list(literal).await.unwrap(), Vec::new(), "list({literal:?})");
    }

    // Another schema's leases are not this store's.
    let default = PostgresStore::connect(&pg.url).await.unwrap();
    assert!(
        default
            .list("a-")
            .await
            .unwrap()
            .iter()
            .all(|o| !o.lease.as_str().starts_with("a-4-orphaned"))
    );
    drop_schema(&pg, &schema).await;
}
