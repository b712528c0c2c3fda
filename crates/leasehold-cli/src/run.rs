//! `leasehold run`: campaign, run the command while leader, stop it before the lease can pass on
//! (the command's containment and its timing: `contain.rs`).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::os::unix::process::ExitStatusExt;

use leasehold::{CandidateId, DeposedReason, Elector, Event, Leader, RunError, Term};
use nix::sys::prctl::set_child_subreaper;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::RunArgs;
use crate::child::{CommandGroup, Prestarted, STUCK_AFTER, check_program, describe, exit_code};
use crate::contain::{Containment, KillTiming};
use crate::exit::{AUTH, Failure, NOT_ELECTED, is_auth_failure};
use crate::http;
use crate::inspect::{connect, lease_name};
use crate::output::{self, short};

/// The first restart delay of `--keep-running` after a failed run; it doubles with every failure
/// in a row, up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest restart delay; a run that lasts this long resets the delay.
const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// The restart delay after `failures` failed runs in a row (`failures >= 1`).
fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_CAP)
}

/// `leasehold run`. Returns the exit code.
pub(crate) async fn run(url: &str, args: RunArgs) -> Result<i32, Failure> {
    let lease = lease_name(&args.lease)?;
    let id = match &args.id {
        Some(id) => CandidateId::new(id.clone()).map_err(Failure::usage)?,
        None => CandidateId::generate(),
    };
    let kill = KillTiming::new(args.ttl, args.kill_grace);
    if let Some(program) = args.command.first() {
        check_program(program)?;
        // Orphans of the command's tree come to this process, not to PID 1, once the guard is
        // gone.
        set_child_subreaper(true).map_err(|e| Failure::runtime(format!("cannot become a child subreaper: {e}")))?;
    } else if args.keep_running {
        return Err(Failure::usage("--keep-running needs a command to restart (after `--`)"));
    }
    // Before connecting: a bad address fails at once, and every series is recorded from the
    // start.
    let http = match args.http {
        Some(addr) => Some((http::bind(addr).await?, http::install_recorder()?)),
        None => None,
    };
    let serving = Arc::new(http::State::new(args.ttl));
    let stop = Shutdown::listen()?;
    let store = connect(url).await?;
    let builder = Elector::builder(store, lease.as_str())
        .ttl(args.ttl)
        .candidate_id(id.as_str())
        .hand_over_requests(true)
        .step_down_margin(kill.step_down_margin());
    kill.check(&builder.timing())?;
    let elector = builder
        .build()
        .map_err(|e| Failure::store("invalid election settings", &e))?;
    if let Some((listener, metrics)) = http {
        let addr = listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string());
        http::serve(listener, serving.clone(), elector.clone(), metrics);
        if !args.quiet {
            output::log(format_args!(
                "serving /healthz, /readyz, /leader and /metrics on http://{addr}"
            ));
        }
    }

    let ctx = Arc::new(Supervisor {
        contain: Containment::new(args.command, kill, args.quiet, args.no_cgroup, stop.hurry.clone()),
        stop_requested: stop.requested.clone(),
        stop_signal: stop.signal.clone(),
        exited: Mutex::new(None),
        finished: Mutex::new(CancellationToken::new()),
        keep_running: args.keep_running,
        give_up: CancellationToken::new(),
        elected: AtomicBool::new(false),
        explained: Mutex::new(None),
        auth: Arc::new(AuthWatch::new(args.auth_retry, args.wait.is_some())),
        serving,
        prestarted: Mutex::new(None),
    });
    ctx.contain.prepare();
    // Subscribed before the first campaign: an early failure is not missed.
    tokio::spawn(log_events(elector.events(), elector.clone(), ctx.clone()));
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
    let mut failures = 0u32;
    let code = loop {
        // The next term's command waits, exec'd as soon as elected (also after --keep-running's
        // restart); a term after a loss within one round starts its command the usual way.
        {
            let mut slot = ctx.prestarted.lock().expect("prestarted lock");
            if slot.is_none() {
                *slot = ctx.contain.prestart();
            }
        }
        let finished = CancellationToken::new();
        *ctx.finished.lock().expect("finished lock") = finished.clone();
        let task = {
            let ctx = ctx.clone();
            move |leader: Leader| {
                let ctx = ctx.clone();
                async move { ctx.supervise(leader).await }
            }
        };
        let shutdown = {
            let (stop, give_up, auth) = (stop.requested.clone(), ctx.give_up.clone(), ctx.auth.give_up.clone());
            async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = finished.cancelled() => {}
                    () = give_up.cancelled() => {}
                    () = auth.cancelled() => {}
                }
            }
        };
        match elector.run_until(task, shutdown).await {
            Ok(()) => {}
            Err(RunError::Task(failure)) => break Err(failure),
            Err(RunError::Panicked) => break Err(Failure::runtime("the supervisor panicked")),
            Err(RunError::Election(e)) => {
                break Err(Failure::store(format!("cannot campaign for lease {lease}"), &e));
            }
        }
        if let Some(signal) = stop.signal() {
            break Ok(128 + signal);
        }
        if ctx.auth.give_up.is_cancelled() || (ctx.give_up.is_cancelled() && ctx.auth.failing()) {
            break Err(ctx.auth.failure(&lease));
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
            break Ok(NOT_ELECTED);
        }
        let exited = ctx.exited.lock().expect("exit status lock").take();
        let Some(exited) = exited else { continue };
        if !ctx.keep_running {
            break Ok(exited.code);
        }
        if exited.code == 0 || exited.ran >= BACKOFF_CAP {
            failures = 0;
        } else {
            failures += 1;
            let delay = backoff(failures);
            ctx.log(format_args!(
                "{} failed {failures} time{} in a row; restarting it in {}",
                ctx.contain.program(),
                if failures == 1 { "" } else { "s" },
                short(delay),
            ));
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.requested.cancelled() => {}
                () = ctx.auth.give_up.cancelled() => {}
            }
            if let Some(signal) = stop.signal() {
                break Ok(128 + signal);
            }
        }
        ctx.log(format_args!("campaigning again for lease {lease}"));
    };
    // Never elected again: the waiting command is ended unrun.
    let unused = ctx.prestarted.lock().expect("prestarted lock").take();
    if let Some(prestarted) = unused {
        prestarted.discard().await;
    }
    code
}

