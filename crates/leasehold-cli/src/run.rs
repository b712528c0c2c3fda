//! `leasehold run`: campaign, run the command while leader, stop it before the lease can pass on.
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
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{CandidateId, DeposedReason, Elector, Event, Leader, RunError};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::RunArgs;
use crate::child::{CommandGroup, Stopped, check_program, describe, exit_code};
use crate::exit::{Failure, NOT_ELECTED};
use crate::inspect::{connect, lease_name};
use crate::output::short;

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

/// `leasehold run`. Returns the exit code.
pub(crate) async fn run(url: &str, args: RunArgs) -> Result<i32, Failure> {
    let lease = lease_name(&args.lease)?;
    let id = match &args.id {
        Some(id) => CandidateId::new(id.clone()).map_err(Failure::usage)?,
        None => CandidateId::generate(),
    };
    let kill = KillTiming::new(args.ttl, args.kill_grace);
    check_program(&args.command[0])?;
    let stop = Shutdown::listen()?;
    let store = connect(url).await?;
    let builder = Elector::builder(store, lease.as_str())
        .ttl(args.ttl)
        .candidate_id(id.as_str())
        .step_down_margin(kill.step_down_margin());
    kill.check(&builder.timing())?;
    let elector = builder
        .build()
        .map_err(|e| Failure::store("invalid election settings", &e))?;
    if !args.quiet {
        tokio::spawn(log_events(elector.clone()));
    }

    let ctx = Arc::new(Supervisor {
        command: args.command,
        kill,
        quiet: args.quiet,
        hurry: stop.hurry.clone(),
        exited: Mutex::new(None),
        finished: CancellationToken::new(),
        keep_running: args.keep_running,
        give_up: CancellationToken::new(),
        elected: AtomicBool::new(false),
    });
    if let Some(wait) = args.wait {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            // One thread: `supervise` checks `give_up` and sets `elected` without an await in
            // between, so the command is either started or never started.
            if !ctx.elected.load(Ordering::SeqCst) {
                ctx.give_up.cancel();
            }
        });
    }
    loop {
        let task = {
            let ctx = ctx.clone();
            move |leader: Leader| {
                let ctx = ctx.clone();
                async move { ctx.supervise(leader).await }
            }
        };
        let shutdown = {
            let (stop, finished, give_up) = (stop.requested.clone(), ctx.finished.clone(), ctx.give_up.clone());
            async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = finished.cancelled() => {}
                    () = give_up.cancelled() => {}
                }
            }
        };
        match elector.run_until(task, shutdown).await {
            Ok(()) => {}
            Err(RunError::Task(failure)) => return Err(failure),
            Err(RunError::Panicked) => return Err(Failure::runtime("the supervisor panicked")),
            Err(RunError::Election(e)) => {
                return Err(Failure::store(format!("cannot campaign for lease {lease}"), &e));
            }
        }
        if let Some(signal) = stop.signal() {
            return Ok(128 + signal);
        }
        if ctx.give_up.is_cancelled() && !ctx.elected.load(Ordering::SeqCst) {
            let holder = match &*elector.observe().borrow() {
                Some(info) => format!("held by {} at term {}", info.holder, info.term),
                None => "not granted".to_string(),
            };
            ctx.log(format_args!(
                "not elected for lease {lease} within --wait {} ({holder}); the command was not run",
                short(args.wait.unwrap_or_default()),
            ));
            return Ok(NOT_ELECTED);
        }
        let exited = ctx.exited.lock().expect("exit status lock").take();
        match exited {
            Some(code) if !ctx.keep_running => return Ok(code),
            Some(_) => ctx.log(format_args!("campaigning again for lease {lease}")),
            None => {}
        }
    }
}

/// What the leader's task needs; shared by every term.
#[derive(Debug)]
struct Supervisor {
    command: Vec<OsString>,
    kill: KillTiming,
    quiet: bool,
    /// Cancelled by a second signal: kill the command now.
    hurry: CancellationToken,
    /// The command's exit code, when it exited on its own.
    exited: Mutex<Option<i32>>,
    /// Cancelled when the command exited on its own and `run` should end.
    finished: CancellationToken,
    keep_running: bool,
    /// Cancelled when `--wait` ran out before this candidate was ever elected.
    give_up: CancellationToken,
    /// Whether the command was ever started.
    elected: AtomicBool,
}

