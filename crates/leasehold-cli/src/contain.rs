//! One command run for one leadership, contained: what `run` (one lease) and `shards run` (one
//! command per owned shard) share. The command is started under a child guard in its own process
//! group (and cgroup v2 leaf, where one can be made), stopped before the lease can pass on when
//! leadership ends, and never started next to what an earlier run left alive.
//!
//! The timing, for a leader whose renewals stop succeeding (see docs/cli.md):
//!
//! ```text
//! sent ─ renew ─ ... ─ cancel ─────────── SIGKILL ── slack ── valid_until ... store may re-grant
//!                      SIGTERM  kill_grace                     (sent + ttl × (1 − drift))
//!                      └──────── step_down_margin ───────────┘
//! ```
//!
//! The engine cancels the leader's work at `valid_until - step_down_margin` at the latest; the
//! margin is set to `kill_grace + slack`, so SIGKILL goes out `slack` before `valid_until`.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Leader, LeaseName};
use tokio_util::sync::CancellationToken;

use crate::child::{CommandGroup, Prestarted, STUCK_AFTER, Stopped};
use crate::exit::Failure;
use crate::output::{self, short};
use crate::tree::{Cgroup, Process, Tree, list};

/// The longest kill grace used when none is given.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
/// The longest safety slack between SIGKILL and `valid_until`.
const MAX_SLACK: Duration = Duration::from_millis(200);

/// When the command is stopped, relative to the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KillTiming {
    /// Between SIGTERM and SIGKILL.
    pub(crate) grace: Duration,
    /// Between SIGKILL and `valid_until`: the time for the kernel to end the group, and for
    /// this process to be scheduled at all on a busy machine.
    pub(crate) slack: Duration,
}

impl KillTiming {
    /// The kill timing for a `ttl`, with the grace asked for (or the default).
    pub(crate) fn new(ttl: Duration, grace: Option<Duration>) -> Self {
        KillTiming {
            grace: grace.unwrap_or(DEFAULT_KILL_GRACE.min(ttl / 5)),
            slack: MAX_SLACK.min(ttl / 10),
        }
    }

    /// The engine's `step_down_margin`: leadership that is not renewed ends this long before
    /// `valid_until`, so the command is gone `slack` before it.
    pub(crate) fn step_down_margin(&self) -> Duration {
        self.grace + self.slack
    }

    /// Checks that a stop fits in the lease after the last renewal that can be attempted:
    /// `kill_grace + slack < ttl × (1 − drift) − renew_every`.
    pub(crate) fn check(&self, timing: &leasehold::Timing) -> Result<(), Failure> {
        let room = timing.believed_ttl().saturating_sub(timing.renew_every);
        if self.step_down_margin() < room {
            return Ok(());
        }
        Err(Failure::usage(format!(
            "--kill-grace {} does not fit in --ttl {}: the command must be gone before the lease can \
             expire, which needs kill_grace + {} slack < ttl × (1 − drift) − renew_every = {}; \
             lower --kill-grace or raise --ttl",
            short(self.grace),
            short(timing.ttl),
            short(self.slack),
            short(room),
        )))
    }
}

/// How the commands of one `leasehold` process are run and stopped.
#[derive(Debug)]
pub(crate) struct Containment {
    /// The command and its arguments.
    pub(crate) command: Vec<OsString>,
    /// The command's name, for the line that says how it is contained.
    program: String,
    pub(crate) kill: KillTiming,
    quiet: bool,
    no_cgroup: bool,
    /// Cancelled by a second signal: kill the command now.
    hurry: CancellationToken,
    /// Whether the containment (cgroup or subreapers only) was said.
    said: AtomicBool,
    /// Whether stale leaves of dead `leasehold` processes were swept.
    swept: AtomicBool,
}

impl Containment {
    pub(crate) fn new(
        command: Vec<OsString>,
        kill: KillTiming,
        quiet: bool,
        no_cgroup: bool,
        hurry: CancellationToken,
    ) -> Self {
        let program = command
            .first()
            .map_or_else(|| "leasehold".into(), |c| c.to_string_lossy().into_owned());
        Containment {
            command,
            program,
            kill,
            quiet,
            no_cgroup,
            hurry,
            said: AtomicBool::new(false),
            swept: AtomicBool::new(false),
        }
    }

    /// Work done before campaigning that would otherwise come between the election and the
    /// command's start: sweeping the stale cgroup leaves of dead `leasehold` processes.
    pub(crate) fn prepare(&self) {
        if !self.command.is_empty() && !self.no_cgroup && !self.swept.swap(true, Ordering::SeqCst) {
            Cgroup::sweep_stale();
        }
    }

