//! `leasehold-bench`: latency, failover, store cost and scale of every backend, side by side.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use leasehold_bench::{ALL_BACKENDS, Options};

/// Benchmarks every leasehold backend on the local servers of `scripts/services` and writes
/// docs/benchmarks.md (section "Backends side by side") and docs/benchmarks-latency.svg.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Tiny counts and no target verdicts, to check that the benchmark runs (CI); writes no docs
    /// unless --docs-dir is given.
    #[arg(long)]
    smoke: bool,
    /// Backends to measure (default: all of memory sqlite postgres mysql redis etcd zookeeper dynamodb azure s3).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    backends: Vec<String>,
    /// Do not run `scripts/services up` first.
    #[arg(long)]
    no_services: bool,
    /// Where to write benchmarks.md and the chart (default: the repository's docs/ in a full run,
    /// nowhere in a smoke run).
    #[arg(long)]
    docs_dir: Option<PathBuf>,
    /// Print only, write no docs.
    #[arg(long)]
    no_write: bool,
    /// Run only these measures (any of: latency handover planned failover observe expiry-floor
    /// transitions idle scale groups group-scale etcdctl election cli), e.g. `--only observe --backends etcd`;
    /// writes no docs unless --docs-dir is given.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    only: Vec<String>,
    /// Samples per row of the settle measure (default 100).
    #[arg(long)]
    settle_samples: Option<usize>,
    /// Internal: run as the leader process of the crash-failover measure.
    #[arg(long, hide = true, requires_all = ["lease", "ttl_ms"])]
    child_leader: Option<String>,
    #[arg(long, hide = true)]
    lease: Option<String>,
    #[arg(long, hide = true)]
    ttl_ms: Option<u64>,
    /// Internal: run the scale measure in this process and print its result.
    #[arg(long, hide = true, requires_all = ["leases", "run", "ttl_ms"])]
    child_scale: Option<String>,
    #[arg(long, hide = true)]
    leases: Option<usize>,
    #[arg(long, hide = true)]
    run: Option<u64>,
    /// Internal: run one lease-group member (until stdin closes, or SIGKILL), printing its shards.
    #[arg(long, hide = true, requires_all = ["group", "id", "shards", "ttl_ms"])]
    child_member: Option<String>,
    #[arg(long, hide = true)]
    group: Option<String>,
    #[arg(long, hide = true)]
    id: Option<String>,
    #[arg(long, hide = true)]
    shards: Option<u32>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let (Some(url), Some(lease), Some(ttl)) = (&args.child_leader, &args.lease, args.ttl_ms) {
        return match leasehold_bench::child_leader(url, lease, Duration::from_millis(ttl)).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leader process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let (Some(url), Some(n), Some(run), Some(ttl)) = (&args.child_scale, args.leases, args.run, args.ttl_ms) {
        return match leasehold_bench::child_scale(url, run, n, Duration::from_millis(ttl), args.smoke).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("scale process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let (Some(url), Some(group), Some(id), Some(shards), Some(ttl)) =
        (&args.child_member, &args.group, &args.id, args.shards, args.ttl_ms)
    {
        return match leasehold_bench::child_member(url, group, shards, id, Duration::from_millis(ttl)).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("member process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut command = "cargo run --release -p leasehold-bench --".to_string();
    for arg in std::env::args().skip(1) {
        command.push(' ');
        command.push_str(&arg);
    }
    let partial = args.smoke || !args.only.is_empty();
    let docs_dir = match (&args.docs_dir, args.no_write, partial) {
        (_, true, _) => None,
        (Some(dir), false, _) => Some(dir.clone()),
        (None, false, false) => Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")),
        (None, false, true) => None,
    };
    let options = Options {
        smoke: args.smoke,
        backends: args.backends,
        only: args.only,
        start_services: !args.no_services,
        docs_dir,
        command,
        child_processes: true,
        settle_samples: args.settle_samples,
    };
    match leasehold_bench::run(&options).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e} (backends: {})", ALL_BACKENDS.join(" "));
            ExitCode::FAILURE
        }
    }
}
