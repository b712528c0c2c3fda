//! The child guard: `leasehold __child-guard --parent PID --grace-ms MS [--cgroup DIR] -- CMD...`.
//!
//! `run` starts this binary again in this mode, as the leader of a new process group, instead
//! of starting the command itself. The guard:
//!
//! 1. takes over SIGHUP, SIGTERM and SIGINT (a handler, not the default action), so that the
//!    SIGTERM that `run` sends to the command's tree does not end the guard before the command;
//! 2. becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`): whatever the command forks, however
//!    it detaches (`setsid`, a double fork), stays a descendant of the guard;
//! 3. asks the kernel for a SIGHUP when its parent dies (`PR_SET_PDEATHSIG`; the parent thread
//!    is `run`'s main thread, which lives as long as the process), then checks that the parent
//!    is still the one that started it (it may have died before the request);
//! 4. starts the command, in the cgroup leaf `run` made when there is one (the guard moves itself
//!    into the leaf for the fork and back out to its own cgroup right after, so the command is
//!    born in the leaf and the guard is not in it), and waits for it. `run` starts the guard of
//!    its next term before the election (`--prestarted`): the guard then starts, in the leaf,
//!    this binary as `__exec-when-elected`, which waits for `run`'s word (the term's environment
//!    and `run`'s stdin, over a socket that was the guard's stdin) and execs the command in
//!    place; without the word it runs nothing (see `child::Prestarted`);
//! 5. if the parent dies meanwhile (SIGHUP and `getppid()` changed, or the once-a-second check
//!    sees it), kills the whole tree with SIGKILL until nothing of it is left, and exits;
//! 6. when the command exits, ends what it left behind (SIGTERM, then SIGKILL after the grace,
//!    for a bounded time), and exits with the command's status (128 + N for a signal N); `run`
//!    then checks that the tree is empty before it releases the lease.
//!
//! All of it through safe wrappers (`nix`, `rustix`, tokio): the workspace forbids `unsafe`,
//! which a `pre_exec` hook in the command itself would need.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::prctl::{set_child_subreaper, set_pdeathsig};
use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};
use tokio::signal::unix::{SignalKind, signal};

use crate::child::exit_code;
use crate::exit::{NOT_EXECUTABLE, NOT_FOUND, RUNTIME};
use crate::tree::{Cgroup, Tree, list};

/// How long the guard keeps sending SIGKILL to what the command left behind before it exits
/// anyway and leaves the rest to `run`.
const LEFTOVER_KILL_LIMIT: Duration = Duration::from_secs(1);

