//! The leader's command, as `run` sees it: a process group headed by the child guard.
//!
//! `run` never starts the command itself. It starts `leasehold __child-guard` (this binary again,
//! see `guard.rs`) as the leader of a new process group, and the guard starts the command inside
//! that group. So the group's id is the guard's pid, which stays reserved until `run` reaps the
//! guard: signalling the group can never hit an unrelated process.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

use crate::exit::{Failure, NOT_EXECUTABLE, NOT_FOUND};

/// A running command group. Dropping it without having seen the guard exit kills the group
/// with SIGKILL at once: that is what happens when the engine aborts the leader's work at
/// `valid_until`.
#[derive(Debug)]
pub(crate) struct CommandGroup {
    guard: tokio::process::Child,
    pgid: Pid,
    reaped: bool,
    /// What to print on stderr if the group has to be killed on drop (`None`: nothing).
    drop_notice: Option<String>,
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The command exited after SIGTERM.
    Terminated,
    /// SIGKILL was needed (the grace ran out, or there was no time left for one).
    Killed,
}

impl CommandGroup {
    /// Starts `command` under a child guard in a new process group, with `env` added.
    pub(crate) fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        grace: Duration,
        drop_notice: Option<String>,
    ) -> Result<Self, Failure> {
        let mut guard = tokio::process::Command::new(Self::own_executable());
        guard
            .arg0("leasehold")
            .arg("__child-guard")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string())
            .arg("--")
            .args(command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .kill_on_drop(false);
        let guard = guard
            .spawn()
            .map_err(|e| Failure::runtime(format!("cannot start the child guard: {e}")))?;
        let pid = guard
            .id()
            .ok_or_else(|| Failure::runtime("the child guard exited at once"))?;
        let pgid = Pid::from_raw(i32::try_from(pid).map_err(|_| Failure::runtime("pid out of range"))?);
        Ok(CommandGroup {
            guard,
            pgid,
            reaped: false,
            drop_notice,
        })
    }

    /// This very binary, also after it was replaced on disk by an upgrade.
    fn own_executable() -> PathBuf {
        let proc = Path::new("/proc/self/exe");
        if proc.exists() {
            proc.to_path_buf()
        } else {
            std::env::current_exe().unwrap_or_else(|_| "leasehold".into())
        }
    }

    /// The process group id (the guard's pid).
    pub(crate) fn pgid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Waits until the guard exits, which it does once the command and everything else in its
    /// group has ended. Cancel safe.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        let status = match self.guard.wait().await {
            Ok(status) => status,
            // Only if the child was already reaped elsewhere; treat as killed.
            Err(_) => ExitStatus::from_raw(Signal::SIGKILL as i32),
        };
        self.reaped = true;
        status
    }

    /// Stops the group: SIGTERM now and SIGKILL `grace` later, but SIGKILL no later than
    /// `kill_by`, and at once when `kill_by` has passed (a process that was paused past its
    /// lease) or `hurry` is cancelled. Returns once the guard has exited.
    pub(crate) async fn stop(
        &mut self,
        grace: Duration,
        kill_by: Option<Instant>,
        hurry: &CancellationToken,
    ) -> (Stopped, ExitStatus) {
        let now = Instant::now();
        let kill_at = kill_by.map_or(now, |by| by.min(now + grace));
        if kill_at <= now || hurry.is_cancelled() {
            self.signal(Signal::SIGKILL);
            return (Stopped::Killed, self.wait().await);
        }
        self.signal(Signal::SIGTERM);
        tokio::select! {
            status = self.wait() => return (Stopped::Terminated, status),
            () = tokio::time::sleep_until(kill_at.into()) => {}
            () = hurry.cancelled() => {}
        }
        self.signal(Signal::SIGKILL);
        (Stopped::Killed, self.wait().await)
    }

    fn signal(&self, signal: Signal) {
        if !self.reaped {
            // ESRCH (the group is already gone) is fine.
            let _ = killpg(self.pgid, signal);
        }
    }
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(Signal::SIGKILL);
            if let Some(notice) = &self.drop_notice {
                eprintln!("leasehold: {notice}");
            }
        }
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
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|dir| executable(&dir.join(name))) {
        Ok(())
    } else {
        Err(Failure::new(NOT_FOUND, format!("command not found: {shown}")))
    }
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
