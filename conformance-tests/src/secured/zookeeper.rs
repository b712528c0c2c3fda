//! zookeeper-auth: digest authentication, the chroot and every znode of the store readable and
//! writable by its identity only. ZooKeeper has no TLS here (Debian's 3.8 server would need a
//! keystore set-up of its own): the TLS refusals do not apply.

use std::sync::Arc;

use leasehold_core::LeaseStore;
use leasehold_zookeeper::ZookeeperStore;

use super::{Refusal, Secured, password_secrets, secured_backend};
use crate::backend::require_server;

/// The zookeeper-auth server (`LEASEHOLD_ZOOKEEPER_AUTH_URL`): digest user `leasehold`, owner of
/// the chroot `/leasehold-tests`.
pub fn zookeeper_auth() -> Option<Secured> {
    let url = require_server("zookeeper-auth", "LEASEHOLD_ZOOKEEPER_AUTH_URL")?;
    let secrets = password_secrets("LEASEHOLD_ZOOKEEPER_AUTH_PASSWORD")?;
    // A digest credential is never refused by itself: a wrong password is another identity,
    // which the ACLs keep out at the first request.
    let refusals = vec![Refusal {
        what: "wrong password (another digest identity)",
        url: url.replacen(&secrets[1], "wrong-password", 1),
        says: "check the digest credentials",
    }];
    let backend = secured_backend("zookeeper", &url, |url| {
        Box::pin(async move { Ok(Arc::new(ZookeeperStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    Some(Secured {
        backend,
        secrets,
        refusals,
    })
}
