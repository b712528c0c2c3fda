//! What the Postgres tests share: the conformance [`Backend`], raw connections, fault proxies.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::{Backend, FaultProxy, Faults, FaultyStore};
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_postgres::PostgresStore;
use sqlx::{Connection, PgConnection};

/// The Postgres server of the tests, as a conformance backend.
pub struct PostgresBackend {
    pub url: String,
    /// Kept alive as long as the backend: dropping a proxy cuts its clients off.
    proxies: Mutex<Vec<FaultProxy>>,
}

impl PostgresBackend {
    pub fn new(url: String) -> Self {
        PostgresBackend {
            url,
            proxies: Mutex::new(Vec::new()),
        }
    }

    /// The server's address, for a proxy in front of it.
    pub fn upstream(&self) -> SocketAddr {
        let url = url::Url::parse(&self.url).expect("a valid URL");
        let host = url.host_str().expect("a TCP host").trim_matches(['[', ']']);
        let port = url.port().unwrap_or(5432);
        (host, port)
            .to_socket_addrs()
            .expect("a resolvable host")
            .next()
            .expect("an address")
    }

    /// The URL with its host and port replaced by `addr`.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = url::Url::parse(&self.url).expect("a valid URL");
        url.set_host(Some(&addr.ip().to_string())).expect("a host");
        url.set_port(Some(addr.port())).expect("a port");
        url.to_string()
    }

    /// A store whose every connection goes through a new fault proxy.
    pub async fn faulty_store(&self) -> Result<(PostgresStore, Faults)> {
        let proxy = FaultProxy::start(self.upstream())
            .await
            .map_err(|e| Error::unreachable("postgres", e))?;
        let faults = proxy.faults();
        let url = self.url_via(proxy.addr());
        self.proxies.lock().unwrap().push(proxy);
        Ok((PostgresStore::connect(&url).await?, faults))
    }

    /// A plain connection, as another program would have.
    pub async fn raw(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("a raw connection to the test server")
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(PostgresStore::connect(&self.url).await?))
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let (store, faults) = self.faulty_store().await?;
        Ok((Arc::new(FaultyStore::counting(Arc::new(store), faults.clone())), faults))
    }

    /// Writes values of the right types but no meaning (a negative term, a version that is not
    /// hex, an impossible TTL), as a foreign program might.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let sql = |e: sqlx::Error| Error::store("postgres", e);
        let mut conn = PgConnection::connect(&self.url).await.map_err(sql)?;
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
    }
}

/// The test server, or `None` (with a loud message; a failure under `CI=true`) when it is down.
pub fn server() -> Option<PostgresBackend> {
    leasehold_conformance::require_server("postgres", "LEASEHOLD_POSTGRES_URL").map(PostgresBackend::new)
}

/// A fresh lease name.
pub fn lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("pg-{tag}-{:x}", leasehold_core::random_u64())).expect("a valid lease name")
}

/// A fresh schema name, for tests that create their own tables.
pub fn schema(tag: &str) -> String {
    format!("lh_{tag}_{:x}", leasehold_core::random_u64() & 0xffff_ffff)
}

/// `url` with `option` added to its query.
pub fn with_option(url: &str, option: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{option}")
}

/// Whether some session holds the advisory lock `key`, and which backend pid.
pub async fn lock_holder(conn: &mut PgConnection, key: i64) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
         AND classid = ((($1::int8) >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid",
    )
    .bind(key)
    .fetch_optional(conn)
    .await
    .expect("pg_locks is readable")
}
