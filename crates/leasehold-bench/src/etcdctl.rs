//! The reference: `etcdctl elect` on the same etcd, handover by SIGINT and failover by kill -9.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::Stats;
use crate::measures::{Outcome, Plan};

/// etcdctl 3.4's `elect` keeps its session lease for 60 s and has no flag to change it.
pub(crate) const ETCDCTL_SESSION_TTL: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(crate) struct EtcdctlReport {
    pub(crate) handover: Outcome<Stats>,
    pub(crate) failover: Outcome<Stats>,
}

impl EtcdctlReport {
    pub(crate) fn unavailable(why: &str) -> EtcdctlReport {
        EtcdctlReport {
            handover: Err(why.to_string()),
            failover: Err(why.to_string()),
        }
    }
}

struct Candidate {
    child: Child,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
}

impl Candidate {
    fn spawn(endpoints: &str, election: &str, proposal: &str) -> Outcome<Candidate> {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["elect", election, proposal])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("etcdctl: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Candidate { child, lines })
    }

    /// When it printed `proposal` (it prints the key, then the proposal, once elected).
    async fn elected(&mut self, proposal: &str, limit: Duration) -> Outcome<Instant> {
        let wait = async {
            while let Some((at, line)) = self.lines.recv().await {
                if line.trim() == proposal {
                    return Some(at);
                }
            }
            None
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| format!("etcdctl elect {proposal}: not elected within {limit:?}"))?
            .ok_or_else(|| format!("etcdctl elect {proposal} exited"))
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    async fn stop(mut self) {
        self.signal(Signal::SIGINT);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

pub(crate) async fn measure(etcd_url: &str, plan: &Plan) -> EtcdctlReport {
    let endpoints = etcd_url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|e| format!("http://{e}"))
        .collect::<Vec<_>>()
        .join(",");
    let run = leasehold::random_u64() % 1_000_000;
    let reps = if plan.smoke { 2 } else { 20 };
    eprintln!("== etcdctl elect (reference)");
    let handover = repeat(reps, |i| graceful(&endpoints, format!("bench-etcdctl-{run}-h{i}"))).await;
    let failover = if plan.smoke {
        Err("skipped in smoke mode (etcdctl's session TTL is 60 s)".into())
    } else {
        repeat(1, |i| crash(&endpoints, format!("bench-etcdctl-{run}-f{i}"))).await
    };
    EtcdctlReport { handover, failover }
}

async fn repeat<F, Fut>(reps: usize, mut f: F) -> Outcome<Stats>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Outcome<Duration>>,
{
    let mut samples = Vec::new();
    for i in 0..reps {
        samples.push(f(i).await?);
    }
    Stats::of(&samples).ok_or_else(|| "no samples".into())
}

/// Leader `A` gets SIGINT (etcdctl resigns and exits); time until `B` prints its proposal.
async fn graceful(endpoints: &str, election: String) -> Outcome<Duration> {
    let mut a = Candidate::spawn(endpoints, &election, "A")?;
    a.elected("A", Duration::from_secs(10)).await?;
    let mut b = Candidate::spawn(endpoints, &election, "B")?;
    // Let B connect and queue behind A.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGINT);
    let at = b.elected("B", Duration::from_secs(10)).await;
    a.stop().await;
    b.stop().await;
    Ok(at?.saturating_duration_since(t0))
}

/// Leader `A` gets SIGKILL; time until `B` prints its proposal (the session lease must expire).
async fn crash(endpoints: &str, election: String) -> Outcome<Duration> {
    let mut a = Candidate::spawn(endpoints, &election, "A")?;
    a.elected("A", Duration::from_secs(10)).await?;
    let mut b = Candidate::spawn(endpoints, &election, "B")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGKILL);
    let at = b.elected("B", ETCDCTL_SESSION_TTL * 2).await;
    a.stop().await;
    b.stop().await;
    Ok(at?.saturating_duration_since(t0))
}
