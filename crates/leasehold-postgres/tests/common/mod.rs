//! What the Postgres tests share: the server, raw connections, fault proxies (the conformance
//! suite's backend is in `tests/conformance.rs`).

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;

use leasehold_conformance::{FaultProxy, Faults};
use leasehold_core::{Error, LeaseName, Result};
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

/// A TCP proxy in front of the server that counts the statements its clients run: the
/// protocol's Execute and simple Query messages (a statement's first preparation is not one).
/// Its clients must not use TLS (`sslmode=disable`).
pub struct StatementCounter {
    addr: SocketAddr,
    statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
    notifications: std::sync::Arc<std::sync::atomic::AtomicU64>,
    accepting: tokio::task::JoinHandle<()>,
}

impl StatementCounter {
    pub async fn start(upstream: SocketAddr) -> StatementCounter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let statements = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = statements.clone();
        let notifications = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let notified_count = notifications.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let count = count.clone();
                let notified = notified_count.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let up = async {
                        let _ = count_frontend(&mut client_read, &mut server_write, &count).await;
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut server_write).await;
                    };
                    let down = async {
                        let _ = count_backend(&mut server_read, &mut client_write, &notified).await;
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut client_write).await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        StatementCounter {
            addr,
            statements,
            notifications,
            accepting,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Statements run through the proxy so far.
    pub fn statements(&self) -> u64 {
        self.statements.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Notifications of the `leasehold_renewed` channel (renewal announcements) delivered to
    /// the proxy's clients so far.
    pub fn renewal_notifications(&self) -> u64 {
        self.notifications.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies the server's messages to a client, counting NotificationResponse (`A`) messages of
/// the `leasehold_renewed` channel. Every server message has a type byte (no TLS:
/// `sslmode=disable`).
async fn count_backend(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    count: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let kind = from.read_u8().await?;
        let length = from.read_u32().await?;
        let mut frame = Vec::with_capacity(length as usize + 1);
        frame.push(kind);
        frame.extend_from_slice(&length.to_be_bytes());
        frame.resize(length as usize + 1, 0);
        from.read_exact(&mut frame[5..]).await?;
        // NotificationResponse: pid (4 bytes), then the channel, NUL-terminated.
        if kind == b'A'
            && frame
                .get(9..)
                .is_some_and(|rest| rest.starts_with(b"leasehold_renewed\0"))
        {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        to.write_all(&frame).await?;
    }
}

impl Drop for StatementCounter {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies a client's messages to the server, counting Execute (`E`) and Query (`Q`) messages.
async fn count_frontend(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    count: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The startup message has a length and no type byte.
    let length = from.read_u32().await?;
    let mut body = vec![0; (length as usize).saturating_sub(4)];
    from.read_exact(&mut body).await?;
    to.write_u32(length).await?;
    to.write_all(&body).await?;
    loop {
        let kind = from.read_u8().await?;
        let length = from.read_u32().await?;
        let mut frame = Vec::with_capacity(length as usize + 1);
        frame.push(kind);
        frame.extend_from_slice(&length.to_be_bytes());
        frame.resize(length as usize + 1, 0);
        from.read_exact(&mut frame[5..]).await?;
        if matches!(kind, b'E' | b'Q') {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        to.write_all(&frame).await?;
    }
}