/// The arguments of the hidden `__child-guard` subcommand.
#[derive(Debug, Args)]
pub(crate) struct GuardArgs {
    /// The pid of the `leasehold run` process that started this guard.
    #[arg(long)]
    parent: i32,
    /// How long leftovers of the command get between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 2000)]
    grace_ms: u64,
    /// The cgroup v2 leaf to run the command in (made by `run`).
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
    /// Say nothing about what the command left behind (`run -q`).
    #[arg(long)]
    quiet: bool,
    /// Start log lines with the time (as `run` does).
    #[arg(long)]
    timestamps: bool,
    /// Pre-started before the election: the command is exec'd only when `run` sends the word
    /// through this process's stdin (see `child::Prestarted`).
    #[arg(long)]
    prestarted: bool,
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
    crate::output::set_timestamps(args.timestamps);
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
    if let Err(e) = set_child_subreaper(true) {
        eprintln!("leasehold: child guard: cannot become a child subreaper: {e}");
        return RUNTIME;
    }
    if getppid() != parent {
        return RUNTIME; // `run` died before the command could start: start nothing.
    }
    // A pre-started guard's first message, before the waiting process shares the socket: where to
    // say that the command's tree is gone (see `child::Prestarted`).
    let gone = if args.prestarted {
        match receive_gone() {
            Ok(gone) => gone,
            Err(()) => return RUNTIME, // `run` closed the socket: it is gone, start nothing
        }
    } else {
        None
    };
    let mut cgroup = args.cgroup.as_ref().map(Cgroup::at);
    let program = &args.command[0];
    let mut command = if args.prestarted {
        // Waits in this binary for `run`'s word, then execs the command in place (same pid, born
        // in the leaf).
        let mut waiting = tokio::process::Command::new(crate::child::own_executable());
        waiting
            .arg0("leasehold")
            .arg(EXEC_WHEN_ELECTED)
            .arg("--")
            .args(&args.command);
        waiting
    } else {
        let mut command = tokio::process::Command::new(program);
        command.args(&args.command[1..]);
        command
    };
    // The command is born in the leaf: the guard steps into it for the fork, and back out to its
    // own cgroup right after (no process of its own in the leaf, so that the leaf empties when the
    // command's tree does). No `pre_exec` (the workspace forbids `unsafe`), and no extra exec of
    // a helper on the way to the command.
    let entered = cgroup.as_ref().and_then(|leaf| match enter_for_spawn(leaf) {
        Ok(own) => Some(own),
        Err(e) => {
            eprintln!(
                "leasehold: cannot move the command into cgroup {}: {e}; it is contained by the child \
                 subreapers only",
                leaf.path().display()
            );
            None
        }
    });
    let spawned = command.spawn();
    if let Some(own) = entered
        && let Err(e) = own.enter()
    {
        // Still in the leaf: the leaf can no longer tell when the command's tree is empty
        // (the guard is in it), so the guard follows its tree by parent pids only; `run` waits
        // for the guard's exit before it looks at the leaf.
        eprintln!(
            "leasehold: child guard: cannot leave cgroup leaf {}: {e}; following the command's \
             tree by parent pids",
            args.cgroup
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
        );
        cgroup = None;
    }
    if args.prestarted {
        // Only the waiting process keeps the socket: once it is gone, `run`'s word fails instead
        // of going nowhere.
        if let Ok(null) = std::fs::File::open("/dev/null") {
            let _ = nix::unistd::dup2_stdin(null);
        }
    }
    let tree = Tree::below_me(cgroup);
    let mut child = match spawned {
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
    let command_pid = child.id().and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
    let mut check = tokio::time::interval(Duration::from_secs(1));
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = hangup.recv() => kill_tree_if_orphaned(parent, &tree).await,
            _ = check.tick() => {
                kill_tree_if_orphaned(parent, &tree).await;
                tree.reap_children(&[command_pid]);
            }
            // Sent by `run` to the whole tree: the command got it too, and will exit (or be
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
    let leftovers = end_leftovers(&tree, Duration::from_millis(args.grace_ms)).await;
    if let Some(gone) = &gone
        && !matches!(leftovers, Some((_, Leftovers::Stuck)))
    {
        // The tree is empty: `run` may go on (it checks again) without waiting for this
        // process's exit, whose teardown and SIGCHLD come later.
        let _ = rustix::io::write(gone, b"e");
    }
    if let Some((count, how)) = leftovers
        && !args.quiet
    {
        let (noun, them) = if count == 1 {
            ("process", "it")
        } else {
            ("processes", "them")
        };
        let how = match how {
            Leftovers::Terminated => format!("ended {them} with SIGTERM"),
            Leftovers::Killed => format!("ended {them} with SIGKILL after the grace"),
            Leftovers::Stuck => format!(
                "SIGTERM, then SIGKILL for {}, did not end {them} all",
                crate::output::short(LEFTOVER_KILL_LIMIT)
            ),
        };
        crate::output::log(format_args!(
            "{} left {count} {noun} behind: {how}",
            program.to_string_lossy()
        ));
    }
    code
}

/// Reads a pre-started guard's first message from its stdin: one byte with the socket to say
/// over that the command's tree is gone (`CMSG_CLOEXEC`: the command does not inherit it). `Ok`
/// without one when it could not be read; `Err` when the socket closed (`run` is gone).
fn receive_gone() -> Result<Option<std::os::fd::OwnedFd>, ()> {
    match receive_on_stdin(&mut [0u8; 1]) {
        Ok((0, _)) => Err(()),
        Ok((_, gone)) => Ok(gone),
        Err(_) => Ok(None),
    }
}

/// Receives one message on stdin (a socket) into `buffer`: its length, and the first file
/// descriptor passed with it (`CMSG_CLOEXEC`: an exec'd command does not inherit it).
fn receive_on_stdin(buffer: &mut [u8]) -> rustix::io::Result<(usize, Option<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    use std::os::fd::AsFd;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let stdin = std::io::stdin();
    let bytes = loop {
        match recvmsg(
            stdin.as_fd(),
            &mut [std::io::IoSliceMut::new(buffer)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?.bytes,
        }
    };
    let mut passed = None;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            passed = passed.or(fds.next());
        }
    }
    Ok((bytes, passed))
}

/// The hidden first argument of the process that waits for `run`'s word (`child::Prestarted`).
pub(crate) const EXEC_WHEN_ELECTED: &str = "__exec-when-elected";

