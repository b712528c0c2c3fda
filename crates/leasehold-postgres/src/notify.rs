//! Change notifications: one `LISTEN` connection per store, fanned out to every candidate that
//! waits on a lease of that store.
//!
//! Releases, takeovers, breaks and the expiry of abandoned grants send `NOTIFY leasehold,
//! '<schema>/<lease>/<candidate>'` in the statement that makes the change, so the notification is
//! delivered when the change commits.
//!
//! The end of a holder's *session* cannot be notified (nothing runs when a session dies). So a
//! follower also learns every renewal of the lease it waits on: its store holds the lease's
//! interest key (taken by its acquire statement), and the holder's renewal statement then
//! sends `NOTIFY leasehold_renewed, '<schema>/<lease>/<term>/<ttl_ms>/<version>/<holder>'`. The
//! follower's store records the version as seen at that moment (its record-version clock, exactly
//! as if an acquire had shown it), and the follower's stream wakes once at the holder's expected
//! expiry: an eighth of a TTL after the TTL since the last version seen (a holder's session that
//! stops speaking is ended by the server one TTL after its last statement; the eighth covers the
//! server's timer and the notification's way). A holder that renews pushes that wake out every
//! time; a silent one is taken over at once when its follower wakes: the follower has seen its
//! last version for a TTL by then. The store's own answers to a candidate's acquires set the wake
//! too (as etcd's change stream learns from its acquires, in process, without extra requests):
//! - held by a live session: the expected expiry of the version seen;
//! - the lock free but the row still naming its holder, replaceable in `store_remaining`: then;
//! - granted, or held by nobody named: no wake.
//!
//! Each wake fires once and is set again only by the next answer or renewal, so a stream never
//! spins. A candidate is not woken by its own change: a leader that released (and may campaign
//! again at once, as `Elector::run` does) learns nothing from it, and being woken would cut short
//! the pause the engine makes after stepping down so that another candidate can take over.
//!
//! The listener never retries on its own: when its connection fails, every stream ends (the
//! engine then polls) and the next [`Notifier::changes`] starts a new listener.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{Acquired, CandidateId, Changes, HolderInfo, LeaseName};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use crate::record::parse_renewal;
use crate::session::Context;
use crate::sql::{CHANNEL, RENEW_CHANNEL};

/// What a waiting candidate's stream is told.
#[derive(Clone, Copy, Debug, Default)]
struct Wake {
    /// Notifications so far: each change yields once.
    changes: u64,
    /// When to yield once more unless something changes first: the holder's expected expiry, or
    /// when the store said the row becomes replaceable.
    at: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    /// Per lease somebody waits on, one channel per waiting candidate.
    waiting: HashMap<String, HashMap<String, watch::Sender<Wake>>>,
    listener: Option<JoinHandle<()>>,
}

/// The notification side of a store.
pub(crate) struct Notifier {
    state: Arc<Mutex<State>>,
    cx: Arc<Context>,
    options: PgConnectOptions,
    connect_timeout: Duration,
    /// `<schema>/`: the payload prefix of this store's notifications.
    prefix: String,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the connect options: their Debug shows the password.
        f.debug_struct("Notifier")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The margin after a TTL of silence before a follower looks: the server ends a silent session
/// one idle timeout (the TTL) after its last statement, and the notification of that statement
/// took a moment to arrive.
fn margin(ttl: Duration) -> Duration {
    ttl / 8
}

impl Notifier {
    pub(crate) fn new(cx: Arc<Context>, options: PgConnectOptions, connect_timeout: Duration) -> Notifier {
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("leasehold-listen"),
        };
        let prefix = format!("{}/", cx.config.schema());
        Notifier {
            state: Arc::default(),
            cx,
            options,
            connect_timeout,
            prefix,
        }
    }

    /// A stream that yields when `lease` was released or taken over by someone other than
    /// `candidate`, and once at the holder's expected expiry (see the module docs). It ends when
    /// the listener's connection fails.
    pub(crate) fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Changes {
        let mut state = self.state.lock().expect("notifier lock poisoned");
        state.waiting.retain(|_, waiters| {
            waiters.retain(|_, tx| tx.receiver_count() > 0);
            !waiters.is_empty()
        });
        let mut rx = state
            .waiting
            .entry(lease.as_str().to_string())
            .or_default()
            .entry(candidate.as_str().to_string())
            .or_insert_with(|| watch::channel(Wake::default()).0)
            .subscribe();
        rx.mark_unchanged();
        if state.listener.as_ref().is_none_or(JoinHandle::is_finished) {
            state.listener = Some(tokio::spawn(listen(
                Arc::downgrade(&self.state),
                self.cx.clone(),
                self.options.clone(),
                self.connect_timeout,
                self.prefix.clone(),
            )));
        }
        let seen = rx.borrow().changes;
        futures::stream::unfold((rx, seen, None), |(mut rx, mut seen, mut fired)| async move {
            loop {
                let wake = *rx.borrow_and_update();
                if wake.changes != seen {
                    seen = wake.changes;
                    return Some(((), (rx, seen, fired)));
                }
                let due = wake.at.filter(|at| Some(*at) != fired);
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    () = async {
                        match due {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        fired = due;
                        return Some(((), (rx, seen, fired)));
                    }
                }
            }
        })
        .boxed()
    }

