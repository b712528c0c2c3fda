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

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpid};

mod cgroup;
mod proc;

pub(crate) use cgroup::Cgroup;
pub(crate) use proc::Process;
use proc::{Scan, children_listed, children_of, descendants, own_children, scan_since, threads, two_scans_since};

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
