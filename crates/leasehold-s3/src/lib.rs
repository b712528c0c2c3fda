#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod config;
mod error;
mod objects;
mod record;
mod shards;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, S3Config, StaticCredentials, URL_SCHEMES};
pub use error::ConnectError;
pub use record::{MAX_TERMS, TTL_RANGE};
pub use store::S3Store;

/// The SDK this crate is built on, for [`S3Store::from_client`].
pub use aws_sdk_s3;