    /// The command's name, for log lines.
    pub(crate) fn program(&self) -> &str {
        &self.program
    }

    /// The last check before the side effect of starting the command: the lease is valid for
    /// longer than a stop takes. `false` (once leadership has ended) when it is not.
    pub(crate) async fn lease_fits(&self, leader: &Leader) -> bool {
        if leader.ensure_valid(self.kill.step_down_margin()).is_ok() {
            return true;
        }
        leader.cancelled().await;
        false
    }

    /// Kills what earlier runs left alive (processes in uninterruptible sleep that outlived
    /// their stop, orphans of a guard that died) before `name` starts: the command never runs
    /// next to them. `false` when leadership ended first.
    pub(crate) async fn clear_earlier(&self, leader: &Leader, name: &str) -> bool {
        let earlier = Tree::below_me(None);
        if earlier.surely_empty() {
            return true;
        }
        let left = earlier.members();
        if left.is_empty() {
            return true;
        }
        self.log(format_args!(
            "{} of an earlier term still alive; killing them before starting {name}",
            list(&left),
        ));
        tokio::select! {
            _ = earlier.kill_until_empty(None, &[]) => true,
            () = leader.cancelled() => false,
        }
    }

    /// Starts the command as `name` for `leader`'s term, with `env` added, in a cgroup v2 leaf
    /// called `leaf` where one can be made, and says so.
    pub(crate) fn start(
        &self,
        leader: &Leader,
        name: &str,
        env: &[(&str, String)],
        leaf: &str,
    ) -> Result<CommandGroup, Failure> {
        let cgroup = self.leaf(leaf);
        let group = CommandGroup::spawn(&self.command, env, self.kill.grace, cgroup, self.quiet)?;
        let place = match group.cgroup() {
            Some(dir) => format!("process group {}, cgroup {}", group.pgid(), dir.display()),
            None => format!("process group {}", group.pgid()),
        };
        self.log(format_args!("started {name} ({place}) at term {}", leader.term()));
        Ok(group)
    }

    /// Starts a guard and its waiting process before the election (see [`Prestarted`]), in a
    /// cgroup v2 leaf `leasehold-PID-rN` where one can be made. `None` when that fails: the
    /// command is then started the usual way once elected.
    pub(crate) fn prestart(&self) -> Option<Prestarted> {
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if self.command.is_empty() {
            return None;
        }
        let run = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
        let cgroup = self.leaf(&format!("leasehold-{}-r{run}", std::process::id()));
        Prestarted::start(&self.command, self.kill.grace, cgroup, self.quiet).ok()
    }

    /// [`Containment::start`] with a pre-started guard: the command is exec'd at once. Falls back
    /// to starting a guard the usual way when the pre-started one is gone; that fallback clears
    /// the old guard first, so the lease is checked again before it (`None`: leadership ended
    /// meanwhile, nothing started).
    pub(crate) async fn start_prestarted(
        &self,
        prestarted: Prestarted,
        leader: &Leader,
        name: &str,
        env: &[(&str, String)],
        leaf: &str,
    ) -> Result<Option<CommandGroup>, Failure> {
        let pgid = prestarted.pgid();
        match prestarted.go(env) {
            Ok(group) => {
                let place = match group.cgroup() {
                    Some(dir) => format!("process group {pgid}, cgroup {}", dir.display()),
                    None => format!("process group {pgid}"),
                };
                self.log(format_args!("started {name} ({place}) at term {}", leader.term()));
                Ok(Some(group))
            }
            Err(prestarted) => {
                // Dropped half-way when leadership ends: its tree is SIGKILLed then.
                tokio::select! {
                    () = prestarted.discard() => {}
                    () = leader.cancelled() => return Ok(None),
                }
                if !self.lease_fits(leader).await {
                    return Ok(None);
                }
                self.start(leader, name, env, leaf).map(Some)
            }
        }
    }

