//! The shared conformance suite against the Postgres test server.
//!
//! The backend: Postgres (`scripts/services up postgres`): every client is its own `PostgresStore` (its own
//! lock session, pool and listener); faulty clients reach the server through the proxy, so that
//! faults hit the lock session itself at the TCP level.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_postgres::PostgresStore;
use sqlx::{Connection, PgConnection};

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

/// The Postgres server named by `LEASEHOLD_POSTGRES_URL`.
fn postgres() -> Option<Arc<dyn Backend>> {
    let url = require_server("postgres", "LEASEHOLD_POSTGRES_URL")?;
    let upstream = host_port(&url)?;
    let (raw, for_remove) = (url.clone(), url.clone());
    let backend = ServerBackend::new(
        "postgres",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(PostgresStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // Values of the right types but no meaning (a negative term, a version that is not hex,
        // an impossible TTL), as a foreign program might write.
        move |lease| {
            let raw = raw.clone();
            Box::pin(async move {
                let sql = |e: sqlx::Error| Error::store("postgres", e);
                let mut conn = PgConnection::connect(&raw).await.map_err(sql)?;
                sqlx::query(
                    "INSERT INTO leasehold.leases (name, holder, term, ttl_ms, version)
                     VALUES ($1, 'vandal', -7, -1, 'garbage!')
                     ON CONFLICT (name) DO UPDATE
                     SET holder = 'vandal', term = -7, ttl_ms = -1, version = 'garbage!'",
                )
                .bind(lease.as_str())
                .execute(&mut conn)
                .await
                .map_err(sql)?;
                conn.close().await.map_err(sql)
            })
        },
    )
    .remove_with(move |lease| {
        let raw = for_remove.clone();
        Box::pin(async move {
            let sql = |e: sqlx::Error| Error::store("postgres", e);
            let mut conn = PgConnection::connect(&raw).await.map_err(sql)?;
            sqlx::query("DELETE FROM leasehold.leases WHERE name = $1")
                .bind(lease.as_str())
                .execute(&mut conn)
                .await
                .map_err(sql)?;
            conn.close().await.map_err(sql)
        })
    })
    // `scripts/services` serves it: the restart scenario stops and starts it.
    .restart_with("postgres", 25432)
    .secret_urls(move |secret| {
        let mut with = url::Url::parse(&url).expect("LEASEHOLD_POSTGRES_URL is a URL");
        with.set_password(Some(secret)).expect("a URL with a host");
        // The test server trusts any password: the store connects.
        let server = with.to_string();
        let mut missing = with.clone();
        missing.set_path("/no_such_database");
        let mut closed = with.clone();
        closed.set_port(Some(1)).expect("a URL with a host");
        SecretUrls {
            accepted: Some(server.clone()),
            refused: Some(missing.to_string()),
            closed: Some(closed.to_string()),
            malformed: vec![
                with_option(&server, "pool_size=lots"),
                server.replacen("postgres://", "postgres:/", 1),
            ],
        }
    });
    Some(Arc::new(backend))
}

leasehold_conformance::suite!(postgres, postgres());
