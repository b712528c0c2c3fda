//! Shard records against the etcd test server (`scripts/services up etcd`), where etcd's own key
//! layout matters: one key per record in `{prefix}/.shards/`, beside the leases and never listed
//! with them, its version the key's `mod_revision`; a listing past one page of keys; keys there
//! that leasehold cannot read. (The contract itself: the shared scenario
//! `shard_records_compare_and_set`.) The test runs under a store prefix of its own, removed at
//! the end.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, DeleteOptions, Txn, TxnOp};
use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Error, LeaseName, LeaseStore, ShardWrite};
use leasehold_etcd::EtcdStore;

/// Records written by hand: three pages of 2,500 keys.
const RECORDS: usize = 5001;

fn name(text: &str) -> LeaseName {
    LeaseName::new(text).expect("valid name")
}

#[tokio::test]
async fn records_live_in_a_folder_of_their_own_and_list_page_by_page() {
    let Some(server) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let address = server.trim_start_matches("etcd://").trim_end_matches('/').to_string();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let prefix = format!("leasehold-shard-tests/{nanos}");
    let store = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("store connects");
    let mut raw = Client::connect([address.as_str()], None)
        .await
        .expect("raw client connects");
    let folder = format!("{prefix}/.shards/");

    // A write by the store: the key `{prefix}/.shards/{name}`, the value as written, the
    // version its mod_revision.
    let value = "leasehold1 1 1 a \"'%\\ é";
    let written = match store.write_shard(&name("g.s.a"), None, value).await.expect("write") {
        ShardWrite::Written(record) => record,
        other => panic!("a first write creates the record: {other:?}"),
    };
    let key = raw.get(format!("{folder}g.s.a"), None).await.expect("raw read");
    let kv = key.kvs().first().expect("the record's key");
    assert_eq!(kv.value(), value.as_bytes(), "the value is kept as written");
    assert_eq!(
        written.version,
        kv.mod_revision().to_string(),
        "the version is the mod_revision"
    );
    assert_eq!(kv.lease(), 0, "a record is bound to no etcd lease");

    // 5,001 records by hand (100 a transaction), in name order over three pages.
    let names: Vec<String> = (0..RECORDS).map(|i| format!("g.s.b{i:05}")).collect();
    for chunk in names.chunks(100) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|n| TxnOp::put(format!("{folder}{n}"), format!("leasehold1 2 2 {n}"), None))
            .collect();
        raw.txn(Txn::new().and_then(ops)).await.expect("raw write");
    }
    let listed = store.shard_records("g.s.b").await.expect("list the records");
    let listed_names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(listed_names, names, "every record, in name order, past the pages");
    assert!(listed.iter().all(|r| r.value == format!("leasehold1 2 2 {}", r.name)));
    assert_eq!(store.shard_records("").await.expect("list all").len(), RECORDS + 1);

    // Leases are not records, records are not leases.
    let request = AcquireRequest {
        lease: name("g.s.a"),
        candidate: CandidateId::new("A").expect("id"),
        ttl: Duration::from_secs(30),
        takeover: None,
    };
    let grant = match store.acquire(&request).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        other => panic!("the lease is free: {other:?}"),
    };
    let leases: Vec<String> = store
        .list("")
        .await
        .expect("list leases")
        .into_iter()
        .map(|o| o.lease.to_string())
        .collect();
    assert_eq!(leases, ["g.s.a"], "list shows the lease alone");
    assert_eq!(store.shard_records("g.s.a").await.expect("list"), vec![written.clone()]);
    store.release(&grant).await.expect("release");

    // Keys there leasehold cannot read: a name that is no lease name, a value with a control
    // character. A write of such a record writes nothing.
    raw.put(format!("{folder}g.s.c/x"), "leasehold1 1 1 x", None)
        .await
        .expect("raw write");
    let corrupt = store.shard_records("g.s.c").await;
    assert!(matches!(corrupt, Err(Error::CorruptRecord { .. })), "{corrupt:?}");
    raw.delete(format!("{folder}g.s.c/x"), None).await.expect("raw delete");
    raw.put(format!("{folder}g.s.d"), "two\nlines", None)
        .await
        .expect("raw write");
    let corrupt = store.shard_records("g.s.d").await;
    assert!(matches!(corrupt, Err(Error::CorruptRecord { .. })), "{corrupt:?}");
    let refused = store.write_shard(&name("g.s.d"), Some("1"), "leasehold1 1 1 y").await;
    assert!(matches!(refused, Err(Error::CorruptRecord { .. })), "{refused:?}");
    let kept = raw.get(format!("{folder}g.s.d"), None).await.expect("raw read");
    assert_eq!(kept.kvs()[0].value(), b"two\nlines", "nothing was written");

    raw.delete(format!("{prefix}/"), Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("clean up");
}