    /// Leadership is ending, for the reason `why`: says so, then stops the command's tree
    /// (SIGTERM, SIGKILL after the grace and no later than `slack` before the lease's deadline,
    /// at once after a second signal), and returns once it is empty. A tree that SIGKILL does not
    /// empty is killed on and on, until it is empty or the engine aborts this at the deadline.
    pub(crate) async fn stop(&self, leader: &Leader, name: &str, group: &mut CommandGroup, why: &str) {
        // `valid_until` is the last confirmed deadline; SIGKILL goes out no later than `slack`
        // before it, at once if that has passed.
        let kill_by = leader.valid_until().checked_sub(self.kill.slack);
        let now = Instant::now();
        let plan = match kill_by {
            Some(by) if by > now && !self.hurry.is_cancelled() => format!(
                "stopping {name}: SIGTERM now, SIGKILL in {}",
                short(self.kill.grace.min(by - now))
            ),
            _ => format!("killing {name} with SIGKILL now: no time is left for a graceful stop"),
        };
        self.log(format_args!("{why}; {plan}"));
        let stopping = Instant::now();
        let deadline = |leader: &Leader| {
            leader.valid_until().checked_duration_since(Instant::now()).map_or_else(
                || "after the lease's deadline".to_string(),
                |d| format!("{} before the lease's deadline", short(d)),
            )
        };
        match group.stop(self.kill.grace, kill_by, &self.hurry).await {
            Ok(stop) => {
                let took = short(stopping.elapsed());
                let processes = match stop.processes {
                    0 | 1 => String::new(),
                    n => format!(" ({n} processes)"),
                };
                let what = match stop.how {
                    Stopped::Terminated => format!("{name}{processes} ended after SIGTERM in {took}"),
                    Stopped::Killed => {
                        format!("killed {name}{processes} with SIGKILL: gone {took} after the stop began")
                    }
                };
                self.log(format_args!("{what}, {}", deadline(leader)));
            }
            Err((_, left)) => {
                self.say_stuck(&left, leader.lease());
                let _ = group.clear(None).await; // until empty, or aborted at `valid_until`
                self.log(format_args!("{name}'s tree is empty now, {}", deadline(leader)));
            }
        }
    }

    /// Logs processes that SIGKILL does not end, and what that means for the lease.
    pub(crate) fn say_stuck(&self, left: &[Process], lease: &LeaseName) {
        self.log(format_args!(
            "{} still alive {} into SIGKILL (a process in uninterruptible sleep dies only when its \
             system call returns); lease {lease} is not released: it runs out at its deadline, and \
             leasehold keeps killing",
            list(left),
            short(STUCK_AFTER),
        ));
    }

    /// The cgroup v2 leaf `name` for a run of the command, if one can be made; says once which
    /// containment is in use.
    fn leaf(&self, name: &str) -> Option<Cgroup> {
        let first = !self.said.swap(true, Ordering::SeqCst);
        let program = &self.program;
        if self.no_cgroup {
            if first {
                self.log(format_args!(
                    "containing {program}'s tree with child subreapers only (--no-cgroup)"
                ));
            }
            return None;
        }
        if !self.swept.swap(true, Ordering::SeqCst) {
            Cgroup::sweep_stale();
        }
        match Cgroup::create(name) {
            Ok(cgroup) => {
                if first {
                    let how = if cgroup.can_kill() {
                        "cgroup.kill"
                    } else {
                        "no cgroup.kill: killed one by one"
                    };
                    self.log(format_args!(
                        "containing {program}'s tree in a cgroup v2 leaf per run, under {} ({how})",
                        cgroup.path().parent().unwrap_or(cgroup.path()).display()
                    ));
                }
                Some(cgroup)
            }
            Err(why) => {
                if first {
                    self.log(format_args!(
                        "no cgroup v2 leaf for {program} ({why}): containing its tree with child \
                         subreapers (orphans come back to leasehold, which kills every descendant)"
                    ));
                }
                None
            }
        }
    }

    pub(crate) fn log(&self, message: std::fmt::Arguments<'_>) {
        if !self.quiet {
            output::log(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(ttl: Duration) -> leasehold::Timing {
        leasehold::Timing::new(ttl)
    }

    #[test]
    fn default_grace_fits_every_ttl() {
        for ms in [600, 1_000, 2_000, 10_000, 60_000] {
            let ttl = Duration::from_millis(ms);
            let kill = KillTiming::new(ttl, None);
            kill.check(&timing(ttl)).unwrap_or_else(|f| panic!("{ms}ms: {f:?}"));
        }
        assert_eq!(
            KillTiming::new(Duration::from_secs(10), None).grace,
            Duration::from_secs(2)
        );
        assert_eq!(
            KillTiming::new(Duration::from_secs(2), None).grace,
            Duration::from_millis(400)
        );
    }

    #[test]
    fn a_grace_that_does_not_fit_is_refused() {
        let ttl = Duration::from_secs(3);
        // believed 2.97s - renew 1s = 1.97s of room: 1.8s + 200ms slack does not fit.
        let failure = KillTiming::new(ttl, Some(Duration::from_millis(1800)))
            .check(&timing(ttl))
            .unwrap_err();
        assert_eq!(failure.code, crate::exit::USAGE);
        KillTiming::new(ttl, Some(Duration::from_millis(1700)))
            .check(&timing(ttl))
            .unwrap();
    }
}
