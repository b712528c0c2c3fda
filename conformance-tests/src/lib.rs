//! The shared conformance suite of leasehold: every backend runs the same scenarios, under a
//! safety checker, with faults injected in-process or through a TCP proxy.
//!
//! - [`Backend`]: what a backend's test file provides (independent clients, a faulty client,
//!   a way to corrupt a record); [`MemoryBackend`] for the in-memory store.
//! - [`Faults`], [`FaultyStore`], [`FaultProxy`]: pass, delay, blackhole or reset each
//!   direction of a client's traffic at runtime.
//! - [`SafetyChecker`]: records every candidate's believed leadership on one monotonic clock and
//!   fails on overlap, non-increasing terms or lost events.
//! - [`scenarios`]: one public async function per guarantee of the contract.
//! - [`conformance_tests!`]: one test per scenario, so a backend's test file is one line:
//!
//! ```
//! use leasehold_conformance::MemoryBackend;
//!
//! leasehold_conformance::conformance_tests!(memory, async { MemoryBackend::server_clock() });
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]

mod backend;
mod checker;
mod faults;
mod macros;
mod proxy;
pub mod scenarios;

pub use backend::{Backend, IntoBackend, MemoryBackend, require_server};
pub use checker::{Interval, Record, SafetyChecker};
pub use faults::{Direction, Fault, FaultState, Faults, FaultyStore, Op, RequestCounts};
pub use proxy::FaultProxy;

/// Re-exports for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
