//! Crash failover and what followers observe after a crash, the leader in this process or in a
//! child process.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Elector, Event, LeaseName, LeaseStore};
use leasehold_conformance::{Direction, Fault, Faults, FaultyStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{broadcast, mpsc};

use crate::Stats;
use crate::backends::Available;
use crate::plan::{Outcome, campaign, connect, elected, elector, elector_polling, lease, sees_holder, within};

/// Crash failover, from the leader's last confirmed renew (the instant its request was sent) to
/// the successor's Elected event; followers poll every `retry_every` where given.
pub(crate) async fn failover(
    av: &Available,
    run: u64,
    reps: usize,
    child_processes: bool,
    retry_every: Option<Duration>,
) -> Outcome<Stats> {
    let mut samples = Vec::new();
    for i in 0..reps {
        let lease = lease(run, "failover", i)?;
        let sample = match av.url().filter(|_| child_processes) {
            Some(url) => failover_process(av, url, &lease, retry_every).await?,
            None => failover_blackhole(av, &lease, retry_every).await?,
        };
        samples.push(sample);
    }
    Ok(Stats::of(&samples).expect("reps > 0"))
}

async fn follower(
    av: &Available,
    lease: &LeaseName,
    retry_every: Option<Duration>,
) -> Outcome<(broadcast::Receiver<Event>, tokio::task::JoinHandle<()>)> {
    let b = elector_polling(connect(av).await?, lease, "successor", av.ttl, retry_every)?;
    let mut events = b.events();
    let task = tokio::spawn(async move {
        if let Ok(leader) = b.campaign().await {
            leader.resign().await;
        }
    });
    let _ = tokio::time::timeout(av.ttl, sees_holder(&mut events)).await;
    Ok((events, task))
}

async fn failover_blackhole(av: &Available, lease: &LeaseName, retry_every: Option<Duration>) -> Outcome<Duration> {
    let ttl = av.ttl;
    let faults = Faults::new();
    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(connect(av).await?, faults.clone()));
    let a = elector(store, lease, "crashing", ttl)?;
    let believed = a.timing().believed_ttl();
    let la = campaign(&a, ttl * 5).await?;
    let (mut events, task) = follower(av, lease, retry_every).await?;
    // Crash right after a renewal, so no renewal is in flight.
    let before = la.valid_until();
    within(ttl, "a renewal", async {
        while la.valid_until() == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let last_renew = la.valid_until() - believed;
    faults.set(Direction::Both, Fault::Blackhole);
    let at = within(ttl * 3, "successor elected", elected(&mut events)).await?;
    faults.heal();
    drop(la);
    let _ = tokio::time::timeout(ttl, task).await;
    Ok(at
        .ok_or("the successor's events closed")?
        .saturating_duration_since(last_renew))
}

/// The leader process (`--child-leader`), once it printed `ELECTED`, and its stdout lines.
async fn leader_process(
    url: &str,
    lease: &LeaseName,
    ttl: Duration,
) -> Outcome<(tokio::process::Child, mpsc::UnboundedReceiver<(Instant, String)>)> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(exe)
        .args(["--child-leader", url, "--lease", lease.as_str(), "--ttl-ms"])
        .arg(ttl.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawning the leader process: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, mut lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    within(
        Duration::from_secs(30) + ttl * 5,
        "leader process elected",
        next_line(&mut lines, "ELECTED"),
    )
    .await?
    .ok_or("the leader process exited before being elected")?;
    Ok((child, lines))
}

async fn failover_process(
    av: &Available,
    url: &str,
    lease: &LeaseName,
    retry_every: Option<Duration>,
) -> Outcome<Duration> {
    let ttl = av.ttl;
    // A random pause first, so that samples do not keep one phase against the store's expiry
    // timers (each sample would otherwise start right after the last one's expiry, on a tick).
    tokio::time::sleep(Duration::from_millis(leasehold::random_u64() % 500)).await;
    let (mut child, mut lines) = leader_process(url, lease, ttl).await?;
    let (mut events, task) = follower(av, lease, retry_every).await?;
    let (seen, age) = within(ttl * 2, "leader process renewed", next_line(&mut lines, "RENEWED "))
        .await?
        .ok_or("the leader process exited")?;
    let age = Duration::from_micros(age.parse().map_err(|_| format!("bad RENEWED line: {age}"))?);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let last_renew = seen - age;
    child.start_kill().map_err(|e| format!("kill -9: {e}"))?;
    let _ = child.wait().await;
    let at = within(
        ttl * 3 + Duration::from_secs(5),
        "successor elected",
        elected(&mut events),
    )
    .await?;
    let _ = tokio::time::timeout(ttl, task).await;
    Ok(at
        .ok_or("the successor's events closed")?
        .saturating_duration_since(last_renew))
}

/// How long the third candidate may take to observe the new leader before the sample fails
/// (the issue measured 13.6 s on etcd and 18.1 s on ZooKeeper before).
const OBSERVE_LIMIT: Duration = Duration::from_secs(40);

/// `observe()` after a crash: leader L (a child process killed with SIGKILL, or a blackholed
/// store in process), N queued next and T third, each on its own client. From the Elected event
/// of whichever of them takes over (N on FIFO stores; either where an expiry wakes everyone) to
/// the `since` of the other's `observe()` value that shows it (when it first saw the new leader).
pub(crate) async fn observe_after_crash(
    av: &Available,
    run: u64,
    reps: usize,
    child_processes: bool,
) -> Outcome<Stats> {
    let ttl = av.ttl;
    let mut samples = Vec::new();
    for i in 0..reps {
        let lease = lease(run, "observe", i)?;
        let faults = Faults::new();
        let mut process = None;
        let mut in_process = None;
        match av.url().filter(|_| child_processes) {
            Some(url) => process = Some(leader_process(url, &lease, ttl).await?.0),
            None => {
                let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(connect(av).await?, faults.clone()));
                in_process = Some(campaign(&elector(store, &lease, "crashing", ttl)?, ttl * 5).await?);
            }
        }
        // Whoever takes over holds on (until the sample is taken), so that the other can see it
        // lead.
        let holding = |e: Elector| async move {
            if let Ok(leader) = e.campaign().await {
                std::future::pending::<()>().await;
                leader.resign().await;
            }
        };
        let n = elector(connect(av).await?, &lease, "next", ttl)?;
        let mut n_events = n.events();
        let n_task = tokio::spawn(holding(n.clone()));
        let _ = tokio::time::timeout(ttl, sees_holder(&mut n_events)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = elector(connect(av).await?, &lease, "third", ttl)?;
        let mut t_events = t.events();
        let t_task = tokio::spawn(holding(t.clone()));
        let _ = tokio::time::timeout(ttl, sees_holder(&mut t_events)).await;
        // Let N and T settle into waiting.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(mut child) = process.take() {
            child.start_kill().map_err(|e| format!("kill -9: {e}"))?;
            let _ = child.wait().await;
        } else {
            faults.set(Direction::Both, Fault::Blackhole);
        }
        let (winner, at, observer) = within(ttl * 3 + Duration::from_secs(5), "N or T elected", async {
            tokio::select! {
                Some(at) = elected(&mut n_events) => Ok((n.id().clone(), at, &t)),
                Some(at) = elected(&mut t_events) => Ok((t.id().clone(), at, &n)),
                else => Err("N's and T's events closed".to_string()),
            }
        })
        .await??;
        let mut seen = observer.observe();
        let what = format!("{} observing {winner}", observer.id());
        let seen = within(
            OBSERVE_LIMIT,
            &what,
            seen.wait_for(|v| v.as_ref().is_some_and(|info| info.holder == winner)),
        )
        .await?
        .map_err(|_| format!("{}'s observe() closed", observer.id()))?
        .as_ref()
        .map(|info| info.since)
        .ok_or("observe() shows nobody")?;
        samples.push(seen.saturating_duration_since(at));
        // Dropping a campaign's future (the task's) releases what it holds.
        n_task.abort();
        t_task.abort();
        faults.heal();
        drop(in_process);
    }
    Stats::of(&samples).ok_or_else(|| "no samples".into())
}

/// The next line of the leader process that starts with `prefix`: when it arrived, and the rest.
async fn next_line(lines: &mut mpsc::UnboundedReceiver<(Instant, String)>, prefix: &str) -> Option<(Instant, String)> {
    while let Some((at, line)) = lines.recv().await {
        if let Some(rest) = line.strip_prefix(prefix) {
            return Some((at, rest.trim().to_string()));
        }
    }
    None
}

/// The hidden `--child-leader` mode: campaign, print `ELECTED`, then `RENEWED <µs since the
/// renew request was sent>` after every renewal, until killed.
///
/// # Errors
///
/// When the store cannot be reached or the elector cannot be built.
pub async fn child_leader(url: &str, lease: &str, ttl: Duration) -> Result<(), String> {
    let store = leasehold::connect(url).await.map_err(|e| e.to_string())?;
    let e = Elector::builder(store, lease)
        .ttl(ttl)
        .candidate_id("crash-leader")
        .build()
        .map_err(|e| e.to_string())?;
    let believed = e.timing().believed_ttl();
    let leader = e.campaign().await.map_err(|e| e.to_string())?;
    println!("ELECTED");
    let mut last = leader.valid_until();
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = leader.valid_until();
        if now != last {
            last = now;
            let sent = now - believed;
            println!("RENEWED {}", Instant::now().saturating_duration_since(sent).as_micros());
        }
        if leader.is_cancelled() {
            println!("DEPOSED");
            return Ok(());
        }
    }
}
