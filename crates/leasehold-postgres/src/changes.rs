//! Change notifications: one `LISTEN` connection per store, fanned out to every candidate that
//! waits on a lease of that store, and a **queue watcher** per lease a candidate of the store
//! waits on, so that a release wakes one candidate, not all of them.
//!
//! Releases, takeovers, breaks and the expiry of abandoned grants send `NOTIFY leasehold,
//! '<schema>/<lease>/<candidate>'` in the statement that makes the change, so the notification is
//! delivered when the change commits. A candidate is not woken by its own change: a leader that
//! released (and may campaign again at once, as `Elector::run` does) learns nothing from it, and
//! being woken would cut short the pause the engine makes after stepping down so that another
//! candidate can take over.
//!
//! # The queue
//!
//! Each store with a candidate waiting on a lease keeps one more connection for that lease, its
//! queue watcher, which waits in the server's lock queue:
//!
//! 1. `pg_advisory_lock(queue key)`: the server grants the lease's queue key to one watcher at a
//!    time, in the order they asked (a dead watcher's place goes with its session). The holder
//!    of the queue key is the **head**.
//! 2. The head waits with `pg_advisory_lock_shared(lease key)` until the lease's lock is free:
//!    the holder released it, handed it over, or its session ended (a crash, `idle_session_timeout`
//!    of a silent holder, `pg_terminate_backend`, a reset connection). The same statement waits
//!    (`SELECT ... FOR SHARE` of the lease row) for the statement that freed the lock to commit
//!    (a release gives the lock back before its commit) and gives the shared lock back: it is
//!    never held across a round trip, so a lost reply cannot leave it keeping everyone out.
//! 3. It wakes one of its store's waiting candidates, which then acquires. Granted: the watcher
//!    gives the queue key back (and queues again if other candidates of the store still wait).
//!    Held by a lock someone holds: it waits on the lease key again. Held by a row whose lock is
//!    free (orphaned, or reserved by a handover): the engine takes it over by its version, on its
//!    own timer.
//!
//! A release that gave its lock back says so in its notification ([`QUEUED`](crate::sql::QUEUED)); a store with a
//! running watcher on the lease does not wake its candidates for it (the head wakes by the
//! lock). A handover names its successor ([`HANDOVER`](crate::sql::HANDOVER)): only the successor is woken (a head
//! whose store does not have it wakes nobody). Without a watcher (none could connect, or [`MAX_WATCHERS`] are running), every
//! notification wakes every candidate, as before the queue. Followers also attempt on their own
//! timer (the store notifies [`Release`](leasehold_core::Notifications::Release): at
//! `retry_every`, or a TTL after the last version announced), so a lost wake-up costs time,
//! never an election.
//!
//! # Announcements
//!
//! Every grant also sends `NOTIFY leasehold_granted, '<schema>/<lease>\n<term>\n<ttl_ms>\n<version>\n<holder>'`
//! in its statement (see [`GRANTED_CHANNEL`]). The same listener listens to that channel and
//! passes each grant of a lease to that lease's announcement streams
//! ([`Notifier::announcements`]) as what `inspect` would show right after it: followers that
//! the queue does not wake learn of the new leader at once, without a read each. Every statement
//! that renews sends its renewed records the same way on [`RENEWED_CHANNEL`] (as many per
//! notification as fit, an empty line between two), passed on as each lease's latest version: an
//! idle follower then sees every version without polling. The listener listens to
//! [`RENEWED_CHANNEL`] only while the store has an announcement stream (`UNLISTEN` when the last
//! one ends, `LISTEN` again with the next): every renewal of the database comes on it, and a
//! store whose followers all lead now has no use for them. Neither wakes a change stream (other
//! channels, which older versions do not listen to).
//!
//! The listener never retries on its own: when its connection fails, every stream ends (the
//! engine then polls) and the next [`Notifier::changes`] starts a new listener.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{Acquired, Announcements, CandidateId, Changes, LeaseName, Observation};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::schema::quoted;
use crate::sql::{CHANNEL, GRANTED_CHANNEL, RENEWED_CHANNEL};

mod payload;
mod queue;

use payload::{Kind, granted, granted_lease, parse};
use queue::watch_queue;

/// Queue watchers one store runs at most (each is a connection). A lease waited on beyond that
/// has none: its candidates wake on every notification, as without the queue.
pub(crate) const MAX_WATCHERS: usize = 32;

