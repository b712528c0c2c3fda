//! The election as a sans-IO state machine.
//!
//! [`Machine`] holds every timing rule of leasehold and does no I/O: it is fed [`Input`]s with
//! the current [`Instant`] and answers [`Output`]s (requests to send, leadership changes). The
//! tokio driver behind [`Elector`](crate::Elector) runs it against a real store; the model check
//! in this crate's tests runs the *same* machine against a modelled store with message delay,
//! loss, process pauses and clock-rate drift.
//!
//! The rules, all in this file:
//!
//! - A grant is believed until `sent + ttl * (1 - drift)`, where `sent` is when the acquire or
//!   renew request was sent, never when its reply arrived. A grant the store made by waiting
//!   ([`Input::YourTurn`]: a FIFO store whose candidate's predecessor left) is believed from the
//!   instant the store's promise rests on ([`Turn::valid_from`](crate::Turn::valid_from)), taken
//!   through the same path as an acquire's grant, and confirmed by a renewal sent at once.
//! - A leader renews every `renew_every`; when no renewal has been confirmed by
//!   `valid_until - step_down_margin`, it is deposed and its work cancelled; work still running at
//!   `valid_until` is aborted.
//! - A leader that steps down releases the lease once its work has stopped, also after
//!   `valid_until`, unless the store proved it lost (another holder, or a record it cannot read).
//!   An unconfirmed renewal proves nothing: the store may hold the grant (or the renewal, applied
//!   with its reply lost) for a TTL more, so it is released too (not with a `lock_delay`: the
//!   release would let the next candidate skip the delay kept for a holder cut off from the
//!   store). A release names the grant's term
//!   and the store applies it only to that term's record: it can never end a successor's grant.
//!   Work that had to be aborted is not known to have stopped, so its lease is left to expire.
//! - An outcome that is unknown (timeout, broken connection) is settled by reading the record
//!   back: the lease is lost only when the store proves another holder, or the deadline passes.
//!   A candidate adopts a grant it finds by reading back only if its term is above every term
//!   seen before, and believes it from the send time of the oldest acquire whose outcome was
//!   ever unknown (any of them may be the one the store applied, however late): that instant is
//!   kept for the machine's whole life and carried into the next campaign's machine
//!   ([`Machine::continue_from`]), so a step-down or a new campaign never forgets it.
//! - Every retry has a floor ([`Timing::retry_floor`]), also a leader's last renewals before its
//!   step-down point, so a store that refuses connections sees a bounded number of requests.
//! - On stores without a clock, and for a record the store says is orphaned (its holder's
//!   session ended but the record stayed), a contender takes over only after it has seen the same
//!   record version unchanged for the holder's full TTL, counted from when the reply that showed
//!   it arrived.
//! - After an unclean end (expiry), a contender waits `lock_delay` before taking over, and looks
//!   again after the wait: it acquires only if no term started in between (a term that started
//!   and expired inside the wait starts a new delay). A lease released, or handed over to this
//!   candidate, ended cleanly: it is taken at once.
//! - A leader whose work stops calling heartbeat for `stall_timeout` steps down; the lease is
//!   released only once the work has stopped.
//! - A release, hand-over or withdrawal whose outcome is unknown is sent again after a retry
//!   delay, while the machine is idle and not leading, until the store answers it (see
//!   `Machine::leave`): on a store whose sessions the process keeps alive, nothing else ends it.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::timing::Timing;
use crate::types::{
    AcquireRequest, Acquired, CandidateId, EndReason, Expiry, Grant, HolderInfo, LeaseName, Notifications, Observation,
    Renewed, Term,
};

/// Identifies one store request, so that a late reply to an abandoned request is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A store request the machine wants sent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    /// [`LeaseStore::acquire`](crate::LeaseStore::acquire).
    Acquire(AcquireRequest),
    /// [`LeaseStore::renew`](crate::LeaseStore::renew).
    Renew(Grant),
    /// [`LeaseStore::release`](crate::LeaseStore::release).
    Release(Grant),
    /// [`LeaseStore::hand_over`](crate::LeaseStore::hand_over) to this successor (answered
    /// with [`Reply::Release`]; the driver releases where the store cannot hand over).
    HandOver(Grant, CandidateId),
    /// [`LeaseStore::inspect`](crate::LeaseStore::inspect) of the machine's lease.
    Inspect,
    /// [`LeaseStore::withdraw`](crate::LeaseStore::withdraw) of this candidate.
    Withdraw,
}

/// A store's answer to a [`Request`].
#[derive(Debug)]
pub enum Reply {
    /// To [`Request::Acquire`].
    Acquire(Result<Acquired>),
    /// To [`Request::Renew`].
    Renew(Result<Renewed>),
    /// To [`Request::Release`].
    Release(Result<()>),
    /// To [`Request::Inspect`].
    Inspect(Result<Observation>),
    /// To [`Request::Withdraw`].
    Withdraw(Result<()>),
}

/// What happens to the machine.
#[derive(Debug)]
pub enum Input {
    /// Time passed (nothing else happened).
    Tick,
    /// The store notified a change (the machine retries at once when it is a follower).
    Notified,
    /// Notifications stopped working (the stream ended): fall back to polling.
    NotificationsLost,
    /// The store's change stream says this candidate's turn has come
    /// ([`Change::YourTurn`](crate::Change::YourTurn)): a follower takes the grant as an
    /// acquire's, sent at [`Turn::valid_from`](crate::Turn::valid_from), and renews at once.
    /// With a request under way, or a `lock_delay`, it is a notification only.
    YourTurn(crate::store::Turn),
    /// The store announced a new holder ([`LeaseStore::announcements`](crate::LeaseStore::announcements)),
    /// or, where [`Input::RenewalsAnnounced`] says so, a holder's renewal. A follower takes a
    /// higher term than the one last seen as the leader it reports. While renewals are announced,
    /// an idle follower (no request under way) also takes a new holder or a new version of the
    /// holder it watches as a sighting, as if a read had shown it now: the store wrote that
    /// version before announcing it, so the holder sent its request earlier still.
    Announced(Observation),
    /// Whether the store's announcements now reach this candidate with every grant and renewal
    /// ([`Announces::GrantsAndRenewals`](crate::Announces::GrantsAndRenewals), the stream live):
    /// then an idle follower attempts only once the version it watches has been unchanged for a
    /// TTL, instead of polling for new versions. The driver says `false` whenever the stream
    /// ends, whatever it announced: the store may have lost what it would announce (a session
    /// ended, a server restarted), so a follower reads within a retry interval, and the driver
    /// asks for announcements again once a reply shows the store answers.
    RenewalsAnnounced(bool),
    /// A reply to the request with this id.
    Reply(OpId, Reply),
    /// The leader's work reported progress at this instant.
    Heartbeat(Instant),
    /// The leader resigns (its work has stopped): release the lease now.
    Resign,
    /// Hand the lease over to this successor
    /// ([`LeaseStore::hand_over`](crate::LeaseStore::hand_over)): a leader steps down, and once
    /// its work has stopped (`work_stopped`: it already has) hands the lease over instead of
    /// releasing it.
    HandOver {
        /// The successor.
        to: CandidateId,
        /// The work has already returned (as for [`Input::Resign`]).
        work_stopped: bool,
    },
    /// The leader's handle ended the leadership for this reason (too little time left for the
    /// work's next side effect, or the step-down point passed while the driver was not
    /// scheduled): step down, release once the work has stopped, and campaign again.
    StepDown(DeposedReason),
    /// The leader's work ended on its own (all its handles dropped).
    WorkStopped,
    /// Stop campaigning for good: a leader cancels its work and releases the lease once the work
    /// has stopped; a follower withdraws.
    Shutdown,
}

