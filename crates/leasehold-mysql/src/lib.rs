#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod config;
mod error;
mod record;
mod schema;
mod session;
mod shards;
mod statements;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_HISTORY_LIMIT, DEFAULT_POOL_SIZE, MysqlConfig, URL_SCHEMES};
pub use record::TTL_RANGE;
pub use store::MysqlStore;
