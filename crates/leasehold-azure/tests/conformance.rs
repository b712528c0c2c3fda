//! The shared conformance suite against the Azurite emulator (`scripts/services up azurite`).
//!
//! Azure's minimum lease is 15 s, so the scenarios that wait for expiries take minutes each: they
//! run *concurrently*, as tasks of one test on one runtime, whatever `--test-threads` says, and
//! every failure is reported by its scenario's name (`azure::renew_keeps_lease: ...`). The whole
//! suite takes about 3.5 minutes, most of it `thousand_leases` holding 1,000 leases for 3 TTLs of
//! 60 s.
//!
//! Every client is its own `AzureBlobStore`, as separate processes would be; faulty clients reach
//! the emulator through a `FaultProxy`. A missing emulator skips loudly, or fails under `CI=true`.

mod common;

use std::time::{Duration, Instant};

use common::AzureBackend;
use futures::future::BoxFuture;
use leasehold_conformance::{Backend, scenarios};
use std::sync::Arc;

type Scenario = fn(Arc<dyn Backend>) -> BoxFuture<'static, ()>;

/// Every scenario of the suite, by name (the same list and order as `scenarios::SCENARIOS`).
fn all_scenarios() -> Vec<(&'static str, Scenario)> {
    macro_rules! list {
        ($($name:ident)*) => {
            vec![$((stringify!($name), (|b| Box::pin(scenarios::$name(b))) as Scenario)),*]
        };
    }
    list! {
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

#[test]
fn every_scenario_is_listed() {
    let names: Vec<&str> = all_scenarios().iter().map(|(name, _)| *name).collect();
    assert_eq!(names, scenarios::SCENARIOS, "the runner must run the whole suite");
}

/// All scenarios at once; a failure names its scenario and carries its panic message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn azure() {
    let Some(mut config) = common::azurite() else {
        eprintln!("SKIPPED: azure conformance suite (no Azurite)");
        return;
    };
    // A container of its own, deleted at the end: the suite writes some 2,500 blobs, and the
    // in-memory emulator scans every blob of the account on each request.
    config.container = format!("leasehold-conformance-{:x}", leasehold_core::random_u64());
    let backend = AzureBackend::shared(config.clone());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    // `LEASEHOLD_CONFORMANCE_ONLY=renew_keeps_lease,thousand_leases` runs just those.
    let only = std::env::var("LEASEHOLD_CONFORMANCE_ONLY").unwrap_or_default();
    let chosen: Vec<_> = all_scenarios()
        .into_iter()
        .filter(|(name, _)| only.is_empty() || only.split(',').any(|o| o.trim() == *name))
        .collect();
    let total = chosen.len();
    for (name, scenario) in chosen {
        let backend = backend.clone();
        tasks.spawn(async move {
            let began = Instant::now();
            let outcome = tokio::spawn(scenario(backend)).await;
            (name, began.elapsed(), outcome)
        });
    }
    let mut failures = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (name, took, outcome) = joined.expect("the scenario wrappers do not panic");
        match outcome {
            Ok(()) => eprintln!("azure::{name} ... ok ({:.1}s)", took.as_secs_f64()),
            Err(e) => {
                let why = match e.try_into_panic() {
                    Ok(panic) => panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                        .unwrap_or_else(|| "a panic without a message".to_string()),
                    Err(e) => e.to_string(),
                };
                eprintln!("azure::{name} ... FAILED ({:.1}s)", took.as_secs_f64());
                failures.push(format!("azure::{name}: {why}"));
            }
        }
    }
    let (many, others) = common::renew_stats();
    eprintln!(
        "azure conformance: {} of {total} scenarios passed in {:.1}s; thousand_leases: {many}; \
         every other lease: {others}",
        total - failures.len(),
        started.elapsed().as_secs_f64(),
    );
    // Bounded: an emulator that stopped answering must not keep the failures from being reported.
    match tokio::time::timeout(Duration::from_secs(30), common::delete_container(&config)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("cannot delete the suite's container {}: {e}", config.container),
        Err(_) => eprintln!(
            "cannot delete the suite's container {}: no answer in 30 s",
            config.container
        ),
    }
    assert!(
        failures.is_empty(),
        "{} of {total} azure conformance scenarios failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
