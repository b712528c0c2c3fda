//! The lease semantics, one store or several on one file, and what garbage in a row gives.

use std::path::Path;
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Expiry, Grant, LeaseName, LeaseStore, Observation,
    Renewed, Term,
};
use leasehold_sqlite::{SqliteConfig, SqliteStore};
use sqlx::{Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(2);

fn lease() -> LeaseName {
    "jobs".parse().unwrap()
}

fn id(name: &str) -> CandidateId {
    name.parse().unwrap()
}

fn request(candidate: &str, takeover: Option<&str>) -> AcquireRequest {
    AcquireRequest {
        lease: lease(),
        candidate: id(candidate),
        ttl: TTL,
        takeover: takeover.map(str::to_string),
    }
}

async fn granted(store: &SqliteStore, candidate: &str, takeover: Option<&str>) -> Grant {
    match store.acquire(&request(candidate, takeover)).await.unwrap() {
        Acquired::Granted(grant) => grant,
        Acquired::Held(observation) => panic!("{candidate} expected a grant, saw {observation:?}"),
    }
}

async fn held(store: &SqliteStore, candidate: &str, takeover: Option<&str>) -> Observation {
    match store.acquire(&request(candidate, takeover)).await.unwrap() {
        Acquired::Held(observation) => observation,
        Acquired::Granted(grant) => panic!("{candidate} expected Held, was granted {grant:?}"),
    }
}

async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

async fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(dir.path().join("leases.db")).await.unwrap()
}

#[tokio::test]
async fn capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let caps = store.capabilities();
    assert_eq!(caps.expiry, Expiry::ObservedByContenders);
    assert_eq!(caps.ttl, Duration::from_millis(1)..=Duration::from_secs(24 * 3600));
    assert!(!caps.fifo);
    assert!(store.can_break());
}

#[tokio::test]
async fn acquire_hold_renew_release_reacquire() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    assert_eq!(
        store.inspect(&lease()).await.unwrap(),
        Observation::free(lease(), Term(0), None)
    );

    let a = granted(&store, "a", None).await;
    assert_eq!((a.term, a.ttl, &a.holder), (Term(1), TTL, &id("a")));

    let seen = held(&store, "b", None).await;
    let holder = seen.holder.as_ref().unwrap();
    assert_eq!(
        (&holder.id, holder.term, holder.ttl, holder.store_remaining),
        (&id("a"), Term(1), TTL, None)
    );
    assert_eq!(holder.version, a.token);
    assert_eq!((seen.last_term, seen.previous_end), (Term(1), None));
    assert_eq!(store.inspect(&lease()).await.unwrap(), seen);

    let Renewed::Renewed(renewed) = store.renew(&a).await.unwrap() else {
        panic!("renew lost")
    };
    assert_eq!(renewed.term, Term(1));
    assert_ne!(renewed.token, a.token, "every renew writes a new record version");
    assert_eq!(
        store.inspect(&lease()).await.unwrap().holder.unwrap().version,
        renewed.token
    );

    store.release(&renewed).await.unwrap();
    assert_eq!(
        store.inspect(&lease()).await.unwrap(),
        Observation::free(lease(), Term(1), Some(EndReason::Released))
    );
    store.release(&renewed).await.unwrap(); // releasing again is not an error

    let b = granted(&store, "b", None).await;
    assert_eq!(b.term, Term(2));
    let Renewed::Lost(lost) = store.renew(&a).await.unwrap() else {
        panic!("a renewed a released lease")
    };
    assert_eq!(lost.holder.unwrap().id, id("b"));

    let history = store.history(&lease(), 10).await.unwrap();
    assert_eq!(
        history.iter().map(|t| (t.term, t.holder.clone())).collect::<Vec<_>>(),
        [(Term(1), id("a")), (Term(2), id("b"))]
    );
    assert_eq!(history[0].ended.map(|(_, reason)| reason), Some(EndReason::Released));
    assert!(history[0].acquired_at <= history[0].ended.unwrap().0);
    assert_eq!(history[1].ended, None);
}

