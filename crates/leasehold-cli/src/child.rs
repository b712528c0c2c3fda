//! The command's process tree, as `run` sees it.
//!
//! `run` does not start the command itself: it starts `leasehold __child-guard` (this binary
//! again, see `guard.rs`) as the leader of a new process group, and the guard starts the command.
//! Both `run` and the guard are child subreapers, and the command runs in a cgroup v2 leaf where
//! one can be made (see `tree.rs`), so every process the command starts stays within reach: the
//! tree is everything below `run`, plus everything in the leaf. `shards run` runs one command per
//! owned shard the same way; each command's tree is then its guard's subtree (and its leaf),
//! see [`Tree`].

use std::ffi::{OsStr, OsString};
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use crate::exit::{Failure, NOT_EXECUTABLE, NOT_FOUND};
use crate::tree::{Cgroup, Process, Tree, guard_gone, guard_started};

/// How long SIGKILL is sent again and again before the processes still there are reported (they
/// are most likely in uninterruptible sleep); the killing goes on after that.
pub(crate) const STUCK_AFTER: Duration = Duration::from_millis(100);

/// A running command tree. Dropping it without having seen the tree empty sends SIGKILL to
/// everything in it at once: that is what happens when the engine aborts the leader's work at
/// `valid_until`.
#[derive(Debug)]
pub(crate) struct CommandGroup {
    guard: tokio::process::Child,
    guard_pid: i32,
    /// The guard's exit status, once reaped.
    status: Option<ExitStatus>,
    tree: Tree,
    /// Whether the tree was seen empty.
    emptied: bool,
    /// A pre-started guard's word that the command's tree is gone (one byte), which comes before
    /// its exit; `None` once the guard closed it without a word, and for other guards.
    gone: Option<tokio::net::UnixStream>,
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Every process of the command ended after SIGTERM.
    Terminated,
    /// SIGKILL was needed (the grace ran out, or there was no time left for one).
    Killed,
}

/// What a stop did.
#[derive(Debug)]
pub(crate) struct Stop {
    pub(crate) how: Stopped,
    /// How many processes the command's tree had when the stop began.
    pub(crate) processes: usize,
}

