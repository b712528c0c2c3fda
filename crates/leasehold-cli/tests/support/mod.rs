//! Helpers for the `leasehold` integration tests: real processes, a real store, and a ledger
//! file that the leader's command appends `TERM PID` to.

#![allow(dead_code, unreachable_pub)] // each test file uses its own part

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold")
}

/// A store URL with the temporary directory that holds what the test writes.
pub struct Store {
    pub url: String,
    pub dir: TempDir,
}

impl Store {
    /// A fresh SQLite file in a temporary directory.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/leases.db", dir.path().display());
        Store { url, dir }
    }

    /// A networked store at `url`, with a temporary directory for the ledger and logs.
    pub fn at(url: &str) -> Self {
        Store {
            url: url.to_string(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasehold --store URL ARGS...`, finished, with its output.
    pub fn leasehold(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .arg("--store")
            .arg(&self.url)
            .args(args)
            .output()
            .unwrap()
    }

    /// Starts `leasehold --store URL run ARGS...` as the leader of its own process group, with
    /// stderr in `NAME.log`.
    pub fn spawn_run(&self, name: &str, args: &[&str]) -> Candidate {
        let log = self.path(&format!("{name}.log"));
        let child = Command::new(bin())
            .arg("--store")
            .arg(&self.url)
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(self.path(&format!("{name}.out"))).unwrap())
            .stderr(File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        Candidate {
            child: Some(child),
            log,
        }
    }
}

use std::os::unix::process::CommandExt;

/// A `leasehold run` process, killed (with its command's group) when dropped.
pub struct Candidate {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Candidate {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// Waits up to `limit` for the process to exit; its exit code (128 + N for a signal N).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let child = self.child.as_mut().unwrap();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status.code().unwrap_or_else(|| 128 + status.signal().unwrap()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the process has exited (and reaps it if so).
    pub fn exited(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_some()
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One line of a ledger: the term the command ran under, and the pid of the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub term: u64,
    pub pid: i32,
}

/// The ledger's complete lines.
pub fn ledger(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some(Entry {
                term: parts.next()?.parse().ok()?,
                pid: parts.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// A shell script that appends `$LEASEHOLD_TERM $$` to `ledger` every 100 ms, forever.
pub fn appender(ledger: &Path) -> String {
    format!(
        "while true; do echo \"$LEASEHOLD_TERM $$\" >> '{}'; sleep 0.1; done",
        ledger.display()
    )
}

/// Polls `check` every millisecond for up to `limit`; the time it took, or `None`.
pub fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    loop {
        if check() {
            return Some(started.elapsed());
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// From `/proc/PID/stat`: (state, ppid, pgrp).
fn stat(pid: i32) -> Option<(char, i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Whether `pid` is a live process (a zombie is not: it can do nothing any more, and nothing
/// here may reap it when PID 1 does not).
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

pub fn pgid_of(pid: i32) -> i32 {
    stat(pid)
        .map(|(_, _, pgrp)| pgrp)
        .unwrap_or_else(|| panic!("no process {pid}"))
}

pub fn ppid_of(pid: i32) -> i32 {
    stat(pid)
        .map(|(_, ppid, _)| ppid)
        .unwrap_or_else(|| panic!("no process {pid}"))
}

/// The leader's processes, found from a ledger entry: the shell, its group (headed by the child
/// guard), and the `leasehold run` process that started the guard.
#[derive(Clone, Copy, Debug)]
pub struct LeaderProcesses {
    pub shell: i32,
    pub group: i32,
    pub leasehold: i32,
}

impl LeaderProcesses {
    pub fn of(entry: Entry) -> Self {
        let group = pgid_of(entry.pid);
        LeaderProcesses {
            shell: entry.pid,
            group,
            leasehold: ppid_of(group),
        }
    }
}

/// A lease name no earlier run used (networked stores keep their state between runs).
pub fn fresh_lease(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// stderr as text, and a check that it is exactly one line starting with `leasehold: `.
pub fn one_error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "expected one line on stderr, got {stderr:?}"
    );
    assert!(stderr.starts_with("leasehold: "), "{stderr:?}");
    stderr
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}
