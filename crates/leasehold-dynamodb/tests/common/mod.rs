//! What the DynamoDB tests share: the conformance [`Backend`] on the server named by
//! `LEASEHOLD_DYNAMODB_URL` (dynalite from `scripts/services up dynalite`), and raw access to it.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::{Backend, FaultProxy, Faults, FaultyStore};
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use leasehold_dynamodb::{DynamoDbConfig, DynamoDbStore};

/// The table every test uses (tests use fresh lease names).
pub const TABLE: &str = "leasehold-tests";

/// The endpoint of the test server, or `None` (after a loud skip message) when it is down.
pub fn endpoint() -> Option<String> {
    leasehold_conformance::require_server("dynalite", "LEASEHOLD_DYNAMODB_URL")
}

/// The configuration of a client of `table` at `endpoint`, with the dummy keys local servers
/// accept, creating the table when missing.
pub fn config(endpoint: &str, table: &str) -> DynamoDbConfig {
    let url = format!(
        "dynamodb://{table}?endpoint={endpoint}&region=us-east-1&access_key_id=local\
         &secret_access_key=local-secret&create_table=true"
    );
    DynamoDbConfig::from_url(&url).expect("a valid test URL")
}

/// The server named by `LEASEHOLD_DYNAMODB_URL`: every `connect` is a new client.
pub struct DynamoBackend {
    pub endpoint: String,
    pub table: String,
    /// The proxies of faulty clients live as long as the backend (one test).
    proxies: Mutex<Vec<FaultProxy>>,
}

impl DynamoBackend {
    pub fn shared(endpoint: String) -> Arc<dyn Backend> {
        Arc::new(DynamoBackend::with_table(endpoint, TABLE))
    }

    pub fn with_table(endpoint: String, table: &str) -> DynamoBackend {
        DynamoBackend {
            endpoint,
            table: table.to_string(),
            proxies: Mutex::new(Vec::new()),
        }
    }

    pub fn upstream(&self) -> SocketAddr {
        let authority = self.endpoint.split("://").nth(1).unwrap_or(&self.endpoint);
        let authority = authority.split('/').next().unwrap_or(authority);
        authority
            .to_socket_addrs()
            .expect("the endpoint resolves")
            .next()
            .expect("the endpoint has an address")
    }

    pub async fn store(&self) -> Result<DynamoDbStore> {
        DynamoDbStore::from_config(config(&self.endpoint, &self.table)).await
    }

    /// A store whose traffic goes through a new fault proxy.
    pub async fn faulty(&self) -> Result<(DynamoDbStore, Faults)> {
        let proxy = FaultProxy::start(self.upstream())
            .await
            .map_err(|e| Error::unreachable("dynamodb", e))?;
        let endpoint = format!("http://{}", proxy.addr());
        let faults = proxy.faults();
        self.proxies.lock().unwrap().push(proxy);
        Ok((
            DynamoDbStore::from_config(config(&endpoint, &self.table)).await?,
            faults,
        ))
    }

    /// Writes an item with the lease's key, bypassing leasehold.
    pub async fn put_raw(&self, lease: &LeaseName, attributes: &[(&str, AttributeValue)]) -> Result<()> {
        let store = self.store().await?;
        let mut item: HashMap<String, AttributeValue> = HashMap::from([
            ("lease".to_string(), AttributeValue::S(lease.to_string())),
            ("sk".to_string(), AttributeValue::S("lease".into())),
        ]);
        item.extend(attributes.iter().map(|(k, v)| (k.to_string(), v.clone())));
        store
            .client()
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map(drop)
            .map_err(|e| Error::store("dynamodb", e))
    }
}

#[async_trait]
impl Backend for DynamoBackend {
    fn name(&self) -> &'static str {
        "dynamodb"
    }

    /// dynalite (one single-threaded Node.js process, about 0.5 ms of CPU per request) and the
    /// SDK (about 0.7 ms of client CPU per request with the AWS crates optimised in dev builds)
    /// serve 1,000-1,600 requests a second on two idle cores, and a third of that or less while
    /// other test suites run. A 20 s TTL asks for 150 renewals a second (3,000 / TTL), and its
    /// request timeout (TTL / 4, 5 s) leaves room for the 1,000 first acquires arriving at once;
    /// at 10 s (300 a second) it passes on an idle machine but lost leases when another suite
    /// kept a core busy.
    fn many_leases_ttl(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(20))
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.store().await?))
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let (store, faults) = self.faulty().await?;
        // The proxy sees bytes; scenarios also count requests.
        let counted = FaultyStore::counting(Arc::new(store), faults.clone());
        Ok((Arc::new(counted), faults))
    }

    /// Overwrites the lease item with a string where the term belongs and no version, as a
    /// foreign program writing to the same key would.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        self.put_raw(
            lease,
            &[
                ("holder", AttributeValue::S("vandal".into())),
                ("term", AttributeValue::S("garbage".into())),
            ],
        )
        .await
    }
}
