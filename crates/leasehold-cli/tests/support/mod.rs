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
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        self.spawn(name, &all)
    }

    /// Starts `leasehold --store URL ARGS...` as the leader of its own process group, with
    /// stderr in `NAME.log`.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Candidate {
        self.spawn_with_env(name, args, &[])
    }

    /// [`Store::spawn`] with `env` added to the environment.
    pub fn spawn_with_env(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Candidate {
        let mut command = Command::new(bin());
        command
            .envs(env.iter().copied())
            .arg("--store")
            .arg(&self.url)
            .args(args);
        self.spawn_command(name, command)
    }

    /// `sh ARGS...` (which is to exec `leasehold`), set up as [`Store::spawn`] sets it up.
    pub fn spawn_shell(&self, name: &str, args: &[&str]) -> Candidate {
        let mut command = Command::new("sh");
        command.args(args);
        self.spawn_command(name, command)
    }

    fn spawn_command(&self, name: &str, mut command: Command) -> Candidate {
        let log = self.path(&format!("{name}.log"));
        let child = command
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
            std::thread::sleep(Duration::from_millis(1));
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

/// A log line without the time that `run` puts first when stderr is not a terminal.
pub fn untimed(line: &str) -> &str {
    match line.split_once(' ') {
        Some((time, rest)) if time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T' => rest,
        _ => line,
    }
}

/// stderr as text (without timestamps), and a check that it is exactly one line starting with
/// `leasehold: `.
pub fn one_error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "expected one line on stderr, got {stderr:?}"
    );
    let stderr = untimed(&stderr).to_string();
    assert!(stderr.starts_with("leasehold: "), "{stderr:?}");
    stderr
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// A live process whose environment names `LEASEHOLD_LEASE=lease`: one of the processes a
/// `leasehold run` started for that lease (the guard, the command, and all it started), by the
/// term in its `LEASEHOLD_TERM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermProcess {
    pub pid: i32,
    pub term: u64,
    pub comm: String,
}

impl TermProcess {
    /// The child guard (and the short-lived step that moves the command into its cgroup) are
    /// `leasehold` itself; everything else is the command's.
    pub fn is_command(&self) -> bool {
        self.comm != "leasehold"
    }
}

/// The live processes started for `lease`, from `/proc/PID/environ` (zombies have none).
pub fn term_processes(lease: &str) -> Vec<TermProcess> {
    let want = format!("LEASEHOLD_LEASE={lease}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(process) = term_process(pid, &want) {
            found.push(process);
        }
    }
    found
}

fn term_process(pid: i32, want: &str) -> Option<TermProcess> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let mut lease = false;
    let mut term = None;
    for var in environ.split(|&b| b == 0) {
        if var == want.as_bytes() {
            lease = true;
        } else if let Some(value) = var.strip_prefix(b"LEASEHOLD_TERM=") {
            term = std::str::from_utf8(value).ok()?.parse().ok();
        }
    }
    if !lease || !alive(pid) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(TermProcess {
        pid,
        term: term?,
        comm: comm.trim_end().to_string(),
    })
}

/// When the command processes of each term were first and last seen alive.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub first: Instant,
    pub last: Instant,
}

/// Watches `/proc` from a thread, as often as it can (a few ms a scan), for the command
/// processes of `lease`: for each term, when one was first and last seen alive, on this test's
/// monotonic clock (`Instant`, CLOCK_MONOTONIC).
pub struct TermWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(std::collections::BTreeMap<u64, Seen>, Duration)>>,
}

