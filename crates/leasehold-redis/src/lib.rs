#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod candidates;
mod changes;
mod config;
mod conn;
mod error;
mod expiry;
mod record;
mod scripts;
mod shards;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{
    DEFAULT_HISTORY_LIMIT, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, ExpiryEvents, LeaseKeys, RedisConfig,
    URL_SCHEMES,
};
pub use error::RedisStoreError;
pub use record::TTL_RANGE;
pub use store::{RENEW_BATCH, RedisStore};