/// How the command's run ended, when it ended on its own.
#[derive(Debug, Clone, Copy)]
struct Exited {
    /// As a shell reports it.
    code: i32,
    /// How long it ran.
    ran: Duration,
}

/// What the leader's task needs; shared by every term.
#[derive(Debug)]
struct Supervisor {
    /// The command (none for a sidecar), how it is contained and stopped.
    contain: Containment,
    /// Cancelled by the first SIGINT, SIGTERM or SIGHUP.
    stop_requested: CancellationToken,
    /// Which signal that was.
    stop_signal: Arc<AtomicI32>,
    /// The command's exit, when it exited on its own.
    exited: Mutex<Option<Exited>>,
    /// This round of `run_until`'s: cancelled to end it (stop campaigning; release once the
    /// command's tree is empty).
    finished: Mutex<CancellationToken>,
    keep_running: bool,
    /// Cancelled when `--wait` ran out before this candidate was ever elected.
    give_up: CancellationToken,
    /// Whether the command was ever started.
    elected: AtomicBool,
    /// The last term whose end was already explained in the log (the engine's Deposed event
    /// then says nothing more).
    explained: Mutex<Option<Term>>,
    auth: Arc<AuthWatch>,
    /// What `--http` serves: this instance's leadership and the store's health.
    serving: Arc<http::State>,
    /// The next term's command, waiting to be exec'd (see `child::Prestarted`).
    prestarted: Mutex<Option<Prestarted>>,
}

