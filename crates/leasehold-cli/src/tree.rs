//! The command's whole process tree: found, signalled and waited for until it is empty.
//!
//! A process group is not a tree: `setsid`, `setpgid` and a double fork all leave it. Two things
//! keep every process that the command ever starts within reach:
//!
//! - **Child subreapers.** `leasehold run` and its child guard both call
//!   `prctl(PR_SET_CHILD_SUBREAPER)` (`nix::sys::prctl::set_child_subreaper`). An orphan is
//!   reparented to its nearest living subreaper ancestor instead of PID 1, so whatever the
//!   command forks, however it detaches, stays a descendant of the guard (of `run`, once the guard
//!   is gone). The tree is then "every descendant in `/proc`", read by parent pid.
//! - **A cgroup v2 leaf**, where one can be made (a writable cgroup2 mount: root, or a delegated
//!   systemd unit). The command is moved into it before it runs, so every process it starts is
//!   in it too; `cgroup.kill` kills them all in one step, and `cgroup.events` says when it is
//!   empty. Where no leaf can be made (a read-only `/sys/fs/cgroup` in a container, no cgroup2
//!   mount, too old a kernel), the subreapers alone do the work, and `run` says so once.
//!
//! Signals go through a pidfd opened after the process was found, and only once its start time
//! is seen unchanged: a pid that was reused in between is never signalled.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpid};

/// One process, as `/proc/PID/stat` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    /// The process group.
    pub(crate) pgrp: i32,
    pub(crate) state: char,
    /// Threads not yet reaped, the main thread's included (`num_threads`).
    pub(crate) threads: u32,
    /// In clock ticks after boot: with the pid, it names one process for good.
    pub(crate) start: u64,
    pub(crate) comm: String,
}

impl Process {
    fn read(pid: i32) -> Option<Process> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        parse_stat(pid, &text)
    }

    /// Zombies and dying processes can do nothing any more. But a process whose main thread
    /// has exited (`pthread_exit`) while others run shows `Z` too: it runs, cannot be reaped,
    /// and counts as live until its last thread has gone (`num_threads` then 1).
    pub(crate) fn is_live(&self) -> bool {
        match self.state {
            'X' | 'x' => false,
            'Z' => self.threads > 1,
            _ => true,
        }
    }

    /// "1234 (sleep, state D: uninterruptible sleep)": for a log line.
    pub(crate) fn describe(&self) -> String {
        let state = match self.state {
            'D' => "state D: uninterruptible sleep",
            'R' => "running",
            'S' => "sleeping",
            'T' | 't' => "stopped",
            'Z' if self.threads > 1 => "main thread exited, other threads running",
            'Z' => "zombie",
            _ => "",
        };
        if state.is_empty() {
            format!("{} ({}, state {})", self.pid, self.comm, self.state)
        } else {
            format!("{} ({}, {state})", self.pid, self.comm)
        }
    }
}

/// Parses the text of `/proc/PID/stat`: "pid (comm) state ppid pgrp ... starttime ...".
fn parse_stat(pid: i32, text: &str) -> Option<Process> {
    // comm may hold spaces and parentheses: it ends at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    Some(Process {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        threads: fields.get(17)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        comm,
    })
}

/// Every process in `/proc`.
fn all_processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(Process::read)
        .collect()
}

/// The children of `pid` (of each of its threads), from the kernel's children lists; `None` when
/// they cannot be read (the process is gone, or the kernel has none).
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let task = format!("/proc/{pid}/task");
    children_listed(&task, &threads(&task)?)
}

/// This process's children, zombies included. `None` when that cannot be told for sure: no
/// children lists, or a thread came or went while they were read (a thread's children move to
/// another thread when it exits).
fn own_children() -> Option<Vec<i32>> {
    let task = "/proc/self/task";
    let before = threads(task)?;
    let children = children_listed(task, &before)?;
    (threads(task)? == before).then_some(children)
}

