//! The shared conformance suite against a real Redis server (`scripts/services up redis`), twice:
//! `redis` with expiry events (`expiry_events=enable`: followers wait for notifications and make
//! no requests while idle) and `redis_polling` without them (`expiry_events=off`: followers poll
//! when the holder's `PTTL` runs out; in the next database). Every client is its own
//! `RedisStore` (its own connections), as separate processes would be; faulty clients reach the
//! server through a `FaultProxy`.

mod common;

use std::sync::Arc;

use common::RedisBackend;
use leasehold_conformance::Backend;
use leasehold_redis::ExpiryEvents;

fn backend(expiry_events: ExpiryEvents) -> Option<Arc<dyn Backend>> {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.expiry_events = expiry_events;
    if expiry_events == ExpiryEvents::Off {
        // Another database, so that its thousand held leases (keys with a TTL) cannot slow down
        // the expiry events of the other module's scenarios running at the same time: Redis
        // finds expired keys by scanning a database's keys with a TTL, about 200 per second.
        config.db += 1;
    }
    Some(Arc::new(RedisBackend::with_config(config)))
}

leasehold_conformance::conformance_tests!(redis, async { backend(ExpiryEvents::Enable) });

leasehold_conformance::conformance_tests!(redis_polling, async { backend(ExpiryEvents::Off) });
