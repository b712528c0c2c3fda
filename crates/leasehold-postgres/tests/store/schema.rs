//! Tables and schemas: foreign tables, schemas kept apart, garbage rows, secrets in errors,
//! synchronous commits.

use std::time::Duration;

use leasehold_core::{Error, LeaseStore};
use leasehold_postgres::{PostgresConfig, PostgresStore};

use super::{acquire, granted, request};
use crate::common::{self, lock_holder, server};

/// A table of leasehold's name but another shape: a typed error naming it, nothing dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_is_a_typed_error_and_left_alone() {
    let Some(pg) = server() else { return };
    let schema = common::schema("foreign");
    let mut raw = pg.raw().await;
    for sql in [
        format!("CREATE SCHEMA {schema}"),
        format!("CREATE TABLE {schema}.leases (id serial PRIMARY KEY, owner text)"),
        format!("INSERT INTO {schema}.leases (owner) VALUES ('someone else')"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut raw).await.unwrap();
    }
    let url = common::with_option(&pg.url, &format!("schema={schema}"));
    match PostgresStore::connect(&url).await {
        Err(Error::CorruptRecord { lease, detail, .. }) => {
            assert!(lease.contains(&format!("{schema}.leases")), "{lease}");
            assert!(detail.contains("owner") && detail.contains("expected"), "{detail}");
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    let kept: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {schema}.leases")))
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the foreign table keeps its data");

    // A schema written by a newer leasehold.
    let newer = common::schema("newer");
    let url = common::with_option(&pg.url, &format!("schema={newer}"));
    drop(PostgresStore::connect(&url).await.unwrap());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE {newer}.meta SET schema_version = 99"
    )))
    .execute(&mut raw)
    .await
    .unwrap();
    match PostgresStore::connect(&url).await {
        Err(Error::CorruptRecord { detail, .. }) => assert!(detail.contains("99"), "{detail}"),
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    for schema in [schema, newer] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut raw)
            .await
            .unwrap();
    }
}

/// Stores that open a new schema at the same moment agree; two schemas never share locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_created_once_and_kept_apart() {
    let Some(pg) = server() else { return };
    let schema = common::schema("together");
    let url = common::with_option(&pg.url, &format!("schema={schema}&history_limit=3"));
    let stores = futures::future::join_all((0..8).map(|_| PostgresStore::connect(&url))).await;
    let stores: Vec<PostgresStore> = stores.into_iter().map(|s| s.unwrap()).collect();
    let default = PostgresStore::connect(&pg.url).await.unwrap();
    let lease = common::lease("apart");
    assert_ne!(stores[0].lock_key(&lease), default.lock_key(&lease));
    let here = granted(acquire(&stores[0], &lease, "a", Duration::from_secs(5)).await);
    let there = granted(acquire(&default, &lease, "b", Duration::from_secs(5)).await);
    default.release(&there).await.unwrap();
    stores[0].release(&here).await.unwrap();
    // history_limit=3 keeps the last three terms.
    for _ in 0..5 {
        let g = granted(acquire(&stores[1], &lease, "a", Duration::from_secs(5)).await);
        stores[1].release(&g).await.unwrap();
    }
    let history = stores[2].history(&lease, 100).await.unwrap();
    let terms: Vec<u64> = history.iter().map(|t| t.term.0).collect();
    assert_eq!(terms, vec![4, 5, 6], "{history:?}");
    let mut raw = pg.raw().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut raw)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_configs_or_errors() {
    let Some(pg) = server() else { return };
    let secret = "hunter2-secret";
    let mut url = url::Url::parse(&pg.url).unwrap();
    url.set_password(Some(secret)).unwrap();
    let config = PostgresConfig::from_url(url.as_str()).unwrap();
    for shown in [config.to_string(), format!("{config:?}")] {
        assert!(!shown.contains(secret) && shown.contains("***"), "{shown}");
    }
    let mut shown = vec![];
    // A database that does not exist (the test server trusts any password).
    let mut missing = url.clone();
    missing.set_path("/no_such_database");
    shown.push(PostgresStore::connect(missing.as_str()).await.unwrap_err());
    // A port nobody listens on.
    let mut closed = url.clone();
    closed.set_port(Some(1)).unwrap();
    shown.push(PostgresStore::connect(closed.as_str()).await.unwrap_err());
    // Malformed.
    shown.push(
        PostgresStore::connect(&format!("{}?pool_size=lots", url.as_str()))
            .await
            .unwrap_err(),
    );
    shown.push(
        PostgresStore::connect(&url.as_str().replace("postgres://", "postgres:/"))
            .await
            .unwrap_err(),
    );
    let store = PostgresStore::connect(url.as_str()).await.unwrap();
    shown.push(Error::store("debug", format!("{store:?}")));
    for error in shown {
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains(secret), "the password leaked: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_rows_are_typed_errors() {
    let Some(pg) = server() else { return };
    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let mut raw = pg.raw().await;
    for (garbage, named) in [
        (
            "holder = 'x', term = -1, ttl_ms = 1000, version = '0123456789abcdef'",
            "term -1 is not a term",
        ),
        ("holder = 'x', term = 3, ttl_ms = 1000, version = 'nothex'", "hex"),
        (
            "holder = 'x', term = 3, ttl_ms = 10, version = '0123456789abcdef'",
            "ttl_ms",
        ),
        (
            "holder = 'x', term = 3, ttl_ms = NULL, version = '0123456789abcdef'",
            "all set or all NULL",
        ),
        (
            "holder = E'bad\\x01id', term = 3, ttl_ms = 1000, version = '0123456789abcdef'",
            "holder",
        ),
        (
            "holder = NULL, term = 3, ttl_ms = NULL, version = NULL, previous_end = 'exploded'",
            "end reason",
        ),
        // A held row's previous_end says whether it is a reservation: only `handed_over` does.
        ("previous_end = 'reserved'", "end reason"),
    ] {
        let lease = common::lease("garbage");
        let grant = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE leasehold.leases SET {garbage} WHERE name = '{lease}'"
        )))
        .execute(&mut raw)
        .await
        .unwrap();
        let other = PostgresStore::connect(&pg.url).await.unwrap();
        for (what, result) in [
            ("inspect", other.inspect(&lease).await.map(|_| ())),
            (
                "acquire",
                other
                    .acquire(&request(&lease, "b", Duration::from_secs(5)))
                    .await
                    .map(|_| ()),
            ),
            ("renew", store.renew(&grant).await.map(|_| ())),
            ("history", other.history(&lease, 5).await.map(|_| ())),
            (
                "acquire after",
                other
                    .acquire(&request(&lease, "b", Duration::from_secs(5)))
                    .await
                    .map(|_| ()),
            ),
        ] {
            match result {
                Err(Error::CorruptRecord { lease: l, detail, .. }) => {
                    assert_eq!(l, lease.as_str());
                    assert!(detail.contains(named), "{what} of {garbage}: {detail}");
                }
                other => panic!("{what} of {garbage}: expected CorruptRecord, got {other:?}"),
            }
        }
        assert_eq!(
            lock_holder(&mut raw, store.lock_key(&lease)).await,
            None,
            "no lock is kept on garbage"
        );
    }
}

