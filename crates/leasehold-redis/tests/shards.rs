//! Shard records against a real server, where Redis's own layout matters: the records of a prefix
//! in one hash (`{prefix}shards`, `{version} {value}` per name) and the sorted set of their names
//! (`{prefix}shard-names`), apart from the leases; a listing past one page of names; keys and
//! fields leasehold cannot read. (The contract itself: the shared scenario
//! `shard_records_compare_and_set`.) The test uses a key prefix of its own, deleted at the end.

use crate::common;

use std::time::Duration;

use leasehold_core::{Error, LeaseName, LeaseStore, ShardWrite, random_u64};
use leasehold_redis::RedisStore;
use redis::Value;

use common::{RedisBackend, grant, raw_cmd, scripts_run};

/// Records written by hand: three pages of 2,500 names.
const RECORDS: usize = 5001;

fn name(text: &str) -> LeaseName {
    LeaseName::new(text).expect("valid name")
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).expect("UTF-8"),
        Value::SimpleString(s) => s.clone(),
        other => panic!("{other:?}, expected text"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_live_in_a_hash_of_their_own_and_list_page_by_page() {
    let Some(url) = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let mut config = common::config(&url);
    config.restart_guard = false;
    // Glob characters in the prefix: nothing here matches keys by pattern.
    config.prefix = format!("lh-shards*?[x]-{:x}:", random_u64());
    let backend = RedisBackend::with_config(config);
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let prefix = backend.config.prefix.clone();
    let (records, names_key) = (format!("{prefix}shards"), format!("{prefix}shard-names"));

    // A write by the store: a field `{version} {value}` of the hash, the name in the sorted set.
    let value = "leasehold1 1 1 a \"'%\\ é";
    let written = match store.write_shard(&name("g.s.a"), None, value).await.unwrap() {
        ShardWrite::Written(record) => record,
        other => panic!("a first write creates the record: {other:?}"),
    };
    let field = raw_cmd(&backend, &["HGET", &records, "g.s.a"]).await;
    assert_eq!(text(&field), format!("{} {value}", written.version));
    let score = raw_cmd(&backend, &["ZSCORE", &names_key, "g.s.a"]).await;
    assert_eq!(text(&score), "0");

    // 5,001 records by hand, in name order over three pages; a name whose field is gone is no
    // record.
    let names: Vec<String> = (0..RECORDS).map(|i| format!("g.s.b{i:05}")).collect();
    let mut hset = vec!["HSET".to_string(), records.clone()];
    let mut zadd = vec!["ZADD".to_string(), names_key.clone()];
    for (i, n) in names.iter().enumerate() {
        hset.extend([n.clone(), format!("{:016x} leasehold1 2 2 {n}", i + 1)]);
        zadd.extend(["0".to_string(), n.clone()]);
    }
    zadd.extend(["0".to_string(), "g.s.b99999".to_string()]);
    raw_cmd(&backend, &hset.iter().map(String::as_str).collect::<Vec<_>>()).await;
    raw_cmd(&backend, &zadd.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let before = scripts_run(&backend).await;
    let listed = store.shard_records("g.s.b").await.unwrap();
    let scripts = scripts_run(&backend).await.saturating_sub(before);
    let listed_names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(listed_names, names, "every record, in name order, past the pages");
    for (i, record) in listed.iter().enumerate() {
        assert_eq!(record.version, format!("{:016x}", i + 1));
        assert_eq!(record.value, format!("leasehold1 2 2 {}", record.name));
    }
    eprintln!("{RECORDS} records listed with {scripts} scripts on the server (server-wide count)");
    assert_eq!(store.shard_records("").await.unwrap().len(), RECORDS + 1);

    // Leases are not records, records are not leases.
    let held = grant(&store, &name("g.s.a"), "A", Duration::from_secs(30)).await;
    let leases: Vec<String> = store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.lease.to_string())
        .collect();
    assert_eq!(leases, ["g.s.a"], "list shows the lease alone");
    assert_eq!(store.shard_records("g.s.a").await.unwrap(), vec![written.clone()]);
    store.release(&held).await.unwrap();

    // What leasehold cannot read: a field of another shape, a name that is no lease name, a key
    // of another type. A write then writes nothing.
    raw_cmd(&backend, &["HSET", &records, "g.s.c", "garbage"]).await;
    raw_cmd(&backend, &["ZADD", &names_key, "0", "g.s.c"]).await;
    let corrupt = store.shard_records("g.s.c").await;
    assert!(matches!(corrupt, Err(Error::CorruptRecord { .. })), "{corrupt:?}");
    let refused = store.write_shard(&name("g.s.c"), None, "leasehold1 1 1 y").await;
    assert!(matches!(refused, Err(Error::CorruptRecord { .. })), "{refused:?}");
    assert_eq!(text(&raw_cmd(&backend, &["HGET", &records, "g.s.c"]).await), "garbage");
    raw_cmd(&backend, &["ZADD", &names_key, "0", "g.s.d/x"]).await;
    let corrupt = store.shard_records("g.s.d").await;
    assert!(matches!(corrupt, Err(Error::CorruptRecord { .. })), "{corrupt:?}");
    raw_cmd(&backend, &["DEL", &names_key]).await;
    raw_cmd(&backend, &["SET", &names_key, "foreign"]).await;
    let corrupt = store.shard_records("").await;
    assert!(matches!(corrupt, Err(Error::CorruptRecord { .. })), "{corrupt:?}");
    let refused = store.write_shard(&name("g.s.e"), None, "leasehold1 1 1 z").await;
    assert!(matches!(refused, Err(Error::CorruptRecord { .. })), "{refused:?}");
    assert_eq!(raw_cmd(&backend, &["HEXISTS", &records, "g.s.e"]).await, Value::Int(0));

    for key in [records, names_key] {
        raw_cmd(&backend, &["DEL", &key]).await;
    }
    let lease = backend.config.keys(&name("g.s.a"));
    for key in [lease.lease, lease.state, lease.history, lease.queue, lease.woken] {
        raw_cmd(&backend, &["DEL", &key]).await;
    }
}