/// The thread ids in a `/proc/PID/task` directory.
fn threads(task: &str) -> Option<BTreeSet<String>> {
    std::fs::read_dir(task)
        .ok()?
        .map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// The children in the kernel's children lists of `threads` under `task`.
fn children_listed(task: &str, threads: &BTreeSet<String>) -> Option<Vec<i32>> {
    let mut children = Vec::new();
    for tid in threads {
        let text = std::fs::read_to_string(format!("{task}/{tid}/children")).ok()?;
        children.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    Some(children)
}

/// One scan of `/proc`.
#[derive(Clone, Debug)]
struct Scan {
    started: Instant,
    ended: Instant,
    processes: Arc<Vec<Process>>,
}

/// The last two scans of `/proc`, oldest first. The trees of this process share them: when the
/// commands of many shards are stopped at once (`shards run`), each round of their polling reads
/// `/proc` once or twice between them, not twice each (32 commands stopping at once, each scanning
/// on its own, kept the one thread so busy that SIGKILL and the renewals came seconds late).
static SCANS: Mutex<(Option<Scan>, Option<Scan>)> = Mutex::new((None, None));

/// A new scan of `/proc`, remembered as the last one.
fn scan() -> Scan {
    let started = Instant::now();
    let processes = Arc::new(all_processes());
    let scan = Scan {
        started,
        ended: Instant::now(),
        processes,
    };
    let mut scans = SCANS.lock().expect("scans lock");
    *scans = (scans.1.take(), Some(scan.clone()));
    scan
}

/// A scan that began at `since` or later: the last one if it did, else a new one.
fn scan_since(since: Instant) -> Scan {
    let last = SCANS.lock().expect("scans lock").1.clone();
    match last {
        Some(last) if last.started >= since => last,
        _ => scan(),
    }
}

/// Two scans that began at `since` or later, the second after the first ended: a scan is not
/// atomic (a process forked while it reads `/proc` may be missed), the next one sees it. The last
/// two scans when they qualify, else new ones.
fn two_scans_since(since: Instant) -> (Scan, Scan) {
    let (previous, last) = SCANS.lock().expect("scans lock").clone();
    match (previous, last) {
        (Some(previous), Some(last)) if previous.started >= since && last.started >= previous.ended => (previous, last),
        (_, Some(last)) if last.started >= since => (last, scan()),
        _ => (scan(), scan()),
    }
}

/// The descendants of `root` among `processes` (not `root` itself), zombies included, except the
/// processes in `prune` and everything below them.
fn descendants(root: i32, processes: &[Process], prune: &HashSet<i32>) -> Vec<Process> {
    let mut children: HashMap<i32, Vec<&Process>> = HashMap::new();
    for process in processes {
        children.entry(process.ppid).or_default().push(process);
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    let mut seen = HashSet::from([root]);
    while let Some(parent) = queue.pop() {
        for child in children.get(&parent).into_iter().flatten() {
            if !prune.contains(&child.pid) && seen.insert(child.pid) {
                queue.push(child.pid);
                found.push((*child).clone());
            }
        }
    }
    found
}

/// A cgroup v2 leaf made for one run of the command.
#[derive(Debug, Clone)]
pub(crate) struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Makes the leaf `name` under this process's own cgroup v2, if there is a cgroup2 mount
    /// and it can be written. The error says why not, for the log.
    pub(crate) fn create(name: &str) -> Result<Cgroup, String> {
        let own = own_cgroup_dir()?;
        let path = own.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        // Before Linux 5.14 there is no cgroup.kill: the leaf still contains, and its processes
        // are killed one by one.
        Ok(Cgroup { path })
    }

    /// Removes the empty leaves `leasehold-PID-TERM` under this process's cgroup whose
    /// `leasehold run` (PID) is gone: it and its guard were killed together, so nobody removed
    /// them. A leaf that still holds a process stays (the kernel refuses to remove it).
    pub(crate) fn sweep_stale() {
        let Ok(own) = own_cgroup_dir() else { return };
        let Ok(entries) = std::fs::read_dir(&own) else { return };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("leasehold-"))
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, _)| pid.parse::<i32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                Cgroup::at(entry.path()).remove();
            }
        }
    }

    /// A leaf made by someone else (`run`, for the guard).
    pub(crate) fn at(path: impl Into<PathBuf>) -> Cgroup {
        Cgroup { path: path.into() }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the kernel can kill the whole leaf in one step (`cgroup.kill`, Linux 5.14).
    pub(crate) fn can_kill(&self) -> bool {
        self.path.join("cgroup.kill").exists()
    }

    /// Moves the calling process into the leaf (what it starts afterwards is born there).
    pub(crate) fn enter(&self) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), "0")
    }

    /// The pids in the leaf and in any cgroup below it.
    fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.path.clone()];
        while let Some(dir) = dirs.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        pids
    }

    /// Whether any process is left in the leaf or below it (`None`: cannot tell).
    fn populated(&self) -> Option<bool> {
        let events = std::fs::read_to_string(self.path.join("cgroup.events")).ok()?;
        events
            .lines()
            .find_map(|line| line.strip_prefix("populated "))
            .map(|value| value.trim() != "0")
    }

    /// SIGKILL to every process in the leaf and below, by the kernel, in one step.
    fn kill(&self) -> bool {
        std::fs::write(self.path.join("cgroup.kill"), "1").is_ok()
    }

    /// Removes the leaf (and any cgroups the command made below it) once it is empty.
    pub(crate) fn remove(&self) {
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.filter_map(Result::ok) {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&entry.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.path);
    }
}

