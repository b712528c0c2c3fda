//! What the ZooKeeper tests share: the conformance [`Backend`] and raw access to the server.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::{Backend, FaultProxy, Faults, FaultyStore};
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_zookeeper::{ZookeeperConfig, ZookeeperStore};
use zookeeper_client as zk;

/// The server named by a `zk://` URL: every `connect` is a new `ZookeeperStore` (new sessions).
pub struct ZookeeperBackend {
    pub url: String,
    pub config: ZookeeperConfig,
    /// The proxies of faulty clients live as long as the backend (one test).
    proxies: Mutex<Vec<FaultProxy>>,
}

impl ZookeeperBackend {
    /// A backend whose leases live under a chroot of their own on the server named by `url`.
    pub fn new(url: &str) -> ZookeeperBackend {
        let url = format!("{}/leasehold-tests", url.trim_end_matches('/'));
        let config = ZookeeperConfig::parse(&url).expect("a valid zk:// URL");
        ZookeeperBackend {
            url,
            config,
            proxies: Mutex::new(Vec::new()),
        }
    }

    pub fn upstream(&self) -> SocketAddr {
        self.config.hosts()[0]
            .to_socket_addrs()
            .expect("the zookeeper host resolves")
            .next()
            .expect("the zookeeper host has an address")
    }

    /// A store whose traffic goes through a new fault proxy.
    pub async fn faulty(&self) -> Result<(ZookeeperStore, Faults)> {
        let proxy = FaultProxy::start(self.upstream())
            .await
            .map_err(|e| Error::unreachable("zookeeper", e))?;
        let url = format!("zk://{}{}", proxy.addr(), self.config.chroot());
        let faults = proxy.faults();
        self.proxies.lock().unwrap().push(proxy);
        Ok((ZookeeperStore::connect(&url).await?, faults))
    }

    /// A plain client for vandalism and inspection.
    pub async fn raw(&self) -> zk::Client {
        zk::Client::connector()
            .with_session_timeout(std::time::Duration::from_secs(10))
            .connect(&self.config.hosts().join(","))
            .await
            .expect("a raw zookeeper client")
    }

    fn candidates(&self, lease: &LeaseName) -> String {
        format!("{}/{lease}/candidates", self.config.chroot())
    }

    fn history(&self, lease: &LeaseName) -> String {
        format!("{}/{lease}/history", self.config.chroot())
    }
}

#[async_trait]
impl Backend for ZookeeperBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    /// Every renewal is a `sync` + `getData` round trip: 1,000 leases at a 2 s TTL need 1,500 a
    /// second, more than one ZooKeeper server on a loaded 2-core machine reliably answers in time
    /// (5 of 1,000 lost in one CI run); at 6 s, 500 a second.
    fn many_leases_ttl(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(6))
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(ZookeeperStore::connect(&self.url).await?))
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let (store, faults) = self.faulty().await?;
        Ok((Arc::new(FaultyStore::counting(Arc::new(store), faults.clone())), faults))
    }

    /// Writes garbage into the leader's candidate znode, or else into the newest history entry.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let raw = self.raw().await;
        let fail = |e: zk::Error| Error::store("zookeeper", e);
        let mut children = raw.list_children(&self.candidates(lease)).await.unwrap_or_default();
        children.sort_by_key(|name| name.rsplit_once('-').and_then(|(_, s)| s.parse::<i64>().ok()));
        let path = match children.first() {
            Some(first) => format!("{}/{first}", self.candidates(lease)),
            None => {
                let mut terms = raw.list_children(&self.history(lease)).await.map_err(fail)?;
                terms.sort();
                let last = terms
                    .last()
                    .ok_or_else(|| Error::store("zookeeper", "nothing to corrupt"))?;
                format!("{}/{last}", self.history(lease))
            }
        };
        raw.set_data(&path, b"\x00garbage from someone else", None)
            .await
            .map_err(fail)?;
        Ok(())
    }
}

/// The single server's URL, if it is up (see `require_server`).
pub fn single_server() -> Option<ZookeeperBackend> {
    leasehold_conformance::require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL").map(|url| ZookeeperBackend::new(&url))
}
