#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod changes;
mod config;
mod error;
mod record;
mod schema;
mod session;
mod shards;
mod sql;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_HISTORY_LIMIT, DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, PostgresConfig, URL_SCHEMES,
};
pub use record::{TTL_RANGE, lock_key};
pub use store::{PostgresStore, WriteSessionSetting};