/// How often the server checks, while a watcher's statement waits, that the watcher's client is
/// still there: bounds how long a vanished watcher keeps its place at the head of a queue.
const CLIENT_CHECK_INTERVAL_MS: u32 = 1000;

/// What a candidate's acquire found, as the queue watcher needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted: the candidate no longer waits.
    Granted,
    /// Held, and the lease's lock was held (by the holder, or for an instant by someone else):
    /// the head waits on the lock again.
    Busy,
    /// Held by a row whose lock is free (orphaned, reserved): the engine's timer decides.
    Free,
    /// The acquire failed: nothing learnt of the lease.
    Unknown,
}

impl Outcome {
    /// The outcome of an acquire's answer.
    pub(crate) fn of(answer: &leasehold_core::Result<Acquired>) -> Outcome {
        match answer {
            Ok(Acquired::Granted(_)) => Outcome::Granted,
            Ok(Acquired::Held(seen)) => match &seen.holder {
                Some(holder) if holder.orphaned => Outcome::Free,
                _ => Outcome::Busy,
            },
            Err(_) => Outcome::Unknown,
        }
    }
}

/// One subscription (one campaign of one candidate).
#[derive(Debug)]
struct Waiter {
    id: u64,
    candidate: String,
    /// Counts wake-ups.
    tx: watch::Sender<u64>,
    /// Its last acquire found the lease held (not granted since).
    waiting: bool,
}

impl Waiter {
    fn live(&self) -> bool {
        self.waiting && self.tx.receiver_count() > 0
    }

    fn wake(&self) {
        self.tx.send_modify(|n| *n += 1);
    }
}

/// The queue watcher of one lease, as its task and the store share it.
#[derive(Debug)]
struct Watcher {
    poke: Arc<Notify>,
    /// A candidate's acquire found the lock held: wait on it again.
    rearm: bool,
    /// A candidate of this store was granted: give the queue key back.
    granted: bool,
    /// The head's candidate found a row whose lock is free (orphaned, reserved): the engine
    /// takes it over on its own timer, and until the watcher waits on the lock again, every
    /// notification wakes this store's candidates (a release by a holder that took its lock
    /// back, which only the queue would otherwise announce).
    free: bool,
    /// The watcher waits in the queue or on the lock (from its decision to wait until the lock
    /// was free): it sees a release that gives the lock back by itself.
    waiting: bool,
    /// A release that gave its lock back was let go while the watcher was not waiting and not
    /// `free`: after it woke the head, before the head's acquire told what it found. If that
    /// acquire found the row orphaned (it read before the holder took its lock back and
    /// released), the release came after what it read: the head is woken again (see
    /// [`Notifier::acquired`]).
    missed: bool,
}

#[derive(Debug, Default)]
struct Lease {
    /// In the order they subscribed.
    waiters: Vec<Waiter>,
    watcher: Option<Watcher>,
}

#[derive(Debug)]
struct State {
    leases: HashMap<String, Lease>,
    /// Per lease with announcement streams: the last grant announced (streams see the latest).
    announced: HashMap<String, watch::Sender<Option<Observation>>>,
    /// Whether some announcement stream exists: the listener listens to [`RENEWED_CHANNEL`]
    /// only then (every renewal of the database comes on it).
    renewals_wanted: watch::Sender<bool>,
    listener: Option<JoinHandle<()>>,
    next_id: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            leases: HashMap::new(),
            announced: HashMap::new(),
            renewals_wanted: watch::channel(false).0,
            listener: None,
            next_id: 0,
        }
    }
}

impl State {
    fn watchers(&self) -> usize {
        self.leases.values().filter(|l| l.watcher.is_some()).count()
    }

    /// Tells the listener whether to listen to renewals, after `announced` changed.
    fn renewals_wanted_now(&self) {
        let wanted = !self.announced.is_empty();
        self.renewals_wanted
            .send_if_modified(|w| std::mem::replace(w, wanted) != wanted);
    }
}

/// What a queue watcher needs to connect and wait.
struct QueueSetup {
    options: PgConnectOptions,
    /// For `pg_terminate_backend` of a watcher dropped while its statement waits.
    pool: PgPool,
    connect_timeout: Duration,
    schema: String,
    /// `$1` lease, `$2` its lock key → waits until the lock is free and the statement that freed
    /// it has committed, then gives the shared lock back; all in one statement, so that the
    /// shared lock is never held across a round trip (a lost reply must not leave it held).
    /// Answers the successor the row is reserved for, if it was handed over.
    free_wait: String,
}

