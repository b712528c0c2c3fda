//! `LeaseStore::list` against a real server: every lease row of the store's schema whose name
//! starts with a prefix, as `inspect` shows it (an orphaned row too), in name order; the prefix
//! is literal (no `LIKE` wildcards). Each test uses a schema of its own, dropped at the end.

mod common;

use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault};
use leasehold_core::{EndReason, Grant, LeaseName, LeaseStore, Observation, Term};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_each_lease_of_a_prefix_as_inspect_does() {
    let Some(pg) = server() else { return };
    let (url, schema) = fresh(&pg, "list");
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "a new schema lists nothing");

    // Created out of order: the listing is sorted by name.
    let held = grant(&store, "a-3-held", "x").await;
    let released = grant(&store, "a-1-released", "y").await;
    store.release(&released).await.unwrap();
    let released_again = grant(&store, "a-1-released", "y").await;
    store.release(&released_again).await.unwrap();
    let broken = grant(&store, "a-2-broken", "z").await;
    assert_eq!(store.break_lease(&name("a-2-broken")).await.unwrap(), Some(broken.term));
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
    let other = grant(&store, "b-1", "x").await;
    // Names a LIKE wildcard would match, and another case.
    grant(&store, "a_1", "x").await;
    grant(&store, "ab-1", "x").await;
    grant(&store, "A-1", "x").await;

    let listed = store.list("a-").await.unwrap();
    assert_eq!(
        names(&listed),
        ["a-1-released", "a-2-broken", "a-3-held", "a-4-orphaned"]
    );
    for observation in &listed {
        assert_eq!(observation, &store.inspect(&observation.lease).await.unwrap());
    }
    let [released, broken_now, held_now, orphaned] = listed.as_slice() else {
        unreachable!()
    };
    assert_eq!(
        (released.holder.as_ref(), released.last_term, released.previous_end),
        (None, released_again.term, Some(EndReason::Released))
    );
    assert!(released.last_term > Term(1));
    assert_eq!(
        (
            broken_now.holder.as_ref(),
            broken_now.last_term,
            broken_now.previous_end
        ),
        (None, broken.term, Some(EndReason::Broken))
    );
    let holder = held_now.holder.as_ref().expect("a-3-held is held");
    assert_eq!((holder.id.as_str(), holder.term, holder.ttl), ("x", held.term, TTL));
    assert_eq!(holder.version, held.token);
    assert!(!holder.orphaned, "a live holder is not orphaned");
    let holder = orphaned.holder.as_ref().expect("the row still names w");
    assert_eq!((holder.id.as_str(), holder.term), ("w", orphan.term));
    assert!(holder.orphaned, "its session ended: {holder:?}");

    let all = store.list("").await.unwrap();
    assert_eq!(
        names(&all),
        [
            "A-1",
            "a-1-released",
            "a-2-broken",
            "a-3-held",
            "a-4-orphaned",
            "a_1",
            "ab-1",
            "b-1"
        ]
    );
    assert_eq!(all[7].holder.as_ref().map(|h| h.term), Some(other.term));
    assert_eq!(names(&store.list("b").await.unwrap()), ["b-1"]);
    assert_eq!(names(&store.list("a-3-held").await.unwrap()), ["a-3-held"]);

    // The prefix is literal: `_` is not "any character", `%`, `*`, `?`, `[` and the escape
    // character match only themselves (no lease name contains them), and case counts.
    assert_eq!(names(&store.list("a_").await.unwrap()), ["a_1"]);
    for literal in ["a%", "%", "*", "a*", "?", "[", "[a]", "a!", "!", "a\\", "A-1%"] {
        assert_eq!(store.list(literal).await.unwrap(), Vec::new(), "list({literal:?})");
    }
    assert_eq!(names(&store.list("A").await.unwrap()), ["A-1"]);

    // Another schema's leases are not this store's.
    let default = PostgresStore::connect(&pg.url).await.unwrap();
    assert!(
        default
            .list("a-")
            .await
            .unwrap()
            .iter()
            .all(|o| !o.lease.as_str().starts_with("a-1-released"))
    );
    drop_schema(&pg, &schema).await;
}
