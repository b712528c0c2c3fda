//! The shared conformance suite against the MySQL/MariaDB test server.
//!
//! The backend: MySQL/MariaDB (`scripts/services up mariadb`): every client is its own `MysqlStore` (its own
//! lock session and pool); faulty clients reach the server through the proxy, so that faults hit
//! the lock session itself at the TCP level.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, LeaseStore};
use leasehold_mysql::MysqlStore;
use sqlx::{Connection, MySqlConnection};

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

/// The MySQL or MariaDB server named by `LEASEHOLD_MYSQL_URL`.
fn mysql() -> Option<Arc<dyn Backend>> {
    let url = require_server("mysql", "LEASEHOLD_MYSQL_URL")?;
    let upstream = host_port(&url)?;
    let (raw, for_remove) = (url.clone(), url.clone());
    let backend = ServerBackend::new(
        "mysql",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(MysqlStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // Values of the right types but no meaning (a negative term, a version that is not hex,
        // an impossible TTL), as a foreign program might write.
        move |lease| {
            let raw = raw.clone();
            Box::pin(async move {
                let sql = |e: sqlx::Error| Error::store("mysql", e);
                let mut conn = MySqlConnection::connect(&raw).await.map_err(sql)?;
                sqlx::query(
                    "INSERT INTO leasehold_leases (name, holder, term, ttl_ms, version)
                     VALUES (?, 'vandal', -7, -1, 'garbage!')
                     ON DUPLICATE KEY UPDATE holder = 'vandal', term = -7, ttl_ms = -1, version = 'garbage!',
                         previous_end = NULL",
                )
                .bind(lease.as_str())
                .execute(&mut conn)
                .await
                .map_err(sql)?;
                conn.close().await.map_err(sql)
            })
        },
    )
    // One lock session serves all 1,000 acquires in turn (1 to 4 ms each, a batch of statements
    // per acquire, 32 per packet): within a 2 s TTL's request timeout (0.67 s) only a few hundred
    // are answered, and the rest are asked again.
    .many_leases_ttl(Duration::from_secs(15))
    .remove_with(move |lease| {
        let raw = for_remove.clone();
        Box::pin(async move {
            let sql = |e: sqlx::Error| Error::store("mysql", e);
            let mut conn = MySqlConnection::connect(&raw).await.map_err(sql)?;
            sqlx::query("DELETE FROM leasehold_leases WHERE name = ?")
                .bind(lease.as_str())
                .execute(&mut conn)
                .await
                .map_err(sql)?;
            conn.close().await.map_err(sql)
        })
    })
    .secret_urls(move |secret| {
        let base = url::Url::parse(&url).expect("LEASEHOLD_MYSQL_URL is a URL");
        // The test server's user has a password: the secret is the wrong one (no URL the server
        // accepts carries it).
        let mut wrong = base.clone();
        wrong.set_password(Some(secret)).expect("a URL with a host");
        let mut closed = wrong.clone();
        closed.set_port(Some(1)).expect("a URL with a host");
        SecretUrls {
            accepted: None,
            refused: Some(wrong.to_string()),
            closed: Some(closed.to_string()),
            malformed: vec![
                with_option(wrong.as_str(), "pool_size=lots"),
                wrong.as_str().replacen("mysql://", "mysql:/", 1),
            ],
        }
    });
    Some(Arc::new(backend))
}

leasehold_conformance::suite!(mysql, mysql());
