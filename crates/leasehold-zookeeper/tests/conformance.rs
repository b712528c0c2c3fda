//! The shared conformance suite against the ZooKeeper test server.
//!
//! The backend: ZooKeeper (`scripts/services up zookeeper`): every client is its own `ZookeeperStore` (its own
//! sessions), leases under a chroot of their own.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, LeaseStore};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

const CHROOT: &str = "/leasehold-tests";

/// The single ZooKeeper server named by `LEASEHOLD_ZOOKEEPER_URL`.
fn zookeeper() -> Option<Arc<dyn Backend>> {
    let server = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL")?;
    let upstream = host_port(&server)?;
    let url = format!("{}{CHROOT}", server.trim_end_matches('/'));
    let host = upstream.clone();
    let backend = ServerBackend::new(
        "zookeeper",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(ZookeeperStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // Garbage in the leader's candidate znode, or else in the newest history entry.
        move |lease| {
            let host = host.clone();
            Box::pin(async move {
                let fail = |e: zk::Error| Error::store("zookeeper", e);
                let raw = zk::Client::connector()
                    .with_session_timeout(Duration::from_secs(10))
                    .connect(&host)
                    .await
                    .map_err(fail)?;
                let candidates = format!("{CHROOT}/{lease}/candidates");
                let history = format!("{CHROOT}/{lease}/history");
                let mut children = raw.list_children(&candidates).await.unwrap_or_default();
                children.sort_by_key(|name| name.rsplit_once('-').and_then(|(_, s)| s.parse::<i64>().ok()));
                let path = match children.first() {
                    Some(first) => format!("{candidates}/{first}"),
                    None => {
                        let mut terms = raw.list_children(&history).await.map_err(fail)?;
                        terms.sort();
                        let last = terms
                            .last()
                            .ok_or_else(|| Error::store("zookeeper", "nothing to corrupt"))?;
                        format!("{history}/{last}")
                    }
                };
                raw.set_data(&path, b"\x00garbage from someone else", None)
                    .await
                    .map_err(fail)?;
                Ok(())
            })
        },
    )
    // Every renewal is a `sync` + `getData` round trip: 1,000 leases at a 2 s TTL need 1,500 a
    // second, more than one ZooKeeper server on a loaded 2-core machine reliably answers in time
    // (5 of 1,000 lost in one CI run); at 6 s, 500 a second.
    .many_leases_ttl(Duration::from_secs(6))
    .grants_by_waiting()
    // `scripts/services` serves it: the restart scenario stops and starts it.
    .restart_with("zookeeper", 22181)
    .secret_urls(move |secret| {
        let auth = format!("auth=digest:leasehold:{secret}");
        // Digest authentication only adds an identity: the server accepts any.
        SecretUrls {
            accepted: Some(with_option(&url, &auth)),
            refused: None,
            closed: Some(with_option(&format!("zk://127.0.0.1:1{CHROOT}"), &auth)),
            malformed: vec![with_option(&with_option(&url, &auth), "nonsense=1")],
        }
    });
    Some(Arc::new(backend))
}

leasehold_conformance::suite!(zookeeper, zookeeper());
