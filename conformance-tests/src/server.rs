//! The one [`Backend`] of every networked store: clients connect by URL, faulty clients reach the
//! server through a [`FaultProxy`] that the URL is rewritten to.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use leasehold_core::{Error, LeaseName, LeaseStore, Result};

use crate::backend::{Backend, SecretUrls};
use crate::faults::Faults;
use crate::faulty::FaultyStore;
use crate::proxy::FaultProxy;
use crate::restart::ServiceRestart;

/// Makes a client from a store URL.
pub type ConnectFn = Arc<dyn Fn(String) -> BoxFuture<'static, Result<Arc<dyn LeaseStore>>> + Send + Sync>;
/// Vandalises the record of a lease, as a foreign program would.
pub type CorruptFn = Arc<dyn Fn(LeaseName) -> BoxFuture<'static, Result<()>> + Send + Sync>;
/// Removes the record of a lease (see [`Backend::remove`]).
pub type RemoveFn = Arc<dyn Fn(LeaseName) -> BoxFuture<'static, Result<()>> + Send + Sync>;
/// Store URLs carrying a secret (see [`Backend::secret_urls`]).
pub type SecretUrlsFn = Arc<dyn Fn(&str) -> SecretUrls + Send + Sync>;
/// Cleans up after a concurrent run (see [`Backend::finish`]).
pub type FinishFn = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A networked store under test, reached by URL.
///
/// Every [`connect`](Backend::connect) is a new client of `url`, as a separate process would
/// have. [`connect_faulty`](Backend::connect_faulty) starts a [`FaultProxy`] in front of the
/// server, connects to the URL with `upstream` (the server's `host:port` as written in the URL)
/// replaced by the proxy's address, and counts the client's requests in the proxy's [`Faults`]
/// ([`FaultyStore::counting`]). The proxies live as long as the backend.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use leasehold_conformance::ServerBackend;
/// use leasehold_core::{LeaseStore, MemoryStore};
///
/// let backend = ServerBackend::new(
///     "example",
///     "example://127.0.0.1:7000/leases",
///     "127.0.0.1:7000",
///     |_url| Box::pin(async { Ok(Arc::new(MemoryStore::new()) as Arc<dyn LeaseStore>) }),
///     |_lease| Box::pin(async { Ok(()) }),
/// );
/// ```
pub struct ServerBackend {
    name: &'static str,
    url: String,
    upstream: String,
    connect: ConnectFn,
    corrupt: CorruptFn,
    remove: Option<RemoveFn>,
    secret_urls: Option<SecretUrlsFn>,
    finish: Option<FinishFn>,
    many_leases_ttl: Option<Duration>,
    restart: Option<ServiceRestart>,
    acquire_reads_first: bool,
    grants_by_waiting: bool,
    proxies: Mutex<Vec<FaultProxy>>,
}

