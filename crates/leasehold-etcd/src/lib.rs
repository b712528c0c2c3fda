#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acquire;
mod announce;
mod candidates;
mod changes;
mod config;
mod error;
mod list;
mod record;
mod release;
mod session;
mod shards;
mod state;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, EtcdConfig, URL_SCHEMES};
pub use record::TTL_RANGE;
pub use store::EtcdStore;
