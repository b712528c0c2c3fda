//! etcd-tls: TLS with client certificates, RBAC with a role limited to the prefix.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_etcd::EtcdStore;

use super::{Refusal, Secured, Tls, escape, password_secrets};
use crate::backend::host_port;
use crate::server::ServerBackend;

/// The etcd-tls server (`LEASEHOLD_ETCD_TLS_URL`): user `leasehold`, role `leasehold-rw`.
pub fn etcd_tls() -> Option<Secured> {
    let tls = Tls::from_env("etcd-tls", "LEASEHOLD_ETCD_TLS_URL")?;
    let mut secrets = password_secrets("LEASEHOLD_ETCD_TLS_PASSWORD")?;
    let readonly = crate::backend::configured_url("LEASEHOLD_ETCD_TLS_READONLY_URL")?;
    let mut refusals = tls.refusals();
    refusals.push(Refusal {
        what: "wrong password",
        url: tls.url.replacen(&escape(&secrets[0]), "wrong-password", 1),
        says: "check the user and password",
    });
    refusals.push(Refusal {
        what: "missing privilege (read-only role)",
        url: readonly,
        says: "check that the user's role may read and write the key prefix",
    });
    secrets.push(tls.key_body());
    let backend = ServerBackend::new(
        "etcd",
        tls.url.clone(),
        host_port(&tls.url)?,
        |url| Box::pin(async move { Ok(Arc::new(EtcdStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        |_| {
            Box::pin(async {
                Err(Error::Unsupported {
                    store: "etcd",
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