/// Why a leader stopped being leader.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum DeposedReason {
    /// The store proves another holder (or that the lease is gone).
    Superseded {
        /// The new holder, if any.
        by: Option<CandidateId>,
        /// Its term, if any.
        term: Option<Term>,
    },
    /// No renewal was confirmed by `valid_until - step_down_margin`.
    RenewFailed {
        /// The last error, if a request failed (rather than went unanswered).
        last_error: Option<String>,
    },
    /// The store answered with a definite error (e.g. a corrupt record) while renewing.
    StoreError {
        /// The error.
        error: String,
    },
    /// The work did not call heartbeat within `stall_timeout`.
    Stalled,
    /// The work found too little of the lease left for its next side effect
    /// ([`Leader::ensure_valid`](crate::Leader::ensure_valid)) and the leader stepped down to
    /// campaign again.
    TooLittleTime {
        /// How much of the lease was left.
        remaining: Duration,
        /// How much the work asked for.
        required: Duration,
    },
    /// The leader resigned.
    Resigned,
    /// The leader handed the lease over to a named successor.
    HandedOver {
        /// The successor.
        to: CandidateId,
    },
    /// The work ended on its own.
    WorkFinished,
}

impl fmt::Display for DeposedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeposedReason::Superseded {
                by: Some(by),
                term: Some(term),
            } => {
                write!(f, "superseded by {by} at term {term}")
            }
            DeposedReason::Superseded { .. } => f.write_str("the store no longer records us as holder"),
            DeposedReason::RenewFailed { last_error: Some(e) } => write!(f, "renew failed: {e}"),
            DeposedReason::RenewFailed { last_error: None } => f.write_str("renew not confirmed in time"),
            DeposedReason::StoreError { error } => write!(f, "store error: {error}"),
            DeposedReason::Stalled => f.write_str("the leader's work stalled (no heartbeat)"),
            DeposedReason::TooLittleTime { remaining, required } => write!(
                f,
                "only {} of the lease was left and the work needed {} (renewals were late)",
                crate::time::Human(*remaining),
                crate::time::Human(*required)
            ),
            DeposedReason::Resigned => f.write_str("resigned"),
            DeposedReason::HandedOver { to } => write!(f, "handed over to {to}"),
            DeposedReason::WorkFinished => f.write_str("the leader's work finished"),
        }
    }
}

/// What the machine asks its driver to do, or reports.
#[derive(Debug)]
pub enum Output {
    /// Send this request; feed the reply back as [`Input::Reply`] with the same id. At most one
    /// request is outstanding; when [`Machine::pending`] no longer names it, drop it.
    Send(OpId, Request),
    /// This candidate is now leader.
    Elected {
        /// The grant.
        grant: Grant,
        /// Until when the leadership may be believed.
        valid_until: Instant,
    },
    /// A renewal was confirmed: the leadership may be believed longer.
    Extended {
        /// The new deadline.
        valid_until: Instant,
    },
    /// Leadership ended: stop believing it now and cancel the work.
    Deposed {
        /// The term that ended.
        term: Term,
        /// Why.
        reason: DeposedReason,
        /// The end of believed leadership (now, or the deadline if that passed first).
        believed_until: Instant,
    },
    /// The work did not stop by `valid_until`: drop it.
    AbortWork,
    /// Stepping down is complete (the work stopped or was aborted, the lease released if it
    /// could be); the machine is a follower again.
    SteppedDown {
        /// The term that ended.
        term: Term,
        /// How long the work took to stop after it was cancelled, if it stopped by itself.
        work_stopped_after: Option<Duration>,
        /// Whether the work had to be aborted.
        aborted: bool,
    },
    /// The holder this candidate sees changed (`None`: nobody holds the lease).
    LeaderChanged(Option<(CandidateId, Term)>),
    /// A store request failed; the machine carries on (retrying, reading back or stepping down).
    StoreTrouble(Error),
    /// The machine stopped for good after [`Input::Shutdown`].
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Purpose {
    Acquire,
    Renew,
    /// A release or hand-over, or a withdrawal sent again: the request, kept to be sent again
    /// should its outcome be unknown (see [`Machine::leave`]). Boxed: a pending request is part
    /// of every machine, thousands of them in a process that leads many leases.
    Delete(Box<Request>),
    /// The withdrawal of a stopping machine.
    Withdraw,
    /// Reading back after an acquire whose outcome is unknown: `sent` is the send time of the
    /// oldest acquire whose outcome is still unknown (any of them may be the one applied).
    AcquireReadBack {
        sent: Instant,
        term_floor: Option<Term>,
    },
    /// Reading back after a renew whose outcome is unknown.
    RenewReadBack,
    /// Checking how the previous holder ended before taking a free lease (lock delay).
    LockDelayCheck,
}

impl Purpose {
    /// The store operation the request is, for errors.
    fn operation(&self) -> &'static str {
        match self {
            Purpose::Acquire => "acquire",
            Purpose::Renew => "renew",
            Purpose::Delete(request) => match **request {
                Request::HandOver(..) => "hand_over",
                Request::Withdraw => "withdraw",
                _ => "release",
            },
            Purpose::Withdraw => "withdraw",
            Purpose::AcquireReadBack { .. } | Purpose::RenewReadBack | Purpose::LockDelayCheck => "inspect",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pending {
    id: OpId,
    purpose: Purpose,
    sent: Instant,
    deadline: Instant,
}

/// The holder record a follower is watching, for expiry observed by contenders.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Seen {
    holder: CandidateId,
    term: Term,
    version: String,
    ttl: Duration,
    /// When the reply that first showed this version arrived.
    since: Instant,
    /// When the store itself says it will let go (server-clock stores).
    store_deadline: Option<Instant>,
    /// A takeover of this version was asked for.
    takeover_asked: bool,
    /// Only contenders will end it: the store's expiry is observed, or the record is orphaned.
    observed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Following {
    next_attempt: Instant,
    seen: Option<Seen>,
    /// A change was notified while a request was under way: its reply may predate the change,
    /// so retry right after it.
    notified: bool,
    /// No attempt before this instant, notified or not (the back-off after stepping down).
    not_before: Instant,
    /// With a lock delay: what the last check found. `None`: check first (an Inspect),
    /// whatever notifications say.
    cleared: Option<Cleared>,
}

/// A lock-delay check found the lease free.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Cleared {
    /// The instant from which it may be acquired.
    from: Instant,
    /// The highest term ever granted, as the check saw it.
    last_term: Term,
    /// A second check after the wait found no newer term: acquire now.
    confirmed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Leading {
    grant: Grant,
    valid_until: Instant,
    next_renew: Instant,
    last_heartbeat: Instant,
    last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SteppingDown {
    grant: Grant,
    valid_until: Instant,
    cancelled_at: Instant,
    /// The lease is, or may still be, ours and its release is still to be sent once the work has
    /// stopped (voluntary, stalled or unconfirmed-renewal step-downs).
    release_due: bool,
    work_stopped: Option<Instant>,
    aborted: bool,
    then: Then,
    /// Hand the lease over to this candidate instead of releasing it.
    successor: Option<CandidateId>,
}

/// Whether a leader that steps down still holds the lease in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lease {
    /// Still ours (a voluntary or stalled step-down), or perhaps (no renewal confirmed in time:
    /// the grant or the last renewal may still stand in the store): released once the work has
    /// stopped. The release is conditional on the term, so it is harmless where the store has
    /// moved on, and frees the lease at once where it has not.
    StillOurs,
    /// Proved lost (another holder), or the record cannot be read (a definite store error):
    /// nothing to release; it expires.
    Lost,
}

/// What the machine does once a step-down is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Then {
    /// Follow again and campaign for the next term.
    CampaignAgain,
    /// Stop for good (a shutdown).
    Stop,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Following(Following),
    Leading(Leading),
    SteppingDown(SteppingDown),
    Stopping,
    Stopped,
}

/// The election state machine of one candidate for one lease. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine {
    timing: Timing,
    expiry: Expiry,
    notifications: Notifications,
    lease: LeaseName,
    me: CandidateId,
    state: State,
    pending: Option<Pending>,
    next_op: u64,
    leader_seen: Option<(CandidateId, Term)>,
    /// The highest term seen, once anything was seen: a read-back only adopts a grant of ours
    /// above it. `None` (nothing seen yet): a grant of ours found by a read-back could be an old
    /// one, so it is not adopted; the next acquire gets a new term instead.
    term_floor: Option<Term>,
    /// The send time of the oldest acquire whose outcome was ever unknown (timed out, failed
    /// ambiguously). Such a request may still be applied at any later moment, so it is never
    /// forgotten: not at a step-down, and not across campaigns ([`Machine::continue_from`]).
    unsettled_since: Option<Instant>,
    rng: u64,
    /// The store's name, for the errors the machine makes itself (a request it stopped waiting
    /// for).
    store: &'static str,
    /// A grant of ours whose reply came after the machine had stopped waiting for it: never
    /// believed (its term is under the floor) and released once the machine is idle.
    stray: Option<Grant>,
    /// An acquire given up on answered while the withdraw was under way: withdraw once more
    /// (see [`Machine::late_acquire`]).
    withdraw_again: bool,
    /// [`Input::RenewalsAnnounced`]: followers see every new version without reading.
    renewals_announced: bool,
    /// Deletions of ours whose outcome is unknown, oldest first: sent again (see
    /// [`Machine::leave`]).
    left: Vec<Left>,
}

/// A release, hand-over or withdrawal of ours that failed with a transient error or went
/// unanswered: it may not have been applied, and on a store whose sessions the process keeps
/// alive for its other leases (etcd, ZooKeeper) what it was to delete would then stay (a lease
/// held by nobody's engine, a candidate queued for nobody). Sent again from `due`, on the retry
/// timing, until the store answers it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Left {
    request: Request,
    due: Instant,
}