impl Supervisor {
    /// The leader's task: run the command until it exits, or until leadership ends.
    async fn supervise(&self, leader: Leader) -> Result<(), Failure> {
        if self.contain.command.is_empty() {
            return self.hold(leader).await;
        }
        let name = self.contain.program();
        if !self.contain.lease_fits(&leader).await {
            return Ok(());
        }
        if self.give_up.is_cancelled() {
            return Ok(()); // elected just as --wait ran out: release, run nothing
        }
        // Processes of an earlier term that could not be killed then (uninterruptible sleep):
        // the command never runs next to them.
        if !self.contain.clear_earlier(&leader, name).await {
            return Ok(());
        }
        if self.give_up.is_cancelled() {
            return Ok(()); // --wait ran out meanwhile
        }
        self.elected.store(true, Ordering::SeqCst);
        let term = leader.term();
        let env = [
            ("LEASEHOLD_LEASE", leader.lease().to_string()),
            ("LEASEHOLD_HOLDER", leader.holder().to_string()),
            ("LEASEHOLD_TERM", term.to_string()),
        ];
        let leaf = format!("leasehold-{}-{term}", std::process::id());
        let prestarted = self.prestarted.lock().expect("prestarted lock").take();
        let mut group = match prestarted {
            Some(prestarted) => {
                let started = self
                    .contain
                    .start_prestarted(prestarted, &leader, name, &env, &leaf)
                    .await?;
                let Some(group) = started else {
                    return Ok(()); // leadership ended while the gone guard was cleared
                };
                group
            }
            None => self.contain.start(&leader, name, &env, &leaf)?,
        };
        let started = Instant::now();
        let leading = self.serving.leading(&leader);
        tokio::select! {
            status = group.wait() => {
                drop(leading);
                return self.after_exit(&leader, group, status, started).await;
            }
            () = leader.cancelled() => drop(leading),
        }

        // Leadership is ending: say why first, once.
        *self.explained.lock().expect("explained lock") = Some(term);
        let why = self.why_ending(&leader);
        self.contain.stop(&leader, name, &mut group, &why).await;
        group.reap_later();
        Ok(())
    }

    /// The command's guard exited: the command exited (the guard ended what it left behind), or
    /// the guard itself was killed. Empties the tree before anything else; the lease is released
    /// when this returns.
    async fn after_exit(
        &self,
        leader: &Leader,
        mut group: CommandGroup,
        status: std::process::ExitStatus,
        started: Instant,
    ) -> Result<(), Failure> {
        let name = self.contain.program();
        let ran = started.elapsed();
        let guard_died = status.signal().is_some();
        let left = group.clear(Some(Instant::now() + STUCK_AFTER)).await;
        if guard_died {
            let killed = match &left {
                Ok(0) => format!("nothing of {name}'s tree was left"),
                Ok(n) => format!(
                    "killed {name}'s tree ({n} process{}) with SIGKILL",
                    if *n == 1 { "" } else { "es" }
                ),
                Err(_) => format!("killing {name}'s tree with SIGKILL"),
            };
            self.log(format_args!(
                "the child guard (pid {}) {}: {killed} before releasing lease {}",
                group.pgid(),
                describe(status),
                leader.lease()
            ));
        } else {
            let behind = match &left {
                Ok(0) => String::new(),
                Ok(n) => format!("; killed {n} process{} it left behind", if *n == 1 { "" } else { "es" }),
                Err(_) => String::new(),
            };
            let next = if self.keep_running || left.is_err() {
                ""
            } else {
                "; releasing lease"
            };
            let next = if next.is_empty() {
                String::new()
            } else {
                format!("{next} {}", leader.lease())
            };
            self.log(format_args!("{name} {}{behind}{next}", describe(status)));
        }
        *self.exited.lock().expect("exit status lock") = Some(Exited {
            code: exit_code(status),
            ran,
        });
        if let Err(left) = left {
            // Not released early: stop renewing and let the lease run out, killing meanwhile.
            *self.explained.lock().expect("explained lock") = Some(leader.term());
            self.contain.say_stuck(&left, leader.lease());
            self.finish();
            let _ = group.clear(None).await;
            return Ok(());
        }
        if !self.keep_running {
            self.finish();
        }
        Ok(()) // returning while leader releases the lease
    }

