//! The secured section of the suite against postgres-tls (`scripts/services up postgres-tls`):
//! `sslmode=verify-full` with a client certificate, scram-sha-256, a role owning only its schema.

use std::sync::Arc;

use leasehold_core::LeaseStore;
use leasehold_postgres::PostgresStore;

use leasehold_conformance::secured::{Secured, Tls, Users, secured_backend};

/// The postgres-tls server (`LEASEHOLD_POSTGRES_TLS_URL`): role `leasehold`, owner of schema
/// `leasehold` only.
fn postgres_tls() -> Option<Secured> {
    let tls = Tls::from_env("postgres-tls", "LEASEHOLD_POSTGRES_TLS_URL")?;
    let backend = secured_backend("postgres", &tls.url, |url| {
        Box::pin(async move { Ok(Arc::new(PostgresStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    tls.with_users(
        backend,
        Users {
            password_var: "LEASEHOLD_POSTGRES_TLS_PASSWORD",
            readonly_var: "LEASEHOLD_POSTGRES_TLS_READONLY_URL",
            wrong_password_says: "check the URL's user and password",
            readonly: (
                "missing privilege (read-only role)",
                "grant the role the privileges leasehold needs",
            ),
        },
    )
}

leasehold_conformance::secured!(postgres_tls, postgres_tls());
