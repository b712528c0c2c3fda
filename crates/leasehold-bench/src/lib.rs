//! leasehold-bench: every measure of docs/benchmarks.md, for every backend, in one run.
//!
//! The binary (`cargo run --release -p leasehold-bench -- --help`) parses arguments into
//! [`Options`] and calls [`run`]; `tests/smoke.rs` runs the smoke mode on the in-memory store so
//! that `cargo test --workspace` keeps this code compiling and working.
#![forbid(unsafe_code)]

mod backends;
mod crash;
mod etcdctl;
mod floor;
mod group_scale;
mod groups;
mod measures;
mod plan;
mod report;
mod scale;
mod settle;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use crash::child_leader;
pub use groups::child_member;
pub use scale::child_scale;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Tiny counts, no target verdicts: checks that the code runs end to end.
    pub smoke: bool,
    /// Backends to measure (`memory sqlite postgres mysql redis etcd zookeeper dynamodb azure s3`); empty: all.
    pub backends: Vec<String>,
    /// Measures to run (see [`MEASURES`]); empty: all.
    pub only: Vec<String>,
    /// Start the local servers with `scripts/services up` first.
    pub start_services: bool,
    /// Write the report into this docs directory (`benchmarks.md`, `benchmarks-latency.svg`).
    pub docs_dir: Option<PathBuf>,
    /// The command line to print in the report.
    pub command: String,
    /// Run crash-failover leaders (killed with SIGKILL) and the scale measures in child processes
    /// of the current executable, which must then be the `leasehold-bench` binary. Without it,
    /// everything runs in this process and crash failover blackholes the leader's store.
    pub child_processes: bool,
    /// Samples per row of the settle measure; `None`: 100 (2 in a smoke run).
    pub settle_samples: Option<usize>,
}

/// Every backend the runner knows, in report order.
pub const ALL_BACKENDS: &[&str] = &[
    "memory",
    "sqlite",
    "postgres",
    "mysql",
    "redis",
    "etcd",
    "zookeeper",
    "dynamodb",
    "azure",
    "s3",
];

/// Every measure the runner knows (for `--only`).
pub const MEASURES: &[&str] = &[
    "latency",
    "handover",
    "planned",
    "failover",
    "observe",
    "expiry-floor",
    "transitions",
    "idle",
    "scale",
    "groups",
    "group-scale",
    "etcdctl",
    "election",
    "cli",
    "settle",
];

/// Runs every measure for every selected backend and returns the report as Markdown.
///
/// # Errors
///
/// Only for problems outside the measures (an unknown backend name, a report that cannot be
/// written); a measure that fails is reported in its table.
pub async fn run(options: &Options) -> Result<String, String> {
    let started = Instant::now();
    let selected: Vec<&'static str> = if options.backends.is_empty() {
        ALL_BACKENDS.to_vec()
    } else {
        let mut v = Vec::new();
        for b in &options.backends {
            match ALL_BACKENDS.iter().find(|k| **k == b.as_str()) {
                Some(k) => v.push(*k),
                None => return Err(format!("unknown backend {b:?}; known: {}", ALL_BACKENDS.join(" "))),
            }
        }
        v
    };
    if let Some(unknown) = options.only.iter().find(|m| !MEASURES.contains(&m.as_str())) {
        return Err(format!("unknown measure {unknown:?}; known: {}", MEASURES.join(" ")));
    }
    // Stopped again when the run ends, however it ends.
    let _started = if options.start_services {
        backends::start_services(&selected)
    } else {
        backends::Started::default()
    };
    let env = backends::ServiceEnv::load();
    let scratch = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let mut plan = plan::Plan::new(options.smoke, options.child_processes);
    plan.only = options.only.clone();
    let etcd_refs = ["etcdctl", "election", "cli"].iter().any(|m| plan.wants(m));
    // Built before any measure, so that a build does not run beside one.
    let cli = (selected.contains(&"etcd") && plan.wants("cli")).then(etcdctl::locate_or_build_cli);
    let mut reports = Vec::new();
    for name in &selected {
        eprintln!("== {name}");
        let backend = backends::Backend::open(name, &env, scratch.path(), options.smoke).await;
        let report = measures::measure_backend(&backend, &plan).await;
        reports.push(report);
    }
    let etcdctl = if selected.contains(&"etcd") && etcd_refs {
        match env.get("LEASEHOLD_ETCD_URL") {
            Some(url) => Some(etcdctl::measure(&url, &plan, cli.as_ref()).await),
            None => Some(etcdctl::EtcdctlReport::unavailable(
                "no LEASEHOLD_ETCD_URL (etcd is not running)",
            )),
        }
    } else {
        None
    };
    let settled = if plan.wants("settle") {
        let reps = options.settle_samples.unwrap_or(if options.smoke { 2 } else { 100 });
        Some(settle::measure(&env, &selected, reps, leasehold::random_u64() % 1_000_000).await)
    } else {
        None
    };
    let elapsed = started.elapsed();
    let settle_only = options.only.iter().all(|m| m == "settle") && !options.only.is_empty();
    let doc = report::render(&reports, etcdctl.as_ref(), options, elapsed);
    if !settle_only {
        println!("{doc}");
    }
    if let Some(section) = &settled {
        println!("{section}");
    }
    if let Some(dir) = &options.docs_dir {
        let writing = |e: std::io::Error| format!("writing {}: {e}", dir.display());
        if !settle_only {
            report::write_docs(dir, &doc, &reports).map_err(writing)?;
            eprintln!("wrote {}/benchmarks.md and benchmarks-latency.svg", dir.display());
        }
        if let Some(section) = &settled {
            report::write_section(dir, settle::HEADING, section).map_err(writing)?;
            eprintln!("wrote {}/benchmarks.md ({})", dir.display(), settle::HEADING);
        }
    }
    eprintln!("finished in {:.1} s", elapsed.as_secs_f64());
    Ok(doc)
}

/// p50 / p99 / count of a set of samples.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    pub(crate) n: usize,
}

impl Stats {
    pub(crate) fn of(samples: &[Duration]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort();
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Stats {
            p50: rank(0.5),
            p99: rank(0.99),
            max: v[v.len() - 1],
            n: v.len(),
        })
    }
}

/// Milliseconds with a sensible number of decimals.
pub(crate) fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 10.0 {
        format!("{v:.2} ms")
    } else if v < 100.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.0} ms")
    }
}