    /// The leader's task without a command (`--http` only): hold the lease, served as ready,
    /// until leadership ends or a signal asks to release it.
    async fn hold(&self, leader: Leader) -> Result<(), Failure> {
        if leader.ensure_valid(Duration::ZERO).is_err() {
            leader.cancelled().await;
            return Ok(());
        }
        if self.give_up.is_cancelled() {
            return Ok(()); // elected just as --wait ran out: release
        }
        self.elected.store(true, Ordering::SeqCst);
        let term = leader.term();
        let leading = self.serving.leading(&leader);
        self.log(format_args!(
            "holding lease {} at term {term} (no command): /readyz answers 200 while it lasts",
            leader.lease()
        ));
        leader.cancelled().await;
        drop(leading);
        *self.explained.lock().expect("explained lock") = Some(term);
        let why = self.why_ending(&leader);
        if self.stop_requested.is_cancelled() {
            self.log(format_args!("{why}; releasing it"));
        } else {
            self.log(format_args!("{why}; /readyz answers 503; campaigning again"));
        }
        Ok(())
    }

    /// Why leadership is ending, for the first line about it.
    fn why_ending(&self, leader: &Leader) -> String {
        let lease = leader.lease();
        let term = leader.term();
        if self.stop_requested.is_cancelled() {
            let signal = self.stop_signal.load(Ordering::SeqCst);
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| format!("signal {signal}"), |s| s.to_string());
            return format!("received {name}: giving up lease {lease} (term {term})");
        }
        if self.auth.give_up.is_cancelled() {
            return format!("giving up lease {lease} (term {term}): the store keeps refusing our credentials");
        }
        match leader.ensure_valid(Duration::ZERO) {
            Err(leasehold::Error::NotLeader { reason, .. }) => {
                let reason = reason.strip_prefix("deposed: ").unwrap_or(&reason).to_string();
                match reason.strip_prefix("handed over to ") {
                    // A planned handover (asked through the store, e.g. by `leasehold handover`).
                    Some(to) => format!("handing {lease} (term {term}) over to {to}, as asked"),
                    None => format!("lost {lease} (term {term}): {reason}"),
                }
            }
            _ => format!("lost {lease} (term {term})"),
        }
    }

    /// Ends this round of `run_until`: no more renewals; the lease is released once the task
    /// returns before its deadline.
    fn finish(&self) {
        self.finished.lock().expect("finished lock").cancel();
    }

    fn log(&self, message: std::fmt::Arguments<'_>) {
        self.contain.log(message);
    }
}

/// Authentication and permission failures of the store: said even under `--quiet`, and given up
/// on after `--auth-retry` of them with no success in between.
#[derive(Debug)]
struct AuthWatch {
    retry: Duration,
    /// Whether `--wait` bounds the retries too.
    wait: bool,
    /// The current streak of failures: when it began, and the last error.
    streak: Mutex<Option<(Instant, String)>>,
    /// Counts streaks, so that a timer of an earlier one does nothing.
    streaks: std::sync::atomic::AtomicU64,
    /// Cancelled when a streak lasted `retry`.
    give_up: CancellationToken,
}

impl AuthWatch {
    fn new(retry: Duration, wait: bool) -> Self {
        AuthWatch {
            retry,
            wait,
            streak: Mutex::new(None),
            streaks: Default::default(),
            give_up: CancellationToken::new(),
        }
    }

