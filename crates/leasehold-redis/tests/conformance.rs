//! The shared conformance suite against a real Redis server (`scripts/services up redis`).
//! Every client is its own `RedisStore` (its own connections), as separate processes would be;
//! faulty clients reach the server through a `FaultProxy`.

mod common;

use common::RedisBackend;

leasehold_conformance::conformance_tests!(redis, async {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    Some(RedisBackend::shared(&url))
});
