#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acquire;
mod config;
mod error;
mod list;
mod record;
mod shards;
mod store;
mod table;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, DynamoDbConfig, StaticCredentials, URL_SCHEMES};
pub use error::TableError;
pub use record::TTL_RANGE;
pub use store::DynamoDbStore;

/// The SDK this crate is built on, for [`DynamoDbStore::from_client`].
pub use aws_sdk_dynamodb;
