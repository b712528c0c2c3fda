//! [`Leader`]: the handle the leader's work holds (term, deadline, cancellation, heartbeat), and
//! what it shares with the driver.

use super::*;

/// The handle of a leader: its fencing term, its deadline, and its duties.
///
/// Clones share one leadership, and the work is the work of all of them: it has stopped once
/// every clone is gone. Dropping every clone, or [`Leader::resign`] on the last one, releases the
/// lease. A resign (or [`Leader::hand_over`]) while other clones are alive ends the leadership at
/// once (every clone's [`Leader::cancelled`] fires, and [`Leader::ensure_valid`] fails once the
/// driver has taken the step-down) but releases (or hands over) only once the last of them is
/// dropped: their work may still be running, and the next candidate must not be elected under
/// it. Should a clone still be alive at `valid_until`, the work counts as aborted (the task of
/// [`Elector::run`] is aborted; clones held elsewhere are not stopped) and the lease is left to
/// expire.
#[derive(Clone, Debug)]
pub struct Leader {
    pub(super) shared: Arc<Shared>,
    pub(super) _alive: Arc<Alive>,
}

/// Held by every clone of one [`Leader`]: when the last clone goes, the work has stopped, and
/// the driver hears of it through the mailbox (after whatever the handles asked before).
#[derive(Debug)]
pub(super) struct Alive(pub(super) Arc<Shared>);

impl Drop for Alive {
    fn drop(&mut self) {
        let _ = self.0.commands.send(Command::WorkStopped);
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) lease: LeaseName,
    pub(super) holder: CandidateId,
    pub(super) term: Term,
    pub(super) elected_at: Instant,
    pub(super) status: watch::Receiver<Status>,
    pub(super) token: CancellationToken,
    /// Nanoseconds after `elected_at` of the last heartbeat.
    pub(super) heartbeat: AtomicU64,
    pub(super) commands: Mailbox,
    pub(super) abort: Mutex<Option<AbortHandle>>,
    /// The work is cancelled at `valid_until - step_down_margin` at the latest.
    pub(super) step_down_margin: Duration,
    /// The most a renewal can give: `ttl * (1 - drift)`.
    pub(super) believed_ttl: Duration,
    /// The leadership this one lives inside ([`Leader::scoped`]): its step-down point is the
    /// parent's, and passing it ends the parent (and with it every scoped one), never a scoped
    /// one alone.
    pub(super) parent: Option<Arc<Shared>>,
}

#[derive(Clone, Debug)]
pub(super) struct Status {
    pub(super) valid_until: Instant,
    pub(super) deposed: Option<DeposedReason>,
    pub(super) stepped_down: bool,
}

#[derive(Debug)]
pub(super) enum Command {
    Resign(oneshot::Sender<()>),
    /// Hand the lease over to `to`; with an `ack`, the work has stopped (as for `Resign`).
    HandOver {
        to: CandidateId,
        ack: Option<oneshot::Sender<()>>,
    },
    Shutdown,
    /// The leader's handle ended the leadership (see [`Input::StepDown`]).
    StepDown(DeposedReason),
    /// Every clone of the leader's handle is gone: the work has stopped.
    WorkStopped,
}

