//! The queue watcher of one lease: waits in the server's lock queue and wakes one candidate
//! of its store when the lease's lock is free (see the module docs of `changes`).

use std::sync::{Arc, Mutex, Weak};

use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use tokio::sync::Notify;
use tracing::debug;

use super::{QueueSetup, State, Waiter};
use crate::record::lock_key;

/// The key of `lease`'s queue: another advisory key than the lease's own.
pub(crate) fn queue_key(schema: &str, lease: &str) -> i64 {
    lock_key(schema, &format!("{lease}\u{0}queue"))
}

/// What the watcher's task does next, decided under the state lock.
enum Next {
    /// Nobody of this store waits: stop (the watcher was removed from the state).
    Stop,
    /// Give the queue key back (a candidate of this store was granted).
    LeaveQueue,
    /// Wait for the lease's lock to be free (queueing first if not the head).
    Wait,
    /// Wait for news (an acquire's outcome, a subscription).
    Idle,
}

fn decide(state: &Weak<Mutex<State>>, lease: &str, head: bool, armed: &mut bool) -> Next {
    let Some(state) = state.upgrade() else {
        return Next::Stop;
    };
    let mut state = state.lock().expect("notifier lock poisoned");
    let Some(entry) = state.leases.get_mut(lease) else {
        return Next::Stop;
    };
    if !entry.waiters.iter().any(Waiter::live) {
        entry.watcher = None;
        if entry.waiters.is_empty() {
            state.leases.remove(lease);
        }
        return Next::Stop;
    }
    let Some(watcher) = &mut entry.watcher else {
        return Next::Stop;
    };
    if std::mem::take(&mut watcher.granted) && head {
        // Queue again behind the others for the candidates of this store that still wait.
        *armed = true;
        return Next::LeaveQueue;
    }
    if std::mem::take(&mut watcher.rearm) || !head {
        *armed = true;
    }
    if *armed {
        watcher.free = false;
        watcher.missed = false;
        watcher.waiting = true;
        Next::Wait
    } else {
        Next::Idle
    }
}

/// Whether a candidate of this store still waits on `lease` (a waiting statement may go on).
fn anyone_waits(state: &Weak<Mutex<State>>, lease: &str) -> bool {
    let Some(state) = state.upgrade() else {
        return false;
    };
    let state = state.lock().expect("notifier lock poisoned");
    state
        .leases
        .get(lease)
        .is_some_and(|entry| entry.waiters.iter().any(Waiter::live))
}

/// Wakes the first waiting candidate of `lease`, or, when the lease was handed over (`reserved`
/// names the successor), the successor if it is one of this store's: another candidate would
/// only find the reservation, and the successor of another store is woken by the handover's
/// notification (which this store then passes on to its own candidates too, see
/// [`Watcher::free`](super::Watcher::free)).
fn wake_head(state: &Weak<Mutex<State>>, lease: &str, reserved: Option<&str>) {
    let Some(state) = state.upgrade() else { return };
    let mut state = state.lock().expect("notifier lock poisoned");
    let Some(entry) = state.leases.get_mut(lease) else {
        return;
    };
    if let Some(watcher) = &mut entry.watcher {
        watcher.waiting = false;
    }
    let next = match reserved {
        Some(successor) => entry.waiters.iter().find(|w| w.candidate == successor && w.live()),
        None => entry.waiters.iter().find(|w| w.live()),
    };
    match next {
        Some(waiter) => waiter.wake(),
        None => {
            if let Some(watcher) = &mut entry.watcher {
                watcher.free = true;
            }
        }
    }
}

/// The watcher failed: forget it and wake every waiter of `lease` (a release it would have
/// turned into a wake-up may have been missed; from now on every notification wakes them).
fn give_up(state: &Weak<Mutex<State>>, lease: &str) {
    let Some(state) = state.upgrade() else { return };
    let mut state = state.lock().expect("notifier lock poisoned");
    if let Some(entry) = state.leases.get_mut(lease) {
        entry.watcher = None;
        for waiter in entry.waiters.iter().filter(|w| w.live()) {
            waiter.wake();
        }
        if entry.waiters.is_empty() {
            state.leases.remove(lease);
        }
    }
}

