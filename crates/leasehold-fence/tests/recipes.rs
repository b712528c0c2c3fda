//! The etcd and Redis recipes of `leasehold_fence::recipes`, run against the local servers
//! (`LEASEHOLD_ETCD_URL`, `LEASEHOLD_REDIS_URL`; skipped loudly when not reachable, a failure
//! under `CI=true`), exactly as the docs show them.

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use leasehold_conformance::require_server;
use leasehold_fence::recipes::{REDIS_FENCED_SET, etcd_term};

fn suffix() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The etcd recipe: `Ok(true)` when it wrote `value` to `data`, `Ok(false)` when the term was
/// stale (nothing written).
async fn etcd_fenced_put(client: &mut Client, fence: &str, term: u64, data: &str, value: &str) -> bool {
    let txn = Txn::new()
        .when([Compare::value(fence, CompareOp::Greater, etcd_term(term))])
        .and_then([TxnOp::get(fence, None)])
        .or_else([TxnOp::put(fence, etcd_term(term), None), TxnOp::put(data, value, None)]);
    !client.txn(txn).await.unwrap().succeeded()
}

async fn etcd_get(client: &mut Client, key: &str) -> Option<String> {
    let resp = client.get(key, None).await.unwrap();
    resp.kvs().first().map(|kv| kv.value_str().unwrap().to_string())
}