impl fmt::Debug for ServerBackend {
    /// The URL may hold a password: only the name and the upstream show.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerBackend")
            .field("name", &self.name)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl ServerBackend {
    /// A backend named `name` whose clients connect to `url`; `upstream` is the server's
    /// `host:port` exactly as `url` spells it (a faulty client gets the proxy's instead).
    pub fn new(
        name: &'static str,
        url: impl Into<String>,
        upstream: impl Into<String>,
        connect: impl Fn(String) -> BoxFuture<'static, Result<Arc<dyn LeaseStore>>> + Send + Sync + 'static,
        corrupt: impl Fn(LeaseName) -> BoxFuture<'static, Result<()>> + Send + Sync + 'static,
    ) -> Self {
        ServerBackend {
            name,
            url: url.into(),
            upstream: upstream.into(),
            connect: Arc::new(connect),
            corrupt: Arc::new(corrupt),
            remove: None,
            secret_urls: None,
            finish: None,
            many_leases_ttl: None,
            restart: None,
            acquire_reads_first: false,
            grants_by_waiting: false,
            proxies: Mutex::new(Vec::new()),
        }
    }

    /// The store's acquire reads before it writes (see [`Backend::acquire_reads_first`]).
    #[must_use]
    pub fn acquire_reads_first(mut self) -> Self {
        self.acquire_reads_first = true;
        self
    }

    /// The store grants by waiting (see [`Backend::grants_by_waiting`]).
    #[must_use]
    pub fn grants_by_waiting(mut self) -> Self {
        self.grants_by_waiting = true;
        self
    }

    /// The TTL of `thousand_leases` (see [`Backend::many_leases_ttl`]).
    #[must_use]
    pub fn many_leases_ttl(mut self, ttl: Duration) -> Self {
        self.many_leases_ttl = Some(ttl);
        self
    }

    /// How to remove a lease's record (see [`Backend::remove`]).
    #[must_use]
    pub fn remove_with(
        mut self,
        remove: impl Fn(LeaseName) -> BoxFuture<'static, Result<()>> + Send + Sync + 'static,
    ) -> Self {
        self.remove = Some(Arc::new(remove));
        self
    }

    /// URLs that carry a secret (see [`Backend::secret_urls`]).
    #[must_use]
    pub fn secret_urls(mut self, urls: impl Fn(&str) -> SecretUrls + Send + Sync + 'static) -> Self {
        self.secret_urls = Some(Arc::new(urls));
        self
    }

    /// What to do after a concurrent run (see [`Backend::finish`]).
    #[must_use]
    pub fn on_finish(mut self, finish: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) -> Self {
        self.finish = Some(Arc::new(finish));
        self
    }

    /// Restarts the server with `scripts/services down|up service` (see [`Backend::restart`]);
    /// `base_port` is the service's port without `LEASEHOLD_SERVICES_PORT_OFFSET`, from which
    /// the offset of the running server is worked out. Without a port in the upstream, the
    /// backend cannot restart.
    #[must_use]
    pub fn restart_with(mut self, service: &'static str, base_port: u16) -> Self {
        self.restart = ServiceRestart::new(service, base_port, &self.upstream);
        self
    }

    /// The URL clients connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn upstream_addr(&self) -> Result<SocketAddr> {
        let unreachable = |why: String| Error::unreachable(self.name, format!("the test server {why}"));
        self.upstream
            .to_socket_addrs()
            .map_err(|e| unreachable(format!("{} does not resolve: {e}", self.upstream)))?
            .next()
            .ok_or_else(|| unreachable(format!("{} has no address", self.upstream)))
    }
}

#[async_trait]
impl Backend for ServerBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        (self.connect)(self.url.clone()).await
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let proxy = FaultProxy::start(self.upstream_addr()?)
            .await
            .map_err(|e| Error::unreachable(self.name, e))?;
        if !self.url.contains(&self.upstream) {
            return Err(Error::store(
                self.name,
                "the suite's URL does not name its upstream: no proxy in between",
            ));
        }
        let url = self.url.replacen(&self.upstream, &proxy.addr().to_string(), 1);
        let faults = proxy.faults();
        self.proxies.lock().expect("proxies lock").push(proxy);
        let store = (self.connect)(url).await?;
        Ok((Arc::new(FaultyStore::counting(store, faults.clone())), faults))
    }

    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        (self.corrupt)(lease.clone()).await
    }

    async fn remove(&self, lease: &LeaseName) -> Result<bool> {
        match &self.remove {
            Some(remove) => remove(lease.clone()).await.map(|()| true),
            None => Ok(false),
        }
    }

    fn many_leases_ttl(&self) -> Option<Duration> {
        self.many_leases_ttl
    }

    fn acquire_reads_first(&self) -> bool {
        self.acquire_reads_first
    }

    fn grants_by_waiting(&self) -> bool {
        self.grants_by_waiting
    }

    fn secret_urls(&self, secret: &str) -> Option<SecretUrls> {
        self.secret_urls.as_ref().map(|urls| urls(secret))
    }

    async fn connect_url(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        (self.connect)(url.to_string()).await
    }

    fn can_restart(&self) -> bool {
        self.restart.is_some()
    }

    async fn restart(&self, down: Duration) -> Result<()> {
        match &self.restart {
            Some(restart) => restart.run(down).await,
            None => Err(Error::store(self.name, "the suite cannot restart this store's server")),
        }
    }

    async fn finish(&self) {
        if let Some(finish) = &self.finish {
            finish().await;
        }
    }
}