#[tokio::test]
async fn the_holder_acquiring_again_gets_a_new_term() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let first = granted(&store, "a", None).await;
    let again = granted(&store, "a", None).await;
    assert_eq!(again.term, Term(2));
    assert_ne!(again.token, first.token);
    let Renewed::Lost(_) = store.renew(&first).await.unwrap() else {
        panic!("the old term renewed")
    };
    let history = store.history(&lease(), 10).await.unwrap();
    assert_eq!(history[0].ended.map(|(_, reason)| reason), Some(EndReason::Expired));
}

/// A handover leaves the row naming the successor at the old term with `previous_end`
/// `handed_over`, and nothing takes that row for a grant of the successor at the old term: a
/// renewal or release of such a grant is `Lost` / a no-op. Breaking a reservation frees it and
/// keeps the history's `handed_over`.
#[tokio::test]
async fn a_reservation_is_the_successor_named_with_previous_end_handed_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let a = granted(&store, "a", None).await;
    store.hand_over(&a, &id("c")).await.unwrap();
    let (holder, term, version, previous_end): (String, i64, String, String) =
        sqlx::query_as("SELECT holder, term, version, previous_end FROM leasehold_leases")
            .fetch_one(&mut raw(&dir.path().join("leases.db")).await)
            .await
            .unwrap();
    assert_eq!((holder.as_str(), term, previous_end.as_str()), ("c", 1, "handed_over"));
    assert_ne!(version, a.token, "a reservation has a version of its own");
    let seen = store.inspect(&lease()).await.unwrap();
    let reserved = seen.holder.clone().unwrap();
    assert!(
        reserved.reserved && reserved.id == id("c") && reserved.term == Term(1),
        "{seen:?}"
    );
    assert_eq!(reserved.version, version);

    // A grant of the successor at the handed-over term is not what the row records.
    let as_c = Grant {
        holder: id("c"),
        token: version,
        ..a.clone()
    };
    let Renewed::Lost(lost) = store.renew(&as_c).await.unwrap() else {
        panic!("a reservation renewed as a grant of the successor")
    };
    assert_eq!(lost, seen);
    store.release(&as_c).await.unwrap();
    store.hand_over(&as_c, &id("b")).await.unwrap();
    assert_eq!(store.inspect(&lease()).await.unwrap(), seen);

    assert_eq!(store.break_lease(&lease()).await.unwrap(), Some(Term(1)));
    assert_eq!(
        store.inspect(&lease()).await.unwrap(),
        Observation::free(lease(), Term(1), Some(EndReason::Broken))
    );
    let history = store.history(&lease(), 10).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|t| (t.term, t.ended.map(|(_, why)| why)))
            .collect::<Vec<_>>(),
        [(Term(1), Some(EndReason::HandedOver))]
    );
    assert_eq!(granted(&store, "b", None).await.term, Term(2));
}

#[tokio::test]
async fn two_stores_on_one_file_see_each_others_leases() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (open(&dir).await, open(&dir).await);
    let a = granted(&one, "a", None).await;
    let seen = held(&two, "b", None).await;
    assert_eq!(seen.holder.unwrap().id, id("a"));
    one.release(&a).await.unwrap();
    assert_eq!(granted(&two, "b", None).await.term, Term(2));
    assert_eq!(one.inspect(&lease()).await.unwrap().holder.unwrap().id, id("b"));
    assert_eq!(one.history(&lease(), 5).await.unwrap().len(), 2);
}

#[tokio::test]
async fn terms_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = open(&dir).await;
    for _ in 0..3 {
        let grant = granted(&store, "a", None).await;
        store.release(&grant).await.unwrap();
    }
    store.close().await;
    // Reopened: the term carries on.
    let store = open(&dir).await;
    let grant = granted(&store, "a", None).await;
    assert_eq!(grant.term, Term(4));
    store.release(&grant).await.unwrap();
    // Even with the lease row deleted by hand, the history keeps the term from going back.
    sqlx::query("DELETE FROM leasehold_leases")
        .execute(&mut raw(&path).await)
        .await
        .unwrap();
    assert_eq!(store.inspect(&lease()).await.unwrap().last_term, Term(4));
    assert_eq!(granted(&store, "a", None).await.term, Term(5));
}

