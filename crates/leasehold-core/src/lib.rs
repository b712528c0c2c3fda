#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod batch;
pub mod config;
mod elector;
mod error;
mod group;
mod handover;
mod ids;
pub mod machine;
mod memory;
mod record;
mod shard_record;
mod store;
mod telemetry;
pub mod time;
mod timing;
#[cfg(feature = "rustls")]
pub mod tls;
mod types;
mod wrap;

pub use batch::RenewBatcher;
pub use elector::{Elector, ElectorBuilder, Event, Health, Leader, LeaderInfo, RunError};
pub use error::{BoxError, Error, Result, innermost_message};
pub use group::{GroupMember, GroupStatus, LeaseGroup, LeaseGroupBuilder, MAX_SHARDS, ShardLeader, ShardStatus};
pub use handover::{Asked, HandOverError, HandOverRequest, HandedOver, PendingHandOver, TargetCheck};
pub use machine::DeposedReason;
pub use memory::MemoryStore;
pub use record::{HolderFields, RecordNumber, RecordVersion, TransitionFields};
pub use shard_record::{
    MAX_SHARD_VALUE_LEN, ShardColumn, ShardRecord, ShardWrite, check_shard_value, like_prefix, prefix_end,
};
pub use store::{Announcements, Change, Changes, LeaseStore, Operation, Turn, notifications, watched_announcements};
pub use timing::{PerMille, Timing};
pub use wrap::{Admitted, CountingStore, LimitStore, RequestCounts, RequestLimit};

/// The attribute macro that [`LeaseStore`] implementations need, re-exported so that a wrapper
/// store needs no `async-trait` dependency of its own (see [`LeaseStore`]'s example).
pub use async_trait::async_trait;
pub use types::{
    AcquireRequest, Acquired, Announces, CandidateId, Capabilities, EndReason, Expiry, Grant, HolderInfo, LeaseName,
    MAX_CANDIDATE_ID_LEN, MAX_LEASE_NAME_LEN, Notifications, Observation, Renewed, Term, Transition, random_u64,
};
