//! The lease table: the SDK client, and checking or creating the table at connect.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, StalledStreamProtectionConfig};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use leasehold_core::{Error, Result};

use crate::config::DynamoDbConfig;
use crate::error::{self, STORE, TableError};
use crate::record::{KEY, SORT};

/// How long [`DynamoDbStore::create_table_if_missing`](crate::DynamoDbStore::create_table_if_missing) waits for a new table to become active.
const TABLE_WAIT: Duration = Duration::from_secs(120);

/// Where the wall-clock times of the audit trail come from.
type AuditClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The requests on the table, behind the [`LimitStore`](leasehold_core::LimitStore) of a [`DynamoDbStore`](crate::DynamoDbStore).
#[derive(Clone)]
pub(crate) struct Table {
    pub(crate) client: Client,
    pub(crate) table: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) audit_clock: AuditClock,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// Checks that the table exists, is active and has leasehold's key schema
    /// (`lease` (S) partition key, `sk` (S) sort key).
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::from_config`](crate::DynamoDbStore::from_config).
    pub(crate) async fn verify_table(&self) -> Result<()> {
        match self.describe_table().await? {
            Some(status) => self.await_active(status).await,
            None => Err(TableError::Missing {
                table: self.table.to_string(),
            }
            .refused()),
        }
    }

    /// Creates the table with on-demand capacity (`PAY_PER_REQUEST`) if it does not exist, waits
    /// until it is active, and checks its key schema. An existing table is never changed.
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::from_config`](crate::DynamoDbStore::from_config); [`Error::Store`] when the table cannot be created
    /// (for instance without `dynamodb:CreateTable` permission).
    pub(crate) async fn create_table_if_missing(&self) -> Result<()> {
        if let Some(status) = self.describe_table().await? {
            return self.await_active(status).await;
        }
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| Error::store(STORE, e))
        };
        let key_element = |name: &str, key_type| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(key_type)
                .build()
                .map_err(|e| Error::store(STORE, e))
        };
        let created = self
            .client
            .create_table()
            .table_name(self.table.as_ref())
            .attribute_definitions(attribute(KEY)?)
            .attribute_definitions(attribute(SORT)?)
            .key_schema(key_element(KEY, KeyType::Hash)?)
            .key_schema(key_element(SORT, KeyType::Range)?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // Someone else is creating it at the same moment.
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
            Err(e) => return Err(error::map(e, "create_table", self.timeout)),
        }
        let status = self.describe_table().await?.unwrap_or(TableStatus::Creating);
        self.await_active(status).await
    }

    /// The table's status after checking its key schema, or `None` when it does not exist.
    async fn describe_table(&self) -> Result<Option<TableStatus>> {
        let described = self
            .client
            .describe_table()
            .table_name(self.table.as_ref())
            .send()
            .await;
        let out = match described {
            Ok(out) => out,
            Err(e) if error::is_missing_table(&e) => return Ok(None),
            Err(e) if error::is_foreign_answer(&e) => {
                let cause = error::Described::new("describe_table", &e);
                return Err(Error::refused(
                    STORE,
                    "connect",
                    format!(
                        "the endpoint answered, but not as DynamoDB ({}): check the endpoint and its port",
                        cause.reason
                    ),
                ));
            }
            Err(e) => return Err(error::map(e, "describe_table", self.timeout)),
        };
        let Some(table) = out.table() else { return Ok(None) };
        let keys: Vec<(String, String)> = table
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name().to_string(), k.key_type().as_str().to_string()))
            .collect();
        let types: HashMap<&str, &str> = table
            .attribute_definitions()
            .iter()
            .map(|a| (a.attribute_name(), a.attribute_type().as_str()))
            .collect();
        let expected = [
            (KEY.to_string(), "HASH".to_string()),
            (SORT.to_string(), "RANGE".to_string()),
        ];
        if keys != expected || types.get(KEY) != Some(&"S") || types.get(SORT) != Some(&"S") {
            let found: Vec<String> = keys
                .iter()
                .map(|(name, kind)| format!("{name} ({}) {kind}", types.get(name.as_str()).unwrap_or(&"?")))
                .collect();
            return Err(Error::corrupt(
                STORE,
                format!("table {}", self.table),
                format!(
                    "the table has key schema [{}], leasehold needs [lease (S) HASH, sk (S) RANGE]; \
                     it was left unchanged: use another table name",
                    found.join(", ")
                ),
            ));
        }
        Ok(Some(table.table_status().cloned().unwrap_or(TableStatus::Active)))
    }

    /// Waits (polling, at setup only) until the table is active.
    async fn await_active(&self, mut status: TableStatus) -> Result<()> {
        let started = tokio::time::Instant::now();
        loop {
            match status {
                TableStatus::Active => return Ok(()),
                TableStatus::Creating | TableStatus::Updating if started.elapsed() < TABLE_WAIT => {}
                other => {
                    return Err(TableError::NotActive {
                        table: self.table.to_string(),
                        status: other.as_str().to_string(),
                        waited: started.elapsed(),
                    }
                    .refused());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            status = self.describe_table().await?.unwrap_or(TableStatus::Deleting);
        }
    }
}

/// The SDK client for `config`: static credentials from the URL or the standard AWS chain, no
/// retries (the engine retries), the configured timeout on every request.
pub(crate) async fn build_client(config: &DynamoDbConfig) -> Result<Client> {
    let static_credentials = config.credentials.as_ref().map(|c| {
        Credentials::new(
            c.access_key_id.expose(),
            c.secret_access_key.expose(),
            c.session_token.as_ref().map(|t| t.expose().to_string()),
            None,
            "leasehold-url",
        )
    });
    #[cfg(feature = "aws-config")]
    let mut builder = {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(credentials) = static_credentials {
            loader = loader.credentials_provider(credentials);
        }
        let shared = loader.load().await;
        if shared.region().is_none() {
            return Err(TableError::NoRegion.refused());
        }
        aws_sdk_dynamodb::config::Builder::from(&shared)
    };
    #[cfg(not(feature = "aws-config"))]
    let mut builder = {
        let credentials = static_credentials.ok_or_else(|| TableError::NoCredentials.refused())?;
        let region = config.region.clone().ok_or_else(|| TableError::NoRegion.refused())?;
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
    };
    if let Some(endpoint) = &config.endpoint {
        builder = builder.endpoint_url(endpoint);
    }
    let builder = builder
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.timeout)
                .operation_attempt_timeout(config.timeout)
                .operation_timeout(config.timeout)
                .build(),
        )
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
    Ok(Client::from_conf(builder.build()))
}