/// The driver's mailbox: what the leader's handles, the hand-over watcher and `run` ask of it,
/// in the order asked. Lighter than a channel (tokio's allocates a block of 32 messages up
/// front, thousands of leases in one process pay for it): a queue that is empty nearly always
/// and a [`Notify`](tokio::sync::Notify).
#[derive(Debug, Default)]
pub(super) struct Mailbox {
    queue: Mutex<Queue>,
    ready: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Queue {
    commands: std::collections::VecDeque<Command>,
    /// The driver is gone: nothing is queued any more.
    closed: bool,
}

impl Mailbox {
    /// Queues `command` for the driver; gives it back once the driver is gone.
    pub(super) fn send(&self, command: Command) -> std::result::Result<(), Command> {
        {
            let mut queue = self.queue.lock().expect("mailbox lock");
            if queue.closed {
                return Err(command);
            }
            queue.commands.push_back(command);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// The next command. Cancel safe: a command stays queued until it is returned.
    pub(super) async fn recv(&self) -> Command {
        loop {
            if let Some(command) = self.pop() {
                return command;
            }
            // `notify_one` stores a permit when nobody waits: a command queued after the look
            // above still wakes this wait.
            self.ready.notified().await;
        }
    }

    fn pop(&self) -> Option<Command> {
        let mut queue = self.queue.lock().expect("mailbox lock");
        let command = queue.commands.pop_front();
        if queue.commands.is_empty() && queue.commands.capacity() > 0 {
            // Commands are rare: an idle leader keeps no buffer.
            queue.commands = std::collections::VecDeque::new();
        }
        command
    }

    /// The driver is gone: later sends fail, and what was queued is dropped (an acknowledgement
    /// waited for ends the wait).
    pub(super) fn close(&self) {
        let dropped = {
            let mut queue = self.queue.lock().expect("mailbox lock");
            queue.closed = true;
            std::mem::take(&mut queue.commands)
        };
        drop(dropped);
    }
}

impl Shared {
    /// Cancels the work and tells the driver to step down, unless that already happened.
    pub(super) fn step_down(&self, reason: DeposedReason) {
        if !self.token.is_cancelled() {
            self.token.cancel();
            let _ = self.commands.send(Command::StepDown(reason));
        }
    }

    /// The instant the work must be cancelled by if no renewal is confirmed.
    pub(super) fn cancel_at(&self) -> Instant {
        let valid_until = self.status.borrow().valid_until;
        valid_until.checked_sub(self.step_down_margin).unwrap_or(valid_until)
    }

    /// Whether leadership has ended: the driver cancelled the work, or the clock passed the
    /// step-down point (the driver may not have been scheduled in time to notice).
    pub(super) fn is_cancelled(&self) -> bool {
        if self.token.is_cancelled() {
            return true;
        }
        if let Some(parent) = &self.parent {
            // The parent's token cancels this one's (a child token).
            return parent.is_cancelled();
        }
        if now() < self.cancel_at() {
            return false;
        }
        self.step_down(DeposedReason::RenewFailed {
            last_error: Some("no renewal confirmed by the step-down point".into()),
        });
        true
    }

    /// Waits until stepping down is complete and returns why it happened.
    pub(super) async fn stepped_down(&self) -> Option<DeposedReason> {
        let mut status = self.status.clone();
        let _ = status.wait_for(|s| s.stepped_down).await;
        status.borrow().deposed.clone()
    }
}

impl Leader {
    /// The fencing token: pass it with every write downstream.
    pub fn term(&self) -> Term {
        self.shared.term
    }

    /// The lease.
    pub fn lease(&self) -> &LeaseName {
        &self.shared.lease
    }

    /// This leader's candidate id.
    pub fn holder(&self) -> &CandidateId {
        &self.shared.holder
    }

    /// When this candidate was elected.
    pub fn elected_at(&self) -> Instant {
        self.shared.elected_at
    }

    /// Until when the leadership may be believed: `sent + ttl * (1 - drift)` of the last
    /// confirmed acquire or renew. Moves forward with every renewal.
    pub fn valid_until(&self) -> Instant {
        self.shared.status.borrow().valid_until
    }

    /// How long the leadership may still be believed (zero once deposed).
    pub fn remaining(&self) -> Duration {
        let status = self.shared.status.borrow();
        if status.deposed.is_some() {
            Duration::ZERO
        } else {
            status.valid_until.saturating_duration_since(now())
        }
    }

    /// Checks, before a side effect, that this candidate still leads and will for at least
    /// `min_remaining`.
    ///
    /// # Errors
    ///
    /// This is the authoritative check: it reads the clock itself, so it is right even when the
    /// runtime is too busy to run the election's driver (then [`Leader::is_cancelled`] and
    /// [`Leader::cancelled`] are right from the step-down point on, but nothing can interrupt
    /// code that never yields).
    ///
    /// When the leader is not deposed but less than `min_remaining` is left (renewals were late),
    /// the leadership ends here: the work is cancelled, the lease released once the work has
    /// returned, and [`Elector::run`] campaigns again rather than returning the task's error. So
    /// `leader.ensure_valid(d)?` in a task is the intended pattern.
    ///
    /// # Errors
    ///
    /// [`Error::NotLeader`] when deposed; [`Error::LeaseEnding`] when too little time is left.
    pub fn ensure_valid(&self, min_remaining: Duration) -> Result<()> {
        let (deposed, remaining) = {
            let status = self.shared.status.borrow();
            (
                status.deposed.clone(),
                status.valid_until.saturating_duration_since(now()),
            )
        };
        if let Some(reason) = deposed {
            return Err(Error::NotLeader {
                lease: self.shared.lease.clone(),
                term: self.shared.term,
                reason: format!("deposed: {reason}"),
            });
        }
        if remaining > min_remaining {
            return Ok(());
        }
        self.shared.step_down(DeposedReason::TooLittleTime {
            remaining,
            required: min_remaining,
        });
        Err(Error::LeaseEnding {
            lease: self.shared.lease.clone(),
            term: self.shared.term,
            remaining,
            required: min_remaining,
            never: min_remaining >= self.shared.believed_ttl,
        })
    }

    /// Whether leadership has ended and the work should stop: true once the driver cancelled the
    /// work, and also once the clock passes `valid_until - step_down_margin` whatever the driver
    /// is doing.
    pub fn is_cancelled(&self) -> bool {
        self.shared.is_cancelled()
    }

    /// Completes when leadership ends and the work should stop: when the driver cancels the
    /// work, or at `valid_until - step_down_margin` at the latest.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn cancelled(&self) {
        if let Some(parent) = &self.shared.parent {
            // A scoped leadership ends with its parent (whose driver cancels the parent's token
            // at its step-down point, and so this one's) or by its own token: no timer of its
            // own, so that thousands of them do not all wake at every renewal of the parent.
            tokio::select! {
                () = self.shared.token.cancelled() => {}
                () = parent.token.cancelled() => {}
            }
            return;
        }
        let mut status = self.shared.status.clone();
        loop {
            let cancel_at = self.shared.cancel_at();
            tokio::select! {
                () = self.shared.token.cancelled() => return,
                () = tokio::time::sleep_until(cancel_at.into()) => {
                    if self.shared.is_cancelled() {
                        return;
                    }
                }
                changed = status.changed() => {
                    if changed.is_err() {
                        // The driver is gone; it cancels the token before it goes.
                        self.shared.token.cancelled().await;
                        return;
                    }
                }
            }
        }
    }

    /// A token cancelled when leadership ends, to hand to code that takes one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.token.child_token()
    }

