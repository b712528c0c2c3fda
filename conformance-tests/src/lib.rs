//! The shared conformance suite of leasehold: every backend runs the same scenarios, under a
//! safety checker, with faults injected in-process or through a TCP proxy.
//!
//! - [`suite!`]: one test per scenario, so a backend's `tests/conformance.rs` is one line:
//!   `leasehold_conformance::suite!(postgres, postgres());` with the store's own factory of
//!   [`Backend`]s beside it, or `suite!(azure, azure(), concurrent)` to run every scenario at once.
//! - [`scenarios`]: one public async function per guarantee of the contract, grouped by theme;
//!   scenarios of guarantees a store does not claim (its `Capabilities`) pass with a note.
//! - [`Backend`]: independent clients, a faulty client, a way to corrupt a record;
//!   [`ServerBackend`] is the one backend of every networked store (clients by URL, faulty
//!   clients through a [`FaultProxy`]); [`MemoryBackend`] for the in-memory store.
//! - [`Faults`], [`FaultyStore`], [`FaultProxy`]: pass, delay, blackhole or reset each
//!   direction of a client's traffic at runtime.
//! - [`SafetyChecker`]: records every candidate's believed leadership on one monotonic clock and
//!   fails on overlap, non-increasing terms or lost events.
//!
//! ```
//! leasehold_conformance::suite!(memory);
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]

mod backend;
pub mod backends;
mod checker;
mod faults;
mod faulty;
mod macros;
mod member;
mod proxy;
mod restart;
mod runner;
pub mod scenarios;
pub mod secured;
mod server;

pub use backend::{
    Backend, IntoBackend, MemoryBackend, SecretUrls, configured_url, host_port, require_server, with_option,
};
pub use checker::{Interval, Record, SafetyChecker};
pub use faults::{Direction, Fault, FaultState, Faults, RequestCounts};
pub use faulty::FaultyStore;
pub use member::SoleMember;
pub use proxy::FaultProxy;
pub use runner::Concurrent;
pub use server::{ConnectFn, CorruptFn, FinishFn, RemoveFn, SecretUrlsFn, ServerBackend};

/// Acquires `lease` for `candidate` on `store`, which must grant it: for a backend's own tests.
///
/// # Panics
///
/// When the store answers anything but a grant.
pub async fn must_grant(
    store: &dyn leasehold_core::LeaseStore,
    lease: &str,
    candidate: &str,
    ttl: std::time::Duration,
) -> leasehold_core::Grant {
    let request = leasehold_core::AcquireRequest {
        lease: lease.parse().unwrap_or_else(|e| panic!("{lease}: {e}")),
        candidate: leasehold_core::CandidateId::new(candidate).unwrap_or_else(|e| panic!("{candidate}: {e}")),
        ttl,
        takeover: None,
    };
    match store.acquire(&request).await {
        Ok(leasehold_core::Acquired::Granted(grant)) => grant,
        other => panic!("{candidate} must be granted {lease}: {other:?}"),
    }
}

/// Re-exports for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
