//! redis-tls: TLS only, client certificates required, an ACL user with exactly the documented commands and keys.

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore};
use leasehold_redis::RedisStore;

use super::{Refusal, Secured, Tls, escape, password_secrets};
use crate::backend::host_port;
use crate::server::ServerBackend;

/// The redis-tls server (`LEASEHOLD_REDIS_TLS_URL`): ACL user `leasehold`.
pub fn redis_tls() -> Option<Secured> {
    let tls = Tls::from_env("redis-tls", "LEASEHOLD_REDIS_TLS_URL")?;
    let mut secrets = password_secrets("LEASEHOLD_REDIS_TLS_PASSWORD")?;
    let readonly = crate::backend::configured_url("LEASEHOLD_REDIS_TLS_READONLY_URL")?;
    let mut refusals = tls.refusals();
    refusals.push(Refusal {
        what: "wrong password",
        url: tls.url.replacen(&escape(&secrets[0]), "wrong-password", 1),
        says: "check the URL's user name and password",
    });
    refusals.push(Refusal {
        what: "missing privilege (read-only role)",
        url: readonly,
        says: "grant the user the ACL permissions leasehold needs",
    });
    secrets.push(tls.key_body());
    let backend = ServerBackend::new(
        "redis",
        tls.url.clone(),
        host_port(&tls.url)?,
        |url| Box::pin(async move { Ok(Arc::new(RedisStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        |_| {
            Box::pin(async {
                Err(Error::Unsupported {
                    store: "redis",
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
