//! `LeaseStore::list`: every lease of the file whose name starts with a prefix, as `inspect`
//! shows it, in name order; the prefix is literal (no `LIKE` or `GLOB` wildcards), case-sensitive.

use std::path::Path;
use std::time::Duration;

use leasehold_core::{EndReason, Error, Grant, LeaseName, LeaseStore, Observation, Term};
use leasehold_sqlite::SqliteStore;
use sqlx::{Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(5);

fn name(text: &str) -> LeaseName {
    text.parse().unwrap()
}

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

#[tokio::test]
async fn list_shows_each_lease_of_a_prefix_as_inspect_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("leases.db")).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), Vec::new(), "an empty file lists nothing");

    // Created out of order: the listing is sorted by name.
    let held = grant(&store, "a-3-held", "x").await;
    let released = grant(&store, "a-1-released", "y").await;
    store.release(&released).await.unwrap();
    let released_again = grant(&store, "a-1-released", "y").await;
    store.release(&released_again).await.unwrap();
    grant(&store, "a-2-broken", "z").await;
    assert_eq!(store.break_lease(&name("a-2-broken")).await.unwrap(), Some(Term(1)));
    let other = grant(&store, "b-1", "x").await;
    // Names a wildcard of LIKE or GLOB would match, and another case.
    grant(&store, "a_1", "x").await;
    grant(&store, "ab-1", "x").await;
    grant(&store, "A-1", "x").await;

    let listed = store.list("a-").await.unwrap();
    assert_eq!(names(&listed), ["a-1-released", "a-2-broken", "a-3-held"]);
    for observation in &listed {
        assert_eq!(observation, &store.inspect(&observation.lease).await.unwrap());
    }
    let [released, broken, held_now] = listed.as_slice() else {
        unreachable!()
    };
    assert_eq!(
        (released.holder.as_ref(), released.last_term, released.previous_end),
        (None, released_again.term, Some(EndReason::Released))
    );
    assert_eq!(released.last_term, Term(2));
    assert_eq!(
        (broken.holder.as_ref(), broken.last_term, broken.previous_end),
        (None, Term(1), Some(EndReason::Broken))
    );
    let holder = held_now.holder.as_ref().expect("a-3-held is held");
    assert_eq!((holder.id.as_str(), holder.term, holder.ttl), ("x", held.term, TTL));
    assert_eq!(holder.version, held.token);
    assert!(!holder.orphaned);

    let all = store.list("").await.unwrap();
    assert_eq!(
        names(&all),
        ["A-1", "a-1-released", "a-2-broken", "a-3-held", "a_1", "ab-1", "b-1"]
    );
    assert_eq!(all[6].holder.as_ref().map(|h| h.term), Some(other.term));
    assert_eq!(names(&store.list("b").await.unwrap()), ["b-1"]);
    assert_eq!(names(&store.list("a-3-held").await.unwrap()), ["a-3-held"]);
    assert_eq!(names(&store.list("a-3-held-").await.unwrap()), Vec::<&str>::new());

    // The prefix is literal: `_` is not "any character", `%`, `*`, `?` and `[` match only
    // themselves (no lease name contains them), and case counts.
    assert_eq!(names(&store.list("a_").await.unwrap()), ["a_1"]);
    for literal in ["a%", "%", "*", "a*", "?", "a?-1", "[", "[a]", "a[_]", "A-1*"] {
        assert_eq!(store.list(literal).await.unwrap(), Vec::new(), "list({literal:?})");
    }
    assert_eq!(names(&store.list("A").await.unwrap()), ["A-1"]);
}

#[tokio::test]
async fn list_names_a_corrupt_lease_and_leaves_other_prefixes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::open(&path).await.unwrap();
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
