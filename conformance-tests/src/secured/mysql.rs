//! mariadb-tls: TLS required (`ssl-mode=VERIFY_IDENTITY`, client certificates checked: `REQUIRE
//! X509`), a password, a user with only the privileges the docs list.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_mysql::MysqlStore;

use super::{Refusal, Secured, Tls, escape, password_secrets};
use crate::backend::host_port;
use crate::server::ServerBackend;

/// The mariadb-tls server (`LEASEHOLD_MYSQL_TLS_URL`): user `leasehold` with SELECT, INSERT,
/// UPDATE, DELETE and CREATE on database `leasehold` only.
pub fn mysql_tls() -> Option<Secured> {
    let tls = Tls::from_env("mariadb-tls", "LEASEHOLD_MYSQL_TLS_URL")?;
    let mut secrets = password_secrets("LEASEHOLD_MYSQL_TLS_PASSWORD")?;
    let readonly = crate::backend::configured_url("LEASEHOLD_MYSQL_TLS_READONLY_URL")?;
    let mut refusals = tls.refusals();
    refusals.push(Refusal {
        what: "wrong password",
        url: tls.url.replacen(&escape(&secrets[0]), "wrong-password", 1),
        says: "check the URL's user and password",
    });
    refusals.push(Refusal {
        what: "missing privilege (read-only user)",
        url: readonly,
        says: "leasehold needs SELECT, INSERT, UPDATE and DELETE",
    });
    secrets.push(tls.key_body());
    let backend = ServerBackend::new(
        "mysql",
        tls.url.clone(),
        host_port(&tls.url)?,
        |url| Box::pin(async move { Ok(Arc::new(MysqlStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        |_| {
            Box::pin(async {
                Err(Error::Unsupported {
                    store: "mysql",
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
