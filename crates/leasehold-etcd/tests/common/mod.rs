//! The etcd [`Backend`] of the conformance suite: every client is its own `EtcdStore` (its own
//! connection and sessions), as a separate process would be; faulty clients reach the server
//! through a TCP `FaultProxy` (gRPC over h2c passes through it).

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, SortOrder, SortTarget};
use leasehold_conformance::{Backend, FaultProxy, Faults, FaultyStore};
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_etcd::{EtcdConfig, EtcdStore};

/// A cluster reached at `url`.
pub struct EtcdBackend {
    pub url: String,
    /// The proxies of faulty clients live as long as the backend (one test).
    proxies: Mutex<Vec<FaultProxy>>,
}

impl EtcdBackend {
    pub fn new(url: &str) -> Self {
        EtcdBackend {
            url: url.to_string(),
            proxies: Mutex::default(),
        }
    }

    pub async fn store(&self) -> Result<EtcdStore> {
        EtcdStore::connect(&self.url).await
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.store().await?))
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let config: EtcdConfig = self.url.parse()?;
        let upstream: SocketAddr = config.endpoints[0]
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| Error::store("etcd", "cannot resolve the etcd endpoint"))?;
        let proxy = FaultProxy::start(upstream)
            .await
            .map_err(|e| Error::unreachable("etcd", e))?;
        let faults = proxy.faults();
        let mut through = config.clone();
        through.endpoints = vec![proxy.addr().to_string()];
        let store = EtcdStore::from_config(through).await?;
        self.proxies.lock().expect("proxies lock").push(proxy);
        Ok((Arc::new(FaultyStore::counting(Arc::new(store), faults.clone())), faults))
    }

    /// A debug-built client on a shared 2-core machine grants about 500 leases a second; with the
    /// engine's request timeout at a quarter of the TTL, a burst of 1,000 first acquires needs a
    /// few seconds of timeout to settle. Renewals are coalesced per session and cost little.
    fn many_leases_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(6))
    }

    /// Overwrites the first candidate's key with text (as a foreign program using the same keys
    /// would) and adds a history entry that does not parse.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let config: EtcdConfig = self.url.parse()?;
        let err = |e: etcd_client::Error| Error::store("etcd", e);
        let mut client = etcd_client::Client::connect(config.endpoints.clone(), None)
            .await
            .map_err(err)?;
        let prefix = &config.prefix;
        let candidates = format!("{prefix}/{lease}/c/");
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let found = client.get(candidates.clone(), Some(first)).await.map_err(err)?;
        let key = match found.kvs().first() {
            Some(kv) => kv.key().to_vec(),
            None => format!("{candidates}vandal").into_bytes(),
        };
        client.put(key, "garbage", None).await.map_err(err)?;
        client
            .put(format!("{prefix}/{lease}/h/99999999999999999999"), "garbage", None)
            .await
            .map_err(err)?;
        Ok(())
    }
}
