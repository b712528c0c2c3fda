//! What a backend's test file provides to the suite.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{LeaseName, LeaseStore, MemoryStore, Result};

use crate::faults::Faults;
use crate::faulty::FaultyStore;

/// A backend under test: makes independent clients of one store and can vandalise its records.
///
/// A backend's test file implements it (or constructs one) and hands it to
/// [`suite!`](crate::suite).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use leasehold_conformance::{Backend, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::server_clock());
/// let a = backend.connect().await?;
/// let b = backend.connect().await?; // another client of the same store
/// assert_eq!(a.name(), b.name());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A short name for messages, e.g. `"etcd"`.
    fn name(&self) -> &'static str;

    /// A new, independent client of the store, as a separate process would have (its own
    /// connections and sessions).
    ///
    /// # Errors
    ///
    /// When the store cannot be reached.
    async fn connect(&self) -> Result<Arc<dyn LeaseStore>>;

    /// A new client whose traffic the returned [`Faults`] can disrupt.
    ///
    /// The default wraps [`Backend::connect`] in the in-process [`FaultyStore`]; networked
    /// backends route the client through a [`FaultProxy`](crate::FaultProxy) instead, so that
    /// the client library itself sees the broken network, and wrap the store in
    /// [`FaultyStore::counting`] with the proxy's `Faults`, so that scenarios can count requests.
    ///
    /// # Errors
    ///
    /// When the store cannot be reached.
    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let store = self.connect().await?;
        let faults = Faults::new();
        Ok((Arc::new(FaultyStore::new(store, faults.clone())), faults))
    }

    /// Overwrites the record of `lease` with garbage, the way a foreign program would.
    ///
    /// # Errors
    ///
    /// When the store cannot be reached.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()>;

    /// Removes the record of `lease` that [`Backend::corrupt`] wrote, so that a listing of the
    /// whole store reads again (`corrupt_record_is_typed_error` cleans up with it). `Ok(false)`,
    /// the default, when the backend cannot: the garbage stays, and `list("")` of that store
    /// fails with `CorruptRecord` until someone removes it.
    ///
    /// # Errors
    ///
    /// When the store cannot be reached.
    async fn remove(&self, lease: &LeaseName) -> Result<bool> {
        let _ = lease;
        Ok(false)
    }

    /// The TTL for holding 1,000 leases at once (`thousand_leases`): a store that handles fewer
    /// requests per second needs a longer TTL for the same number of leases (renewals per second
    /// are 3,000 / TTL in seconds). Default 2 s; clamped into the store's TTL range.
    fn many_leases_ttl(&self) -> Option<Duration> {
        None
    }

    /// Whether the store's acquire reads the record before its conditional write (S3: the ETag
    /// the write must name), so that replies lost from the start of an acquire lose the read's,
    /// and the write is never sent. `lost_reply_resolved_by_read_back` then delays C's replies
    /// past the request timeout instead of dropping them: the write goes out, is applied, and
    /// its answer comes too late, which the engine must settle by reading back. C's later
    /// acquires, sent while the replies were late, may land after it and grant C a new term
    /// (as the holder's own acquire does), so C must lead at the applied term or a later one of
    /// its own, with nobody else in between. Default `false`.
    fn acquire_reads_first(&self) -> bool {
        false
    }

    /// Whether the store grants by waiting: a candidate queued right behind the holder hears on
    /// its change stream that its turn has come ([`Change::YourTurn`](leasehold_core::Change))
    /// when the holder releases (etcd, ZooKeeper). `a_release_is_the_next_candidates_turn` then
    /// demands the turn; other notifying stores may say only that something changed. Default
    /// `false`.
    fn grants_by_waiting(&self) -> bool {
        false
    }

    /// Store URLs that carry `secret` as a password, key or signature, for
    /// `secrets_stay_out_of_debug_and_errors`; `None` (the default) for a store without secrets.
    fn secret_urls(&self, secret: &str) -> Option<SecretUrls> {
        let _ = secret;
        None
    }

    /// A client of the store at `url` (one of [`Backend::secret_urls`]).
    ///
    /// # Errors
    ///
    /// Whatever the store's constructor says about `url`.
    async fn connect_url(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        let _ = url;
        Err(leasehold_core::Error::store(
            self.name(),
            "the suite's backend does not connect by URL",
        ))
    }

    /// Whether [`Backend::restart`] can stop and start the store's server: the restart scenario
    /// (`store_restart_then_leader_crash`) runs only then. The default: it cannot.
    fn can_restart(&self) -> bool {
        false
    }

    /// Stops the store's server, keeps it down for `down`, starts it again, and returns once it
    /// answers. Every other scenario of the process waits while it runs (see the scenarios'
    /// module docs).
    ///
    /// # Errors
    ///
    /// When the server cannot be stopped or started (the default: always).
    async fn restart(&self, down: Duration) -> Result<()> {
        let _ = down;
        Err(leasehold_core::Error::store(
            self.name(),
            "the suite cannot restart this store's server",
        ))
    }

    /// Called once after the last scenario of a concurrent run (e.g. to delete the suite's
    /// container); the default does nothing.
    async fn finish(&self) {}
}

