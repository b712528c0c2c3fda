//! Many leases held by one process on one `EtcdStore`: the resident memory and CPU they cost.
//!
//! The same measure as the benchmark's "many leases in one process" (one elector per lease,
//! campaigns 256 at a time, held for two TTLs, a lease on time when its remaining validity never
//! fell below TTL/3), in a process of its own, with the memory after each phase:
//!
//! ```sh
//! eval "$(scripts/services env | sed 's/^/export /')"
//! cargo run --release -p leasehold-etcd --example many_leases -- 10000 5
//! ```
//!
//! Arguments: the number of leases (default 10,000) and the TTL in seconds (default 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_core::{Elector, Leader, LeaseStore, MemoryStore};
use leasehold_etcd::EtcdStore;

/// VmRSS of this process, MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// User + system CPU time of this process, seconds (Linux clock ticks are 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let ttl = Duration::from_secs(args.next().map_or(Ok(5), |a| a.parse())?);
    let url = std::env::var("LEASEHOLD_ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".into());
    let run = leasehold_core::random_u64() % 1_000_000;
    let start = rss_mib();
    // `LEASEHOLD_ETCD_URL=memory` measures the engine alone, on core's in-memory store.
    let store: Arc<dyn LeaseStore> = if url == "memory" {
        Arc::new(MemoryStore::new())
    } else {
        Arc::new(EtcdStore::connect(&url).await?)
    };
    println!("connected: RSS {:.1} MiB (process start {start:.1} MiB)", rss_mib());
    let electors = (0..n)
        .map(|i| {
            Elector::builder(store.clone(), format!("many-{run}-{i}"))
                .ttl(ttl)
                .candidate_id("many")
                .build()
        })
        .collect::<Result<Vec<Elector>, _>>()?;
    let built = rss_mib();
    println!("{n} electors built: RSS {built:.1} MiB");
    let began = Instant::now();
    let leaders: Vec<Leader> = futures::stream::iter(electors.iter())
        .map(|e| async move { tokio::time::timeout(Duration::from_secs(60), e.campaign()).await })
        .buffer_unordered(256)
        .filter_map(|r| async move { r.ok().and_then(Result::ok) })
        .collect()
        .await;
    println!(
        "{} of {n} elected in {:.1} s: RSS {:.1} MiB",
        leaders.len(),
        began.elapsed().as_secs_f64(),
        rss_mib()
    );
    let window = ttl * 2;
    let mut late = vec![false; leaders.len()];
    let cpu0 = cpu_seconds();
    let w0 = Instant::now();
    while w0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (i, l) in leaders.iter().enumerate() {
            if l.is_cancelled() || l.remaining() < ttl / 3 {
                late[i] = true;
            }
        }
    }
    let cores = (cpu_seconds() - cpu0) / w0.elapsed().as_secs_f64();
    let held = rss_mib();
    println!(
        "held {:.1} s: {} / {n} renewed on time, {cores:.2} cores, RSS {held:.1} MiB ({:.0} bytes per lease above the built electors)",
        w0.elapsed().as_secs_f64(),
        late.iter().filter(|l| !**l).count(),
        (held - built) * 1024.0 * 1024.0 / n as f64,
    );
    let all = futures::stream::iter(leaders).map(|l| l.resign()).buffer_unordered(256);
    let _ = tokio::time::timeout(Duration::from_secs(30), all.collect::<Vec<()>>()).await;
    Ok(())
}