    /// Reports that the work is alive and making progress. With a `stall_timeout`, a leader
    /// whose work stops calling this steps down.
    pub fn heartbeat(&self) {
        let nanos = (now() - self.shared.elected_at).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.shared.heartbeat.fetch_max(nanos, Ordering::Relaxed);
    }

    /// Gives up leadership now: the work must have stopped. Releases the lease so the next
    /// candidate can take over at once, and returns when the release is done (or failed).
    ///
    /// Called on one clone while other clones are alive, it ends the leadership (the other
    /// clones' work is cancelled) and returns at once; the lease is released once the last of
    /// them is dropped, since until then their work may still run.
    pub async fn resign(self) {
        if !self.is_last_clone() {
            self.shared.step_down(DeposedReason::Resigned);
            // Dropping this clone here: should the others have gone meanwhile, this was the last,
            // and its drop tells the driver that the work has stopped.
            return;
        }
        let (ack, done) = oneshot::channel();
        if self.shared.commands.send(Command::Resign(ack)).is_ok() {
            let _ = done.await;
        }
    }

    /// Whether no other clone of this handle is alive (so its work is the only one left, and has
    /// stopped when this clone's owner says so). Exact when true: no other clone exists to be
    /// cloned from. When false, the others may be going at this moment; the drop of the last
    /// one then signals the end of the work.
    fn is_last_clone(&self) -> bool {
        Arc::strong_count(&self._alive) == 1
    }

    /// Gives up leadership to the candidate `to` (a planned handover: a rolling deploy, moving
    /// leadership off a node): the work must have stopped. The store keeps the lease reserved
    /// for `to` ([`LeaseStore::hand_over`]), so `to`, if it campaigns, takes over at once with a
    /// higher term and nobody else can; if `to` does not take it, the lease opens to everyone
    /// once its TTL has passed. Where the store cannot reserve, the lease is released to
    /// everyone. Returns when the handover is done (or failed).
    ///
    /// Called on one clone while other clones are alive, it ends the leadership and returns at
    /// once; the lease is handed over once the last of them is dropped (see [`Leader`]).
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Elector, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = Arc::new(MemoryStore::new());
    /// let elector = |id: &str| Elector::builder(store.clone(), "jobs").candidate_id(id).build();
    /// let (a, b) = (elector("a")?, elector("b")?);
    /// let first = a.campaign().await?;
    /// let handed_over = first.term();
    /// let successor = tokio::spawn(async move { b.campaign().await });
    /// tokio::time::sleep(Duration::from_millis(50)).await; // b is campaigning
    /// first.hand_over(&"b".parse()?).await;
    /// let second = successor.await.expect("b campaigns")?;
    /// assert!(second.term() > handed_over);
    /// # Ok(()) }
    /// ```
    pub async fn hand_over(self, to: &CandidateId) {
        if !self.is_last_clone() {
            // The hand-over watcher's form: step down now, hand over once the work has stopped
            // (the last clone dropped).
            let _ = self.shared.commands.send(Command::HandOver {
                to: to.clone(),
                ack: None,
            });
            self.shared.token.cancel();
            return;
        }
        let (ack, done) = oneshot::channel();
        let command = Command::HandOver {
            to: to.clone(),
            ack: Some(ack),
        };
        if self.shared.commands.send(command).is_ok() {
            let _ = done.await;
        }
    }
}