/// `leasehold __exec-when-elected -- CMD...`, started by a pre-started guard, stdin a socket from
/// `run`: waits for one message (the environment to add, `KEY=VALUE` each ended by a NUL, and
/// `run`'s stdin as a file descriptor), then execs CMD with them. Runs nothing, and exits 0, when
/// the socket closes without a message. No runtime and no argument parser: this is on the way
/// from the election to the command.
pub(crate) fn exec_when_elected(args: &[OsString]) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let command = match args.first() {
        Some(first) if first == "--" => &args[1..],
        _ => args,
    };
    let Some(program) = command.first() else {
        eprintln!("leasehold: {EXEC_WHEN_ELECTED}: no command");
        return RUNTIME;
    };
    // Found in PATH now, while waiting, not after the word: the exec is then one system call
    // instead of one per PATH entry before the command's. The environment added by the word has
    // no PATH (`run` sends LEASEHOLD_* only); should the file be gone by then, the exec falls back
    // to a PATH search of its own.
    let found = if program.as_encoded_bytes().contains(&b'/') {
        None
    } else {
        crate::child::find_in_path(program)
    };
    let mut buffer = vec![0u8; 64 * 1024];
    let (bytes, passed) = match receive_on_stdin(&mut buffer) {
        Ok((0, _)) => return 0, // never elected: `run` closed the socket
        Ok(received) => received,
        Err(e) => {
            eprintln!("leasehold: {EXEC_WHEN_ELECTED}: cannot read the word to start: {e}");
            return RUNTIME;
        }
    };
    let env: Vec<(&std::ffi::OsStr, &std::ffi::OsStr)> = buffer[..bytes]
        .split(|b| *b == 0)
        .filter_map(|pair| {
            let at = pair.iter().position(|b| *b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&pair[..at]),
                std::ffi::OsStr::from_bytes(&pair[at + 1..]),
            ))
        })
        .collect();
    // The command's stdin is `run`'s (or /dev/null when `run` had none), not this socket.
    let replaced = match passed {
        Some(fd) => nix::unistd::dup2_stdin(fd),
        None => std::fs::File::open("/dev/null")
            .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(0)))
            .and_then(nix::unistd::dup2_stdin),
    };
    if let Err(e) = replaced {
        eprintln!("leasehold: {EXEC_WHEN_ELECTED}: cannot set the command's stdin: {e}");
        return RUNTIME;
    }
    if let Some(found) = found
        && !env.iter().any(|(key, _)| *key == "PATH")
    {
        // Returns only when it failed.
        let _ = std::process::Command::new(found)
            .arg0(program)
            .args(&command[1..])
            .envs(env.iter().copied())
            .exec();
    }
    let error = std::process::Command::new(program).args(&command[1..]).envs(env).exec();
    eprintln!("leasehold: cannot run {}: {error}", program.to_string_lossy());
    if error.kind() == std::io::ErrorKind::NotFound {
        NOT_FOUND
    } else {
        NOT_EXECUTABLE
    }
}

/// Moves the guard into `leaf` (what it forks next is born there); returns the cgroup to move
/// back to: the leaf's parent, where `run` made it, which is the guard's own (inherited from `run`).
fn enter_for_spawn(leaf: &Cgroup) -> std::io::Result<Cgroup> {
    let own = leaf
        .path()
        .parent()
        .map(Cgroup::at)
        .ok_or_else(|| std::io::Error::other("the leaf has no parent cgroup"))?;
    // Checked first, so that a guard that could not step back out never steps in.
    std::fs::OpenOptions::new()
        .write(true)
        .open(own.path().join("cgroup.procs"))?;
    leaf.enter()?;
    Ok(own)
}

/// `run` is gone: nobody renews the lease any more, so nothing of the tree may go on. Kills it
/// until it is empty (however long that takes: nobody else will), then exits.
async fn kill_tree_if_orphaned(parent: Pid, tree: &Tree) {
    if getppid() == parent {
        return;
    }
    let limit = Instant::now() + LEFTOVER_KILL_LIMIT;
    if let Err(left) = tree.kill_until_empty(Some(limit), &[]).await {
        eprintln!(
            "leasehold: child guard: `leasehold run` is gone; {} still alive after SIGKILL; \
             killing until they are gone",
            list(&left)
        );
        let _ = tree.kill_until_empty(None, &[]).await;
    }
    if let Some(cgroup) = tree.cgroup() {
        cgroup.remove();
    }
    std::process::exit(137);
}

/// How the processes the command left behind ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leftovers {
    Terminated,
    Killed,
    /// Still there after [`LEFTOVER_KILL_LIMIT`] of SIGKILLs: `run` takes over.
    Stuck,
}

/// Ends what the command left behind (anything still in the tree): SIGTERM, then SIGKILL to
/// what is still there after `grace`, for at most [`LEFTOVER_KILL_LIMIT`]. `run` deals with
/// what survives even that. How many there were, and how they ended, if there were any.
async fn end_leftovers(tree: &Tree, grace: Duration) -> Option<(usize, Leftovers)> {
    if tree.wait_empty(Instant::now(), &[], &[]).await {
        return None;
    }
    let found = tree.signal(Signal::SIGTERM, &[]).len();
    if tree.wait_empty(Instant::now() + grace, &[], &[]).await {
        return Some((found, Leftovers::Terminated));
    }
    let killed = tree
        .kill_until_empty(Some(Instant::now() + LEFTOVER_KILL_LIMIT), &[])
        .await;
    Some((
        found,
        if killed.is_ok() {
            Leftovers::Killed
        } else {
            Leftovers::Stuck
        },
    ))
}
