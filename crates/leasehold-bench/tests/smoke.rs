//! Runs the benchmark's smoke mode on the in-memory store, so `cargo test --workspace` exercises
//! every measure and the report (CI does not run the benchmark binary).

use std::time::{Duration, Instant};

use leasehold_bench::Options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_mode_runs_end_to_end_on_the_memory_store() {
    let docs = tempfile::tempdir().unwrap();
    let options = Options {
        smoke: true,
        backends: vec!["memory".into()],
        start_services: false,
        docs_dir: Some(docs.path().to_path_buf()),
        command: "cargo test -p leasehold-bench --test smoke".into(),
        child_processes: false,
    };
    let started = Instant::now();
    let report = leasehold_bench::run(&options).await.expect("the smoke run completes");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "smoke run took {:?}",
        started.elapsed()
    );
    for table in [
        "### Acquire and renew latency",
        "### Graceful handover",
        "### Crash failover",
        "### Store requests per leadership transition",
        "### Store requests while idle",
        "### Many leases in one process",
    ] {
        assert!(report.contains(table), "missing {table}:\n{report}");
    }
    let memory_rows: Vec<&str> = report.lines().filter(|l| l.starts_with("| memory |")).collect();
    assert!(memory_rows.len() >= 6, "{report}");
    assert!(
        !memory_rows
            .iter()
            .any(|l| l.contains("nothing within") || l.contains("not available")),
        "every measure should produce numbers on the memory store:\n{report}"
    );
    let written = std::fs::read_to_string(docs.path().join("benchmarks.md")).unwrap();
    assert!(written.contains("## Backends side by side"));
    let svg = std::fs::read_to_string(docs.path().join("benchmarks-latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("memory"), "{svg}");
}