/// Runs `statement` on `conn`, unless nobody of this store waits on `lease` any more before it
/// answers: then `None`, and the connection is in an unknown state (the caller drops it).
async fn wait_for(
    state: &Weak<Mutex<State>>,
    lease: &str,
    poke: &Notify,
    conn: &mut PgConnection,
    statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Option<Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>> {
    let running = statement.fetch_all(&mut *conn);
    tokio::pin!(running);
    loop {
        tokio::select! {
            done = &mut running => return Some(done),
            () = poke.notified() => {
                if !anyone_waits(state, lease) {
                    return None;
                }
            }
        }
    }
}

/// The queue watcher of one lease (see the module docs).
pub(super) async fn watch_queue(state: Weak<Mutex<State>>, setup: Arc<QueueSetup>, lease: String, poke: Arc<Notify>) {
    let key = lock_key(&setup.schema, &lease);
    let queue = queue_key(&setup.schema, &lease);
    let connected = tokio::time::timeout(setup.connect_timeout, PgConnection::connect_with(&setup.options)).await;
    let mut conn = match connected {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            debug!(%lease, error = %e, "queue watcher cannot connect; its candidates wake on every release");
            return give_up(&state, &lease);
        }
        Err(_) => {
            debug!(%lease, "queue watcher cannot connect in time; its candidates wake on every release");
            return give_up(&state, &lease);
        }
    };
    let me: Result<(i32, i64), sqlx::Error> = sqlx::query_as(
        "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 FROM pg_stat_activity
         WHERE pid = pg_backend_pid()",
    )
    .fetch_one(&mut conn)
    .await;
    let Ok(me) = me else {
        return give_up(&state, &lease);
    };
    let mut head = false;
    let mut armed = true;
    loop {
        let outcome = match decide(&state, &lease, head, &mut armed) {
            Next::Stop => {
                // Closing the session gives the queue key back (if held) and leaves the queue.
                let _ = conn.close().await;
                return;
            }
            Next::Idle => {
                poke.notified().await;
                continue;
            }
            Next::LeaveQueue => {
                head = false;
                sqlx::query("SELECT pg_advisory_unlock($1::int8)")
                    .bind(queue)
                    .execute(&mut conn)
                    .await
                    .map(|_| ())
            }
            Next::Wait => {
                let mut waited = Ok(());
                if !head {
                    let enqueue = sqlx::query("SELECT pg_advisory_lock($1::int8)").bind(queue);
                    match wait_for(&state, &lease, &poke, &mut conn, enqueue).await {
                        None => return terminate(&setup, me, conn).await,
                        Some(Ok(_)) => head = true,
                        Some(Err(e)) => waited = Err(e),
                    }
                }
                if waited.is_ok() {
                    // The statement that freed the lock may not have committed yet (a release
                    // gives the lock back first): it waits for that too.
                    let free = sqlx::query(AssertSqlSafe(setup.free_wait.clone()))
                        .bind(lease.as_str())
                        .bind(key);
                    let mut reserved = None;
                    match wait_for(&state, &lease, &poke, &mut conn, free).await {
                        None => return terminate(&setup, me, conn).await,
                        Some(Ok(rows)) => {
                            reserved = rows
                                .first()
                                .and_then(|row| row.try_get::<Option<String>, _>(1).ok().flatten());
                        }
                        Some(Err(e)) => waited = Err(e),
                    }
                    if waited.is_ok() {
                        armed = false;
                        wake_head(&state, &lease, reserved.as_deref());
                    }
                }
                waited
            }
        };
        if let Err(e) = outcome {
            debug!(%lease, error = %e, "queue watcher stopped; its candidates wake on every release");
            give_up(&state, &lease);
            let _ = conn.close().await;
            return;
        }
    }
}

