//! The secured section of the suite against mariadb-tls (`scripts/services up mariadb-tls`):
//! `ssl-mode=VERIFY_IDENTITY` with a client certificate (`REQUIRE X509`), a password, a user with
//! only the privileges the docs list.

use std::sync::Arc;

use leasehold_core::LeaseStore;
use leasehold_mysql::MysqlStore;

use leasehold_conformance::secured::{Secured, Tls, Users, secured_backend};

/// The mariadb-tls server (`LEASEHOLD_MYSQL_TLS_URL`): user `leasehold` with SELECT, INSERT,
/// UPDATE, DELETE and CREATE on database `leasehold` only.
fn mysql_tls() -> Option<Secured> {
    let tls = Tls::from_env("mariadb-tls", "LEASEHOLD_MYSQL_TLS_URL")?;
    let backend = secured_backend("mysql", &tls.url, |url| {
        Box::pin(async move { Ok(Arc::new(MysqlStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    tls.with_users(
        backend,
        Users {
            password_var: "LEASEHOLD_MYSQL_TLS_PASSWORD",
            readonly_var: "LEASEHOLD_MYSQL_TLS_READONLY_URL",
            wrong_password_says: "check the URL's user and password",
            readonly: (
                "missing privilege (read-only user)",
                "leasehold needs SELECT, INSERT, UPDATE and DELETE",
            ),
        },
    )
}

leasehold_conformance::secured!(mysql_tls, mysql_tls());