impl CommandGroup {
    /// Starts `command` under a child guard in a new process group, with `env` added, in
    /// `cgroup` if given.
    pub(crate) fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        grace: Duration,
        cgroup: Option<Cgroup>,
        quiet: bool,
    ) -> Result<Self, Failure> {
        Self::spawn_guard(command, env, grace, cgroup, quiet, None)
    }

    /// Starts the guard; with `control`, the guard is pre-started: the command waits, exec'd only
    /// when [`Prestarted::go`] says so through `control` (the guard's stdin).
    fn spawn_guard(
        command: &[OsString],
        env: &[(&str, String)],
        grace: Duration,
        cgroup: Option<Cgroup>,
        quiet: bool,
        control: Option<OwnedFd>,
    ) -> Result<Self, Failure> {
        let mut guard = tokio::process::Command::new(own_executable());
        guard
            .arg0("leasehold")
            .arg("__child-guard")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string());
        if let Some(cgroup) = &cgroup {
            guard.arg("--cgroup").arg(cgroup.path());
        }
        if quiet {
            guard.arg("--quiet");
        }
        if crate::output::timestamps() {
            guard.arg("--timestamps");
        }
        if let Some(control) = control {
            guard.arg("--prestarted").stdin(Stdio::from(control));
        }
        guard
            .arg("--")
            .args(command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .kill_on_drop(false);
        let guard = guard
            .spawn()
            .map_err(|e| Failure::runtime(format!("cannot start the child guard: {e}")))?;
        let guard_pid = guard
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| Failure::runtime("the child guard exited at once"))?;
        // Before any await: no other command's tree may take the new guard for an orphan.
        guard_started(guard_pid);
        Ok(CommandGroup {
            guard,
            guard_pid,
            status: None,
            tree: Tree::of_guard(guard_pid, cgroup),
            emptied: false,
            gone: None,
        })
    }

    /// The process group id (the guard's pid).
    pub(crate) fn pgid(&self) -> i32 {
        self.guard_pid
    }

    /// The cgroup leaf the command runs in, if any.
    pub(crate) fn cgroup(&self) -> Option<&Path> {
        self.tree.cgroup().map(Cgroup::path)
    }

    /// Waits until the guard exits: after the command exited and the guard ended what it left
    /// behind, or because the guard was killed. Cancel safe.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let status = match self.guard.wait().await {
            Ok(status) => status,
            // Only if the child was already reaped elsewhere; treat as killed.
            Err(_) => ExitStatus::from_raw(Signal::SIGKILL as i32),
        };
        self.status = Some(status);
        guard_gone(self.guard_pid);
        self.tree.guard_reaped();
        status
    }

    /// Sends `signal` to the guard's process group (the guard, and the command unless it left
    /// the group). Only while the guard is not reaped: until then its pid, the group's id, cannot
    /// name another group. The group's id when sent.
    fn signal_group(&self, signal: Signal) -> Option<i32> {
        if self.status.is_some() {
            return None;
        }
        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.guard_pid), signal)
            .ok()
            .map(|()| self.guard_pid)
    }

    /// Pids that only tokio may reap.
    fn tokio_reaps(&self) -> Vec<i32> {
        if self.status.is_some() {
            Vec::new()
        } else {
            vec![self.guard_pid]
        }
    }

    /// Stops the tree: SIGTERM to every process of it now and SIGKILL `grace` later, but SIGKILL
    /// no later than `kill_by`, and at once when `kill_by` has passed (a process that was paused
    /// past its lease) or `hurry` is cancelled. SIGKILL is repeated until nothing is left.
    ///
    /// Returns once the tree is empty, or with what is left [`STUCK_AFTER`] into the SIGKILLs
    /// (then call [`CommandGroup::clear`] to go on killing).
    pub(crate) async fn stop(
        &mut self,
        grace: Duration,
        kill_by: Option<Instant>,
        hurry: &CancellationToken,
    ) -> Result<Stop, (Stop, Vec<Process>)> {
        let now = Instant::now();
        let kill_at = kill_by.map_or(now, |by| by.min(now + grace));
        let guard = [self.guard_pid];
        let graceful = kill_at > now && !hurry.is_cancelled();
        // One scan for both: the count, and the processes that get SIGTERM.
        let processes = if graceful {
            // The command's process group first, by the kernel in one step (before any look at
            // `/proc`, and atomic with the group's forks); then, found by the tree, what left the
            // group (`setsid`, `setpgid`). The guard, in the group, ignores it.
            let sent = self.signal_group(Signal::SIGTERM);
            // The group's processes were woken to die, most likely on this CPU: they go first
            // (`sched_yield`), the look for what left the group after.
            std::thread::yield_now();
            self.tree.signal_quickly(Signal::SIGTERM, &guard, sent).len()
        } else {
            self.tree.members().iter().filter(|p| p.pid != self.guard_pid).count()
        };
        if graceful {
            // The guard exits by itself once the command has exited and what it left behind has
            // ended: its exit (SIGCHLD, not a timer) is the moment to look at the tree. A
            // pre-started guard says so before it exits: then the tree is checked at once, the
            // guard aside (it runs nothing more; it is reaped later, see `reap_later`).
            let mut gone = self.gone.take();
            let status = loop {
                tokio::select! {
                    status = self.wait() => break Some(status),
                    () = said_gone(&mut gone) => {
                        if self.tree.surely_empty_but_guard(self.guard_pid) {
                            self.emptied = true;
                            return Ok(Stop {
                                how: Stopped::Terminated,
                                processes,
                            });
                        }
                    }
                    () = tokio::time::sleep_until(kill_at.into()) => break None,
                    () = hurry.cancelled() => break None,
                }
            };
            if status.is_some() {
                // Seen empty in two scans begun after the guard's exit; else (a guard killed by
                // someone else leaves its tree behind) what got SIGTERM has the rest of the grace.
                let emptied = self.tree.is_empty_now(&[])
                    || tokio::select! {
                        emptied = self.tree.wait_empty(kill_at, &[], &[]) => emptied,
                        () = hurry.cancelled() => false,
                    };
                if emptied {
                    self.emptied = true;
                    return Ok(Stop {
                        how: Stopped::Terminated,
                        processes,
                    });
                }
            }
        }
        let reap = self.tokio_reaps();
        let killed = self
            .tree
            .kill_until_empty(Some(Instant::now() + STUCK_AFTER), &reap)
            .await;
        let stop = Stop {
            how: Stopped::Killed,
            processes,
        };
        match killed {
            Ok(()) => {
                // The guard was SIGKILLed with the rest (or had just exited): reaped at once.
                self.wait().await;
                self.emptied = true;
                Ok(stop)
            }
            Err(left) => Err((stop, left)),
        }
    }

    /// Drops the group once its guard is reaped: after a stop that saw the tree empty on the
    /// guard's word, the guard is still exiting, and stays listed as a guard (not taken for a
    /// leftover by a next term's check) until then. In a task of its own: the lease is released
    /// meanwhile.
    pub(crate) fn reap_later(mut self) {
        if self.status.is_some() || !self.emptied {
            return;
        }
        tokio::spawn(async move {
            let _ = tokio::time::timeout(STUCK_AFTER * 10, self.wait()).await;
        });
    }

    /// Kills what is left of the tree (SIGKILL, again and again) until it is empty (`Ok` with
    /// how many processes there were) or `until` passes (`Err` with what is left). Forever
    /// without `until`.
    pub(crate) async fn clear(&mut self, until: Option<Instant>) -> Result<usize, Vec<Process>> {
        let found = self.tree.members().len();
        let reap = self.tokio_reaps();
        self.tree.kill_until_empty(until, &reap).await?;
        self.emptied = true;
        Ok(found)
    }
}

