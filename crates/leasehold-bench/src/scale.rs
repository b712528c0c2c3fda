//! Many leases held by one process: campaign time, renewals on time, CPU and memory.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold::{Elector, Leader, LeaseStore};

use crate::backends::Available;
use crate::plan::{Outcome, campaign, elector, lease, within};

/// Many leases held by one process.
#[derive(Clone, Debug)]
pub(crate) struct Scale {
    pub(crate) campaign_time: Duration,
    pub(crate) window: Duration,
    pub(crate) on_time: usize,
    pub(crate) n: usize,
    pub(crate) cores: f64,
    pub(crate) rss_delta_mib: f64,
    pub(crate) rss_mib: f64,
}

/// Runs [`scale`] in a fresh process (`--child-scale`), so that its memory and CPU are its own.
pub(crate) async fn scale_in_child(av: &Available, run: u64, n: usize, smoke: bool) -> Outcome<Scale> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--child-scale", av.url().unwrap_or("memory")])
        .args(["--leases", &n.to_string(), "--run", &run.to_string()])
        .args(["--ttl-ms", &av.scale_ttl.as_millis().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if smoke {
        cmd.arg("--smoke");
    }
    let child = cmd.spawn().map_err(|e| format!("spawning the scale process: {e}"))?;
    let limit = Duration::from_secs(150) + av.scale_ttl * 3;
    let output = within(limit, "scale process", child.wait_with_output())
        .await?
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("SCALE ")) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(format!("scale process failed ({}): {last}", output.status));
    };
    let f: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    if f.len() != 7 {
        return Err(format!("bad SCALE line: {line}"));
    }
    Ok(Scale {
        campaign_time: Duration::from_secs_f64(f[0]),
        window: Duration::from_secs_f64(f[1]),
        on_time: f[2] as usize,
        n: f[3] as usize,
        cores: f[4],
        rss_delta_mib: f[5],
        rss_mib: f[6],
    })
}

/// The hidden `--child-scale` mode: runs the scale measure and prints one `SCALE` line.
///
/// # Errors
///
/// When the store cannot be reached or the measure fails.
pub async fn child_scale(url: &str, run: u64, n: usize, ttl: Duration, smoke: bool) -> Result<(), String> {
    let store: Arc<dyn LeaseStore> = if url == "memory" {
        Arc::new(leasehold::MemoryStore::new())
    } else {
        leasehold::connect(url).await.map_err(|e| e.to_string())?
    };
    let s = scale(store, run, n, ttl, smoke).await?;
    println!(
        "SCALE {} {} {} {} {} {} {}",
        s.campaign_time.as_secs_f64(),
        s.window.as_secs_f64(),
        s.on_time,
        s.n,
        s.cores,
        s.rss_delta_mib,
        s.rss_mib
    );
    Ok(())
}

/// `n` leases held by one process on one client for a window of `ttl` (smoke) or 2 x `ttl`.
pub(crate) async fn scale(
    store: Arc<dyn LeaseStore>,
    run: u64,
    n: usize,
    ttl: Duration,
    smoke: bool,
) -> Outcome<Scale> {
    let rss_before = rss_mib();
    let electors: Vec<Elector> = (0..n)
        .map(|i| elector(store.clone(), &lease(run, &format!("scale{n}"), i)?, "scale", ttl))
        .collect::<Outcome<_>>()?;
    let started = Instant::now();
    let limit = Duration::from_secs(if smoke { 20 } else { 60 });
    let results: Vec<Outcome<Leader>> = futures::stream::iter(electors.iter())
        .map(|e| campaign(e, limit))
        .buffer_unordered(256)
        .collect()
        .await;
    let campaign_time = started.elapsed();
    let mut leaders = Vec::new();
    let mut first_error = None;
    for r in results {
        match r {
            Ok(l) => leaders.push(l),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if leaders.len() < n {
        let elected = leaders.len();
        resign_all(leaders).await;
        return Err(format!(
            "only {elected} of {n} elected within {limit:?} (first error: {})",
            first_error.unwrap_or_default()
        ));
    }
    let window = if smoke { ttl } else { ttl * 2 };
    let mut late = vec![false; n];
    let cpu_before = cpu_seconds();
    let w0 = Instant::now();
    while w0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (i, l) in leaders.iter().enumerate() {
            if l.is_cancelled() || l.remaining() < ttl / 3 {
                late[i] = true;
            }
        }
    }
    let elapsed = w0.elapsed();
    let cpu = cpu_seconds() - cpu_before;
    let rss_after = rss_mib();
    resign_all(leaders).await;
    Ok(Scale {
        campaign_time,
        window: elapsed,
        on_time: late.iter().filter(|l| !**l).count(),
        n,
        cores: cpu / elapsed.as_secs_f64(),
        rss_delta_mib: rss_after - rss_before,
        rss_mib: rss_after,
    })
}

async fn resign_all(leaders: Vec<Leader>) {
    let all = futures::stream::iter(leaders)
        .map(|l| l.resign())
        .buffer_unordered(256)
        .collect::<Vec<()>>();
    let _ = tokio::time::timeout(Duration::from_secs(30), all).await;
}

/// VmRSS of this process, MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// User + system CPU time of this process (all threads), seconds; Linux clock ticks are 1/100 s.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