impl Left {
    /// The term a release or hand-over names.
    fn term(&self) -> Option<Term> {
        match &self.request {
            Request::Release(g) | Request::HandOver(g, _) => Some(g.term),
            _ => None,
        }
    }
}

/// At most this many deletions are kept to be sent again; the oldest is forgotten first.
const MAX_LEFT: usize = 4;

/// A follower's next attempt after it saw `seen` (its latest view of the holder), with `retry`
/// the next poll and `safety_poll` the long backstop of a store that notifies every end.
fn next_attempt(
    seen: Option<&Seen>,
    me: &CandidateId,
    notifications: Notifications,
    renewals_announced: bool,
    retry: Instant,
    safety_poll: Instant,
    lock_delay: Duration,
) -> Instant {
    match (seen, notifications) {
        (None, _) => retry,
        // Ours from an earlier campaign (not believed): the next acquire gets a new term.
        (Some(seen), _) if seen.holder == *me => retry,
        // A takeover of this very version was refused (the store knows better): wait a retry
        // interval rather than ask again at once.
        (Some(seen), _) if seen.observed && seen.takeover_asked => retry,
        // Every new version is announced: nothing to poll for until this one has been
        // unchanged for a TTL.
        (Some(seen), _) if seen.observed && renewals_announced => seen.since + seen.ttl + lock_delay,
        (Some(seen), _) if seen.observed => retry.min(seen.since + seen.ttl + lock_delay),
        (Some(_), Notifications::ReleaseAndExpiry) => safety_poll,
        // The store ends the grant itself; a holder that stops renewing is looked at once
        // its last version is a TTL old (a notification may come sooner). A lock delay runs
        // from the end the store then shows, not from here.
        (Some(seen), _) if renewals_announced => retry.max(seen.since + seen.ttl),
        (Some(seen), Notifications::Release) => seen.store_deadline.map_or(retry, |at| at.max(retry)),
        (Some(_), _) => retry,
    }
}

/// The highest term an observation proves was granted.
fn highest_term(observation: &Observation) -> Term {
    observation
        .holder
        .as_ref()
        .map_or(observation.last_term, |h| h.term.max(observation.last_term))
}

/// How long a follower with change notifications that cover expiry waits between safety polls,
/// in TTLs.
const SAFETY_POLL_TTLS: u32 = 10;

impl Machine {
    /// A follower of `lease` that makes its first attempt at `now`.
    ///
    /// `expiry` and `notifications` come from the store's
    /// [`Capabilities`](crate::Capabilities); `seed` seeds the retry jitter.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `timing` breaks an invariant.
    pub fn new(
        timing: Timing,
        expiry: Expiry,
        notifications: Notifications,
        lease: LeaseName,
        me: CandidateId,
        now: Instant,
        seed: u64,
    ) -> Result<Self> {
        timing.validate()?;
        Ok(Machine {
            timing,
            expiry,
            notifications,
            lease,
            me,
            state: State::Following(Following {
                next_attempt: now,
                seen: None,
                notified: false,
                not_before: now,
                cleared: None,
            }),
            pending: None,
            next_op: 0,
            leader_seen: None,
            term_floor: None,
            unsettled_since: None,
            rng: seed | 1,
            store: "lease",
            stray: None,
            withdraw_again: false,
            renewals_announced: false,
            left: Vec::new(),
        })
    }

    /// Names the store in the errors the machine makes itself (e.g. "etcd store did not answer
    /// renew within 3s"); the driver sets it from [`LeaseStore::name`](crate::LeaseStore::name).
    #[must_use]
    pub fn with_store_name(mut self, store: &'static str) -> Self {
        self.store = store;
        self
    }

