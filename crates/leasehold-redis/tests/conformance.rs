//! The shared conformance suite against the Redis test server, with expiry events and without
//! (`leasehold_conformance::backends::{redis, redis_polling}`).
leasehold_conformance::suite!(redis);
leasehold_conformance::suite!(redis_polling);
