//! `list(prefix)` against the etcd test server (`scripts/services up etcd`), where etcd's own key
//! layout matters: keys that are no lease's, and history spread over several pages of keys. Each
//! test runs under a store prefix of its own (so `list("")` sees only its leases), removed at the
//! end.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, DeleteOptions, Txn, TxnOp};
use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, CandidateId, EndReason, Grant, LeaseName, LeaseStore, Term};
use leasehold_etcd::EtcdStore;

const TTL: Duration = Duration::from_secs(30);

/// A store under a fresh prefix, a raw client, and the prefix.
struct Setup {
    store: EtcdStore,
    raw: Client,
    prefix: String,
}

impl Setup {
    async fn new(name: &str) -> Option<Setup> {
        let server = require_server("etcd", "LEASEHOLD_ETCD_URL")?;
        let address = server.trim_start_matches("etcd://").trim_end_matches('/').to_string();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let prefix = format!("leasehold-list-tests/{name}-{nanos}");
        let store = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
            .await
            .expect("store connects");
        let raw = Client::connect([address.as_str()], None)
            .await
            .expect("raw client connects");
        Some(Setup { store, raw, prefix })
    }

    async fn grant(&self, store: &EtcdStore, lease: &str, id: &str) -> Grant {
        match store.acquire(&request(lease, id)).await.expect("acquire") {
            Acquired::Granted(grant) => grant,
            held => panic!("{id} must be granted {lease}: {held:?}"),
        }
    }

    /// Writes raw keys under the store's prefix, 100 per transaction.
    async fn put_raw(&mut self, kvs: Vec<(String, String)>) {
        for chunk in kvs.chunks(100) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(k, v)| TxnOp::put(format!("{}/{k}", self.prefix), v.clone(), None))
                .collect();
            self.raw.txn(Txn::new().and_then(ops)).await.expect("raw write");
        }
    }

    async fn finish(mut self) {
        let prefix = format!("{}/", self.prefix);
        self.raw
            .delete(prefix, Some(DeleteOptions::new().with_prefix()))
            .await
            .expect("clean up");
    }
}

fn lease(name: &str) -> LeaseName {
    LeaseName::new(name).expect("valid lease name")
}

fn request(name: &str, id: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease(name),
        candidate: CandidateId::new(id).expect("valid id"),
        ttl: TTL,
        takeover: None,
    }
}

fn names(listed: &[leasehold_core::Observation]) -> Vec<&str> {
    listed.iter().map(|o| o.lease.as_str()).collect()
}

/// etcd's own key layout: keys under the store's prefix that are no lease's (a foreign key, a
/// stray path) and a lease's internal keys (a queued candidate's, its history) are never listed,
/// and a prefix reaching into a lease's internal paths lists nothing. (What a listing shows of
/// each lease, in which order, and literal prefixes: the shared scenario `list_by_prefix`.)
#[tokio::test]
async fn keys_that_are_no_lease_are_never_listed() {
    let Some(mut setup) = Setup::new("prefix").await else {
        return;
    };
    let other = EtcdStore::connect(&format!(
        "etcd://{}/{}",
        require_server("etcd", "LEASEHOLD_ETCD_URL")
            .expect("server")
            .trim_start_matches("etcd://")
            .trim_end_matches('/'),
        setup.prefix
    ))
    .await
    .expect("second store connects");
    let store = setup.store.clone();
    // a-held: held by A, B queued behind it (a candidate key that is no lease of its own).
    let held = setup.grant(&store, "a-held", "A").await;
    let queued = other.acquire(&request("a-held", "B")).await.expect("B asks");
    assert!(matches!(queued, Acquired::Held(_)), "{queued:?}");
    setup
        .put_raw(vec![
            ("a-foreign".into(), "not ours".into()),
            ("a-stray/x/1".into(), "not ours".into()),
        ])
        .await;

    assert_eq!(names(&store.list("").await.expect("list everything")), ["a-held"]);
    assert_eq!(names(&other.list("a-").await.expect("list a-")), ["a-held"]);
    for pattern in ["a-held/", "a-held/c/", "a-stray", "a-foreign"] {
        let listed = store.list(pattern).await.expect("list a prefix");
        assert!(listed.is_empty(), "{pattern:?}: {:?}", names(&listed));
    }

    store.release(&held).await.expect("release");
    other
        .withdraw(&lease("a-held"), &CandidateId::new("B").expect("id"))
        .await
        .expect("withdraw");
    setup.finish().await;
}

#[tokio::test]
async fn list_reads_past_one_page_of_keys() {
    let Some(mut setup) = Setup::new("pages").await else {
        return;
    };
    // 1,500 terms of one lease (3,000 history keys: three pages), then a lease held.
    let at = "1700000000000";
    let mut kvs = Vec::new();
    for term in 1..=1500u64 {
        kvs.push((format!("paged/h/{term:020}"), format!("leasehold1 h {at} A")));
        kvs.push((format!("paged/e/{term:020}"), format!("leasehold1 e {at} released")));
    }
    setup.put_raw(kvs).await;
    let store = setup.store.clone();
    let held = setup.grant(&store, "pz", "A").await;
    let listed = store.list("").await.expect("list");
    assert_eq!(names(&listed), ["paged", "pz"]);
    assert_eq!(listed[0].last_term, Term(1500), "the last history key of the last page");
    assert_eq!(listed[0].previous_end, Some(EndReason::Released));
    assert!(listed[0].holder.is_none());
    assert_eq!(listed[1].holder.as_ref().map(|h| h.term), Some(held.term));
    assert_eq!(store.inspect(&lease("paged")).await.expect("inspect"), listed[0]);
    store.release(&held).await.expect("release");
    setup.finish().await;
}
