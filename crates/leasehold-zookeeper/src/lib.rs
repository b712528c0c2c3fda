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
mod queue;
mod reads;
mod record;
mod release;
mod renew;
mod session;
mod shards;
mod state;
mod store;
mod turn;

#[doc = include_str!("../docs.md")]
pub mod docs {}

pub use config::{DEFAULT_CHROOT, URL_SCHEMES, ZookeeperConfig};
pub use record::HISTORY_LIMIT;
pub use store::ZookeeperStore;