/// Store URLs that carry a secret (see [`Backend::secret_urls`]), by what the store must make of
/// them. Whatever it makes of them, the secret shows in no error and no `Debug`.
#[derive(Clone, Debug, Default)]
pub struct SecretUrls {
    /// The test server, which accepts this secret: the store connects and answers.
    pub accepted: Option<String>,
    /// The test server, which refuses this secret (or the database, user or table it names):
    /// a definite (not transient) error when connecting or on the first request.
    pub refused: Option<String>,
    /// A port nobody listens on: a transient error when connecting or on the first request.
    pub closed: Option<String>,
    /// Malformed (an unknown option, a broken scheme): an error when connecting.
    pub malformed: Vec<String>,
}

/// The [`Backend`] of a [`MemoryStore`]: every client shares one store.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    store: MemoryStore,
    name: &'static str,
}

impl MemoryBackend {
    /// A store whose own clock expires leases ([`MemoryStore::new`]).
    pub fn server_clock() -> Self {
        MemoryBackend {
            store: MemoryStore::new(),
            name: "memory",
        }
    }

    /// A store without a clock, where contenders observe expiry
    /// ([`MemoryStore::observed_expiry`]).
    pub fn observed_expiry() -> Self {
        MemoryBackend {
            store: MemoryStore::observed_expiry(),
            name: "memory-observed-expiry",
        }
    }

    /// The shared store.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.store.clone()))
    }

    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        self.store.corrupt(lease);
        Ok(())
    }

    async fn remove(&self, lease: &LeaseName) -> Result<bool> {
        self.store.repair(lease);
        Ok(true)
    }
}

/// The in-memory store whose own clock expires leases, for `suite!(memory)`.
pub fn memory() -> Option<Arc<dyn Backend>> {
    Some(Arc::new(MemoryBackend::server_clock()))
}

/// The in-memory store where contenders observe expiry, for `suite!(memory_observed)`.
pub fn memory_observed() -> Option<Arc<dyn Backend>> {
    Some(Arc::new(MemoryBackend::observed_expiry()))
}

/// What a backend constructor given to [`suite!`](crate::suite) may
/// yield: a backend (`MemoryBackend`, `Arc<dyn Backend>`), or an `Option` of one, where `None`
/// means its server is not available (the tests then skip).
pub trait IntoBackend {
    /// The backend, or `None` to skip.
    fn into_backend(self) -> Option<Arc<dyn Backend>>;
}

impl<T: Backend> IntoBackend for T {
    fn into_backend(self) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(self))
    }
}

impl<T: Backend> IntoBackend for Option<T> {
    fn into_backend(self) -> Option<Arc<dyn Backend>> {
        self.map(|backend| Arc::new(backend) as Arc<dyn Backend>)
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Option<Arc<dyn Backend>> {
        Some(self)
    }
}

impl IntoBackend for Option<Arc<dyn Backend>> {
    fn into_backend(self) -> Option<Arc<dyn Backend>> {
        self
    }
}

/// The URL of a networked backend's server, if it is configured and answers.
///
/// Reads `env_var`, or else the `KEY=VALUE` lines of the `target/services/env` file that
/// `scripts/services up` writes (searched upwards from `CARGO_MANIFEST_DIR` and from the current
/// directory). The server counts as reachable when a TCP connection to the URL's first host
/// succeeds within 2 s.
///
/// When it is not set or not reachable: under `CI=true` this panics (a CI run must not pass by
/// skipping); otherwise it prints a loud `SKIPPED` line to stderr and returns `None`. The URL
/// itself is never printed (it may hold a password).
///
/// # Panics
///
/// Under `CI=true`, when the server is not set or not reachable.
///
/// # Examples
///
/// ```no_run
/// use leasehold_conformance::require_server;
///
/// let Some(url) = require_server("redis", "LEASEHOLD_REDIS_URL") else { return };
/// # let _ = url;
/// ```
pub fn require_server(name: &str, env_var: &str) -> Option<String> {
    let problem = match configured_url(env_var) {
        None => format!("{env_var} is not set and no target/services/env file defines it"),
        Some(url) => match reachable(&url) {
            Ok(()) => return Some(url),
            Err(why) => format!("the {name} server named by {env_var} is not reachable: {why}"),
        },
    };
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if ci {
        panic!(
            "{name} conformance tests cannot run under CI=true: {problem}. Start it with `scripts/services up {name}`."
        );
    }
    eprintln!(
        "\n==================== SKIPPED: {name} conformance tests ====================\n\
         {problem}.\nStart the server with `eval \"$(scripts/services up {name})\"` to run them \
         (under CI=true this is a failure).\n"
    );
    None
}

/// The value of `env_var`, from the environment or else from the `target/services/env` file
/// `scripts/services up` writes (looked for from the crate's directory and the working directory
/// up); `None` when neither has it.
pub fn configured_url(env_var: &str) -> Option<String> {
    if let Some(url) = std::env::var(env_var).ok().filter(|v| !v.trim().is_empty()) {
        return Some(url.trim().to_string());
    }
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        starts.push(dir.into());
    }
    if let Ok(dir) = std::env::current_dir() {
        starts.push(dir);
    }
    starts.iter().find_map(|start| env_file_value(start, env_var))
}