impl TermWatch {
    pub fn start(lease: &str) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let want = format!("LEASEHOLD_LEASE={lease}");
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeMap::<u64, Seen>::new();
            let (mut scans, started) = (0u32, Instant::now());
            while !flag.load(Ordering::SeqCst) {
                let Ok(entries) = std::fs::read_dir("/proc") else { break };
                for entry in entries.flatten() {
                    let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                        continue;
                    };
                    let Some(process) = term_process(pid, &want) else {
                        continue;
                    };
                    let now = Instant::now();
                    if process.is_command() {
                        seen.entry(process.term)
                            .and_modify(|s| s.last = now)
                            .or_insert(Seen { first: now, last: now });
                    }
                }
                scans += 1;
            }
            (seen, started.elapsed() / scans.max(1))
        });
        TermWatch {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching: what was seen, and how long a scan of `/proc` took on average.
    pub fn finish(mut self) -> (std::collections::BTreeMap<u64, Seen>, Duration) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TermWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A shell snippet that, first thing in a command, appends to `ledger` the line
/// `start TERM PID [PID:COMM:TERM ...]`, listing every command process of the same lease and
/// another term that is alive at that moment (from `/proc/*/environ`; the guard excluded).
pub fn start_check(ledger: &Path) -> String {
    format!(
        r#"old=''
for f in $(grep -lsazx "LEASEHOLD_LEASE=$LEASEHOLD_LEASE" /proc/[0-9]*/environ); do
  p=${{f#/proc/}}; p=${{p%/environ}}
  t=$(grep -sazx 'LEASEHOLD_TERM=[0-9]*' "$f" | tr -d '\000'); t=${{t#LEASEHOLD_TERM=}}
  c=$(cat /proc/$p/comm 2>/dev/null)
  if [ -n "$t" ] && [ "$t" != "$LEASEHOLD_TERM" ] && [ -n "$c" ] && [ "$c" != leasehold ]; then old="$old $p:$c:$t"; fi
done
echo "start $LEASEHOLD_TERM $$$old" >> '{}'
"#,
        ledger.display()
    )
}

/// A `start` line of the ledger written by [`start_check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub term: u64,
    pub pid: i32,
    /// `PID:COMM:TERM` of each other-term command process alive when this one started.
    pub others: Vec<String>,
}

/// The `start` lines of a ledger.
pub fn starts(path: &Path) -> Vec<Start> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            if parts.next()? != "start" {
                return None;
            }
            Some(Start {
                term: parts.next()?.parse().ok()?,
                pid: parts.next()?.parse().ok()?,
                others: parts.map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A command process of a lease group's shard (`shards run`), from `/proc/PID/environ`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardProcess {
    pub pid: i32,
    pub shard: u32,
    pub term: u64,
    /// The member running it (`LEASEHOLD_HOLDER`).
    pub member: String,
}

fn shard_process(pid: i32, want: &[u8]) -> Option<ShardProcess> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let (mut group, mut shard, mut term, mut member) = (false, None, None, None);
    for var in environ.split(|&b| b == 0) {
        if var == want {
            group = true;
        } else if let Some(value) = var.strip_prefix(b"LEASEHOLD_SHARD=") {
            shard = std::str::from_utf8(value).ok()?.parse().ok();
        } else if let Some(value) = var.strip_prefix(b"LEASEHOLD_TERM=") {
            term = std::str::from_utf8(value).ok()?.parse().ok();
        } else if let Some(value) = var.strip_prefix(b"LEASEHOLD_HOLDER=") {
            member = Some(String::from_utf8_lossy(value).into_owned());
        }
    }
    if !group || !alive(pid) {
        return None;
    }
    // The child guard (and the step into the cgroup) are `leasehold` itself.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    if comm.trim_end() == "leasehold" {
        return None;
    }
    Some(ShardProcess {
        pid,
        shard: shard?,
        term: term?,
        member: member?,
    })
}

/// The live command processes of `group`'s shards.
pub fn shard_processes(group: &str) -> Vec<ShardProcess> {
    let want = format!("LEASEHOLD_GROUP={group}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| shard_process(pid, want.as_bytes()))
        .collect()
}

/// Watches `/proc` from a thread, as often as it can, for the command processes of `group`: for
/// each (shard, term), when one was first and last seen alive, and by which member.
pub struct GroupWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<GroupSeen>>,
}

/// What a [`GroupWatch`] saw: `(shard, term)` -> (member, first and last sighting).
pub type GroupSeen = std::collections::BTreeMap<(u32, u64), (String, Seen)>;

impl GroupWatch {
    pub fn start(group: &str) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let group = group.to_string();
        let thread = std::thread::spawn(move || {
            let mut seen = GroupSeen::new();
            while !flag.load(Ordering::SeqCst) {
                for process in shard_processes(&group) {
                    let now = Instant::now();
                    seen.entry((process.shard, process.term))
                        .and_modify(|(_, s)| s.last = now)
                        .or_insert((process.member, Seen { first: now, last: now }));
                }
            }
            seen
        });
        GroupWatch {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> GroupSeen {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for GroupWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
