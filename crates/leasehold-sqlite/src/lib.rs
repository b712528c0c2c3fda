#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod changes;
mod config;
mod error;
mod record;
mod schema;
mod shards;
mod store;
mod writer;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_HISTORY_LIMIT, DEFAULT_POOL_SIZE, SqliteConfig, Synchronous, URL_SCHEMES,
};
pub use error::OpenError;
pub use record::TTL_RANGE;
pub use store::SqliteStore;
