//! The shared conformance suite against the etcd test server.
//!
//! The backend: etcd (`scripts/services up etcd`): every client is its own `EtcdStore` (its own connection and
//! sessions); faulty clients reach the server through the proxy (gRPC over h2c passes through).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, DeleteOptions, GetOptions, SortOrder, SortTarget};
use leasehold_core::{Error, LeaseStore};
use leasehold_etcd::EtcdStore;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

const PREFIX: &str = "leasehold-tests";

/// The etcd server named by `LEASEHOLD_ETCD_URL`, leases under a prefix of their own.
fn etcd() -> Option<Arc<dyn Backend>> {
    let server = require_server("etcd", "LEASEHOLD_ETCD_URL")?;
    let upstream = host_port(&server)?;
    let url = format!("{}/{PREFIX}", server.trim_end_matches('/'));
    let (endpoint, for_remove) = (upstream.clone(), upstream.clone());
    let backend = ServerBackend::new(
        "etcd",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(EtcdStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // Text in the first candidate's key (as a foreign program using the same keys would
        // write) and a history entry that does not parse.
        move |lease| {
            let endpoint = endpoint.clone();
            Box::pin(async move {
                let err = |e: etcd_client::Error| Error::store("etcd", e);
                let mut client = Client::connect([endpoint.as_str()], None).await.map_err(err)?;
                let candidates = format!("{PREFIX}/{lease}/c/");
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
                    .put(format!("{PREFIX}/{lease}/h/99999999999999999999"), "garbage", None)
                    .await
                    .map_err(err)?;
                Ok(())
            })
        },
    )
    // Every key of the lease: candidates, history, garbage.
    .remove_with(move |lease| {
        let endpoint = for_remove.clone();
        Box::pin(async move {
            let err = |e: etcd_client::Error| Error::store("etcd", e);
            let mut client = Client::connect([endpoint.as_str()], None).await.map_err(err)?;
            let keys = format!("{PREFIX}/{lease}/");
            client
                .delete(keys, Some(DeleteOptions::new().with_prefix()))
                .await
                .map_err(err)?;
            Ok(())
        })
    })
    // A debug-built client on a shared 2-core machine grants about 500 leases a second; with the
    // engine's request timeout at a quarter of the TTL, a burst of 1,000 first acquires needs a
    // few seconds of timeout to settle. Renewals are coalesced per session and cost little.
    .many_leases_ttl(Duration::from_secs(6))
    .grants_by_waiting()
    // `scripts/services` serves it: the restart scenario stops and starts it.
    .restart_with("etcd", 22379)
    .secret_urls(move |secret| {
        let (scheme, rest) = url.split_once("://").expect("an etcd URL");
        // Authentication is not enabled on the test server: the password is refused.
        let with = format!("{scheme}://leasehold:{secret}@{rest}");
        let closed = format!("{scheme}://leasehold:{secret}@127.0.0.1:1/{PREFIX}");
        SecretUrls {
            accepted: None,
            refused: Some(with.clone()),
            closed: Some(closed),
            malformed: vec![
                with_option(&with, "nonsense=1"),
                with_option(&url, &format!("user=leasehold&password={secret}&nonsense=1")),
            ],
        }
    });
    Some(Arc::new(backend))
}

leasehold_conformance::suite!(etcd, etcd());
