//! Change notifications: one `LISTEN` connection per store, fanned out to every candidate that
//! waits on a lease of that store.
//!
//! Releases, takeovers, breaks and the expiry of abandoned grants send `NOTIFY leasehold,
//! '<schema>/<lease>/<candidate>'` in the statement that makes the change, so the notification is
//! delivered when the change commits. The end of a holder's *session* cannot be notified
//! (nothing runs when a session dies), so followers also poll at `retry_every`.
//!
//! A candidate is not woken by its own change: a leader that released (and may campaign again
//! at once, as `Elector::run` does) learns nothing from it, and being woken would cut short the
//! pause the engine makes after stepping down so that another candidate can take over.
//!
//! The listener never retries on its own: when its connection fails, every stream ends (the
//! engine then polls) and the next [`Notifier::changes`] starts a new listener.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use leasehold_core::{CandidateId, Changes, LeaseName};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::sql::CHANNEL;

#[derive(Debug, Default)]
struct State {
    /// Per lease somebody waits on, one channel per waiting candidate; the value counts
    /// notifications.
    waiting: HashMap<String, HashMap<String, watch::Sender<u64>>>,
    listener: Option<JoinHandle<()>>,
}

/// The notification side of a store.
pub(crate) struct Notifier {
    state: Arc<Mutex<State>>,
    options: PgConnectOptions,
    connect_timeout: std::time::Duration,
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

impl Notifier {
    pub(crate) fn new(options: PgConnectOptions, connect_timeout: std::time::Duration, schema: &str) -> Notifier {
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("leasehold-listen"),
        };
        Notifier {
            state: Arc::default(),
            options,
            connect_timeout,
            prefix: format!("{schema}/"),
        }
    }

    /// A stream that yields when `lease` was released or taken over by someone other than
    /// `candidate`. It ends when the listener's connection fails.
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
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        rx.mark_unchanged();
        if state.listener.as_ref().is_none_or(JoinHandle::is_finished) {
            state.listener = Some(tokio::spawn(listen(
                Arc::downgrade(&self.state),
                self.options.clone(),
                self.connect_timeout,
                self.prefix.clone(),
            )));
        }
        futures::stream::unfold(rx, |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) }).boxed()
    }
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
            tx.send_modify(|n| *n += 1);
        }
    }
    true
}

async fn listen(
    state: Weak<Mutex<State>>,
    options: PgConnectOptions,
    connect_timeout: std::time::Duration,
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
        // A change made while this connects is missed; followers also poll, so it is seen at the
        // next poll. (Waking everyone here instead would add a request per waiter at every
        // reconnect, for nothing in the usual case.)
        listener.listen(CHANNEL).await?;
        while let Some(notification) = listener.try_recv().await? {
            // `<schema>/<lease>/<by>`: lease names have no '/', candidate ids may.
            if let Some(change) = notification
                .payload()
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.split_once('/'))
                && !wake(&state, change)
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
        state.waiting.clear();
        state.listener = None;
    }
}