impl Supervisor {
    /// The leader's task: run the command until it exits, or until leadership ends.
    async fn supervise(&self, leader: Leader) -> Result<(), Failure> {
        // The last check before the side effect of starting the command.
        if leader.ensure_valid(self.kill.step_down_margin()).is_err() {
            leader.cancelled().await;
            return Ok(());
        }
        if self.give_up.is_cancelled() {
            return Ok(()); // elected just as --wait ran out: release, run nothing
        }
        self.elected.store(true, Ordering::SeqCst);
        let env = [
            ("LEASEHOLD_LEASE", leader.lease().to_string()),
            ("LEASEHOLD_HOLDER", leader.holder().to_string()),
            ("LEASEHOLD_TERM", leader.term().to_string()),
        ];
        let name = self.command[0].to_string_lossy();
        let notice = (!self.quiet).then(|| {
            format!(
                "killed {name} with SIGKILL: leadership ended and its deadline passed (term {})",
                leader.term()
            )
        });
        let mut group = CommandGroup::spawn(&self.command, &env, self.kill.grace, notice)?;
        self.log(format_args!(
            "started {name} (process group {}) at term {}",
            group.pgid(),
            leader.term()
        ));
        tokio::select! {
            status = group.wait() => {
                self.log(format_args!("{name} {}; releasing lease {}", describe(status), leader.lease()));
                *self.exited.lock().expect("exit status lock") = Some(exit_code(status));
                if !self.keep_running {
                    self.finished.cancel();
                }
                return Ok(()); // returning while leader releases the lease
            }
            () = leader.cancelled() => {}
        }
        // Leadership is ending (lost, or shutting down). `valid_until` is the last confirmed
        // deadline; SIGKILL goes out no later than `slack` before it, at once if that has passed.
        let kill_by = leader.valid_until().checked_sub(self.kill.slack);
        let started = Instant::now();
        let (how, status) = group.stop(self.kill.grace, kill_by, &self.hurry).await;
        let how = match how {
            Stopped::Terminated => "after SIGTERM",
            Stopped::Killed => "after SIGKILL",
        };
        self.log(format_args!(
            "{name} {} {how} in {}, {} before the lease's deadline",
            describe(status),
            short(started.elapsed()),
            leader
                .valid_until()
                .checked_duration_since(Instant::now())
                .map_or_else(|| "not".into(), short),
        ));
        Ok(())
    }

    fn log(&self, message: std::fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!("leasehold: {message}");
        }
    }
}

/// Prints what happens to the election on stderr.
async fn log_events(elector: Elector) {
    let mut events = elector.events();
    let (lease, me) = (elector.lease().clone(), elector.id().clone());
    let mut last_trouble = None;
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        match event {
            Event::Elected { term, valid_until, at } => {
                last_trouble = None;
                eprintln!(
                    "leasehold: {me} leads {lease} at term {term} (valid for {})",
                    short(valid_until.saturating_duration_since(at))
                );
            }
            Event::Deposed { term, reason, .. } => match reason {
                DeposedReason::WorkFinished => {
                    eprintln!("leasehold: released {lease} (term {term})")
                }
                DeposedReason::Resigned => {
                    eprintln!("leasehold: stepping down from {lease} (term {term})")
                }
                reason => eprintln!("leasehold: lost {lease} (term {term}): {reason}"),
            },
            Event::LeaderChanged(Some(info)) if info.holder != me => {
                eprintln!(
                    "leasehold: {lease} is held by {} at term {}; waiting",
                    info.holder, info.term
                );
            }
            Event::StoreTrouble { error } if last_trouble.as_ref() != Some(&error) => {
                eprintln!("leasehold: store trouble (retrying): {error}");
                last_trouble = Some(error);
            }
            _ => {}
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP: the first asks for a graceful stop, the second for a quick one.
#[derive(Debug)]
struct Shutdown {
    requested: CancellationToken,
    hurry: CancellationToken,
    signal: Arc<AtomicI32>,
}

impl Shutdown {
    fn listen() -> Result<Self, Failure> {
        let kinds = [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()];
        let mut streams = Vec::new();
        for kind in kinds {
            let stream = signal(kind).map_err(|e| Failure::runtime(format!("cannot handle signals: {e}")))?;
            streams.push((kind.as_raw_value(), stream));
        }
        let shutdown = Shutdown {
            requested: CancellationToken::new(),
            hurry: CancellationToken::new(),
            signal: Arc::default(),
        };
        let (requested, hurry, received) = (
            shutdown.requested.clone(),
            shutdown.hurry.clone(),
            shutdown.signal.clone(),
        );
        tokio::spawn(async move {
            loop {
                let arrivals = streams.iter_mut().map(|(number, stream)| {
                    let number = *number;
                    Box::pin(async move {
                        stream.recv().await;
                        number
                    })
                });
                let (number, _, _) = futures::future::select_all(arrivals).await;
                if requested.is_cancelled() {
                    eprintln!("leasehold: second signal: killing the command now");
                    hurry.cancel();
                } else {
                    received.store(number, Ordering::SeqCst);
                    requested.cancel();
                }
            }
        });
        Ok(shutdown)
    }

    /// The first signal received, if any.
    fn signal(&self) -> Option<i32> {
        self.requested
            .is_cancelled()
            .then(|| self.signal.load(Ordering::SeqCst))
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
