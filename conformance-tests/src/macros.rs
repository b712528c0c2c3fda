//! The macro that turns the scenarios into one test per scenario for a backend.

/// Expands to a module `$name` with one test per scenario of
/// [`scenarios`](crate::scenarios), so a failure reads `etcd::partitioned_leader_steps_down`.
///
/// The second argument is an async expression evaluated afresh in every test. It yields a
/// backend (any [`Backend`](crate::Backend), or an `Arc<dyn Backend>`) or an `Option` of one
/// (see [`IntoBackend`](crate::IntoBackend)); `None` means the backend's server is not
/// available: each test then returns early, after the loud skip message of
/// [`require_server`](crate::require_server). Items of the enclosing module are in scope.
///
/// Each test runs on a multi-threaded tokio runtime with two workers.
///
/// # Examples
///
/// ```
/// use leasehold_conformance::{MemoryBackend, require_server};
/// # use std::sync::Arc;
/// # use leasehold_conformance::Backend;
/// # #[derive(Debug)] struct RedisBackend;
/// # impl RedisBackend { fn new(_url: String) -> Self { RedisBackend } }
/// # #[async_trait::async_trait] impl Backend for RedisBackend {
/// #     fn name(&self) -> &'static str { "redis" }
/// #     async fn connect(&self) -> leasehold_core::Result<Arc<dyn leasehold_core::LeaseStore>> { unimplemented!() }
/// #     async fn corrupt(&self, _: &leasehold_core::LeaseName) -> leasehold_core::Result<()> { unimplemented!() }
/// # }
///
/// leasehold_conformance::conformance_tests!(memory, async { MemoryBackend::server_clock() });
///
/// // A networked backend skips (or fails under CI=true) when its server is down.
/// leasehold_conformance::conformance_tests!(redis, async {
///     require_server("redis", "LEASEHOLD_REDIS_URL").map(RedisBackend::new)
/// });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $backend:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::__private::tokio;

            $crate::__conformance_scenarios! {
                $backend;
                acquire_release_reacquire
                renew_keeps_lease
                race_has_one_winner
                crash_successor_after_valid_until
                graceful_release_fast_handover
                partitioned_leader_steps_down
                store_outage_no_leader_then_one
                slow_store_no_double_leadership
                lost_reply_resolved_by_read_back
                terms_increase_and_history
                corrupt_record_is_typed_error
                invalid_inputs
                thousand_leases
                stalled_task_steps_down
            }
        }
    };
}

/// One test per scenario (used by [`conformance_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenarios {
    ($backend:expr; $($scenario:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let Some(backend) = $crate::IntoBackend::into_backend($backend.await) else {
                eprintln!("SKIPPED: {}::{}", module_path!(), stringify!($scenario));
                return;
            };
            $crate::scenarios::$scenario(backend).await;
        }
    )*};
}