    /// Carries over what an earlier machine of the same candidate and lease knew that still
    /// matters for safety: the send time of its oldest acquire whose outcome is unknown (the
    /// store may apply it at any later moment) and the highest term it saw; and what it still
    /// had to give back: a stray grant, and the releases and hand-overs whose outcome is unknown
    /// (sent again by this machine; a withdrawal is not, since this campaign queues the
    /// candidate again). The driver calls this for every new campaign of one
    /// [`Elector`](crate::Elector).
    pub fn continue_from(&mut self, earlier: &Machine) {
        for left in earlier.left.iter().filter(|l| l.term().is_some()) {
            if !self.left.contains(left) && self.left.len() < MAX_LEFT {
                self.left.push(left.clone());
            }
        }
        self.unsettled_since = match (self.unsettled_since, earlier.unsettled_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.term_floor = self.term_floor.max(earlier.term_floor);
        if self.stray.is_none() {
            self.stray.clone_from(&earlier.stray);
        }
    }

    /// Whether the machine is a follower (campaigning, not leading or stepping down).
    pub fn is_following(&self) -> bool {
        matches!(self.state, State::Following(_))
    }

    /// The timing the machine runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The outstanding request, if any.
    pub fn pending(&self) -> Option<OpId> {
        self.pending.as_ref().map(|p| p.id)
    }

    /// Whether this candidate believes it leads at `now`: it is leader and `now < valid_until`.
    /// This is what [`Leader::ensure_valid`](crate::Leader::ensure_valid) checks.
    pub fn believes_leader(&self, now: Instant) -> bool {
        matches!(&self.state, State::Leading(l) if now < l.valid_until)
    }

    /// The current term, while leader or stepping down.
    pub fn term(&self) -> Option<Term> {
        match &self.state {
            State::Leading(l) => Some(l.grant.term),
            State::SteppingDown(s) => Some(s.grant.term),
            _ => None,
        }
    }

    /// Whether the machine has stopped for good.
    pub fn is_stopped(&self) -> bool {
        self.state == State::Stopped
    }

    /// When the machine next needs an [`Input::Tick`] if nothing else happens.
    pub fn next_wake(&self) -> Option<Instant> {
        let op = self.pending.as_ref().map(|p| p.deadline);
        let state = match &self.state {
            State::Following(f) if self.pending.is_none() => Some(f.next_attempt),
            State::Leading(l) => {
                let mut at = l.valid_until - self.timing.step_down_margin;
                if self.pending.is_none() {
                    at = at.min(l.next_renew);
                }
                if let Some(stall) = self.timing.stall_timeout {
                    at = at.min(l.last_heartbeat + stall);
                }
                Some(at)
            }
            State::SteppingDown(s) if s.work_stopped.is_none() && !s.aborted => Some(s.valid_until),
            _ => None,
        };
        let left = match self.state {
            State::Following(_) | State::Stopped if self.pending.is_none() => self.left.iter().map(|l| l.due).min(),
            _ => None,
        };
        [op, state, left].into_iter().flatten().min()
    }

    /// Whether deletions of ours whose outcome is unknown (a release, hand-over or withdrawal
    /// that failed with a transient error or went unanswered) are still to be sent again: the
    /// driver keeps a stopped machine until none is.
    pub fn has_deletions_left(&self) -> bool {
        !self.left.is_empty()
    }

    /// Feeds one input at `now` and appends what to do to `out`.
    pub fn handle(&mut self, now: Instant, input: Input, out: &mut Vec<Output>) {
        match input {
            Input::Tick => {}
            Input::Notified => self.notified(now),
            Input::NotificationsLost => {
                self.notifications = Notifications::None;
                if let State::Following(f) = &mut self.state {
                    f.next_attempt = f.next_attempt.min(now.max(f.not_before));
                }
            }
            Input::YourTurn(turn) => self.your_turn(now, turn, out),
            Input::Announced(observation) => self.announced(now, &observation, out),
            Input::RenewalsAnnounced(live) => {
                self.renewals_announced = live;
                let retry = now + self.retry_delay();
                let idle = self.pending.is_none();
                let (me, notifications) = (self.me.clone(), self.notifications);
                let safety_poll = now + self.timing.ttl * SAFETY_POLL_TTLS;
                let lock_delay = self.timing.lock_delay.unwrap_or_default();
                match self.following_mut() {
                    Some(f) if !live => f.next_attempt = f.next_attempt.min(retry),
                    // Announcements came after the first answer (they are set up beside the
                    // campaign): the poll that answer armed is not needed, as if the answer had
                    // come now. A pending request or notification re-plans anyway.
                    Some(f) if idle && !f.notified && f.seen.is_some() => {
                        f.next_attempt = next_attempt(
                            f.seen.as_ref(),
                            &me,
                            notifications,
                            true,
                            retry,
                            safety_poll,
                            lock_delay,
                        );
                    }
                    _ => {}
                }
            }
            Input::Reply(id, reply) => match self.pending.take_if(|p| p.id == id) {
                Some(pending) => self.on_reply(now, pending, reply, out),
                None => match reply {
                    Reply::Acquire(Ok(Acquired::Granted(grant))) => self.late_grant(now, grant, out),
                    Reply::Acquire(_) => self.late_acquire(),
                    _ => {}
                },
            },
            Input::Heartbeat(at) => {
                if let State::Leading(l) = &mut self.state {
                    l.last_heartbeat = l.last_heartbeat.max(at);
                }
            }
            Input::Resign => self.resign(now, Then::CampaignAgain, out),
            Input::HandOver { to, work_stopped } => self.hand_over(now, to, work_stopped, out),
            Input::StepDown(reason) => {
                // The work's handle saw the step-down point first: the same as the timer below.
                let lease = match reason {
                    DeposedReason::RenewFailed { .. } => self.unconfirmed_lease(),
                    _ => Lease::StillOurs,
                };
                self.step_down(now, reason, lease, Then::CampaignAgain, out);
            }
            Input::Shutdown => self.resign(now, Then::Stop, out),
            Input::WorkStopped => match &mut self.state {
                State::Leading(_) => {
                    self.step_down(
                        now,
                        DeposedReason::WorkFinished,
                        Lease::StillOurs,
                        Then::CampaignAgain,
                        out,
                    );
                    if let State::SteppingDown(s) = &mut self.state {
                        s.work_stopped = Some(now);
                    }
                }
                State::SteppingDown(s) if s.work_stopped.is_none() && !s.aborted => s.work_stopped = Some(now),
                _ => {}
            },
        }
        self.advance(now, out);
    }

    /// `Resign` (the work has stopped) or `Shutdown` (stop for good, the work may still run).
    fn resign(&mut self, now: Instant, then: Then, out: &mut Vec<Output>) {
        // A resign comes from the work's handle once the work has returned; a shutdown may
        // come while it still runs.
        let work_stopped = then == Then::CampaignAgain;
        match &mut self.state {
            State::Leading(_) => {
                self.step_down(now, DeposedReason::Resigned, Lease::StillOurs, then, out);
                if let State::SteppingDown(s) = &mut self.state {
                    s.work_stopped = work_stopped.then_some(now);
                }
            }
            State::SteppingDown(s) => {
                if then == Then::Stop {
                    s.then = Then::Stop;
                }
                if work_stopped && s.work_stopped.is_none() && !s.aborted {
                    s.work_stopped = Some(now);
                }
            }
            // An acquire still in flight is waited for: a late grant is released before withdrawing.
            State::Following(_) if then == Then::Stop => self.state = State::Stopping,
            _ => {}
        }
    }

    /// A leader steps down to hand the lease over to `to` once its work has stopped; a leader
    /// already stepping down with the lease still to release hands it over instead.
    fn hand_over(&mut self, now: Instant, to: CandidateId, work_stopped: bool, out: &mut Vec<Output>) {
        if matches!(self.state, State::Leading(_)) {
            let reason = DeposedReason::HandedOver { to: to.clone() };
            self.step_down(now, reason, Lease::StillOurs, Then::CampaignAgain, out);
        }
        if let State::SteppingDown(s) = &mut self.state {
            if s.release_due {
                s.successor = Some(to);
            }
            // Also when there is nothing to hand over (the lease was lost, or is left to expire
            // with a lock delay): the work has stopped, and is not to be waited for.
            if work_stopped && s.work_stopped.is_none() && !s.aborted {
                s.work_stopped = Some(now);
            }
        }
    }

    /// Time-driven transitions, then the next request if none is outstanding.
    fn advance(&mut self, now: Instant, out: &mut Vec<Output>) {
        if let Some(pending) = self.pending.take_if(|p| now >= p.deadline) {
            let timeout = || Error::Timeout {
                store: self.store,
                operation: pending.purpose.operation(),
                after: now - pending.sent,
            };
            let reply = match pending.purpose {
                Purpose::Acquire => Reply::Acquire(Err(timeout())),
                Purpose::Renew => Reply::Renew(Err(timeout())),
                Purpose::Delete(ref request) if **request != Request::Withdraw => Reply::Release(Err(timeout())),
                Purpose::Delete(_) | Purpose::Withdraw => Reply::Withdraw(Err(timeout())),
                _ => Reply::Inspect(Err(timeout())),
            };
            self.on_reply(now, pending, reply, out);
        }
        if self.pending.is_none()
            && matches!(self.state, State::Following(_) | State::Stopping | State::Stopped)
            && let Some(grant) = self.stray.take()
        {
            self.delete(now, Request::Release(grant), out);
            return;
        }
        if self.pending.is_none()
            && matches!(self.state, State::Following(_) | State::Stopping | State::Stopped)
            && let Some(at) = self.left.iter().position(|l| now >= l.due)
        {
            let left = self.left.remove(at);
            self.delete(now, left.request, out);
            return;
        }
        match &mut self.state {
            State::Leading(l) => {
                if now >= l.valid_until - self.timing.step_down_margin {
                    let last_error = l.last_error.clone();
                    let lease = self.unconfirmed_lease();
                    self.step_down(
                        now,
                        DeposedReason::RenewFailed { last_error },
                        lease,
                        Then::CampaignAgain,
                        out,
                    );
                } else if self
                    .timing
                    .stall_timeout
                    .is_some_and(|stall| now >= l.last_heartbeat + stall)
                {
                    self.step_down(now, DeposedReason::Stalled, Lease::StillOurs, Then::CampaignAgain, out);
                } else if self.pending.is_none() && now >= l.next_renew {
                    let grant = l.grant.clone();
                    self.send(now, Purpose::Renew, Request::Renew(grant), out);
                }
            }
            State::Following(f) if self.pending.is_none() && now >= f.next_attempt => {
                let takeover = f.seen.as_ref().filter(|seen| {
                    seen.observed && now >= seen.since + seen.ttl + self.timing.lock_delay.unwrap_or_default()
                });
                let lock_delay = self.timing.lock_delay.is_some() && takeover.is_none();
                let wait_until = f
                    .cleared
                    .as_ref()
                    .filter(|c| lock_delay && now < c.from)
                    .map(|c| c.from);
                let look = lock_delay && !f.cleared.as_ref().is_some_and(|c| c.confirmed);
                if let Some(at) = wait_until {
                    // Still inside the lock delay (a notification woke us early).
                    f.next_attempt = at;
                } else if look {
                    // The first look, or the look again once the delay has passed.
                    self.send(now, Purpose::LockDelayCheck, Request::Inspect, out);
                } else {
                    let takeover = takeover.map(|seen| seen.version.clone());
                    if let Some(seen) = f.seen.as_mut().filter(|_| takeover.is_some()) {
                        seen.takeover_asked = true;
                    }
                    // Should this acquire fail, the next one looks again first.
                    if let Some(c) = &mut f.cleared {
                        c.confirmed = false;
                    }
                    let request = AcquireRequest {
                        lease: self.lease.clone(),
                        candidate: self.me.clone(),
                        ttl: self.timing.ttl,
                        takeover,
                    };
                    self.send(now, Purpose::Acquire, Request::Acquire(request), out);
                }
            }
            State::Stopping if self.pending.is_none() => {
                self.send(now, Purpose::Withdraw, Request::Withdraw, out);
            }
            _ => {}
        }
        self.advance_step_down(now, out);
    }

    fn advance_step_down(&mut self, now: Instant, out: &mut Vec<Output>) {
        let State::SteppingDown(s) = &mut self.state else {
            return;
        };
        if s.work_stopped.is_none() && !s.aborted {
            if now < s.valid_until {
                return;
            }
            s.aborted = true;
            out.push(Output::AbortWork);
        }
        // Also after `valid_until` (a resign the driver could only pass on late): the release is
        // conditional on the grant's term, so it cannot end a successor's grant. Not after an
        // abort: that work is not known to have stopped.
        if s.release_due && !s.aborted && self.pending.is_none() {
            s.release_due = false;
            let grant = s.grant.clone();
            let request = match s.successor.clone() {
                Some(to) => Request::HandOver(grant, to),
                None => Request::Release(grant),
            };
            self.delete(now, request, out);
            return;
        }
        if self.pending.is_some() {
            return; // the release is under way
        }
        // A newer grant of ours that the store showed superseding this term (an acquire of ours
        // applied late): believed by nobody, and holding the lease from everyone until it
        // expires. Given back (conditionally on its term) before the step-down is complete.
        if let Some(stray) = self.stray.take() {
            self.delete(now, Request::Release(stray), out);
            return;
        }
        out.push(Output::SteppedDown {
            term: s.grant.term,
            work_stopped_after: s.work_stopped.map(|at| at - s.cancelled_at),
            aborted: s.aborted,
        });
        let (then, term) = (s.then, s.grant.term);
        self.raise_term_floor(term);
        if then == Then::Stop {
            self.state = State::Stopped;
            out.push(Output::Stopped);
        } else {
            // Back off before campaigning again, so that a healthy candidate can take over.
            let next_attempt = now + self.timing.step_down_backoff();
            self.state = State::Following(Following {
                next_attempt,
                seen: None,
                notified: false,
                not_before: next_attempt,
                cleared: None,
            });
        }
    }

    /// Sends a release, hand-over or withdrawal, to be sent again should its outcome be unknown.
    fn delete(&mut self, now: Instant, request: Request, out: &mut Vec<Output>) {
        self.send(now, Purpose::Delete(Box::new(request.clone())), request, out);
    }

    /// A release, hand-over or withdrawal of ours failed with a transient error, or went
    /// unanswered: the store may not have applied it. Where the process keeps the store's
    /// session alive for its other leases (etcd, ZooKeeper), what it was to delete would stay
    /// for as long: a released lease held by nobody's engine, a withdrawn candidate queued ahead
    /// of everyone behind it. So it is sent again after a retry delay, while the machine is idle
    /// and not leading, until the store answers it (the driver runs on until then, or hands
    /// them to the next campaign's machine: [`Machine::continue_from`]). Always safe: a release
    /// or hand-over names its grant's term and the store applies it to that term's record only;
    /// a withdrawal is left only by a stopped machine, and is not carried into a next campaign
    /// (which queues the candidate again). A grant of that same term (a FIFO store handing the
    /// candidate its place again) takes it back (see [`Machine::granted`]).
    fn leave(&mut self, now: Instant, request: Request) {
        if self.left.iter().any(|l| l.request == request) {
            return;
        }
        if self.left.len() >= MAX_LEFT {
            self.left.remove(0);
        }
        let due = now + self.retry_delay();
        self.left.push(Left { request, due });
    }

    fn send(&mut self, now: Instant, purpose: Purpose, request: Request, out: &mut Vec<Output>) {
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.pending = Some(Pending {
            id,
            purpose,
            sent: now,
            deadline: now + self.timing.request_timeout,
        });
        out.push(Output::Send(id, request));
    }

    fn on_reply(&mut self, now: Instant, pending: Pending, reply: Reply, out: &mut Vec<Output>) {
        match (pending.purpose, reply) {
            (Purpose::Acquire, Reply::Acquire(result)) => match result {
                Ok(Acquired::Granted(grant)) => self.granted(now, pending.sent, grant, out),
                Ok(Acquired::Held(observation)) => self.observe(now, &observation, out),
                Err(e) if e.is_transient() => {
                    let sent = *self.unsettled_since.get_or_insert(pending.sent);
                    let term_floor = self.term_floor;
                    out.push(Output::StoreTrouble(e));
                    let purpose = Purpose::AcquireReadBack { sent, term_floor };
                    self.send(now, purpose, Request::Inspect, out);
                }
                Err(e) => self.follower_trouble(now, e, out),
            },
            (Purpose::AcquireReadBack { sent, term_floor }, Reply::Inspect(result)) => match result {
                Ok(observation) => match &observation.holder {
                    // Stopping: whatever grant of ours the store shows is given back (a release
                    // is conditional on that very record, and nobody believes it), so the lease
                    // does not sit held until it expires.
                    Some(h) if h.id == self.me && self.state == State::Stopping => {
                        self.raise_term_floor(h.term);
                        let grant = self.our_grant(h);
                        self.delete(now, Request::Release(grant), out);
                    }
                    // Above the floor when the acquire was sent, and above anything learnt since
                    // (a stray grant of ours that came back late is never adopted).
                    // A reservation for us is no grant: its term is the previous holder's.
                    Some(h)
                        if h.id == self.me
                            && !h.reserved
                            && term_floor.is_some_and(|floor| h.term > floor.max(self.term_floor.unwrap_or(floor))) =>
                    {
                        let grant = self.our_grant(h);
                        self.granted(now, sent, grant, out);
                    }
                    _ => self.observe(now, &observation, out),
                },
                Err(e) => self.follower_trouble(now, e, out),
            },
            (Purpose::LockDelayCheck, Reply::Inspect(result)) => match result {
                Ok(observation) if observation.holder.is_none() => {
                    let delay = match observation.previous_end {
                        Some(EndReason::Released) => Duration::ZERO,
                        _ => self.timing.lock_delay.unwrap_or_default(),
                    };
                    let earlier = self.following_mut().and_then(|f| f.cleared.take());
                    self.observe(now, &observation, out);
                    if let Some(f) = self.following_mut() {
                        let last_term = observation.last_term;
                        let cleared = match earlier {
                            // The second look after the wait: no term started in between.
                            Some(c) if c.last_term == last_term && now >= c.from => Cleared { confirmed: true, ..c },
                            // First look, or a term started (and ended) inside the wait: wait
                            // again, from now. A release needs no delay and no second look.
                            _ => Cleared {
                                from: now + delay,
                                last_term,
                                confirmed: delay.is_zero(),
                            },
                        };
                        f.next_attempt = if cleared.confirmed { now } else { cleared.from };
                        f.cleared = Some(cleared);
                    }
                }
                // Handed over to this candidate: a clean end, taken at once with no delay (the
                // look would otherwise see the reservation as a holder and look again until it
                // expired).
                Ok(observation)
                    if observation
                        .holder
                        .as_ref()
                        .is_some_and(|h| h.reserved && h.id == self.me) =>
                {
                    self.observe(now, &observation, out);
                    if let Some(f) = self.following_mut() {
                        f.cleared = Some(Cleared {
                            from: now,
                            last_term: observation.last_term,
                            confirmed: true,
                        });
                        f.next_attempt = now;
                    }
                }
                Ok(observation) => self.observe(now, &observation, out),
                Err(e) => self.follower_trouble(now, e, out),
            },
            (Purpose::Renew, Reply::Renew(result)) => match result {
                Ok(Renewed::Renewed(grant)) => {
                    let believed_ttl = self.timing.believed_ttl();
                    let renew_every = self.timing.renew_every;
                    if let State::Leading(l) = &mut self.state {
                        l.valid_until = l.valid_until.max(pending.sent + believed_ttl);
                        l.next_renew = pending.sent + renew_every;
                        l.grant = grant;
                        l.last_error = None;
                        out.push(Output::Extended {
                            valid_until: l.valid_until,
                        });
                    }
                }
                Ok(Renewed::Lost(observation)) => self.superseded(now, &observation, out),
                Err(e) if e.is_transient() => {
                    if let State::Leading(l) = &mut self.state {
                        l.last_error = Some(e.to_string());
                    }
                    out.push(Output::StoreTrouble(e));
                    self.send(now, Purpose::RenewReadBack, Request::Inspect, out);
                }
                Err(e) => {
                    let error = e.to_string();
                    out.push(Output::StoreTrouble(e));
                    self.step_down(
                        now,
                        DeposedReason::StoreError { error },
                        Lease::Lost,
                        Then::CampaignAgain,
                        out,
                    );
                }
            },
            (Purpose::RenewReadBack, Reply::Inspect(result)) => {
                let retry = now + self.retry_delay();
                // The last moment a renewal can be sent and still be confirmed before the
                // step-down point: a retry interval later may be too late on a slow store.
                let last_chance = self.timing.step_down_margin + self.timing.request_timeout;
                let floor = self.timing.retry_floor();
                let State::Leading(l) = &mut self.state else { return };
                // Never sooner than the retry floor: a store that fails at once must not see a
                // storm of renewals near the step-down point.
                let next = retry
                    .min(l.valid_until.checked_sub(last_chance).unwrap_or(now))
                    .max(now + floor);
                match result {
                    Ok(observation) => match &observation.holder {
                        Some(h) if h.id == self.me && h.term == l.grant.term => {
                            // Still ours; the deadline stays where the last confirmed renewal put it.
                            l.grant.token = h.version.clone();
                            l.next_renew = next;
                        }
                        _ => self.superseded(now, &observation, out),
                    },
                    Err(e) if e.is_transient() => {
                        l.last_error = Some(e.to_string());
                        l.next_renew = next;
                        out.push(Output::StoreTrouble(e));
                    }
                    Err(e) => {
                        let error = e.to_string();
                        out.push(Output::StoreTrouble(e));
                        self.step_down(
                            now,
                            DeposedReason::StoreError { error },
                            Lease::Lost,
                            Then::CampaignAgain,
                            out,
                        );
                    }
                }
            }
            (Purpose::Delete(request), Reply::Release(result) | Reply::Withdraw(result)) => {
                if let Err(e) = result {
                    if e.is_transient() {
                        self.leave(now, *request);
                    }
                    out.push(Output::StoreTrouble(e));
                }
            }
            (Purpose::Withdraw, Reply::Withdraw(result)) => {
                if let Err(e) = result {
                    if e.is_transient() {
                        self.leave(now, Request::Withdraw);
                    }
                    out.push(Output::StoreTrouble(e));
                }
                // Otherwise still stopping: the withdraw is sent again.
                if !std::mem::take(&mut self.withdraw_again) {
                    self.state = State::Stopped;
                    out.push(Output::Stopped);
                }
            }
            (purpose, reply) => {
                debug_assert!(false, "reply {reply:?} does not answer {purpose:?}");
            }
        }
    }

    fn granted(&mut self, now: Instant, sent: Instant, grant: Grant, out: &mut Vec<Output>) {
        let valid_until = sent + self.timing.believed_ttl();
        if self.state == State::Stopping {
            self.delete(now, Request::Release(grant), out);
            return;
        }
        if !matches!(self.state, State::Following(_)) {
            return;
        }
        if now + self.timing.step_down_margin >= valid_until {
            // The reply came too late to lead safely: give the lease back at once.
            out.push(Output::StoreTrouble(Error::engine(format!(
                "the {} store granted term {} {:?} after the acquire was sent, too late to lead \
                 with (less than the step-down margin left): releasing it",
                self.store,
                grant.term,
                now - sent
            ))));
            self.delete(now, Request::Release(grant), out);
            let next = now + self.timing.retry_floor();
            if let Some(f) = self.following_mut() {
                f.next_attempt = next;
            }
            return;
        }
        let next_renew = sent + self.timing.renew_every;
        // A store that hands a candidate its existing place again (a FIFO queue) may grant the
        // term of a stray: it is in use now, not to be released.
        self.stray.take_if(|stray| stray.term == grant.term);
        self.left.retain(|l| l.term() != Some(grant.term));
        self.raise_term_floor(grant.term);
        self.set_leader_seen(Some((grant.holder.clone(), grant.term)), out);
        // A leader's driver drops its announcements; a follower again counts on them only once
        // they are live again.
        self.renewals_announced = false;
        out.push(Output::Elected {
            grant: grant.clone(),
            valid_until,
        });
        self.state = State::Leading(Leading {
            grant,
            valid_until,
            next_renew,
            last_heartbeat: now,
            last_error: None,
        });
    }

    fn superseded(&mut self, now: Instant, observation: &Observation, out: &mut Vec<Output>) {
        // The store may show this very candidate at a newer term (an old acquire applied late):
        // that term must not be adopted later by a read-back, and is released as a stray once
        // the work has stopped.
        self.raise_term_floor(highest_term(observation));
        if let Some(h) = observation.holder.as_ref().filter(|h| h.id == self.me && !h.reserved)
            && self.stray.as_ref().is_none_or(|stray| stray.term < h.term)
        {
            self.stray = Some(self.our_grant(h));
        }
        let by = observation.holder.as_ref().map(|h| h.id.clone());
        let term = observation.holder.as_ref().map(|h| h.term);
        self.step_down(
            now,
            DeposedReason::Superseded { by, term },
            Lease::Lost,
            Then::CampaignAgain,
            out,
        );
    }

    /// What a leader deposed for want of a confirmed renewal does with its lease. Not proved
    /// lost: the store may still hold the grant (or the last renewal, applied with its reply
    /// missing) for a TTL more. Released once the work has stopped, so that the next candidate
    /// need not wait for it to expire; but not with a lock delay: a leader cut off from the store
    /// is what the delay is for (its side effects may still be in flight), and a release would
    /// let the next candidate skip it.
    fn unconfirmed_lease(&self) -> Lease {
        if self.timing.lock_delay.is_some() {
            Lease::Lost
        } else {
            Lease::StillOurs
        }
    }

    fn step_down(&mut self, now: Instant, reason: DeposedReason, lease: Lease, then: Then, out: &mut Vec<Output>) {
        let State::Leading(l) = &self.state else { return };
        self.pending = None;
        // When the store proved who leads now, observers learn it at once.
        let reason_leader = match &reason {
            DeposedReason::Superseded {
                by: Some(by),
                term: Some(term),
            } => Some((by.clone(), *term)),
            _ => None,
        };
        out.push(Output::Deposed {
            term: l.grant.term,
            reason,
            believed_until: now.min(l.valid_until),
        });
        self.state = State::SteppingDown(SteppingDown {
            grant: l.grant.clone(),
            valid_until: l.valid_until,
            cancelled_at: now,
            release_due: lease == Lease::StillOurs,
            work_stopped: None,
            aborted: false,
            then,
            successor: None,
        });
        self.set_leader_seen(reason_leader, out);
    }

    fn follower_trouble(&mut self, now: Instant, error: Error, out: &mut Vec<Output>) {
        out.push(Output::StoreTrouble(error));
        let next = now + self.retry_delay();
        if let Some(f) = self.following_mut() {
            f.next_attempt = next;
        }
    }

    /// An announced holder (see [`Input::Announced`]).
    fn announced(&mut self, now: Instant, observation: &Observation, out: &mut Vec<Output>) {
        let (State::Following(f), Some(h)) = (&self.state, &observation.holder) else {
            return;
        };
        if h.id == self.me {
            return;
        }
        let newer = self.leader_seen.as_ref().is_none_or(|(_, term)| *term < h.term);
        // A new version of the holder watched, or a newer holder; never an older term (an
        // announcement can come after a read that showed what followed it).
        let sighting = self.renewals_announced
            && self.pending.is_none()
            && f.seen.as_ref().is_none_or(|seen| {
                seen.term < h.term || (seen.term == h.term && seen.holder == h.id && seen.version != h.version)
            });
        if sighting {
            self.observe(now, observation, out);
        } else if newer {
            self.set_leader_seen(Some((h.id.clone(), h.term)), out);
        }
    }

    /// Records what a follower saw and picks its next attempt.
    fn observe(&mut self, now: Instant, observation: &Observation, out: &mut Vec<Output>) {
        let retry = now + self.retry_delay();
        let notifications = self.notifications;
        let expiry = self.expiry;
        let lock_delay = self.timing.lock_delay.unwrap_or_default();
        let safety_poll = now + self.timing.ttl * SAFETY_POLL_TTLS;
        let renewals_announced = self.renewals_announced;
        let me = self.me.clone();
        self.raise_term_floor(highest_term(observation));
        let Some(f) = self.following_mut() else { return };
        match &observation.holder {
            Some(h) => {
                f.cleared = None;
                let store_deadline = h.store_remaining.map(|r| now + r);
                let observed = expiry == Expiry::ObservedByContenders || h.orphaned;
                match &mut f.seen {
                    Some(seen) if seen.version == h.version && seen.holder == h.id && seen.term == h.term => {
                        seen.store_deadline = store_deadline;
                        seen.observed = observed;
                    }
                    seen => {
                        *seen = Some(Seen {
                            holder: h.id.clone(),
                            term: h.term,
                            version: h.version.clone(),
                            ttl: h.ttl,
                            since: now,
                            store_deadline,
                            takeover_asked: false,
                            observed,
                        });
                    }
                }
            }
            None => f.seen = None,
        }
        f.next_attempt = next_attempt(
            f.seen.as_ref(),
            &me,
            notifications,
            renewals_announced,
            retry,
            safety_poll,
            lock_delay,
        );
        if std::mem::take(&mut f.notified) {
            f.next_attempt = now.max(f.not_before);
        }
        let leader = observation.holder.as_ref().map(|h| (h.id.clone(), h.term));
        self.set_leader_seen(leader, out);
    }

    /// A change was notified: a follower attempts at once (after a request under way, whose
    /// reply may predate the change).
    fn notified(&mut self, now: Instant) {
        let busy = self.pending.is_some();
        if let State::Following(f) = &mut self.state {
            f.next_attempt = f.next_attempt.min(now.max(f.not_before));
            f.notified |= busy;
        }
    }

    /// The store's change stream says this candidate's turn has come ([`Input::YourTurn`]). An
    /// idle follower takes it as a grant answering an acquire sent at `valid_from` and renews at
    /// once: that renewal is the engine's confirmation, and writes what the store records of a
    /// term. A follower with a request under way (whose reply may predate the turn, and which
    /// the store may still apply) or with a `lock_delay` (the store does not say how the term
    /// before ended) takes it as a notification, and asks: the model check finds two leaders
    /// when a turn gives up on an acquire under way instead. A turn at or below a term already
    /// seen is stale, and one that comes to anything but a follower is a late grant.
    fn your_turn(&mut self, now: Instant, turn: crate::store::Turn, out: &mut Vec<Output>) {
        let crate::store::Turn { grant, valid_from } = turn;
        let following = matches!(self.state, State::Following(_));
        if following && (self.pending.is_some() || self.timing.lock_delay.is_some()) {
            return self.notified(now);
        }
        if !following || self.term_floor.is_some_and(|floor| grant.term <= floor) {
            return self.late_grant(now, grant, out);
        }
        self.granted(now, valid_from.min(now), grant, out);
        if let State::Leading(l) = &mut self.state {
            l.next_renew = now;
        }
    }

    /// A grant of ours that came back after the machine stopped waiting for its acquire (the
    /// request was applied late, or its reply was slow).
    ///
    /// A follower takes it as a read-back showing the grant would be taken: believed from the
    /// send time of the oldest acquire whose outcome was unknown (this request was sent no
    /// earlier), and given back at once if that leaves too little time. It is a reply to this
    /// machine's own request, so no floor applies: it cannot be an old grant of an earlier run.
    ///
    /// Otherwise it is not believed, ever: its term goes under the floor, so no read-back adopts
    /// it, and unless the machine leads or steps down with that very term (adopted meanwhile by
    /// a read-back) it is released once the machine is idle and not leading (stopping or stopped
    /// included: the driver keeps a stopped machine until every call it gave up on has ended), so
    /// that it does not keep the lease from everyone until it expires.
    fn late_grant(&mut self, now: Instant, grant: Grant, out: &mut Vec<Output>) {
        match &self.state {
            State::Leading(Leading { grant: ours, .. }) | State::SteppingDown(SteppingDown { grant: ours, .. })
                if ours.term == grant.term =>
            {
                return;
            }
            State::Following(_) if self.term_floor.is_none_or(|floor| grant.term > floor) => {
                if let Some(sent) = self.unsettled_since {
                    // A call under way (the next acquire, a read-back) is given up on: a leader
                    // must be free to renew. Its reply comes late (a grant is then a stray).
                    self.pending = None;
                    self.granted(now, sent, grant, out);
                    return;
                }
            }
            _ => {}
        }
        self.raise_term_floor(grant.term);
        if self.stray.as_ref().is_none_or(|stray| stray.term < grant.term) {
            self.stray = Some(grant);
        }
    }

    /// An acquire the machine gave up on answered late, with anything but a grant (which
    /// [`Machine::late_grant`] releases). Once stopping, it may have been applied after the
    /// withdraw: a FIFO store would then keep this candidate's place queued for nobody, ahead of
    /// every later candidate (on etcd a key on the process's shared session, kept alive by its
    /// other elections), so the candidate withdraws once more. The driver keeps a stopped machine
    /// until every call it gave up on has ended, so every such answer comes here.
    fn late_acquire(&mut self) {
        match &self.state {
            State::Stopped => self.state = State::Stopping,
            State::Stopping if self.pending.as_ref().is_some_and(|p| p.purpose == Purpose::Withdraw) => {
                self.withdraw_again = true;
            }
            _ => {}
        }
    }

    /// The grant a read-back shows this candidate holding.
    fn our_grant(&self, holder: &HolderInfo) -> Grant {
        Grant {
            lease: self.lease.clone(),
            holder: self.me.clone(),
            term: holder.term,
            ttl: self.timing.ttl,
            token: holder.version.clone(),
        }
    }

    fn raise_term_floor(&mut self, term: Term) {
        self.term_floor = Some(self.term_floor.unwrap_or_default().max(term));
    }

    fn set_leader_seen(&mut self, leader: Option<(CandidateId, Term)>, out: &mut Vec<Output>) {
        if self.leader_seen != leader {
            self.leader_seen = leader.clone();
            out.push(Output::LeaderChanged(leader));
        }
    }

    fn following_mut(&mut self) -> Option<&mut Following> {
        match &mut self.state {
            State::Following(f) => Some(f),
            _ => None,
        }
    }

    /// `retry_every` plus up to `jitter * retry_every`, from a xorshift generator.
    fn retry_delay(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        self.timing.retry_every + self.timing.retry_every.mul_f64(self.timing.jitter.as_f64() * unit)
    }
}
