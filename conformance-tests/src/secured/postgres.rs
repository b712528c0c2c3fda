//! postgres-tls: TLS (`sslmode=verify-full`, client certificates checked), scram-sha-256, a role
//! that owns only its schema.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_postgres::PostgresStore;

use super::{Refusal, Secured, Tls, escape, password_secrets};
use crate::backend::host_port;
use crate::server::ServerBackend;

/// The postgres-tls server (`LEASEHOLD_POSTGRES_TLS_URL`): role `leasehold`, owner of schema
/// `leasehold` only.
pub fn postgres_tls() -> Option<Secured> {
    let tls = Tls::from_env("postgres-tls", "LEASEHOLD_POSTGRES_TLS_URL")?;
    let mut secrets = password_secrets("LEASEHOLD_POSTGRES_TLS_PASSWORD")?;
    let readonly = crate::backend::configured_url("LEASEHOLD_POSTGRES_TLS_READONLY_URL")?;
    let mut refusals = tls.refusals();
    refusals.push(Refusal {
        what: "wrong password",
        url: tls.url.replacen(&escape(&secrets[0]), "wrong-password", 1),
        says: "check the URL's user and password",
    });
    refusals.push(Refusal {
        what: "missing privilege (read-only role)",
        url: readonly,
        says: "grant the role the privileges leasehold needs",
    });
    secrets.push(tls.key_body());
    let backend = ServerBackend::new(
        "postgres",
        tls.url.clone(),
        host_port(&tls.url)?,
        |url| Box::pin(async move { Ok(Arc::new(PostgresStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        |_| {
            Box::pin(async {
                Err(Error::Unsupported {
                    store: "postgres",
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