/// A child guard started before the election, with its command waiting to be exec'd (in the
/// cgroup leaf already, where there is one): what is left to do once elected is one message and
/// an exec, instead of a leaf, two exec's of this binary, a runtime and a cgroup migration (about
/// 10 ms: the kernel waits for an RCU grace period on the first move of a process into a
/// cgroup). Nothing of the command runs before [`Prestarted::go`]: the waiting process is this
/// binary (`__exec-when-elected`), which execs the command only on the message `go` sends, and
/// exits without running anything when the message never comes (its socket closes).
#[derive(Debug)]
pub(crate) struct Prestarted {
    group: CommandGroup,
    /// `run`'s end of the guard's stdin, a `SOCK_SEQPACKET` socket shared by the waiting process.
    control: OwnedFd,
}

impl Prestarted {
    /// Starts the guard and the waiting process for `command`.
    pub(crate) fn start(
        command: &[OsString],
        grace: Duration,
        cgroup: Option<Cgroup>,
        quiet: bool,
    ) -> Result<Self, Failure> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
        let (control, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| Failure::runtime(format!("cannot make the child guard's socket: {e}")))?;
        let mut group = CommandGroup::spawn_guard(command, &[], grace, cgroup, quiet, Some(theirs))?;
        // The guard's first message, read before it starts the waiting process: a socket to say
        // over that the command's tree is gone. Without it the guard's exit is waited for. Not
        // sent (other than to a guard already gone, which `go` notices), the guard would take the
        // start message for it: this guard is dropped (killed: it has started nothing) instead.
        group.gone = give_gone(&control)
            .map_err(|e| Failure::runtime(format!("cannot send the child guard its first message: {e}")))?;
        Ok(Prestarted { group, control })
    }

    /// The process group id (the guard's pid).
    pub(crate) fn pgid(&self) -> i32 {
        self.group.guard_pid
    }

    /// Execs the command with `env` added, and this process's stdin as its stdin. `Err` with the
    /// group (to [`Prestarted::discard`]) when the waiting process is gone: nothing was started.
    pub(crate) fn go(mut self, env: &[(&str, String)]) -> Result<CommandGroup, Box<Prestarted>> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
        if let Ok(Some(_)) = self.group.guard.try_wait() {
            return Err(Box::new(self));
        }
        // A leading NUL (skipped by the reader, as an entry without '='): never an empty message,
        // which the waiting process could not tell from the socket's end (both read 0 bytes).
        let mut message = vec![0];
        for (key, value) in env {
            message.extend_from_slice(key.as_bytes());
            message.push(b'=');
            message.extend_from_slice(value.as_bytes());
            message.push(0);
        }
        // The command's stdin is this process's, as for a command started directly (a closed
        // stdin: none is passed, and the command gets /dev/null).
        let stdin = std::io::stdin().as_fd().try_clone_to_owned().ok();
        let fds: Vec<_> = stdin.iter().map(AsFd::as_fd).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut ancillary = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            ancillary.push(SendAncillaryMessage::ScmRights(&fds));
        }
        let sent = sendmsg(
            &self.control,
            &[IoSlice::new(&message)],
            &mut ancillary,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        );
        match sent {
            Ok(_) => Ok(self.group),
            Err(_) => Err(Box::new(self)),
        }
    }

    /// Ends the guard and its waiting process (nothing of the command ever ran), and waits until
    /// they are gone.
    pub(crate) async fn discard(self) {
        let Prestarted { mut group, control } = self;
        drop(control); // the waiting process reads the end of its socket and exits
        let _ = group.clear(Some(Instant::now() + STUCK_AFTER)).await;
        group.wait().await;
    }
}