/// Ends a watcher whose statement is still waiting: its session is terminated (from the pool),
/// so that its place in the queue, or the queue key, goes at once rather than when the server
/// next checks the closed connection.
async fn terminate(setup: &QueueSetup, (pid, started): (i32, i64), conn: PgConnection) {
    drop(conn);
    let ended = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE pid = $1 AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2",
    )
    .bind(pid)
    .bind(started)
    .execute(&setup.pool)
    .await;
    if let Err(e) = ended {
        debug!(error = %e, "could not end a queue watcher's session; the server ends it within a second");
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Kind, Lease, Notifier, Outcome, Watcher, wake};
    use super::*;
    use leasehold_core::{CandidateId, LeaseName};
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    /// A notifier (never connected) whose lease `l` has one waiting candidate `f` and an idle
    /// queue watcher: it woke `f` at the head, and `f`'s acquire is under way.
    fn woken_head() -> (Notifier, tokio::sync::watch::Receiver<u64>) {
        let options = PgConnectOptions::new();
        let pool = PgPoolOptions::new().connect_lazy_with(options.clone());
        let notifier = Notifier::new(options, std::time::Duration::from_secs(1), "s", pool);
        let (tx, rx) = tokio::sync::watch::channel(0);
        let mut lease = Lease::default();
        lease.waiters.push(Waiter {
            id: 0,
            candidate: "f".to_string(),
            tx,
            waiting: true,
        });
        lease.watcher = Some(Watcher {
            poke: Arc::new(Notify::new()),
            rearm: false,
            granted: false,
            free: false,
            waiting: false,
            missed: false,
        });
        notifier.state.lock().unwrap().leases.insert("l".to_string(), lease);
        (notifier, rx)
    }

    /// The holder took its lock back and released it (a notification marked queued) after the
    /// head's acquire read the row orphaned, before that acquire's answer came: the release is
    /// not lost, the head is woken again when its acquire tells it found the row orphaned.
    #[tokio::test]
    async fn a_release_while_the_heads_acquire_is_under_way_is_not_lost() {
        let (notifier, mut rx) = woken_head();
        let state = Arc::downgrade(&notifier.state);
        assert!(wake(&state, "l", "holder", Kind::Queued));
        assert!(
            !rx.has_changed().unwrap(),
            "the queue, not the notification, wakes the head"
        );
        let (lease, f) = (LeaseName::new("l").unwrap(), CandidateId::new("f").unwrap());
        notifier.acquired(&lease, &f, Outcome::Free);
        assert!(
            rx.has_changed().unwrap(),
            "the head's acquire read before the release: woken again"
        );
        rx.mark_unchanged();
        // Then the watcher idles with `free` set: a later release wakes it by its notification.
        assert!(wake(&state, "l", "holder", Kind::Queued));
        assert!(rx.has_changed().unwrap());
    }

    /// The head's acquire failed after a release was let go: the head is woken again, and
    /// later releases wake it by their notifications until the watcher waits on the lock.
    #[tokio::test]
    async fn a_release_while_the_heads_acquire_fails_is_not_lost() {
        let (notifier, mut rx) = woken_head();
        let state = Arc::downgrade(&notifier.state);
        assert!(wake(&state, "l", "holder", Kind::Queued));
        let (lease, f) = (LeaseName::new("l").unwrap(), CandidateId::new("f").unwrap());
        notifier.acquired(&lease, &f, Outcome::Unknown);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert!(wake(&state, "l", "holder", Kind::Queued));
        assert!(rx.has_changed().unwrap());
    }

    /// Without a release meanwhile, the head's acquire that found the row orphaned wakes nobody
    /// (the engine takes the row over on its own timer), and a release while the watcher waits
    /// on the lock is left to the watcher.
    #[tokio::test]
    async fn an_orphaned_row_alone_wakes_nobody() {
        let (notifier, rx) = woken_head();
        let (lease, f) = (LeaseName::new("l").unwrap(), CandidateId::new("f").unwrap());
        notifier.acquired(&lease, &f, Outcome::Free);
        assert!(!rx.has_changed().unwrap());
        let (notifier, rx) = woken_head();
        let state = Arc::downgrade(&notifier.state);
        notifier
            .state
            .lock()
            .unwrap()
            .leases
            .get_mut("l")
            .unwrap()
            .watcher
            .as_mut()
            .unwrap()
            .waiting = true;
        assert!(wake(&state, "l", "holder", Kind::Queued));
        notifier.acquired(&lease, &f, Outcome::Free);
        assert!(
            !rx.has_changed().unwrap(),
            "the waiting watcher wakes the head by the lock"
        );
    }

    #[test]
    fn the_queue_key_is_not_the_lease_key() {
        assert_ne!(queue_key("s", "a"), lock_key("s", "a"));
        assert_ne!(queue_key("s", "a"), queue_key("s", "b"));
        assert_ne!(queue_key("s", "a"), queue_key("t", "a"));
    }
}
