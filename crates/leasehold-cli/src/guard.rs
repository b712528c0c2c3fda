//! The child guard: `leasehold __child-guard --parent PID --grace-ms MS -- CMD ARGS...`.
//!
//! `run` starts this binary again in this mode, as the leader of a new process group, instead
//! of starting the command itself. The guard:
//!
//! 1. takes over SIGHUP, SIGTERM and SIGINT (a handler, not the default action), so that the
//!    SIGTERM that `run` sends to the whole group reaches the command while the guard stays to
//!    see it out;
//! 2. asks the kernel for a SIGHUP when its parent dies (`PR_SET_PDEATHSIG`; the parent thread
//!    is `run`'s main thread, which lives as long as the process), then checks that the parent
//!    is still the one that started it (it may have died before the request);
//! 3. starts the command in its group, and waits for it;
//! 4. if the parent dies meanwhile (SIGHUP and `getppid()` changed, or the once-a-second check
//!    sees it), kills the whole group, itself included, with SIGKILL;
//! 5. when the command exits, ends what it left behind in the group (SIGTERM, then SIGKILL after
//!    the grace), and exits with the command's status (128 + N for a signal N).
//!
//! All of it through safe wrappers (`nix`, tokio): the workspace forbids `unsafe`, which a
//! `pre_exec` hook setting the death signal in the command itself would need. It also covers
//! what a `pre_exec` hook would not: the command's own children, which share the group.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgrp, getpid, getppid};
use tokio::signal::unix::{SignalKind, signal};

use crate::child::exit_code;
use crate::exit::{NOT_EXECUTABLE, NOT_FOUND, RUNTIME};

/// The arguments of the hidden `__child-guard` subcommand.
#[derive(Debug, Args)]
pub(crate) struct GuardArgs {
    /// The pid of the `leasehold run` process that started this guard.
    #[arg(long)]
    parent: i32,
    /// How long leftovers of the command get between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 2000)]
    grace_ms: u64,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// Runs the guard; returns its exit code.
pub(crate) fn main(args: GuardArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("leasehold: child guard: cannot start: {e}");
            return RUNTIME;
        }
    };
    runtime.block_on(guard(args))
}

async fn guard(args: GuardArgs) -> i32 {
    let parent = Pid::from_raw(args.parent);
    let handlers = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    let (Ok(mut hangup), Ok(mut terminate), Ok(mut interrupt)) = handlers else {
        eprintln!("leasehold: child guard: cannot handle signals");
        return RUNTIME;
    };
    if let Err(e) = set_pdeathsig(Signal::SIGHUP) {
        eprintln!("leasehold: child guard: cannot watch its parent: {e}");
        return RUNTIME;
    }
    if getppid() != parent {
        return RUNTIME; // `run` died before the command could start: start nothing.
    }
    let program = &args.command[0];
    let mut child = match tokio::process::Command::new(program).args(&args.command[1..]).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("leasehold: cannot run {}: {e}", program.to_string_lossy());
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                NOT_EXECUTABLE
            };
            return code;
        }
    };
    let mut check = tokio::time::interval(Duration::from_secs(1));
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = hangup.recv() => kill_group_if_orphaned(parent),
            _ = check.tick() => kill_group_if_orphaned(parent),
            // Sent to the whole group by `run`: the command got it too, and will exit (or be
            // killed). Stay until then.
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    let code = match status {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("leasehold: child guard: lost track of the command: {e}");
            RUNTIME
        }
    };
    end_leftovers(Duration::from_millis(args.grace_ms)).await;
    code
}

/// `run` is gone: nobody renews the lease any more, so nothing in the group may go on.
fn kill_group_if_orphaned(parent: Pid) {
    if getppid() != parent {
        let _ = killpg(getpgrp(), Signal::SIGKILL);
        // Not reached: the guard is in the group.
        std::process::exit(137);
    }
}

/// Ends every other live process of the guard's group (what the command left running in the
/// background): SIGTERM, then SIGKILL to those still there after `grace`.
async fn end_leftovers(grace: Duration) {
    let group = getpgrp();
    if group_members(group).is_empty() {
        return;
    }
    let _ = killpg(group, Signal::SIGTERM); // the guard itself ignores it
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if group_members(group).is_empty() {
            return;
        }
    }
    for pid in group_members(group) {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// The live processes of `group` other than this one, from `/proc`.
fn group_members(group: Pid) -> Vec<Pid> {
    let me = getpid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw)
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
                .is_some_and(|(state, pgrp)| pgrp == group.as_raw() && !matches!(state, 'Z' | 'X' | 'x'))
        })
        .collect()
}

/// The state and process group from the text of `/proc/PID/stat`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        assert_eq!(parse_stat("42 (sh) S 1 40 40 0 -1"), Some(('S', 40)));
        assert_eq!(parse_stat("42 (a) (b) c) Z 1 7 7"), Some(('Z', 7)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_group_is_found_without_self() {
        assert!(!group_members(getpgrp()).contains(&getpid()));
    }
}
