//! The factory of each backend's test server, one feature each: how to reach it, how to vandalise
//! a record, which URLs carry secrets. A backend's `tests/conformance.rs` names it in
//! [`suite!`](crate::suite): `leasehold_conformance::suite!(postgres);` runs every scenario
//! against `backends::postgres()`.
//!
//! Each factory returns `None` (after the loud message of [`require_server`](crate::require_server),
//! a failure under `CI=true`) when its server is not running.

#[cfg(feature = "azure")]
mod azure;
#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "s3")]
mod s3;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "zookeeper")]
mod zookeeper;

#[cfg(feature = "azure")]
pub use azure::azure;
#[cfg(feature = "dynamodb")]
pub use dynamodb::dynamodb;
#[cfg(feature = "etcd")]
pub use etcd::etcd;
#[cfg(feature = "mysql")]
pub use mysql::mysql;
#[cfg(feature = "postgres")]
pub use postgres::postgres;
#[cfg(feature = "redis")]
pub use redis::{redis, redis_polling};
#[cfg(feature = "s3")]
pub use s3::s3;
#[cfg(feature = "sqlite")]
pub use sqlite::sqlite;
#[cfg(feature = "zookeeper")]
pub use zookeeper::zookeeper;

pub use crate::backend::{MemoryBackend, memory, memory_observed};

/// `url` with `option` (`key=value`) appended to its query.
#[allow(dead_code)]
pub(crate) fn with_option(url: &str, option: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{option}")
}