/// The notification side of a store.
pub(crate) struct Notifier {
    state: Arc<Mutex<State>>,
    options: PgConnectOptions,
    connect_timeout: Duration,
    /// `<schema>/`: the payload prefix of this store's notifications.
    prefix: String,
    queue: Arc<QueueSetup>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the connect options: their Debug shows the password.
        f.debug_struct("Notifier")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    pub(crate) fn new(options: PgConnectOptions, connect_timeout: Duration, schema: &str, pool: PgPool) -> Notifier {
        let queue_options = options.clone().options([
            ("statement_timeout", "0".to_string()),
            ("lock_timeout", "0".to_string()),
            ("idle_session_timeout", "0".to_string()),
            ("client_connection_check_interval", CLIENT_CHECK_INTERVAL_MS.to_string()),
        ]);
        let queue_options = match queue_options.get_application_name() {
            Some(_) => queue_options,
            None => queue_options.application_name("leasehold-queue"),
        }
        // Its `pg_advisory_lock` waits for as long as the followers before it: slow by design,
        // not the WARN sqlx gives a statement over a second (the application's own connections
        // keep that default).
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1));
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("leasehold-listen"),
        };
        Notifier {
            state: Arc::default(),
            options,
            connect_timeout,
            prefix: format!("{schema}/"),
            queue: Arc::new(QueueSetup {
                options: queue_options,
                pool,
                connect_timeout,
                schema: schema.to_string(),
                // The row lock waits after the advisory one: the join needs `k`'s row before any
                // lease row reaches the lock. CASE evaluates its condition (both waits) before
                // the unlock.
                free_wait: format!(
                    "WITH k AS MATERIALIZED (SELECT pg_advisory_lock_shared($2::int8)),
                     r AS MATERIALIZED (
                        SELECT l.holder, l.previous_end
                        FROM (SELECT count(*) AS n FROM k) AS kk, {}.leases AS l
                        WHERE l.name = $1::text AND kk.n > 0
                        FOR SHARE OF l)
                     SELECT CASE WHEN (SELECT count(*) FROM k) + (SELECT count(*) FROM r) >= 0
                                 THEN pg_advisory_unlock_shared($2::int8) END,
                            (SELECT holder FROM r WHERE previous_end = 'handed_over')",
                    quoted(schema)
                ),
            }),
        }
    }

    /// A stream that yields when `candidate` should look at `lease` again: it is the head of the
    /// store-side queue and the lease's lock is free, or the lease was taken over, broken or
    /// handed over by someone other than `candidate` (or released, where the store has no queue
    /// watcher on it). It ends when the listener's connection fails.
    pub(crate) fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Changes {
        let mut state = self.state.lock().expect("notifier lock poisoned");
        let id = state.next_id;
        state.next_id += 1;
        let (tx, mut rx) = watch::channel(0);
        rx.mark_unchanged();
        // Not waiting until an acquire of it finds the lease held (see `acquired`).
        state
            .leases
            .entry(lease.as_str().to_string())
            .or_default()
            .waiters
            .push(Waiter {
                id,
                candidate: candidate.as_str().to_string(),
                tx,
                waiting: false,
            });
        self.ensure_listener(&mut state);
        let guard = Unsubscribe {
            state: Arc::downgrade(&self.state),
            lease: lease.as_str().to_string(),
            id,
        };
        leasehold_core::notifications(futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            rx.changed().await.ok().map(|()| ((), (rx, guard)))
        }))
    }

    /// Starts the listener unless one runs.
    fn ensure_listener(&self, state: &mut State) {
        if state.listener.as_ref().is_none_or(JoinHandle::is_finished) {
            state.listener = Some(tokio::spawn(listen(
                Arc::downgrade(&self.state),
                state.renewals_wanted.subscribe(),
                self.options.clone(),
                self.connect_timeout,
                self.prefix.clone(),
            )));
        }
    }

    /// The grants of `lease` from now on, each as `inspect` would show it right after the grant
    /// (a stream that falls behind sees the latest). It ends when the listener's connection
    /// fails.
    pub(crate) fn announcements(&self, lease: &LeaseName) -> Announcements {
        let mut state = self.state.lock().expect("notifier lock poisoned");
        let mut rx = state
            .announced
            .entry(lease.as_str().to_string())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        rx.mark_unchanged();
        state.renewals_wanted_now();
        self.ensure_listener(&mut state);
        let guard = StopAnnouncing {
            state: Arc::downgrade(&self.state),
            lease: lease.as_str().to_string(),
        };
        futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            loop {
                rx.changed().await.ok()?;
                let seen = rx.borrow_and_update().clone();
                if let Some(seen) = seen {
                    return Some((seen, (rx, guard)));
                }
            }
        })
        .boxed()
    }

    /// Tells the queue watcher of `lease` what `candidate`'s acquire found, starting one when a
    /// subscribed candidate of this store finds the lease held and none runs.
    pub(crate) fn acquired(&self, lease: &LeaseName, candidate: &CandidateId, outcome: Outcome) {
        let mut state = self.state.lock().expect("notifier lock poisoned");
        let room = state.watchers() < MAX_WATCHERS;
        let Some(entry) = state.leases.get_mut(lease.as_str()) else {
            return;
        };
        let mut ours = false;
        for waiter in entry.waiters.iter_mut().filter(|w| w.candidate == candidate.as_str()) {
            if outcome != Outcome::Unknown {
                waiter.waiting = outcome != Outcome::Granted;
            }
            ours = true;
        }
        if !ours {
            return;
        }
        if outcome == Outcome::Unknown {
            // The head's acquire failed: a watcher idle since it woke the head lets every
            // notification through until it waits on the lock again (as for an orphaned row),
            // and a release let go meanwhile wakes the head again.
            if let Some(watcher) = entry.watcher.as_mut()
                && !watcher.waiting
            {
                watcher.free = true;
                if std::mem::take(&mut watcher.missed) {
                    for waiter in entry.waiters.iter().filter(|w| w.live()) {
                        waiter.wake();
                    }
                }
            }
            return;
        }
        match &mut entry.watcher {
            Some(watcher) => {
                match outcome {
                    Outcome::Granted => watcher.granted = true,
                    Outcome::Busy => watcher.rearm = true,
                    Outcome::Free | Outcome::Unknown => {}
                }
                watcher.free = outcome == Outcome::Free;
                if std::mem::take(&mut watcher.missed) && outcome == Outcome::Free {
                    for waiter in entry.waiters.iter().filter(|w| w.live()) {
                        waiter.wake();
                    }
                }
                watcher.poke.notify_one();
            }
            None if room && outcome != Outcome::Granted => {
                let poke = Arc::new(Notify::new());
                entry.watcher = Some(Watcher {
                    poke: poke.clone(),
                    rearm: false,
                    granted: false,
                    free: false,
                    waiting: false,
                    missed: false,
                });
                tokio::spawn(watch_queue(
                    Arc::downgrade(&self.state),
                    self.queue.clone(),
                    lease.as_str().to_string(),
                    poke,
                ));
            }
            None => {}
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.lock() {
            if let Some(listener) = state.listener.take() {
                listener.abort();
            }
            state.announced.clear();
            state.renewals_wanted_now();
            // Ends every stream; each watcher then finds nobody waiting and stops.
            for entry in state.leases.values_mut() {
                entry.waiters.clear();
                if let Some(watcher) = &entry.watcher {
                    watcher.poke.notify_one();
                }
            }
        }
    }
}