/// Finding 8 of issue 12: with `synchronous_commit = off` as the database's or the role's default,
/// the lock session inherited it, so an acknowledged grant could be lost in a server crash and its
/// term granted again. Every connection that writes lease records must commit synchronously
/// whatever the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_writes_commit_synchronously_whatever_the_defaults() {
    use sqlx::Connection as _;
    let Some(pg) = server() else { return };
    let name = common::schema("sync");
    let mut admin = pg.raw().await;
    for statement in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("CREATE DATABASE {name} OWNER {name}"),
        format!("ALTER DATABASE {name} SET synchronous_commit = off"),
        format!("ALTER ROLE {name} SET synchronous_commit = off"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let mut url = url::Url::parse(&pg.url).unwrap();
    url.set_username(&name).unwrap();
    url.set_path(&format!("/{name}"));

    // Any other session of that role in that database commits asynchronously.
    let mut plain = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    let inherited: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(inherited, "off", "the test's defaults did not apply");
    plain.close().await.unwrap();

    // Nor can the URL's own options weaken it.
    // (`%20`, not the form encoding's `+`: in leasehold's URL grammar a `+` stays a `+`.)
    let query = match url.query() {
        Some(query) => format!("{query}&options=-c%20synchronous_commit%3Doff"),
        None => "options=-c%20synchronous_commit%3Doff".to_string(),
    };
    url.set_query(Some(&query));
    let store = PostgresStore::connect(url.as_str()).await.unwrap();
    let lease = common::lease("sync");
    let grant = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
    let setting = store.write_session_setting("synchronous_commit").await;
    store.release(&grant).await.unwrap();
    drop(store);
    for statement in [
        format!("DROP DATABASE {name} WITH (FORCE)"),
        format!("DROP ROLE {name}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    let setting = setting.unwrap();
    assert_eq!(setting.lock_session, "on", "the lock session's synchronous_commit");
    assert_eq!(
        setting.pool, "on",
        "the pool's synchronous_commit (break_lease writes there)"
    );
}
