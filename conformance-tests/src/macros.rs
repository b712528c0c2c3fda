//! [`suite!`]: the whole suite as tests of a backend, one line per backend.

/// Expands to a module `$name` with one `#[test]` per scenario of
/// [`scenarios`](crate::scenarios), so a failure reads `etcd::partitioned_leader_steps_down`.
///
/// - `suite!(memory)` runs against [`backends::memory()`](crate::backends) (the in-memory
///   backends; a store's own factory is in its tests: `suite!(postgres, postgres())`);
/// - `suite!(name, expr)` runs against `expr`: any [`Backend`](crate::Backend), an
///   `Arc<dyn Backend>`, or an `Option` of one where `None` means the server is not available
///   (each test then skips, after the loud message of [`require_server`](crate::require_server));
///   items of the enclosing module are in scope;
/// - `suite!(name, expr, concurrent)` (or `suite!(memory, concurrent)`) runs every scenario at once
///   on one runtime, whatever `--test-threads` says (see [`Concurrent`](crate::Concurrent)): for
///   stores whose minimum TTL makes each scenario take minutes. Each test still reports its own
///   scenario, and test-name filters choose which scenarios run.
///
/// Sequential tests each get a multi-threaded tokio runtime with two workers.
///
/// # Examples
///
/// ```
/// leasehold_conformance::suite!(memory);
/// leasehold_conformance::suite!(observed, leasehold_conformance::MemoryBackend::observed_expiry());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! suite {
    ($name:ident $(,)?) => {
        $crate::suite!($name, $crate::backends::$name());
    };
    ($name:ident, concurrent $(,)?) => {
        $crate::suite!($name, $crate::backends::$name(), concurrent);
    };
    ($name:ident, $backend:expr, concurrent $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            static RUN: $crate::Concurrent = $crate::Concurrent::new(stringify!($name));

            fn backend() -> ::std::option::Option<::std::sync::Arc<dyn $crate::Backend>> {
                $crate::IntoBackend::into_backend($backend)
            }

            $crate::__every_scenario!(__concurrent_tests {});
        }
    };
    ($name:ident, $backend:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::__private::tokio;

            fn backend() -> ::std::option::Option<::std::sync::Arc<dyn $crate::Backend>> {
                $crate::IntoBackend::into_backend($backend)
            }

            $crate::__every_scenario!(__sequential_tests {});
        }
    };
}

/// One test per scenario, each on its own runtime (used by [`suite!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __sequential_tests {
    (; $($scenario:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let Some(backend) = backend() else {
                eprintln!("SKIPPED: {}::{}", module_path!(), stringify!($scenario));
                return;
            };
            $crate::scenarios::$scenario(backend).await;
        }
    )*};
}

/// One test per scenario, all run at once by `RUN` (used by [`suite!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __concurrent_tests {
    (; $($scenario:ident)*) => {$(
        #[test]
        fn $scenario() {
            RUN.scenario(stringify!($scenario), backend);
        }
    )*};
}