    /// Learns from the store's answer to an acquire of `candidate` (or a renewal of its that was
    /// lost: `Held`), which arrived at `arrived`, when its stream should wake next (see the module
    /// docs). A failed acquire (`None`) wakes it at the expected expiry of the holder last seen,
    /// if any: the engine may settle the failure by a read and then wait for this stream.
    pub(crate) fn answered(
        &self,
        lease: &LeaseName,
        candidate: &CandidateId,
        answer: Option<&Acquired>,
        arrived: Instant,
    ) {
        let at = match answer {
            Some(Acquired::Granted(_)) => None,
            Some(Acquired::Held(observation)) => {
                observation.holder.as_ref().map(|holder| match holder.store_remaining {
                    Some(remaining) => arrived + remaining,
                    None => expected_expiry(&self.cx, lease, arrived, holder.ttl),
                })
            }
            None => self
                .cx
                .sightings
                .since(lease)
                .map(|(_, ttl)| expected_expiry(&self.cx, lease, arrived, ttl)),
        };
        let state = self.state.lock().expect("notifier lock poisoned");
        if let Some(tx) = state
            .waiting
            .get(lease.as_str())
            .and_then(|waiters| waiters.get(candidate.as_str()))
        {
            tx.send_if_modified(|wake| {
                let modified = wake.at != at;
                wake.at = at;
                modified
            });
        }
    }

    /// Learns from a read of `lease` that showed `holder` at `arrived`: the streams of the
    /// lease's waiters with no wake to come wake at the holder's expected expiry.
    pub(crate) fn read(&self, lease: &LeaseName, holder: Option<&HolderInfo>, arrived: Instant) {
        let Some(holder) = holder else { return };
        let at = expected_expiry(&self.cx, lease, arrived, holder.ttl);
        let state = self.state.lock().expect("notifier lock poisoned");
        for (candidate, tx) in state.waiting.get(lease.as_str()).into_iter().flatten() {
            if candidate != holder.id.as_str() {
                tx.send_if_modified(|wake| {
                    let idle = wake.at.is_none_or(|at| at <= arrived);
                    if idle {
                        wake.at = Some(at);
                    }
                    idle
                });
            }
        }
    }
}

/// When a holder whose current version this store first saw at `since` would have lost its
/// session if it renewed no more, plus the margin; no earlier than `arrived` plus the margin.
fn expected_expiry(cx: &Context, lease: &LeaseName, arrived: Instant, ttl: Duration) -> Instant {
    let (since, ttl) = cx.sightings.since(lease).unwrap_or((arrived, ttl));
    (since + ttl).max(arrived) + margin(ttl)
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.lock()
            && let Some(listener) = state.listener.take()
        {
            listener.abort();
        }
    }
}

/// Wakes the waiters of `lease` except the candidate `by` who made the change; `false` once the
/// store is gone.
fn wake(state: &Weak<Mutex<State>>, (lease, by): (&str, &str)) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let state = state.lock().expect("notifier lock poisoned");
    for (candidate, tx) in state.waiting.get(lease).into_iter().flatten() {
        if candidate != by {
            tx.send_modify(|wake| wake.changes += 1);
        }
    }
    true
}

/// Records a renewal announced by its holder (`payload` after the schema prefix) as seen now, and
/// moves the wake of the lease's other waiters to its expected expiry; `false` once the store is
/// gone.
fn renewed(state: &Weak<Mutex<State>>, cx: &Context, payload: &str) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let Some((lease, record)) = parse_renewal(payload) else {
        return true;
    };
    let Some(holder) = &record.holder else { return true };
    let state = state.lock().expect("notifier lock poisoned");
    let Some(waiters) = state.waiting.get(lease.as_str()) else {
        return true;
    };
    let arrived = Instant::now();
    cx.sightings.see(&lease, &record, arrived);
    let at = Some(expected_expiry(cx, &lease, arrived, holder.ttl));
    for (candidate, tx) in waiters {
        if candidate != holder.id.as_str() {
            tx.send_modify(|wake| wake.at = at);
        }
    }
    true
}

async fn listen(
    state: Weak<Mutex<State>>,
    cx: Arc<Context>,
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
        listener.listen_all([CHANNEL, RENEW_CHANNEL]).await?;
        while let Some(notification) = listener.try_recv().await? {
            let Some(rest) = notification.payload().strip_prefix(prefix.as_str()) else {
                continue;
            };
            let alive = if notification.channel() == RENEW_CHANNEL {
                renewed(&state, &cx, rest)
            } else {
                // `<lease>/<by>`: lease names have no '/', candidate ids may.
                rest.split_once('/').is_none_or(|change| wake(&state, change))
            };
            if !alive {
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
        state.waiting.clear();
        state.listener = None;
    }
}