/// On a fence key nobody wrote, the first term writes; an equal term writes; a lower one is
/// refused and the data keeps the successor's value; 10 after 9 (one more digit) writes and 9
/// is then refused; `u64::MAX` writes and `u64::MAX - 1` is refused (no precision loss).
#[tokio::test]
async fn etcd_recipe_refuses_lower_terms_and_accepts_equal_and_higher() {
    let Some(url) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let hosts = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let hosts = hosts.split(['/', '?']).next().unwrap();
    let mut client = Client::connect(hosts.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let run = suffix();
    let fence = format!("fence-test/{run}/fence");
    let data = format!("fence-test/{run}/data");

    assert!(etcd_fenced_put(&mut client, &fence, 5, &data, "A@5").await);
    assert!(etcd_fenced_put(&mut client, &fence, 6, &data, "B@6").await);
    assert!(etcd_fenced_put(&mut client, &fence, 6, &data, "B@6 again").await);
    assert!(!etcd_fenced_put(&mut client, &fence, 5, &data, "A@5 late").await);
    assert_eq!(etcd_get(&mut client, &data).await.as_deref(), Some("B@6 again"));
    assert_eq!(etcd_get(&mut client, &fence).await, Some(etcd_term(6)));

    assert!(etcd_fenced_put(&mut client, &fence, 9, &data, "9").await);
    assert!(etcd_fenced_put(&mut client, &fence, 10, &data, "10").await);
    assert!(!etcd_fenced_put(&mut client, &fence, 9, &data, "9 late").await);
    assert!(etcd_fenced_put(&mut client, &fence, u64::MAX, &data, "max").await);
    assert!(!etcd_fenced_put(&mut client, &fence, u64::MAX - 1, &data, "max-1").await);
    assert_eq!(etcd_get(&mut client, &data).await.as_deref(), Some("max"));

    client
        .delete(
            format!("fence-test/{run}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
}

/// The Redis script: first, equal and higher terms write (`{1, term}`); a lower one returns
/// `{0, highest}` and leaves the data alone; 10 after 9 writes and 9 is then refused (string
/// comparison, not lexicographic on unequal lengths); `u64::MAX` then `u64::MAX - 1` is refused
/// (Lua numbers would round both to 2^64); a term with a leading zero is an error.
#[tokio::test]
async fn redis_recipe_refuses_lower_terms_and_accepts_equal_and_higher() {
    let Some(url) = require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let run = suffix();
    let fence = format!("{{fence-test-{run}}}:fence");
    let data = format!("{{fence-test-{run}}}:data");
    let script = redis::Script::new(REDIS_FENCED_SET);
    let mut put = async |term: String, value: &str| -> redis::RedisResult<(i64, String)> {
        script
            .key(&fence)
            .key(&data)
            .arg(term)
            .arg(value)
            .invoke_async(&mut conn)
            .await
    };

    assert_eq!(put("5".into(), "A@5").await.unwrap(), (1, "5".into()));
    assert_eq!(put("6".into(), "B@6").await.unwrap(), (1, "6".into()));
    assert_eq!(put("6".into(), "B@6 again").await.unwrap(), (1, "6".into()));
    assert_eq!(put("5".into(), "A@5 late").await.unwrap(), (0, "6".into()));
    assert_eq!(put("9".into(), "9").await.unwrap(), (1, "9".into()));
    assert_eq!(put("10".into(), "10").await.unwrap(), (1, "10".into()));
    assert_eq!(put("9".into(), "9 late").await.unwrap(), (0, "10".into()));
    assert_eq!(put(u64::MAX.to_string(), "max").await.unwrap().0, 1);
    assert_eq!(
        put((u64::MAX - 1).to_string(), "max-1").await.unwrap(),
        (0, u64::MAX.to_string())
    );
    assert!(put("011".into(), "leading zero").await.is_err());

    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stored: String = redis::cmd("GET").arg(&data).query_async(&mut conn).await.unwrap();
    assert_eq!(stored, "max");
    let _: i64 = redis::cmd("DEL")
        .arg(&fence)
        .arg(&data)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The DynamoDB recipe on one item: `SET #data = :data, fence_term = :t` under
/// `attribute_not_exists(fence_term) OR fence_term <= :t`. First, equal and higher terms write;
/// a lower one fails with `ConditionalCheckFailed` and leaves the item alone; 10 after 9 and
/// `u64::MAX` after `u64::MAX - 1` compare as numbers. (`TransactWriteItems`, the multi-item
/// form, is not tested: dynalite, the local server, does not implement it.)
#[tokio::test]
async fn dynamodb_recipe_refuses_lower_terms_and_accepts_equal_and_higher() {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    };

    let Some(endpoint) = require_server("dynalite", "LEASEHOLD_DYNAMODB_URL") else {
        return;
    };
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(endpoint)
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let table = format!("fence_test_{}", suffix());
    client
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    for _ in 0..100 {
        let described = client.describe_table().table_name(&table).send().await.unwrap();
        if described.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let put = async |term: u64, data: &str| -> Result<(), String> {
        client
            .update_item()
            .table_name(&table)
            .key("pk", AttributeValue::S("orders/42".into()))
            .update_expression("SET #data = :data, fence_term = :t")
            .condition_expression("attribute_not_exists(fence_term) OR fence_term <= :t")
            .expression_attribute_names("#data", "data")
            .expression_attribute_values(":data", AttributeValue::S(data.into()))
            .expression_attribute_values(":t", AttributeValue::N(term.to_string()))
            .send()
            .await
            .map(drop)
            .map_err(|e| match e.as_service_error() {
                Some(e) if e.is_conditional_check_failed_exception() => "stale".to_string(),
                _ => format!("{e:?}"),
            })
    };
    let item = async || {
        let got = client
            .get_item()
            .table_name(&table)
            .key("pk", AttributeValue::S("orders/42".into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        let item = got.item().unwrap();
        (
            item["data"].as_s().unwrap().clone(),
            item["fence_term"].as_n().unwrap().clone(),
        )
    };

    put(5, "A@5").await.unwrap();
    put(6, "B@6").await.unwrap();
    put(6, "B@6 again").await.unwrap();
    assert_eq!(put(5, "A@5 late").await, Err("stale".into()));
    assert_eq!(item().await, ("B@6 again".into(), "6".into()));
    put(9, "9").await.unwrap();
    put(10, "10").await.unwrap();
    assert_eq!(put(9, "9 late").await, Err("stale".into()));
    put(u64::MAX, "max").await.unwrap();
    assert_eq!(put(u64::MAX - 1, "max-1").await, Err("stale".into()));
    assert_eq!(item().await, ("max".into(), u64::MAX.to_string()));

    client.delete_table().table_name(&table).send().await.unwrap();
}