/// Sends the guard, through `control`, its first message: one byte, with one end of a new socket
/// for [`said_gone`] (this process's end returned). Sent also when no socket can be made (then
/// without one): the guard reads this message before it starts the waiting process, which would
/// otherwise take `run`'s word for it. `Err` when it could not be sent to a guard still there.
fn give_gone(control: &OwnedFd) -> rustix::io::Result<Option<tokio::net::UnixStream>> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let pair = std::os::unix::net::UnixStream::pair().ok().and_then(|(ours, theirs)| {
        ours.set_nonblocking(true).ok()?;
        Some((tokio::net::UnixStream::from_std(ours).ok()?, theirs))
    });
    let sent = {
        let fds: Vec<_> = pair.iter().map(|(_, theirs)| theirs.as_fd()).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut ancillary = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            ancillary.push(SendAncillaryMessage::ScmRights(&fds));
        }
        sendmsg(
            control,
            &[IoSlice::new(b"g")],
            &mut ancillary,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        )
    };
    // This process's copy of the guard's end is closed here: the guard's is the only one.
    match sent {
        Ok(_) => Ok(pair.map(|(ours, _)| ours)),
        Err(rustix::io::Errno::PIPE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Returns when the guard says that the command's tree is gone; never when it closes its end
/// without a word (it exited or died: its exit is waited for instead), nor without a socket.
/// Cancel safe.
async fn said_gone(gone: &mut Option<tokio::net::UnixStream>) {
    use tokio::io::AsyncReadExt;
    if let Some(stream) = gone {
        let mut byte = [0u8; 1];
        if let Ok(1) = stream.read(&mut byte).await {
            return;
        }
        *gone = None;
    }
    std::future::pending().await
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        if !self.emptied {
            // The engine's Deposed event (`aborted`) is logged instead.
            self.tree.signal(Signal::SIGKILL, &[]);
        }
        // Not reaped (tokio reaps a dropped child): what is left is nobody's now. (A reaped
        // guard was unlisted then, and its pid may be another command's guard's by now.)
        if self.status.is_none() {
            guard_gone(self.guard_pid);
        }
        if let Some(cgroup) = self.tree.cgroup() {
            cgroup.remove(); // refused while a process is still in it
        }
    }
}

/// This very binary, also after it was replaced on disk by an upgrade.
pub(crate) fn own_executable() -> PathBuf {
    let proc = Path::new("/proc/self/exe");
    if proc.exists() {
        proc.to_path_buf()
    } else {
        std::env::current_exe().unwrap_or_else(|_| "leasehold".into())
    }
}

/// The exit code a shell would report for `status`: the code, or 128 + the signal number.
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Describes `status` for a log line.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("was killed by {signal}"),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, None) => "ended".to_string(),
    }
}

/// Checks before campaigning that `program` can be executed, as a shell would find it, so that
/// a typo fails at once with 127 (or 126) instead of after winning the lease.
pub(crate) fn check_program(program: &OsString) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    let name = Path::new(program);
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let shown = name.display();
    if program.as_encoded_bytes().contains(&b'/') {
        return match name.metadata() {
            Err(e) => Err(Failure::new(NOT_FOUND, format!("cannot run {shown}: {e}"))),
            Ok(_) if executable(name) => Ok(()),
            Ok(_) => Err(Failure::new(
                NOT_EXECUTABLE,
                format!("cannot run {shown}: not an executable file"),
            )),
        };
    }
    if find_in_path(program).is_some() {
        Ok(())
    } else {
        Err(Failure::new(NOT_FOUND, format!("command not found: {shown}")))
    }
}

/// Where a shell would find `program` (a name without '/') in `PATH`: the first regular file
/// with an execute bit.
pub(crate) fn find_in_path(program: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(describe(ExitStatus::from_raw(15)), "was killed by SIGTERM");
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exited with status 3");
    }

    #[test]
    fn programs_are_checked_like_a_shell() {
        assert!(check_program(&"sh".into()).is_ok());
        assert!(check_program(&"/bin/sh".into()).is_ok());
        assert_eq!(
            check_program(&"no-such-command-xyz".into()).unwrap_err().code,
            NOT_FOUND
        );
        assert_eq!(check_program(&"/no/such/file".into()).unwrap_err().code, NOT_FOUND);
        assert_eq!(
            check_program(&"/etc/passwd".into()).map_err(|f| f.code).err(),
            Some(NOT_EXECUTABLE)
        );
    }
}
