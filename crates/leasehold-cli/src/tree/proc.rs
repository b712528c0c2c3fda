//! The processes, as `/proc` shows them: each one's `stat`, its children, and the scans of
//! `/proc` the trees of this process share.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    pub(super) fn read(pid: i32) -> Option<Process> {
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
pub(super) fn children_of(pid: i32) -> Option<Vec<i32>> {
    let task = format!("/proc/{pid}/task");
    children_listed(&task, &threads(&task)?)
}

/// This process's children, zombies included. `None` when that cannot be told for sure: no
/// children lists, or a thread came or went while they were read (a thread's children move to
/// another thread when it exits).
pub(super) fn own_children() -> Option<Vec<i32>> {
    let task = "/proc/self/task";
    let before = threads(task)?;
    let children = children_listed(task, &before)?;
    (threads(task)? == before).then_some(children)
}

/// The thread ids in a `/proc/PID/task` directory.
pub(super) fn threads(task: &str) -> Option<BTreeSet<String>> {
    std::fs::read_dir(task)
        .ok()?
        .map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// The children in the kernel's children lists of `threads` under `task`.
pub(super) fn children_listed(task: &str, threads: &BTreeSet<String>) -> Option<Vec<i32>> {
    let mut children = Vec::new();
    for tid in threads {
        let text = std::fs::read_to_string(format!("{task}/{tid}/children")).ok()?;
        children.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    Some(children)
}

/// One scan of `/proc`.
#[derive(Clone, Debug)]
pub(super) struct Scan {
    pub(super) started: Instant,
    pub(super) ended: Instant,
    pub(super) processes: Arc<Vec<Process>>,
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
pub(super) fn scan_since(since: Instant) -> Scan {
    let last = SCANS.lock().expect("scans lock").1.clone();
    match last {
        Some(last) if last.started >= since => last,
        _ => scan(),
    }
}

/// Two scans that began at `since` or later, the second after the first ended: a scan is not
/// atomic (a process forked while it reads `/proc` may be missed), the next one sees it. The last
/// two scans when they qualify, else new ones.
pub(super) fn two_scans_since(since: Instant) -> (Scan, Scan) {
    let (previous, last) = SCANS.lock().expect("scans lock").clone();
    match (previous, last) {
        (Some(previous), Some(last)) if previous.started >= since && last.started >= previous.ended => (previous, last),
        (_, Some(last)) if last.started >= since => (last, scan()),
        _ => (scan(), scan()),
    }
}

/// The descendants of `root` among `processes` (not `root` itself), zombies included, except the
/// processes in `prune` and everything below them.
pub(super) fn descendants(root: i32, processes: &[Process], prune: &HashSet<i32>) -> Vec<Process> {
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
}
