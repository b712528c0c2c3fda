//! What the DynamoDB tests share: clients of the server named by
//! `LEASEHOLD_DYNAMODB_URL` (dynalite from `scripts/services up dynalite`), and raw access to it.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;

use leasehold_conformance::{FaultProxy, Faults};
use leasehold_core::{Error, LeaseName, Result};
use leasehold_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use leasehold_dynamodb::{DynamoDbConfig, DynamoDbStore};

mod holding;

pub use holding::holding_many_leases;

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

    /// The lease item as stored (empty when there is none), bypassing leasehold.
    pub async fn get_raw(&self, lease: &LeaseName) -> Result<HashMap<String, AttributeValue>> {
        let store = self.store().await?;
        let out = store
            .client()
            .get_item()
            .table_name(&self.table)
            .key("lease", AttributeValue::S(lease.to_string()))
            .key("sk", AttributeValue::S("lease".into()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Error::store("dynamodb", e))?;
        Ok(out.item().cloned().unwrap_or_default())
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