#[tokio::test]
async fn history_is_oldest_first_limited_and_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("leases.db"));
    config.history_limit = 4;
    let store = SqliteStore::from_config(config).await.unwrap();
    for _ in 0..7 {
        let grant = granted(&store, "a", None).await;
        store.release(&grant).await.unwrap();
    }
    let terms = |history: Vec<leasehold_core::Transition>| history.iter().map(|t| t.term.0).collect::<Vec<_>>();
    assert_eq!(terms(store.history(&lease(), 100).await.unwrap()), [4, 5, 6, 7]);
    assert_eq!(terms(store.history(&lease(), 2).await.unwrap()), [6, 7]);
    assert_eq!(terms(store.history(&lease(), 0).await.unwrap()), Vec::<u64>::new());
    assert_eq!(
        terms(store.history(&"other".parse().unwrap(), 10).await.unwrap()),
        Vec::<u64>::new()
    );
}

/// Another program's garbage in a lease's row: every operation answers a typed error naming the
/// lease and the field, and nothing panics.
#[tokio::test]
async fn garbage_in_the_row_is_a_corrupt_record() {
    let cases = [
        (
            "UPDATE leasehold_leases SET term = 'garbage'",
            "term is the text \"garbage\"",
        ),
        ("UPDATE leasehold_leases SET term = 1.5", "term is a REAL"),
        ("UPDATE leasehold_leases SET term = -3", "term -3"),
        ("UPDATE leasehold_leases SET holder = ''", "holder"),
        ("UPDATE leasehold_leases SET holder = 'bell' || char(7)", "holder"),
        ("UPDATE leasehold_leases SET holder = x'ff00'", "holder"),
        (
            "UPDATE leasehold_leases SET holder = CAST('abc' AS BLOB)",
            "holder is a BLOB value",
        ),
        ("UPDATE leasehold_leases SET version = NULL", "version"),
        ("UPDATE leasehold_leases SET version = 'xyz'", "version \"xyz\""),
        ("UPDATE leasehold_leases SET ttl_ms = 0", "ttl_ms 0"),
        (
            "UPDATE leasehold_leases SET ttl_ms = 'soon'",
            "ttl_ms is the text \"soon\"",
        ),
        (
            "UPDATE leasehold_leases SET previous_end = 'exploded'",
            "unknown end reason \"exploded\"",
        ),
        (
            "UPDATE leasehold_leases SET holder = NULL",
            "must be all set or all NULL",
        ),
        ("UPDATE leasehold_terms SET term = 'x'", "leasehold_terms.term"),
    ];
    for (sql, why) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let store = open(&dir).await;
        let grant = granted(&store, "a", None).await;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut raw(&path).await)
            .await
            .unwrap();

        let results: Vec<(&str, Result<(), Error>)> = vec![
            ("acquire", store.acquire(&request("b", None)).await.map(drop)),
            ("renew", store.renew(&grant).await.map(drop)),
            ("release", store.release(&grant).await),
            ("inspect", store.inspect(&lease()).await.map(drop)),
            ("history", store.history(&lease(), 10).await.map(drop)),
            ("break_lease", store.break_lease(&lease()).await.map(drop)),
        ];
        for (operation, result) in results {
            match result {
                Err(Error::CorruptRecord {
                    store: "sqlite",
                    lease: name,
                    detail,
                }) => {
                    assert_eq!(name, "jobs", "{sql}: {operation}");
                    assert!(detail.contains(why), "{sql}: {operation}: {detail:?} lacks {why:?}");
                }
                other => panic!("{sql}: {operation}: expected CorruptRecord, got {other:?}"),
            }
        }
        // Other leases in the same file are unaffected.
        let other = AcquireRequest {
            lease: "other".parse().unwrap(),
            ..request("b", None)
        };
        assert!(
            matches!(store.acquire(&other).await.unwrap(), Acquired::Granted(_)),
            "{sql}"
        );
    }
}

