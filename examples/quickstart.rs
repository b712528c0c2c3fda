//! The first thing to run: `cargo run --example quickstart`.
//!
//! Three worker processes elect a leader over one SQLite file in a temp dir. The leader runs a
//! coordinator task that does fenced work: it appends its term to a ledger that rejects stale
//! terms, checking and writing in one locked step. The example then
//!
//! 1. kills the leader with SIGKILL and shows a successor taking over within the TTL (plus one
//!    poll) with a higher term, and
//! 2. asks the new leader to resign and shows the graceful hand-over to the last worker,
//!
//! prints a timeline, cleans up, and exits 0 only if all of that happened.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold::{Elector, Event, Leader};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const TTL: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2], Path::new(&args[3]), &args[4]).await;
    }
    coordinator().await
}

/// One candidate: campaigns, and while leader appends fenced entries to the ledger.
async fn worker(url: &str, ledger: &Path, id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = leasehold::connect(url).await?;
    let elector = Elector::builder(store, "quickstart")
        .ttl(TTL)
        .candidate_id(id)
        .build()?;
    let mut events = elector.events();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            match event {
                Event::Elected { term, .. } => println!("elected {term}"),
                Event::Deposed { term, reason, .. } => println!("deposed {term} {reason}"),
                _ => {}
            }
        }
    });
    // The coordinator writes "resign" on our stdin to ask for a graceful hand-over.
    let (resign_tx, resign_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim() == "resign" {
                let _ = resign_tx.send(true);
            }
        }
    });
    let ledger = ledger.to_path_buf();
    elector
        .run(move |leader: Leader| {
            let ledger = ledger.clone();
            let mut resign = resign_rx.clone();
            async move {
                loop {
                    if *resign.borrow_and_update() {
                        return Ok(()); // returning while leader releases the lease
                    }
                    leader.ensure_valid(Duration::from_millis(300))?;
                    append_fenced(&ledger, leader.term().0, leader.holder().as_str())?;
                    leader.heartbeat();
                    tokio::select! {
                        () = leader.cancelled() => return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()),
                        _ = resign.changed() => {}
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        })
        .await
        .map_err(|e| e.to_string())?;
    println!("resigned");
    Ok(())
}

/// The downstream system: accepts an entry only if its term is not older than the newest seen.
///
/// The check and the write are one step of the ledger (the file is locked exclusively while it
/// reads the newest term and appends), as a fenced write must be: a check in one request and
/// the write in another would let a deposed leader's write through between the two (see
/// docs/fencing.md; a database does it with one statement or transaction, as
/// `leasehold_fence::postgres::check_and_advance` does).
fn append_fenced(ledger: &Path, term: u64, holder: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(ledger)?;
    file.lock()?; // until the file is closed: no other writer between the check and the write
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let newest = text
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    if term < newest {
        return Err(std::io::Error::other(format!("stale term {term} < {newest}: rejected")));
    }
    writeln!(file, "{term} {holder}")
}

struct Worker {
    id: String,
    child: Child,
}

/// What a worker printed, with when the coordinator saw it.
struct Line {
    at: Instant,
    id: String,
    text: String,
}

async fn coordinator() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    let ledger = dir.path().join("ledger.txt");
    let start = Instant::now();
    let mut timeline: Vec<String> = Vec::new();
    let mut note = |at: Instant, what: String| {
        let line = format!("{:>7.3}s  {what}", (at - start).as_secs_f64());
        println!("{line}");
        timeline.push(line);
    };
    note(
        start,
        format!("3 workers campaign for lease `quickstart` on {url} (ttl {TTL:?})"),
    );

    let (tx, mut rx) = mpsc::unbounded_channel::<Line>();
    let mut workers = Vec::new();
    for id in ["alpha", "bravo", "charlie"] {
        workers.push(spawn_worker(&url, &ledger, id, tx.clone())?);
    }

    let (first, term1, _) = wait_elected(&mut rx, 0, &mut note).await?;
    tokio::time::sleep(Duration::from_millis(700)).await; // let it do some fenced work
    let victim = workers.iter_mut().find(|w| w.id == first).ok_or("no such worker")?;
    victim.child.kill().await?; // SIGKILL: no release, no goodbye
    let killed_at = Instant::now();
    note(killed_at, format!("SIGKILL {first} (leader, term {term1})"));

    let (second, term2, elected_at) = wait_elected(&mut rx, term1.0, &mut note).await?;
    let failover = elected_at - killed_at;
    note(
        elected_at,
        format!("{second} took over after {failover:.2?} with term {term2} > {term1}"),
    );

    tokio::time::sleep(Duration::from_millis(700)).await;
    let leader = workers.iter_mut().find(|w| w.id == second).ok_or("no such worker")?;
    let stdin = leader.child.stdin.as_mut().ok_or("no stdin")?;
    tokio::io::AsyncWriteExt::write_all(stdin, b"resign\n").await?;
    let resign_at = Instant::now();
    note(resign_at, format!("asked {second} to resign"));
    let (third, term3, elected_at) = wait_elected(&mut rx, term2.0, &mut note).await?;
    let handover = elected_at - resign_at;
    note(
        elected_at,
        format!("{third} took over after {handover:.2?} with term {term3} > {term2}"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    for w in &mut workers {
        let _ = w.child.kill().await;
    }
    let ledger_text = std::fs::read_to_string(&ledger)?;
    let terms: Vec<u64> = ledger_text
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    let ordered = terms.windows(2).all(|w| w[0] <= w[1]);
    let distinct: std::collections::BTreeSet<u64> = terms.iter().copied().collect();
    println!(
        "\nledger: {} fenced entries, terms {:?}, never decreasing: {ordered}",
        terms.len(),
        distinct
    );

    let failover_ok = failover <= TTL * 2;
    let handover_ok = handover <= TTL;
    println!(
        "SIGKILL failover {failover:.2?} (limit {:?}): {}",
        TTL * 2,
        verdict(failover_ok)
    );
    println!(
        "graceful hand-over {handover:.2?} (limit {TTL:?}): {}",
        verdict(handover_ok)
    );
    let all_ok = failover_ok && handover_ok && ordered && distinct.len() >= 3 && term1 < term2 && term2 < term3;
    if !all_ok {
        return Err("quickstart did not show what it should (see above)".into());
    }
    println!("quickstart OK");
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "TOO SLOW" }
}

fn spawn_worker(url: &str, ledger: &Path, id: &str, tx: mpsc::UnboundedSender<Line>) -> std::io::Result<Worker> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["worker", url, &ledger.display().to_string(), id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let worker_id = id.to_string();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(text)) = lines.next_line().await {
            let _ = tx.send(Line {
                at: Instant::now(),
                id: worker_id.clone(),
                text,
            });
        }
    });
    Ok(Worker {
        id: id.to_string(),
        child,
    })
}

/// Waits (at most 4 TTLs) until some worker reports being elected with a term above `above`.
async fn wait_elected(
    rx: &mut mpsc::UnboundedReceiver<Line>,
    above: u64,
    note: &mut impl FnMut(Instant, String),
) -> Result<(String, leasehold::Term, Instant), Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + TTL * 4;
    loop {
        let line = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| "no leader elected in time")?;
        let line = line.ok_or("all workers exited")?;
        note(line.at, format!("{}: {}", line.id, line.text));
        if let Some(term) = line.text.strip_prefix("elected ").and_then(|t| t.parse::<u64>().ok())
            && term > above
        {
            return Ok((line.id, leasehold::Term(term), line.at));
        }
    }
}
