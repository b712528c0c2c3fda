//! The shared conformance suite against the Redis test server, with expiry events and without.
//!
//! The backend: Redis (`scripts/services up redis`): every client is its own `RedisStore` (its own
//! connections), with a key prefix of its own; `redis` with expiry events (`expiry_events=enable`:
//! idle followers wait for notifications), `redis_polling` without (`expiry_events=off`, in the
//! next database).

use std::sync::Arc;

use leasehold_core::{Error, LeaseStore, Notifications};
use leasehold_redis::RedisStore;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

const PREFIX: &str = "leasehold-test:";

/// Redis with expiry events turned on (the server started by `scripts/services` may not send
/// them, and a restart forgets a `CONFIG SET`, so the store turns them on).
fn redis() -> Option<Arc<dyn Backend>> {
    backend("redis", 0, "enable")
}

/// Redis without expiry events: followers poll when the holder's `PTTL` runs out. In the next
/// database, so that its thousand held leases (keys with a TTL) cannot slow down the expiry
/// events of the other suite running at the same time: Redis finds expired keys by scanning a
/// database's keys with a TTL, about 200 per second.
fn redis_polling() -> Option<Arc<dyn Backend>> {
    backend("redis_polling", 1, "off")
}

fn backend(name: &'static str, db_offset: u32, expiry_events: &'static str) -> Option<Arc<dyn Backend>> {
    let expected = if expiry_events == "enable" {
        Notifications::ReleaseAndExpiry
    } else {
        Notifications::Release
    };
    let server = require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let upstream = host_port(&server)?;
    let mut parsed = url::Url::parse(&server).expect("LEASEHOLD_REDIS_URL is a URL");
    let db = parsed.path().trim_matches('/').parse::<u32>().unwrap_or(0) + db_offset;
    parsed.set_path(&format!("/{db}"));
    let base = parsed.to_string();
    let url = with_option(
        &with_option(&base, &format!("prefix={PREFIX}")),
        &format!("expiry_events={expiry_events}"),
    );
    let (raw, for_remove) = (base.clone(), base.clone());
    let backend = ServerBackend::new(
        name,
        url.clone(),
        upstream,
        move |url| {
            Box::pin(async move {
                let store = RedisStore::connect(&url).await?;
                // The gated scenarios must not pass as "not applicable" because the store stopped
                // claiming what this configuration promises.
                let notifications = store.capabilities().notifications;
                if notifications != expected {
                    return Err(Error::store(
                        "redis",
                        format!(
                            "expiry_events={expiry_events} must notify {expected:?}, the store claims {notifications:?}"
                        ),
                    ));
                }
                Ok(Arc::new(store) as Arc<dyn LeaseStore>)
            })
        },
        // A string where the lease record (a hash) belongs, as a foreign program using the same
        // key would write.
        move |lease| {
            let raw = raw.clone();
            Box::pin(async move {
                let fail = |e: ::redis::RedisError| Error::store("redis", e);
                let client = ::redis::Client::open(raw.as_str()).map_err(fail)?;
                let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
                // The layout of `RedisConfig::keys`.
                let key = format!("{PREFIX}lease:{{{lease}}}");
                ::redis::cmd("SET")
                    .arg(&key)
                    .arg("garbage")
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(fail)
            })
        },
    )
    // The garbage goes; the term counter stays.
    .remove_with(move |lease| {
        let raw = for_remove.clone();
        Box::pin(async move {
            let fail = |e: ::redis::RedisError| Error::store("redis", e);
            let client = ::redis::Client::open(raw.as_str()).map_err(fail)?;
            let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
            ::redis::cmd("DEL")
                .arg(format!("{PREFIX}lease:{{{lease}}}"))
                .query_async::<()>(&mut conn)
                .await
                .map_err(fail)
        })
    })
    // `scripts/services` serves it: the restart scenario stops and starts it.
    .restart_with("redis", 24379)
    .secret_urls(move |secret| {
        let mut with = url::Url::parse(&url).expect("a URL");
        // The default user of a server without `requirepass` accepts any password; a user
        // that does not exist is refused.
        with.set_username("default").expect("a URL with a host");
        with.set_password(Some(secret)).expect("a URL with a host");
        let accepted = with.to_string();
        let mut refused = with.clone();
        refused.set_username("leasehold-nobody").expect("a URL with a host");
        let mut closed = with.clone();
        closed.set_port(Some(1)).expect("a URL with a host");
        SecretUrls {
            malformed: vec![with_option(&accepted, "nonsense=1")],
            accepted: Some(accepted),
            refused: Some(refused.to_string()),
            closed: Some(closed.to_string()),
        }
    });
    Some(Arc::new(backend))
}

leasehold_conformance::suite!(redis, redis());
leasehold_conformance::suite!(redis_polling, redis_polling());