#[tokio::test]
async fn garbage_in_the_history_is_a_corrupt_record() {
    for (sql, why) in [
        (
            "UPDATE leasehold_terms SET end_reason = 'exploded', ended_at = 1",
            "unknown end reason \"exploded\"",
        ),
        ("UPDATE leasehold_terms SET ended_at = 5", "ended_at and end_reason"),
        (
            "UPDATE leasehold_terms SET acquired_at = 'yesterday'",
            "acquired_at is the text",
        ),
        ("UPDATE leasehold_terms SET holder = ''", "holder"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        granted(&store, "a", None).await;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut raw(&dir.path().join("leases.db")).await)
            .await
            .unwrap();
        match store.history(&lease(), 10).await {
            Err(Error::CorruptRecord {
                lease: name, detail, ..
            }) => {
                assert_eq!(name, "jobs");
                assert!(detail.contains(why), "{sql}: {detail:?} lacks {why:?}");
            }
            other => panic!("{sql}: expected CorruptRecord, got {other:?}"),
        }
    }
}

/// A write lock held by another process past the busy timeout is a transient timeout: the
/// engine reads back and retries.
#[tokio::test]
async fn a_lock_held_too_long_is_a_transient_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let mut config = SqliteConfig::new(&path);
    config.busy_timeout = Duration::from_millis(100);
    let store = SqliteStore::from_config(config).await.unwrap();
    let mut other = raw(&path).await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.unwrap();
    let error = store.acquire(&request("a", None)).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Timeout {
                store: "sqlite",
                operation: "acquire",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_transient());
    // Readers are not blocked by a writer (write-ahead logging).
    assert_eq!(store.inspect(&lease()).await.unwrap().holder, None);
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    granted(&store, "a", None).await;
}

#[tokio::test]
async fn a_closed_store_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store.close().await;
    let error = store.inspect(&lease()).await.unwrap_err();
    assert!(matches!(error, Error::Unreachable { store: "sqlite", .. }), "{error:?}");
    assert!(error.is_transient());
}

/// 16 candidates race, exactly one wins: from 8 stores on one file (as from 8 processes), and
/// from one store, whose requests share transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_candidates_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(open(&dir).await);
    }
    for round in 0..10 {
        let name: LeaseName = format!("race-{round}").parse().unwrap();
        let clients = if round % 2 == 0 { &stores[..] } else { &stores[..1] };
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = clients[i % clients.len()].clone();
                let request = AcquireRequest {
                    lease: name.clone(),
                    ..request(&format!("c{i}"), None)
                };
                tokio::spawn(async move { store.acquire(&request).await })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            if let Acquired::Granted(grant) = task.await.unwrap().unwrap() {
                assert_eq!(grant.term, Term(1));
                winners += 1;
            }
        }
        assert_eq!(winners, 1, "round {round}");
    }
}

/// Requests that share a transaction do not share failures: a corrupt record fails only the
/// requests for that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_fails_only_its_own_requests() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    granted(&store, "a", None).await;
    sqlx::query("UPDATE leasehold_leases SET term = 'garbage'")
        .execute(&mut raw(&dir.path().join("leases.db")).await)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            let lease = if i % 2 == 0 {
                lease()
            } else {
                format!("healthy-{i}").parse().unwrap()
            };
            tokio::spawn(async move {
                (
                    i,
                    store
                        .acquire(&AcquireRequest {
                            lease,
                            ..request("b", None)
                        })
                        .await,
                )
            })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            (i, Err(Error::CorruptRecord { .. })) if i % 2 == 0 => {}
            (i, Ok(Acquired::Granted(grant))) if i % 2 == 1 => assert_eq!(grant.term, Term(1)),
            (i, other) => panic!("request {i}: {other:?}"),
        }
    }
}

/// The store's writer runs on the runtime that opened it; once that runtime is gone, writes fail
/// as a transient error instead of hanging.
#[test]
fn a_store_outliving_its_runtime_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = first.block_on(open(&dir));
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let error = second.block_on(store.acquire(&request("a", None))).unwrap_err();
    assert!(matches!(error, Error::Unreachable { store: "sqlite", .. }), "{error:?}");
    assert!(error.to_string().contains("runtime"), "{error}");
    // Reads still work: they need no task.
    assert_eq!(second.block_on(store.inspect(&lease())).unwrap().holder, None);
}