    /// A failure: says it once per streak (the streak's first; the give-up line names the last)
    /// and starts the give-up timer of a new streak. Once, not once per distinct text: one refusal
    /// shows up in several calls (an acquire's script, the withdraw when a campaign ends), each
    /// worded by its own operation.
    fn failed(self: &Arc<Self>, error: &str) {
        let mut streak = self.streak.lock().expect("auth lock");
        let new = streak.is_none();
        let since = streak.as_ref().map_or_else(Instant::now, |(since, _)| *since);
        *streak = Some((since, error.to_string()));
        drop(streak);
        if new {
            let until = if self.wait { " or until --wait ends" } else { "" };
            output::log(format_args!(
                "the store refused our credentials or permissions (retrying for up to {}{until}, then \
                 exit 6): {error}",
                short(self.retry)
            ));
            let id = self.streaks.fetch_add(1, Ordering::SeqCst) + 1;
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until((since + this.retry).into()).await;
                if this.streaks.load(Ordering::SeqCst) == id && this.failing() {
                    this.give_up.cancel();
                }
            });
        }
    }

    /// Anything else happened (a success, or another kind of trouble): the streak is over.
    fn succeeded(&self) {
        if self.streak.lock().expect("auth lock").take().is_some() {
            self.streaks.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn failing(&self) -> bool {
        self.streak.lock().expect("auth lock").is_some()
    }

    fn failure(&self, lease: &leasehold::LeaseName) -> Failure {
        let streak = self.streak.lock().expect("auth lock").clone();
        let (since, error) = streak.unwrap_or_else(|| (Instant::now(), "authentication or permission failure".into()));
        Failure::new(
            AUTH,
            format!(
                "giving up on lease {lease} after {} of authentication or permission failures: {error}",
                short(since.elapsed())
            ),
        )
    }
}

/// Prints what happens to the election on stderr (unless quiet), and watches for
/// authentication and permission failures (always).
async fn log_events(mut events: tokio::sync::broadcast::Receiver<Event>, elector: Elector, ctx: Arc<Supervisor>) {
    let (lease, me) = (elector.lease().clone(), elector.id().clone());
    let mut last_trouble = None;
    let say = |text: std::fmt::Arguments<'_>| ctx.log(text);
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        match &event {
            Event::StoreTrouble { error } => ctx.serving.store_failed(&error.to_string()),
            Event::Elected { .. } | Event::LeaderChanged(_) => ctx.serving.store_answered(),
            _ => {}
        }
        if let Event::StoreTrouble { error } = &event
            && (matches!(**error, leasehold::Error::Refused { .. }) || is_auth_failure(&error.to_string()))
        {
            ctx.auth.failed(&error.to_string());
            continue;
        }
        ctx.auth.succeeded();
        match event {
            Event::Elected { term, valid_until, at } => {
                last_trouble = None;
                say(format_args!(
                    "{me} leads {lease} at term {term} (valid for {})",
                    short(valid_until.saturating_duration_since(at))
                ));
            }
            Event::Deposed {
                term, reason, aborted, ..
            } => {
                let explained = *ctx.explained.lock().expect("explained lock") == Some(term);
                let name = ctx.contain.program();
                match reason {
                    DeposedReason::WorkFinished | DeposedReason::Resigned if aborted => say(format_args!(
                        "lease {lease} (term {term}) was not released: {name}'s tree was not empty by \
                         the lease's deadline, and got SIGKILL then; the lease runs out"
                    )),
                    DeposedReason::WorkFinished | DeposedReason::Resigned => {
                        say(format_args!("released {lease} (term {term})"))
                    }
                    _ if aborted && explained => say(format_args!(
                        "{name}'s tree got SIGKILL once more at the lease's deadline (term {term})"
                    )),
                    // Resumed after a pause past the deadline: the engine deposed and aborted
                    // in one step, before the supervisor could say anything.
                    reason if aborted => say(format_args!(
                        "lost {lease} (term {term}): {reason}; the lease's deadline had passed, so \
                         {name}'s tree got SIGKILL at once"
                    )),
                    _ if explained => {}
                    reason => say(format_args!("lost {lease} (term {term}): {reason}")),
                }
            }
            Event::LeaderChanged(Some(info)) if info.holder != me => {
                say(format_args!(
                    "{lease} is held by {} at term {}; waiting",
                    info.holder, info.term
                ));
            }
            Event::StoreTrouble { error } if last_trouble.as_ref() != Some(&error.to_string()) => {
                say(format_args!("store trouble (retrying): {error}"));
                last_trouble = Some(error.to_string());
            }
            _ => {}
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP: the first asks for a graceful stop, the second for a quick one.
#[derive(Debug)]
pub(crate) struct Shutdown {
    /// Cancelled by the first signal.
    pub(crate) requested: CancellationToken,
    /// Cancelled by a second signal.
    pub(crate) hurry: CancellationToken,
    /// The first signal's number.
    pub(crate) signal: Arc<AtomicI32>,
}

impl Shutdown {
    /// Starts listening for the signals.
    pub(crate) fn listen() -> Result<Self, Failure> {
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
                    output::log("second signal: killing the command now");
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
    pub(crate) fn signal(&self) -> Option<i32> {
        self.requested
            .is_cancelled()
            .then(|| self.signal.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_up_to_a_minute() {
        let delays: Vec<u64> = [1, 2, 3, 6, 7, 40].map(|n| backoff(n).as_secs()).to_vec();
        assert_eq!(delays, [1, 2, 4, 32, 60, 60]);
    }
}