/// Looks for `target/services/env` in `start` and its ancestors and reads `key` from it.
fn env_file_value(start: &Path, key: &str) -> Option<String> {
    start.ancestors().find_map(|dir| {
        let text = std::fs::read_to_string(dir.join("target/services/env")).ok()?;
        text.lines().find_map(|line| {
            let line = line.trim().strip_prefix("export ").unwrap_or(line.trim());
            let (k, v) = line.split_once('=')?;
            let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
            (k.trim() == key && !v.is_empty()).then(|| v.to_string())
        })
    })
}

/// Tries a TCP connection to the first host of `url`.
fn reachable(url: &str) -> std::result::Result<(), String> {
    let addr = host_port(url).ok_or_else(|| "cannot find a host and port in the URL".to_string())?;
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .collect();
    let mut last = format!("{addr} resolves to no address");
    for socket in addrs {
        match TcpStream::connect_timeout(&socket, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("cannot connect to {socket}: {e}"),
        }
    }
    Err(last)
}

/// `host:port` of the first host of a URL such as `scheme://user:pass@host:port,host2/path`.
pub fn host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let first = authority.split(',').next()?.trim();
    if first.is_empty() {
        return None;
    }
    let has_port = if first.starts_with('[') {
        first.contains("]:")
    } else {
        first.contains(':')
    };
    if has_port {
        return Some(first.to_string());
    }
    let port = match scheme.to_ascii_lowercase().as_str() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        "redis" => 6379,
        "rediss" => 6380,
        "etcd" => 2379,
        "zookeeper" | "zk" => 2181,
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    Some(format!("{first}:{port}"))
}

/// `url` with `option` (`key=value`) appended to its query.
///
/// ```
/// assert_eq!(leasehold_conformance::with_option("redis://h/0", "a=1"), "redis://h/0?a=1");
/// assert_eq!(leasehold_conformance::with_option("redis://h/0?a=1", "b=2"), "redis://h/0?a=1&b=2");
/// ```
pub fn with_option(url: &str, option: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{option}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_of_urls() {
        assert_eq!(
            host_port("redis://:secret@127.0.0.1:24379/0").as_deref(),
            Some("127.0.0.1:24379")
        );
        assert_eq!(
            host_port("etcd://127.0.0.1:22479,127.0.0.1:22579/app").as_deref(),
            Some("127.0.0.1:22479")
        );
        assert_eq!(host_port("postgres://u:p@db/leases").as_deref(), Some("db:5432"));
        assert_eq!(
            host_port("http://[::1]:21000/devstoreaccount1?sv=x").as_deref(),
            Some("[::1]:21000")
        );
        assert_eq!(host_port("no-scheme"), None);
    }

    #[test]
    fn env_file_lookup() {
        let dir = std::env::temp_dir().join(format!("leasehold-conf-{:x}", leasehold_core::random_u64()));
        let nested = dir.join("a/b");
        std::fs::create_dir_all(dir.join("target/services")).unwrap();
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::write(
            dir.join("target/services/env"),
            "LEASEHOLD_X_URL=redis://h:1\nexport LEASEHOLD_Y_URL=\"etcd://h:2\"\n",
        )
        .unwrap();
        assert_eq!(
            env_file_value(&nested, "LEASEHOLD_X_URL").as_deref(),
            Some("redis://h:1")
        );
        assert_eq!(
            env_file_value(&nested, "LEASEHOLD_Y_URL").as_deref(),
            Some("etcd://h:2")
        );
        assert_eq!(env_file_value(&nested, "LEASEHOLD_Z_URL"), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn missing_server_is_skipped_outside_ci() {
        if std::env::var("CI").is_ok() {
            return;
        }
        assert_eq!(require_server("nothing", "LEASEHOLD_CONFORMANCE_TEST_UNSET_URL"), None);
        assert!(
            reachable("redis://127.0.0.1:1").is_err(),
            "port 1 on loopback is closed"
        );
    }
}
