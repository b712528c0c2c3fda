//! Three processes elect a leader through one SQLite file; the leader is SIGKILLed (twice) and a
//! successor with a higher term takes over within `ttl + retry_every + slack`.
//!
//! The test binary re-executes itself: with `LEASEHOLD_SQLITE_WORKER` set, the `worker` test is a
//! candidate process; without it, `worker` returns at once. Each worker runs an
//! [`Elector`] and, while it leads, appends `term holder` to a ledger file, fenced: only when
//! `ensure_valid` passes and its term is at least the ledger's last term. A fenced append that
//! finds a higher term would mean two processes believed they led at once; it is recorded in a
//! second file, which must stay empty.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{Elector, Leader};
use leasehold_sqlite::SqliteStore;

const WORKER_ENV: &str = "LEASEHOLD_SQLITE_WORKER";
const TTL: Duration = Duration::from_secs(1);
/// `Timing::new(TTL).retry_every` plus its 20 % jitter.
const RETRY: Duration = Duration::from_millis(240);
/// Process scheduling on a busy 2-core machine, the worker's first append, the polling here.
const SLACK: Duration = Duration::from_millis(1000);
const WORKERS: usize = 3;

/// A candidate process (only when started by `three_processes_fail_over`).
#[test]
fn worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, '\n');
    let (id, db, dir) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let (id, db, dir) = (id.to_string(), PathBuf::from(db), PathBuf::from(dir));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = SqliteStore::open(&db).await.expect("open the lease file");
        let elector = Elector::builder(Arc::new(store), "multiprocess")
            .ttl(TTL)
            .candidate_id(id)
            .build()
            .unwrap();
        elector
            .run(move |leader: Leader| {
                let dir = dir.clone();
                async move {
                    while !leader.is_cancelled() {
                        if leader.ensure_valid(Duration::from_millis(100)).is_ok() {
                            fenced_append(&dir, &leader);
                            leader.heartbeat();
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok::<(), leasehold_core::Error>(())
                }
            })
            .await
            .unwrap();
    });
}

fn fenced_append(dir: &Path, leader: &Leader) {
    let term = leader.term().0;
    let last = ledger(dir).last().map_or(0, |(term, _)| *term);
    let (file, line) = if term >= last {
        ("ledger", format!("{term} {}\n", leader.holder()))
    } else {
        ("overlaps", format!("{term} {} found {last}\n", leader.holder()))
    };
    // One write of one short line to a file opened for appending: lines never interleave.
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file))
        .unwrap();
    file.write_all(line.as_bytes()).unwrap();
}

fn ledger(dir: &Path) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(dir.join("ledger")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (term, holder) = line.split_once(' ')?;
            Some((term.parse().ok()?, holder.to_string()))
        })
        .collect()
}

/// Kills every worker still running when the test ends, also when it fails.
struct Workers(Vec<Option<Child>>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in self.0.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Workers {
    fn kill(&mut self, index: usize) {
        let mut child = self.0[index].take().expect("worker already killed");
        child.kill().unwrap(); // SIGKILL: no release, no last words
        child.wait().unwrap();
    }
}

/// Waits until the ledger's last line has a term above `above`; returns it and when it was seen.
fn wait_for_leader(dir: &Path, above: u64, within: Duration) -> (u64, String, Instant) {
    let deadline = Instant::now() + within;
    loop {
        if let Some((term, holder)) = ledger(dir).last().filter(|(term, _)| *term > above) {
            return (*term, holder.clone(), Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "no leader with a term above {above} within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn three_processes_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let exe = std::env::current_exe().unwrap();
    let spawn = |i: usize| {
        let spec = format!("worker-{i}\n{}\n{}", db.display(), dir.path().display());
        Command::new(&exe)
            .args(["multiprocess::worker", "--exact", "--nocapture", "--test-threads=1"])
            .env(WORKER_ENV, spec)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    // All three open the new file at once.
    let mut workers = Workers((0..WORKERS).map(|i| Some(spawn(i))).collect());

    let (mut term, mut holder, _) = wait_for_leader(dir.path(), 0, Duration::from_secs(20));
    for round in 1..WORKERS {
        // Let the leader renew a few times, then kill it.
        std::thread::sleep(TTL * 2);
        let current = ledger(dir.path()).last().cloned().unwrap();
        assert_eq!(current, (term, holder.clone()), "leadership moved without a kill");
        let index: usize = holder.trim_start_matches("worker-").parse().unwrap();
        let killed_at = Instant::now();
        workers.kill(index);

        let bound = TTL + RETRY + SLACK;
        let (next_term, next_holder, seen_at) = wait_for_leader(dir.path(), term, bound + Duration::from_secs(5));
        let takeover = seen_at - killed_at;
        println!(
            "round {round}: killed {holder} (term {term}); {next_holder} took over at term {next_term} after {takeover:?}"
        );
        assert_ne!(next_holder, holder);
        assert!(
            takeover <= bound,
            "takeover took {takeover:?}, more than ttl + retry + slack = {bound:?}"
        );
        // Not before the dead leader's grant could have run out (ttl from its last renewal, which
        // was at most renew_every = ttl/3 before the kill).
        assert!(
            takeover >= TTL - TTL / 3 - Duration::from_millis(50),
            "takeover after only {takeover:?}"
        );
        (term, holder) = (next_term, next_holder);
    }
    std::thread::sleep(TTL);

    let ledger = ledger(dir.path());
    assert!(
        ledger.windows(2).all(|w| w[0].0 <= w[1].0),
        "ledger terms decreased: {ledger:?}"
    );
    let overlaps = std::fs::read_to_string(dir.path().join("overlaps")).unwrap_or_default();
    assert!(
        overlaps.is_empty(),
        "two processes believed they led at once:\n{overlaps}"
    );
    let mut holders: Vec<(u64, &str)> = ledger.iter().map(|(t, h)| (*t, h.as_str())).collect();
    holders.dedup();
    assert_eq!(holders.len(), WORKERS, "one term per leader: {holders:?}");
}
