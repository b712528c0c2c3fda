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
        only: Vec::new(),
        start_services: false,
        docs_dir: Some(docs.path().to_path_buf()),
        command: "cargo test -p leasehold-bench --test smoke".into(),
        child_processes: false,
        settle_samples: None,
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
        "### Planned handover to a named successor",
        "### Lease groups: 3 members, 16 shards",
        "### Lease groups: store requests per member",
        "### Store expiry floor",
        "### `observe()` after a crash, a follower not next in line",
        "### Issue 17 targets",
    ] {
        assert!(report.contains(table), "missing {table}:\n{report}");
    }
    let memory_rows: Vec<&str> = report.lines().filter(|l| l.starts_with("| memory |")).collect();
    assert!(memory_rows.len() >= 6, "{report}");
    assert!(
        !memory_rows.iter().any(|l| [
            "nothing within",
            "not within",
            "not available",
            "skipped",
            "unsupported",
            "failed"
        ]
        .iter()
        .any(|bad| l.contains(bad))),
        "every measure should produce numbers on the memory store:\n{report}"
    );
    // The memory store reserves leases for a named successor, and a stable group moves nothing.
    let section = |heading: &str| {
        let start = report.find(heading).unwrap_or_else(|| panic!("no {heading}"));
        let rest = &report[start..];
        let end = rest[heading.len()..]
            .find("\n### ")
            .map_or(rest.len(), |i| i + heading.len());
        rest[..end].to_string()
    };
    let planned = section("### Planned handover");
    let row = planned
        .lines()
        .find(|l| l.starts_with("| memory |"))
        .expect("a memory row");
    assert!(row.contains(" ms |"), "{row}");
    let groups = section("### Lease groups: 3 members");
    let row = groups
        .lines()
        .find(|l| l.starts_with("| memory |"))
        .expect("a memory row");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells[7], "8/8", "c's 5 or 6 shards spread over a and b: {row}");
    assert_eq!(cells[10], "6/5/5", "balanced after d joined: {row}");
    assert!(cells[11].starts_with("0 in "), "moves while stable: {row}");
    assert_eq!(cells[12], "0", "overlaps: {row}");
    let cost = section("### Lease groups: store requests per member");
    let row = cost
        .lines()
        .find(|l| l.starts_with("| memory |"))
        .expect("a memory row");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells[3], "16", "shards: {row}");
    let rate = |i: usize, what: &str| -> f64 { cells[i].parse().unwrap_or_else(|_| panic!("{what}: {row}")) };
    assert!(
        rate(5, "renew /s") > 0.0,
        "the member lease was renewed in the window: {row}"
    );
    assert_eq!(
        (rate(7, "shard_records /s"), rate(8, "write_shard /s")),
        (0.0, 0.0),
        "no shard record read or written while nothing changed: {row}"
    );
    // The third candidate saw the new leader (the memory store notifies releases and expiry).
    let observe = section("### `observe()` after a crash");
    let row = observe
        .lines()
        .find(|l| l.starts_with("| memory |"))
        .expect("a memory row");
    assert!(row.contains(" ms |"), "{row}");
    // One row per row of the table, each with a verdict.
    let targets = section("### Issue 17 targets");
    let rows: Vec<&str> = targets
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| measure"))
        .collect();
    assert_eq!(rows.len(), 10, "{targets}");
    assert!(rows.iter().all(|r| r.trim_end().ends_with('|')), "{targets}");
    let written = std::fs::read_to_string(docs.path().join("benchmarks.md")).unwrap();
    assert!(written.contains("## Backends side by side"));
    let svg = std::fs::read_to_string(docs.path().join("benchmarks-latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("memory"), "{svg}");
}
