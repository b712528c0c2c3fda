//! The secured section of the suite against etcd-tls (`scripts/services up etcd-tls`): TLS with
//! client certificates, RBAC with a role limited to the key prefix.

use std::sync::Arc;

use leasehold_core::LeaseStore;
use leasehold_etcd::EtcdStore;

use leasehold_conformance::secured::{Secured, Tls, Users, secured_backend};

/// The etcd-tls server (`LEASEHOLD_ETCD_TLS_URL`): user `leasehold`, role `leasehold-rw`.
fn etcd_tls() -> Option<Secured> {
    let tls = Tls::from_env("etcd-tls", "LEASEHOLD_ETCD_TLS_URL")?;
    let backend = secured_backend("etcd", &tls.url, |url| {
        Box::pin(async move { Ok(Arc::new(EtcdStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    tls.with_users(
        backend,
        Users {
            password_var: "LEASEHOLD_ETCD_TLS_PASSWORD",
            readonly_var: "LEASEHOLD_ETCD_TLS_READONLY_URL",
            wrong_password_says: "check the user and password",
            readonly: (
                "missing privilege (read-only role)",
                "check that the user's role may read and write the key prefix",
            ),
        },
    )
}

leasehold_conformance::secured!(etcd_tls, etcd_tls());
