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
