#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod claim;
mod config;
mod error;
mod history;
mod list;
mod record;
mod sas;
mod shards;
mod store;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{
    Auth, AzureConfig, DEFAULT_HISTORY_LIMIT, DEFAULT_MAX_RENEWALS, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT, TTL_RANGE,
    URL_SCHEMES,
};
pub use error::AzureError;
pub use sas::account_sas;
pub use store::AzureBlobStore;
