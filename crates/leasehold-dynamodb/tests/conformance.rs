//! The shared conformance suite against dynalite.
//!
//! The backend: DynamoDB (dynalite from `scripts/services up dynalite`): every client is its own
//! `DynamoDbStore` (its own SDK client and connections), on one table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_core::{Error, LeaseStore};
use leasehold_dynamodb::DynamoDbStore;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

const TABLE: &str = "leasehold-tests";

/// The DynamoDB server named by `LEASEHOLD_DYNAMODB_URL` (an `http://` endpoint), with the dummy
/// keys local servers accept, creating the table when missing.
fn dynamodb() -> Option<Arc<dyn Backend>> {
    let endpoint = require_server("dynalite", "LEASEHOLD_DYNAMODB_URL")?;
    let endpoint = endpoint.trim_end_matches('/').to_string();
    let upstream = host_port(&endpoint)?;
    let url = format!(
        "dynamodb://{TABLE}?endpoint={endpoint}&region=us-east-1&access_key_id=local\
         &secret_access_key=local-secret&create_table=true"
    );
    let (raw, for_remove) = (endpoint.clone(), endpoint.clone());
    let backend = ServerBackend::new(
        "dynamodb",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(DynamoDbStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // A string where the term belongs and no version, as a foreign program writing to the
        // same key would.
        move |lease| {
            let endpoint = raw.clone();
            Box::pin(async move {
                let item = HashMap::from([
                    ("lease".to_string(), AttributeValue::S(lease.to_string())),
                    ("sk".to_string(), AttributeValue::S("lease".into())),
                    ("holder".to_string(), AttributeValue::S("vandal".into())),
                    ("term".to_string(), AttributeValue::S("garbage".into())),
                ]);
                raw_client(endpoint)
                    .put_item()
                    .table_name(TABLE)
                    .set_item(Some(item))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| Error::store("dynamodb", e))
            })
        },
    )
    .remove_with(move |lease| {
        let endpoint = for_remove.clone();
        Box::pin(async move {
            raw_client(endpoint)
                .delete_item()
                .table_name(TABLE)
                .key("lease", AttributeValue::S(lease.to_string()))
                .key("sk", AttributeValue::S("lease".into()))
                .send()
                .await
                .map(drop)
                .map_err(|e| Error::store("dynamodb", e))
        })
    })
    // dynalite (one single-threaded Node.js process, about 0.5 ms of CPU per request) and the SDK
    // (about 0.7 ms of client CPU per request with the AWS crates optimised in dev builds) serve
    // 1,000-1,600 requests a second on two idle cores, and a third of that or less while other
    // test suites run. A 20 s TTL asks for 150 renewals a second (3,000 / TTL), and its request
    // timeout (TTL / 4, 5 s) leaves room for the 1,000 first acquires arriving at once; at 10 s
    // (300 a second) it passes on an idle machine but lost leases when another suite kept a core
    // busy.
    .many_leases_ttl(Duration::from_secs(20))
    // No `restart_with`: dynalite runs in memory here (no `--path`), and a restart would lose the
    // table, which no real service does: the restart scenario does not run.
    .secret_urls(move |secret| {
        let keys = format!("access_key_id={secret}&secret_access_key={secret}&session_token={secret}");
        let server = format!("dynamodb://{TABLE}?endpoint={endpoint}&region=us-east-1&{keys}");
        let closed = format!("dynamodb://{TABLE}?endpoint=http://127.0.0.1:1&region=us-east-1&{keys}&timeout=500ms");
        // dynalite accepts any keys.
        SecretUrls {
            malformed: vec![with_option(&server, "nonsense=1")],
            accepted: Some(server),
            refused: None,
            closed: Some(closed),
        }
    });
    Some(Arc::new(backend))
}

/// A client of the local server with the dummy keys it accepts.
fn raw_client(endpoint: String) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local-secret", None, None, "conformance"))
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

leasehold_conformance::suite!(dynamodb, dynamodb());
