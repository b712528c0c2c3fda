//! The shared conformance suite against a real Redis server (`scripts/services up redis`), twice:
//! `redis` with expiry events (`expiry_events=enable`: followers wait for notifications and make
//! no requests while idle) and `redis_polling` without them (`expiry_events=off`: followers poll
//! when the holder's `PTTL` runs out). Every client is its own `RedisStore` (its own
//! connections), as separate processes would be; faulty clients reach the server through a
//! `FaultProxy`.

mod common;

use std::sync::Arc;

use common::RedisBackend;
use leasehold_conformance::Backend;
use leasehold_redis::ExpiryEvents;

fn backend(expiry_events: ExpiryEvents) -> Option<Arc<dyn Backend>> {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.expiry_events = expiry_events;
    Some(Arc::new(RedisBackend::with_config(config)))
}

leasehold_conformance::conformance_tests!(redis, async { backend(ExpiryEvents::Enable) });

leasehold_conformance::conformance_tests!(redis_polling, async { backend(ExpiryEvents::Off) });
