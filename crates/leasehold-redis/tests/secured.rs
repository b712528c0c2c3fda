//! The secured section of the suite against redis-tls (`scripts/services up redis-tls`): TLS with
//! a private CA and client certificates, an ACL user with exactly the documented commands, keys
//! and channels.

use std::sync::Arc;

use leasehold_core::LeaseStore;
use leasehold_redis::RedisStore;

use leasehold_conformance::secured::{Secured, Tls, Users, secured_backend};

/// The redis-tls server (`LEASEHOLD_REDIS_TLS_URL`): ACL user `leasehold`.
fn redis_tls() -> Option<Secured> {
    let tls = Tls::from_env("redis-tls", "LEASEHOLD_REDIS_TLS_URL")?;
    let backend = secured_backend("redis", &tls.url, |url| {
        Box::pin(async move { Ok(Arc::new(RedisStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    tls.with_users(
        backend,
        Users {
            password_var: "LEASEHOLD_REDIS_TLS_PASSWORD",
            readonly_var: "LEASEHOLD_REDIS_TLS_READONLY_URL",
            wrong_password_says: "check the URL's user name and password",
            readonly: (
                "missing privilege (read-only role)",
                "grant the user the ACL permissions leasehold needs",
            ),
        },
    )
}

leasehold_conformance::secured!(redis_tls, redis_tls());