/// Removes a subscription when its stream is dropped.
struct Unsubscribe {
    state: Weak<Mutex<State>>,
    lease: String,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let Some(state) = self.state.upgrade() else { return };
        let Ok(mut state) = state.lock() else { return };
        let Some(entry) = state.leases.get_mut(&self.lease) else {
            return;
        };
        entry.waiters.retain(|w| w.id != self.id);
        match &mut entry.watcher {
            Some(watcher) => {
                // It may have been the one woken: the next one is, if the lock is free.
                watcher.rearm = true;
                watcher.poke.notify_one();
            }
            None if entry.waiters.is_empty() => {
                state.leases.remove(&self.lease);
            }
            None => {}
        }
    }
}

/// Forgets a lease's announcements when its last stream is dropped (after its receiver).
struct StopAnnouncing {
    state: Weak<Mutex<State>>,
    lease: String,
}

impl Drop for StopAnnouncing {
    fn drop(&mut self) {
        let Some(state) = self.state.upgrade() else { return };
        let Ok(mut state) = state.lock() else { return };
        if state
            .announced
            .get(&self.lease)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            state.announced.remove(&self.lease);
            state.renewals_wanted_now();
        }
    }
}

/// Passes a grant announcement to the announcement streams of its lease. `false` once the
/// store is gone.
fn announce(state: &Weak<Mutex<State>>, payload: &str, prefix: &str) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let state = state.lock().expect("notifier lock poisoned");
    let Some((name, fields)) = granted_lease(payload, prefix) else {
        return true;
    };
    let Some(tx) = state.announced.get(name) else {
        return true;
    };
    let Ok(lease) = LeaseName::new(name) else {
        return true;
    };
    match granted(&lease, fields) {
        Ok(seen) => {
            tx.send_replace(Some(seen));
        }
        Err(e) => debug!(error = %e, "an unreadable grant announcement"),
    }
    true
}