/// This process's cgroup v2 directory: the cgroup2 mount point joined with the path in
/// `/proc/self/cgroup` (the `0::` line).
fn own_cgroup_dir() -> Result<PathBuf, String> {
    let cgroups =
        std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let own = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 hierarchy")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let (root, mount_point) = cgroup2_mount(&mounts).ok_or("no cgroup2 file system is mounted")?;
    // A mount of a subtree (a container's cgroup namespace shows "/") holds the paths below its root.
    let relative = own.strip_prefix(root.as_str()).unwrap_or(own).trim_start_matches('/');
    if own.contains("/../") || own.ends_with("/..") {
        return Err(format!(
            "this process's cgroup {own} is outside the mounted cgroup2 tree"
        ));
    }
    Ok(Path::new(&mount_point).join(relative))
}

/// The root and mount point of the first cgroup2 mount in `/proc/self/mountinfo`.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        if fstype != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = before.split_whitespace().collect();
        Some((unescape(fields.get(3)?), unescape(fields.get(4)?)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The child guards of the commands this process runs now, by pid: one for `run`, one per owned
/// shard for `shards run`. Each guard is a child subreaper, so everything its command starts
/// stays below it while it lives: its subtree is its own command's, and no other command's
/// tree includes it. A guard is listed from its spawn until it is reaped (or its command tree
/// abandoned), and only tokio reaps it.
static GUARDS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Lists a child guard just started (before anything else can scan `/proc`: the runtime has one
/// thread and this is called right after the spawn).
pub(crate) fn guard_started(pid: i32) {
    GUARDS.lock().expect("guards lock").insert(pid);
}

/// Unlists a child guard: reaped, or its tree abandoned (what is left of it is then nobody's:
/// every tree includes it, see [`Tree`]).
pub(crate) fn guard_gone(pid: i32) {
    GUARDS.lock().expect("guards lock").remove(&pid);
}

fn guards() -> BTreeSet<i32> {
    GUARDS.lock().expect("guards lock").clone()
}

/// The processes of one run of the command: the live descendants of `root` (this process, a
/// child subreaper), except the subtrees of the *other* commands' guards (`shards run` runs one
/// command per shard), and everything in the cgroup leaf, if there is one.
///
/// A process below `root` but under no listed guard is an orphan of a guard that died (its
/// children were reparented to this process): which command it came from cannot be told without
/// a cgroup, so it belongs to every tree, and whichever command stops or exits next kills it.
/// With one command (`run`) the tree is exactly everything below this process.
#[derive(Debug)]
pub(crate) struct Tree {
    root: i32,
    cgroup: Option<Cgroup>,
    /// This tree's own guard, which is not pruned.
    guard: Option<i32>,
}

impl Tree {
    /// The tree below this process (which must be a child subreaper), with the command's leaf:
    /// without a guard of its own, what no listed guard holds (the leftovers of earlier runs).
    pub(crate) fn below_me(cgroup: Option<Cgroup>) -> Tree {
        Tree {
            root: getpid().as_raw(),
            cgroup,
            guard: None,
        }
    }

    /// The tree of the command whose child guard is `guard` (listed with [`guard_started`]).
    pub(crate) fn of_guard(guard: i32, cgroup: Option<Cgroup>) -> Tree {
        Tree {
            guard: Some(guard),
            ..Tree::below_me(cgroup)
        }
    }

    pub(crate) fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// This tree's guard was reaped: its pid may name another command's guard from now on, which
    /// is not this tree's.
    pub(crate) fn guard_reaped(&mut self) {
        self.guard = None;
    }

    /// The live processes of the tree, this process excluded, from a new scan of `/proc`.
    pub(crate) fn members(&self) -> Vec<Process> {
        self.members_in(&scan_since(Instant::now()).processes)
    }

    /// The live processes of the tree among `processes` (a scan of `/proc`).
    fn members_in(&self, processes: &[Process]) -> Vec<Process> {
        let mut others = guards();
        if let Some(own) = self.guard {
            others.remove(&own);
        }
        let mut members = descendants(self.root, processes, &others.into_iter().collect());
        if let Some(cgroup) = &self.cgroup {
            let known: HashSet<i32> = members.iter().map(|p| p.pid).collect();
            for pid in cgroup.pids() {
                if pid != self.root
                    && !known.contains(&pid)
                    && let Some(process) = Process::read(pid)
                {
                    members.push(process);
                }
            }
        }
        members.retain(Process::is_live);
        members
    }

    /// The live processes of the tree found by following the kernel's children lists down from
    /// the root (`/proc/PID/task/TID/children`), with the leaf's: a few reads for a small tree
    /// instead of a scan of all of `/proc`. Like a scan, it may miss a process forked meanwhile:
    /// for signalling, not for deciding that the tree is empty. `None` where the kernel has no
    /// children lists (`CONFIG_PROC_CHILDREN`).
    pub(crate) fn members_by_children(&self) -> Option<Vec<Process>> {
        let mut others = guards();
        if let Some(own) = self.guard {
            others.remove(&own);
        }
        let mut members = Vec::new();
        let mut seen = HashSet::from([self.root]);
        let mut queue = vec![self.root];
        while let Some(parent) = queue.pop() {
            let children = match children_of(parent) {
                Some(children) => children,
                None if parent == self.root => return None,
                None => continue,
            };
            for child in children {
                if others.contains(&child) || !seen.insert(child) {
                    continue;
                }
                if let Some(process) = Process::read(child) {
                    members.push(process);
                    queue.push(child);
                }
            }
        }
        if let Some(cgroup) = &self.cgroup {
            for pid in cgroup.pids() {
                if seen.insert(pid)
                    && let Some(process) = Process::read(pid)
                {
                    members.push(process);
                }
            }
        }
        members.retain(Process::is_live);
        Some(members)
    }

    /// Whether the tree is surely empty, told without scanning `/proc`: the root is this process,
    /// whose children lists hold none but other commands' guards, and the leaf (if any) is not
    /// populated. A live process of the tree would have a chain of parents up to this process (a
    /// child subreaper: an orphan below it comes to it or to a living guard below it, never
    /// elsewhere), so one of this process's children, live or a zombie, would be its ancestor.
    /// `false` when it cannot tell this way (the caller then scans).
    pub(crate) fn surely_empty(&self) -> bool {
        if self.root != getpid().as_raw() {
            return false;
        }
        let Some(children) = own_children() else {
            return false;
        };
        let others = guards();
        let outside = |pid: &i32| others.contains(pid) && self.guard != Some(*pid);
        children.iter().all(outside) && self.cgroup.as_ref().is_none_or(|c| c.populated() == Some(false))
    }

    /// [`Tree::surely_empty`] while this tree's guard `guard` (not reaped, so its pid is still
    /// its own) is alive but has said the command's tree is gone: the guard's children lists
    /// hold nothing, then this process's hold none but guards (this one included), and the leaf
    /// (if any) is not populated. The guard's first: an orphan of the tree that moves from the
    /// guard (exiting meanwhile) up to this process is seen in the second. Below the guard, a
    /// live process would have a chain of parents up to it (a subreaper), so one of its children
    /// would be an ancestor. `false` when it cannot tell this way.
    pub(crate) fn surely_empty_but_guard(&self, guard: i32) -> bool {
        if self.root != getpid().as_raw() || self.guard != Some(guard) {
            return false;
        }
        let task = format!("/proc/{guard}/task");
        let Some(before) = threads(&task) else {
            return false;
        };
        let below = children_listed(&task, &before);
        if below.is_none_or(|below| !below.is_empty()) || threads(&task).as_ref() != Some(&before) {
            return false;
        }
        let Some(children) = own_children() else {
            return false;
        };
        let guards = guards();
        children.iter().all(|pid| guards.contains(pid))
            && self.cgroup.as_ref().is_none_or(|c| c.populated() == Some(false))
    }

    /// Whether the tree is empty in two scans that began at `since` or later, one after the
    /// other: no live member but `except`, and the leaf (if any) unpopulated.
    fn is_empty_since(&self, since: Instant, except: &[i32]) -> (bool, Scan) {
        let (first, second) = two_scans_since(since);
        let empty = |scan: &Scan| {
            let populated = self.cgroup.as_ref().and_then(Cgroup::populated).unwrap_or(false);
            !populated && self.members_in(&scan.processes).iter().all(|p| except.contains(&p.pid))
        };
        (empty(&first) && empty(&second), second)
    }

    /// Sends `signal` to every member but those in `except`; SIGKILL also through
    /// `cgroup.kill`. Returns the members found.
    pub(crate) fn signal(&self, signal: Signal, except: &[i32]) -> Vec<Process> {
        self.signal_in(&scan_since(Instant::now()).processes, signal, except)
    }

    /// [`Tree::signal`], to the members found through the children lists where the kernel has
    /// them (see [`Tree::members_by_children`]: no scan of `/proc` before the signal goes out).
    /// Members in process group `sent` (already signalled as a group with `killpg`) are found and
    /// returned but not signalled again: a command's trap would run twice.
    pub(crate) fn signal_quickly(&self, signal: Signal, except: &[i32], sent: Option<i32>) -> Vec<Process> {
        let members = self
            .members_by_children()
            .unwrap_or_else(|| self.members_in(&scan_since(Instant::now()).processes));
        let members: Vec<Process> = members.into_iter().filter(|p| !except.contains(&p.pid)).collect();
        for process in &members {
            if sent != Some(process.pgrp) {
                send(process, signal);
            }
        }
        members
    }

    /// [`Tree::signal`] to the members found in `processes` (a scan of `/proc`).
    fn signal_in(&self, processes: &[Process], signal: Signal, except: &[i32]) -> Vec<Process> {
        if signal == Signal::SIGKILL
            && except.is_empty()
            && let Some(cgroup) = &self.cgroup
        {
            cgroup.kill();
        }
        let members: Vec<Process> = self
            .members_in(processes)
            .into_iter()
            .filter(|p| !except.contains(&p.pid))
            .collect();
        for process in &members {
            send(process, signal);
        }
        members
    }

    /// Reaps the zombies among this process's own children (orphans reparented to it), except
    /// `except` (a child that tokio waits for) and every listed child guard (tokio waits for
    /// them).
    pub(crate) fn reap(&self, except: &[i32]) {
        Tree::reap_in(&scan_since(Instant::now()).processes, except);
    }

    /// [`Tree::reap`] without a scan of `/proc` where the kernel lists this process's children
    /// (the scan otherwise): each child but `except` and the listed guards is waited for without
    /// blocking, which leaves a live one alone. For the guard's periodic reaping: a scan of all
    /// of `/proc` once a second in every waiting guard was the idle cost of a pre-started one.
    pub(crate) fn reap_children(&self, except: &[i32]) {
        let Some(children) = own_children() else {
            return self.reap(except);
        };
        let guards = guards();
        for pid in children {
            if !except.contains(&pid) && !guards.contains(&pid) {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }

    /// [`Tree::reap`], for the zombies in `processes` (a scan of `/proc`; a zombie stays one
    /// until it is reaped, so an older scan is as good).
    fn reap_in(processes: &[Process], except: &[i32]) {
        let me = getpid().as_raw();
        let guards = guards();
        for process in processes {
            if process.ppid == me
                && process.state == 'Z'
                && !process.is_live()
                && !except.contains(&process.pid)
                && !guards.contains(&process.pid)
            {
                let _ = waitpid(Pid::from_raw(process.pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }

    /// Whether the tree is empty but for `except` now: no live member in two scans begun now,
    /// one after the other, and the leaf (if any) unpopulated. Reaps first.
    pub(crate) fn is_empty_now(&self, except: &[i32]) -> bool {
        if self.surely_empty() {
            return true;
        }
        let since = Instant::now();
        Tree::reap_in(&scan_since(since).processes, &[]);
        self.is_empty_since(since, except).0
    }

    /// Waits up to `until` for every member but `except` to be gone; reaps meanwhile. Whether it
    /// emptied.
    pub(crate) async fn wait_empty(&self, until: Instant, except: &[i32], reap_except: &[i32]) -> bool {
        if self.surely_empty() {
            return true;
        }
        // Scans that began after the last look are news, whichever tree made them.
        let mut since = Instant::now();
        if until > since {
            // Nothing ends at once; meanwhile the trees stopped at the same moment scan once
            // between them, not once each.
            tokio::time::sleep(POLL.min(until - since)).await;
        }
        loop {
            Tree::reap_in(&scan_since(since).processes, reap_except);
            let (empty, _) = self.is_empty_since(since, except);
            if empty {
                return true;
            }
            since = Instant::now();
            if since >= until {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL to the whole tree, again and again, until it is empty (`Ok`) or `until` passes
    /// (`Err` with what is left, e.g. a process in uninterruptible sleep). Each round kills what
    /// the last one's processes forked before they died.
    pub(crate) async fn kill_until_empty(
        &self,
        until: Option<Instant>,
        reap_except: &[i32],
    ) -> Result<(), Vec<Process>> {
        let mut since = Instant::now();
        loop {
            Tree::reap_in(&scan_since(since).processes, reap_except);
            // Two scans: one is not atomic. Both began after the last SIGKILL round, by this tree
            // or another: what they show alive outlived it.
            let (empty, last) = self.is_empty_since(since, &[]);
            if empty {
                return Ok(());
            }
            let found = self.signal_in(&last.processes, Signal::SIGKILL, &[]);
            if found.is_empty() {
                // Only the leaf is still populated: by zombies, reparented to this process after
                // that scan when their guard died. Reap them now.
                self.reap(reap_except);
            }
            since = Instant::now();
            // Stuck: a live process outlived the SIGKILLs (or the leaf stays populated with
            // nothing alive in it for a second more).
            let stuck = |until: Instant| since >= until && (!found.is_empty() || since >= until + ZOMBIE_WAIT);
            if until.is_some_and(stuck) {
                return Err(found);
            }
            tokio::time::sleep(KILL_POLL).await;
        }
    }
}

/// How often a wait for the tree to empty looks again.
const POLL: Duration = Duration::from_millis(10);
/// How long the kill loop waits, past its limit, for a leaf that holds nothing alive to be
/// reported unpopulated (its zombies reaped) before it gives up.
const ZOMBIE_WAIT: Duration = Duration::from_secs(1);
/// How often the kill loop looks again.
const KILL_POLL: Duration = Duration::from_millis(2);

/// Signals `process` through a pidfd, if it is still the process that was found.
fn send(process: &Process, signal: Signal) {
    use rustix::process::{PidfdFlags, pidfd_open, pidfd_send_signal};
    let Some(pid) = rustix::process::Pid::from_raw(process.pid) else {
        return;
    };
    let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return; // gone
    };
    // The pidfd names whatever has this pid now; it is ours if it started when ours did.
    if Process::read(process.pid).is_none_or(|now| now.start != process.start) {
        return;
    }
    let Some(signal) = rustix::process::Signal::from_named_raw(signal as i32) else {
        return;
    };
    let _ = pidfd_send_signal(&fd, signal);
}

/// "3 processes: 1234 (sleep, sleeping), ..." for a log line (at most 5 named).
pub(crate) fn list(processes: &[Process]) -> String {
    let mut named: Vec<String> = processes.iter().take(5).map(Process::describe).collect();
    if processes.len() > 5 {
        named.push(format!("and {} more", processes.len() - 5));
    }
    let noun = if processes.len() == 1 { "process" } else { "processes" };
    format!("{} {noun}: {}", processes.len(), named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let line = "42 (a) (b) c) S 1 40 40 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 0 0";
        let process = parse_stat(42, line).unwrap();
        assert_eq!(process.comm, "a) (b) c");
        assert_eq!(
            (
                process.state,
                process.ppid,
                process.pgrp,
                process.threads,
                process.start
            ),
            ('S', 1, 40, 1, 777)
        );
        // The main thread exited, two others run: live. A whole zombie: not.
        let leader_gone = parse_stat(42, "42 (py) Z 1 40 40 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0 777 0 0").unwrap();
        assert!(leader_gone.is_live());
        let zombie = parse_stat(42, "42 (py) Z 1 40 40 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0").unwrap();
        assert!(!zombie.is_live());
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn descendants_follow_parent_pids() {
        let p = |pid, ppid| Process {
            pid,
            ppid,
            pgrp: 0,
            state: 'S',
            threads: 1,
            start: 0,
            comm: "x".into(),
        };
        let all = [p(10, 1), p(11, 10), p(12, 11), p(13, 1), p(14, 12)];
        let mut found: Vec<i32> = descendants(10, &all, &HashSet::new()).iter().map(|p| p.pid).collect();
        found.sort_unstable();
        assert_eq!(found, [11, 12, 14]);
        // Another command's guard (12) and what is below it are not this tree's.
        let found: Vec<i32> = descendants(10, &all, &HashSet::from([12]))
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(found, [11]);
    }

    #[test]
    fn cgroup2_mounts_are_found() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(("/".to_string(), "/sys/fs/cgroup/unified".to_string()))
        );
        assert_eq!(cgroup2_mount("30 25 0:26 / /x rw - ext4 /dev/sda rw"), None);
    }

    #[test]
    fn a_listed_guards_subtree_belongs_to_its_own_tree_only() {
        let spawn = || std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let (mut guard, mut stray) = (spawn(), spawn());
        let (g, s) = (guard.id() as i32, stray.id() as i32);
        guard_started(g);
        let pids = |tree: &Tree| tree.members().iter().map(|p| p.pid).collect::<Vec<_>>();
        let others = pids(&Tree::below_me(None));
        assert!(!others.contains(&g) && others.contains(&s), "{others:?}");
        let own = pids(&Tree::of_guard(g, None));
        assert!(own.contains(&g) && own.contains(&s), "{own:?}");
        let mut reaped = Tree::of_guard(g, None);
        reaped.guard_reaped();
        assert!(
            !pids(&reaped).contains(&g),
            "a reaped guard's pid is no longer the tree's"
        );
        guard_gone(g);
        assert!(pids(&Tree::below_me(None)).contains(&g));
        for child in [&mut guard, &mut stray] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    #[allow(clippy::zombie_processes)] // `dead` is reaped by what the test checks
    fn zombie_children_are_reaped_without_a_scan_and_live_ones_left_alone() {
        let mut live = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let dead = std::process::Command::new("true").spawn().unwrap();
        let (live_pid, dead_pid) = (live.id() as i32, dead.id() as i32);
        let state = |pid: i32| Process::read(pid).map(|p| p.state);
        let deadline = Instant::now() + Duration::from_secs(5);
        while state(dead_pid) != Some('Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(state(dead_pid), Some('Z'));
        Tree::below_me(None).reap_children(&[]);
        assert_eq!(state(dead_pid), None, "the zombie is reaped");
        assert!(
            state(live_pid).is_some_and(|s| s != 'Z'),
            "the live child is left alone"
        );
        live.kill().unwrap();
        live.wait().unwrap();
    }

    #[test]
    fn own_children_are_found() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tree = Tree::below_me(None);
        let members = tree.members();
        assert!(
            members.iter().any(|p| p.pid == child.id() as i32 && p.comm == "sleep"),
            "{members:?}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
