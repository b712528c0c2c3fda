//! zookeeper-auth: digest authentication, the chroot and every znode of the store readable and
//! writable by its identity only. ZooKeeper has no TLS here (Debian's 3.8 server would need a
//! keystore set-up of its own): the TLS refusals do not apply.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_zookeeper::ZookeeperStore;

use super::{Refusal, Secured, escape, password_secrets};
use crate::backend::{host_port, require_server};
use crate::server::ServerBackend;

/// The zookeeper-auth server (`LEASEHOLD_ZOOKEEPER_AUTH_URL`): digest user `leasehold`, owner of
/// the chroot `/leasehold-tests`.
pub fn zookeeper_auth() -> Option<Secured> {
    let url = require_server("zookeeper-auth", "LEASEHOLD_ZOOKEEPER_AUTH_URL")?;
    let secrets = password_secrets("LEASEHOLD_ZOOKEEPER_AUTH_PASSWORD")?;
    // A digest credential is never refused by itself: a wrong password is another identity,
    // which the ACLs keep out at the first request.
    let refusals = vec![Refusal {
        what: "wrong password (another digest identity)",
        url: url.replacen(&escape(&secrets[0]), "wrong-password", 1),
        says: "check the digest credentials",
    }];
    let backend = ServerBackend::new(
        "zookeeper",
        url.clone(),
        host_port(&url)?,
        |url| Box::pin(async move { Ok(Arc::new(ZookeeperStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        |_| {
            Box::pin(async {
                Err(Error::Unsupported {
                    store: "zookeeper",
                    operation: "corrupt (not part of the secured section)",
                })
            })
        },
    );
    Some(Secured {
        backend: Arc::new(backend),
        secrets,
        refusals,
    })
}