/// Wakes the waiters of `lease` except the candidate `by` who made the change: for a release
/// that gave its lock back, only where the store has no queue watcher on the lease waiting on
/// its lock (none, or one whose candidate found the row orphaned or reserved); for a handover,
/// only the successor. `false` once the store is gone.
fn wake(state: &Weak<Mutex<State>>, lease: &str, by: &str, kind: Kind<'_>) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let mut state = state.lock().expect("notifier lock poisoned");
    let Some(entry) = state.leases.get_mut(lease) else {
        return true;
    };
    if kind == Kind::Queued
        && let Some(watcher) = entry.watcher.as_mut()
        && !watcher.free
    {
        // Waiting, the watcher sees the lock given back; otherwise the head's acquire is
        // under way, and what it finds decides (see `Watcher::missed`).
        watcher.missed |= !watcher.waiting;
        return true;
    }
    for waiter in entry.waiters.iter().filter(|w| w.candidate != by) {
        match kind {
            Kind::HandOver(to) if waiter.candidate != to => {}
            _ => waiter.wake(),
        }
    }
    true
}

async fn listen(
    state: Weak<Mutex<State>>,
    mut renewals_wanted: watch::Receiver<bool>,
    options: PgConnectOptions,
    connect_timeout: Duration,
    prefix: String,
) {
    let outcome: Result<(), sqlx::Error> = async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(connect_timeout)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.eager_reconnect(false);
        // A change made while this connects is missed; followers also attempt on their own
        // timer, so it is seen at the next attempt. (Waking everyone here instead would add a request per waiter at every
        // reconnect, for nothing in the usual case.)
        listener.listen_all([CHANNEL, GRANTED_CHANNEL]).await?;
        let mut renewals = false;
        loop {
            // Renewals only while some announcement stream exists (a renewal made before the
            // LISTEN is missed: the follower then attempts a TTL after the version it last saw,
            // and reads the newer one, a request, not a wrong decision).
            let wanted = *renewals_wanted.borrow_and_update();
            if wanted != renewals {
                if wanted {
                    listener.listen(RENEWED_CHANNEL).await?;
                } else {
                    listener.unlisten(RENEWED_CHANNEL).await?;
                }
                renewals = wanted;
            }
            // `try_recv` is cancel safe (a message is taken from the buffer only when whole).
            let notification = tokio::select! {
                received = listener.try_recv() => match received? {
                    Some(notification) => notification,
                    None => break,
                },
                changed = renewals_wanted.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    continue;
                }
            };
            if notification.channel() == GRANTED_CHANNEL || notification.channel() == RENEWED_CHANNEL {
                // A renewal announcement carries the records of one statement, an empty line
                // between two.
                for record in notification.payload().split("\n\n") {
                    if !announce(&state, record, &prefix) {
                        return Ok(());
                    }
                }
            } else if let Some((lease, by, kind)) = parse(notification.payload(), &prefix)
                && !wake(&state, lease, by, kind)
            {
                return Ok(());
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        debug!(error = %e, "notification listener stopped; waiters fall back to polling");
    }
    // End every stream: the engine polls, and the next `changes` starts a new listener.
    // Under one lock, so that a `changes` call either sees this listener and is ended with the
    // others, or sees none and starts a new one.
    if let Some(state) = state.upgrade() {
        let mut state = state.lock().expect("notifier lock poisoned");
        for entry in state.leases.values_mut() {
            entry.waiters.clear();
            if let Some(watcher) = &entry.watcher {
                watcher.poke.notify_one();
            }
        }
        state.leases.retain(|_, entry| entry.watcher.is_some());
        // Ends every announcement stream (their senders go).
        state.announced.clear();
        state.renewals_wanted_now();
        state.listener = None;
    }
}
