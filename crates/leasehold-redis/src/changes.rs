//! Change notifications: one pub/sub connection per store, shared by every lease it watches.
//!
//! Each watched lease is one channel subscription, and each candidate watching it one more (its
//! own channel, on which a release wakes the next waiter alone). A stream wakes on a message on
//! its own channel, and on a message on the lease's channel that names nobody
//! ([`wakes`]). With expiry events (see [`crate::expiry`]) the connection also holds one
//! subscription to the server's key-event channel of expired keys, and an expired lease record
//! wakes the streams of its lease. When the connection breaks, stops answering pings, or the
//! store is dropped, every stream ends and the engine falls back to polling; the next `changes()`
//! call opens a new connection (and asks the server again whether it sends expiry events).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use leasehold_core::{
    Announcements, Changes, EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, Result, Term,
};
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ExpiryEvents;
use crate::error::{self, STORE};
use crate::expiry::{self, Probe, Route};
use crate::record::TTL_RANGE;

/// Whether the server sends expiry events, as last asked.
const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// The pub/sub side of one store.
pub(crate) struct Hub {
    client: redis::Client,
    timeout: Duration,
    mode: ExpiryEvents,
    route: Route,
    /// [`UNKNOWN`], [`OFF`] or [`ON`]: what the last probe found.
    expiry: AtomicU8,
    /// Set by a probe at connect, cleared by the first connection: that one needs no probe of
    /// its own.
    fresh: AtomicBool,
    /// Whether `capabilities()` ever reported expiry events: electors built then wait for them,
    /// so a connection without them must not pretend otherwise.
    promised: AtomicBool,
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
    /// Cancelled when the store is dropped: stops the connection's tasks.
    dropped: CancellationToken,
}

/// The streams of one subscribed channel.
struct Channel {
    /// Changes streams: sent a wake-up ([`wakes`]).
    wake: watch::Sender<()>,
    /// Announcement streams: the last `granted` message, or the last end of a term
    /// (`released`, `broken`, `handed_over`).
    granted: watch::Sender<Option<Vec<u8>>>,
}

impl Channel {
    fn receivers(&self) -> usize {
        self.wake.receiver_count() + self.granted.receiver_count()
    }
}

/// One pub/sub connection and its subscriptions.
struct Live {
    sink: PubSubSink,
    channels: Mutex<HashMap<String, Channel>>,
    /// Where expired keys are announced, when this connection is subscribed to them.
    expired: Option<Route>,
    /// Cancelled when the connection is given up.
    dead: CancellationToken,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("timeout", &self.timeout)
            .field("mode", &self.mode)
            .field("expiry_events", &(self.expiry.load(Ordering::Relaxed) == ON))
            .finish_non_exhaustive()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

impl Hub {
    pub(crate) fn new(client: redis::Client, timeout: Duration, mode: ExpiryEvents, db: u32, prefix: &str) -> Self {
        Hub {
            client,
            timeout,
            mode,
            route: Route::new(db, prefix),
            expiry: AtomicU8::new(if mode == ExpiryEvents::Off { OFF } else { UNKNOWN }),
            fresh: AtomicBool::new(false),
            promised: AtomicBool::new(false),
            live: tokio::sync::Mutex::new(None),
            dropped: CancellationToken::new(),
        }
    }

    /// Whether the server sends expiry events and this store uses them, as last asked. Marks
    /// them as promised when they are on: the caller reports them in its capabilities.
    pub(crate) fn expiry_events(&self) -> bool {
        let on = self.expiry.load(Ordering::Acquire) == ON;
        if on {
            self.promised.store(true, Ordering::Release);
        }
        on
    }

    /// Asks the server whether it sends expiry events (turning them on for `enable`), and, when
    /// it does, opens the pub/sub connection with their subscription, so that a refused
    /// subscription (an ACL without the channel) is known before the store reports them.
    ///
    /// Never fails: without expiry events, followers poll. Does nothing for `off`.
    pub(crate) async fn start(&self) {
        if self.mode == ExpiryEvents::Off {
            return;
        }
        if let Err(why) = self.probe().await {
            // The command connection has just worked, so this is unusual: poll to be safe.
            self.set_off(&why);
        }
        self.fresh.store(true, Ordering::Release);
        if self.expiry.load(Ordering::Acquire) == ON {
            let opened = tokio::time::timeout(self.timeout * 3, self.live()).await;
            let why = match opened {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => format!("cannot open the pub/sub connection: {e}"),
                Err(_) => format!("opening the pub/sub connection took longer than {:?}", self.timeout * 3),
            };
            self.set_off(&why);
        }
    }

    /// Asks the server and records the answer; `Err` (and nothing recorded) when it could not
    /// be asked.
    async fn probe(&self) -> std::result::Result<(), String> {
        let probe = expiry::probe(&self.client, self.mode, self.route.db, self.timeout).await;
        expiry::log(&probe, self.mode, self.route.db);
        let state = match probe {
            Probe::On { .. } => ON,
            Probe::Off(_) => OFF,
            Probe::Unknown(why) => return Err(why),
        };
        self.expiry.store(state, Ordering::Release);
        Ok(())
    }

    fn set_off(&self, why: &str) {
        expiry::log(&Probe::Off(why.to_string()), self.mode, self.route.db);
        self.expiry.store(OFF, Ordering::Release);
    }

    /// A stream that yields whenever a message that wakes ([`wakes`]) arrives on the lease's
    /// `channel` or the candidate's own `waiter` channel, or the record of its lease (or an
    /// untaken wake-up) expires (with expiry events). `None` when the store promised expiry
    /// events but the connection has none now (the server stopped sending them): the engine then
    /// polls.
    ///
    /// Both subscriptions are confirmed before it returns: a waiter queued by an acquire sent
    /// after that is woken on its channel.
    ///
    /// Takes at most about four timeouts: three to connect (or wait for another caller
    /// connecting), ask the server about expiry events and subscribe to them, one for the
    /// subscriptions to be confirmed.
    pub(crate) async fn changes(&self, channel: String, waiter: String) -> Result<Option<Changes>> {
        let timed_out = |operation, after| Error::Timeout {
            store: STORE,
            operation,
            after,
        };
        let live = tokio::time::timeout(self.timeout * 3, self.live())
            .await
            .map_err(|_| timed_out("subscribe", self.timeout * 3))??;
        if live.expired.is_none() && self.promised.load(Ordering::Acquire) {
            tracing::debug!("redis expiry events are gone; this follower polls");
            return Ok(None);
        }
        let (rx, lease_subscribing) = live.join(&channel);
        let (waiter_rx, waiter_subscribing) = live.join(&waiter);
        // Made now, so that an early return leaves both channels (unsubscribing the last).
        let subscription = Subscription {
            live: live.clone(),
            channel,
            rx,
            waiter,
            waiter_rx,
        };
        let subscribed = async {
            if let Some(subscribing) = lease_subscribing {
                subscribing.await?;
            }
            if let Some(subscribing) = waiter_subscribing {
                subscribing.await?;
            }
            Ok::<(), redis::RedisError>(())
        };
        match tokio::time::timeout(self.timeout, subscribed).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                live.dead.cancel();
                return Err(error::map(e, "changes"));
            }
            Err(_) => {
                live.dead.cancel();
                return Err(timed_out("subscribe", self.timeout));
            }
        }
        let stream = futures::stream::unfold(subscription, |mut s| async move {
            tokio::select! {
                changed = s.rx.changed() => changed.ok()?,
                changed = s.waiter_rx.changed() => changed.ok()?,
            }
            Some(((), s))
        });
        Ok(Some(leasehold_core::notifications(stream)))
    }

    /// The grants announced on the lease's `channel`, from now on (a subscriber that falls
    /// behind sees the latest), each as `inspect` would show it right after the grant.
    pub(crate) async fn announcements(&self, lease: LeaseName, channel: String) -> Result<Option<Announcements>> {
        let timed_out = |after| Error::Timeout {
            store: STORE,
            operation: "announcements",
            after,
        };
        let live = tokio::time::timeout(self.timeout * 3, self.live())
            .await
            .map_err(|_| timed_out(self.timeout * 3))??;
        let (rx, subscribing) = live.join_granted(&channel);
        let held = Held {
            live: live.clone(),
            channel,
            rx,
        };
        if let Some(subscribing) = subscribing {
            match tokio::time::timeout(self.timeout, subscribing).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    live.dead.cancel();
                    return Err(error::map(e, "announcements"));
                }
                Err(_) => {
                    live.dead.cancel();
                    return Err(timed_out(self.timeout));
                }
            }
        }
        let stream = futures::stream::unfold((held, lease), |(mut held, lease)| async move {
            loop {
                held.rx.changed().await.ok()?;
                let payload = held.rx.borrow_and_update().clone();
                match payload.as_deref().map(|p| announced(&lease, p)) {
                    Some(Ok(seen)) => return Some((seen, (held, lease))),
                    Some(Err(e)) => tracing::debug!(error = %e, "an unreadable grant announcement"),
                    None => {}
                }
            }
        });
        Ok(Some(stream.boxed()))
    }

    /// The live connection, opened if there is none.
    async fn live(&self) -> Result<Arc<Live>> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref().filter(|live| !live.dead.is_cancelled()) {
            return Ok(live.clone());
        }
        let timed_out = || Error::Timeout {
            store: STORE,
            operation: "subscribe",
            after: self.timeout,
        };
        let pubsub = tokio::time::timeout(self.timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| error::map(e, "changes"))?;
        if self.mode != ExpiryEvents::Off && !self.fresh.swap(false, Ordering::AcqRel) {
            // A new connection, perhaps to a restarted server that forgot a CONFIG SET: ask
            // again (only once connected, so that an unreachable server fails fast).
            self.probe().await.map_err(|why| Error::unreachable(STORE, why))?;
        }
        let (mut sink, stream) = pubsub.split();
        let mut expired = None;
        if self.expiry.load(Ordering::Acquire) == ON {
            // Confirmed before the connection is used: a follower that reads the lease after
            // `changes()` returned cannot miss its expiry.
            let channel = self.route.channel.clone();
            let subscribed = async {
                sink.subscribe(&channel).await?;
                // `subscribe` reads a refusal (NOPERM: an ACL without the channel) as success.
                // This is the connection's first subscription, so a PING tells: a subscribed
                // RESP2 connection answers `["pong", ""]`, one that was refused a plain `PONG`.
                sink.ping::<redis::Value>().await
            };
            match tokio::time::timeout(self.timeout, subscribed).await {
                Ok(Ok(redis::Value::Array(_))) => expired = Some(self.route.clone()),
                Ok(Ok(_)) => self.set_off(&format!("SUBSCRIBE {channel} was refused (ACL channel permissions)")),
                Ok(Err(e)) if !error::is_connection_error(&e) => {
                    self.set_off(&format!("SUBSCRIBE {channel} failed: {e}"));
                }
                Ok(Err(e)) => return Err(error::map(e, "changes")),
                Err(_) => return Err(timed_out()),
            }
        }
        let live = Arc::new(Live {
            sink,
            channels: Mutex::new(HashMap::new()),
            expired,
            dead: CancellationToken::new(),
        });
        tokio::spawn(read(live.clone(), stream, self.dropped.clone()));
        tokio::spawn(keep_alive(live.clone(), self.dropped.clone(), self.timeout));
        *slot = Some(live.clone());
        Ok(live)
    }
}

type Subscribing = futures::future::BoxFuture<'static, redis::RedisResult<()>>;

impl Live {
    /// A wake-up receiver for `channel`, and the pending subscription if this is its first
    /// receiver.
    fn join(&self, channel: &str) -> (watch::Receiver<()>, Option<Subscribing>) {
        self.enter(channel, |c| c.wake.subscribe())
    }

    /// A receiver of the grants announced on `channel` (none yet), and the pending subscription
    /// if this is its first receiver.
    fn join_granted(&self, channel: &str) -> (watch::Receiver<Option<Vec<u8>>>, Option<Subscribing>) {
        self.enter(channel, |c| {
            let mut rx = c.granted.subscribe();
            rx.mark_unchanged();
            rx
        })
    }

    fn enter<R>(&self, channel: &str, receiver: impl Fn(&Channel) -> R) -> (R, Option<Subscribing>) {
        let mut channels = self.channels.lock().expect("channels lock poisoned");
        if let Some(c) = channels.get(channel) {
            return (receiver(c), None);
        }
        let c = Channel {
            wake: watch::channel(()).0,
            granted: watch::channel(None).0,
        };
        let rx = receiver(&c);
        channels.insert(channel.to_string(), c);
        // Polled once under the lock, the request is queued on the connection before any later
        // (un)subscription of the same channel.
        let mut sink = self.sink.clone();
        let channel = channel.to_string();
        let mut subscribing: Subscribing = async move { sink.subscribe(channel).await }.boxed();
        let early = (&mut subscribing).now_or_never();
        let subscribing = match early {
            Some(result) => async move { result }.boxed(),
            None => subscribing,
        };
        (rx, Some(subscribing))
    }

    /// Called as a stream of `channel` is dropped (its receiver still counted): unsubscribes
    /// when it was the last one.
    fn leave(&self, channel: &str) {
        if self.dead.is_cancelled() {
            return;
        }
        let mut channels = self.channels.lock().expect("channels lock poisoned");
        if channels.get(channel).is_some_and(|c| c.receivers() <= 1) {
            channels.remove(channel);
            let mut sink = self.sink.clone();
            let channel = channel.to_string();
            // Queued now; nobody waits for the confirmation.
            let _ = async move { sink.unsubscribe(channel).await }.boxed().now_or_never();
        }
    }

    fn notify(&self, channel: &str) {
        if let Some(c) = self.channels.lock().expect("channels lock poisoned").get(channel) {
            c.wake.send_replace(());
        }
    }

    /// Hands a message to the streams of its channel: a wake-up ([`wakes`]), and a grant or the
    /// end of a term to the announcement streams.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        if let Some(c) = self.channels.lock().expect("channels lock poisoned").get(channel) {
            if wakes(payload) {
                c.wake.send_replace(());
            }
            if payload.starts_with(b"granted ") || ended(payload).is_some() {
                c.granted.send_replace(Some(payload.to_vec()));
            }
        }
    }

    /// Gives the connection up: every stream ends.
    fn close(&self) {
        self.dead.cancel();
        self.channels.lock().expect("channels lock poisoned").clear();
    }
}

/// One stream's hold on the lease's channel and its candidate's own.
struct Subscription {
    live: Arc<Live>,
    channel: String,
    rx: watch::Receiver<()>,
    waiter: String,
    waiter_rx: watch::Receiver<()>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.live.leave(&self.channel);
        self.live.leave(&self.waiter);
    }
}

/// An announcement stream's hold on the lease's channel.
struct Held {
    live: Arc<Live>,
    channel: String,
    rx: watch::Receiver<Option<Vec<u8>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.live.leave(&self.channel);
    }
}

/// The holder a `granted <term> <ttl_ms> <version> <holder>` message announces, as `inspect`
/// would show it right after the grant (the full TTL remaining).
pub(crate) fn granted(lease: &LeaseName, payload: &[u8]) -> Result<Observation> {
    let text = std::str::from_utf8(payload).map_err(|e| error::unexpected("announcements", e.to_string()))?;
    let mut words = text.splitn(5, ' ');
    let (Some("granted"), Some(term), Some(ttl_ms), Some(version), Some(id)) =
        (words.next(), words.next(), words.next(), words.next(), words.next())
    else {
        return Err(error::unexpected(
            "announcements",
            text.chars().take(80).collect::<String>(),
        ));
    };
    let ttl = Duration::from_millis(
        ttl_ms
            .parse()
            .map_err(|_| error::unexpected("announcements", format!("ttl {ttl_ms:?}")))?,
    );
    let fields = HolderFields {
        id,
        term: term.into(),
        ttl_ms: ttl_ms.into(),
        version,
        store_remaining: Some(ttl),
    };
    let info = HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?;
    Ok(Observation {
        lease: lease.clone(),
        last_term: info.term,
        holder: Some(info),
        previous_end: None,
    })
}

/// How a `released <term> ...`, `broken <term> ...` or `handed_over <term> <to>` message says a
/// term ended, and the term.
pub(crate) fn ended(payload: &[u8]) -> Option<(EndReason, Term)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    let reason = match words.next()? {
        "released" => EndReason::Released,
        "broken" => EndReason::Broken,
        "handed_over" => EndReason::HandedOver,
        _ => return None,
    };
    Some((reason, Term(words.next()?.parse().ok()?)))
}

/// An announcement as `inspect` would show the lease then: a grant ([`granted`]), or the lease
/// free after a term's end ([`ended`]; a hand-over's reservation, which the message does not
/// describe, as free and handed over), which the engine takes to tell a hand-over from a
/// failover in its metrics.
fn announced(lease: &LeaseName, payload: &[u8]) -> Result<Observation> {
    match ended(payload) {
        Some((reason, term)) => Ok(Observation::free(lease.clone(), term, Some(reason))),
        None => granted(lease, payload),
    }
}

/// Whether a message on a lease's channel or a waiter's own wakes its streams: one that names
/// nobody (`released <term>`, `broken <term>`, and on a waiter's channel every wake-up), not
/// one that names who was woken or took the lease (a third word: `released <term> <woken>`,
/// `granted <term> <holder>`), nor a `probe` (a sweep of the queue asking who still listens).
/// An older leasehold-redis sends two words on the lease's channel: those wake everyone, as
/// they did.
pub(crate) fn wakes(payload: &[u8]) -> bool {
    payload != b"probe" && payload.split(|&b| b == b' ').nth(2).is_none()
}

/// Hands each message to the streams of its channel, until the connection or the store goes.
async fn read(live: Arc<Live>, mut stream: PubSubStream, dropped: CancellationToken) {
    loop {
        tokio::select! {
            () = dropped.cancelled() => break,
            () = live.dead.cancelled() => break,
            message = stream.next() => match message {
                Some(message) => match &live.expired {
                    Some(route) if message.get_channel_name() == route.channel => {
                        if let Some(channel) = route.lease_channel(message.get_payload_bytes()) {
                            live.notify(&channel);
                        }
                    }
                    _ => live.deliver(message.get_channel_name(), message.get_payload_bytes()),
                },
                None => {
                    tracing::debug!("redis pub/sub connection closed; candidates poll");
                    break;
                }
            },
        }
    }
    live.close();
}

/// Pings the pub/sub connection: a connection that stops answering (a silent network) is given
/// up, so that candidates poll instead of waiting for messages that cannot come.
async fn keep_alive(live: Arc<Live>, dropped: CancellationToken, timeout: Duration) {
    let every = timeout.max(Duration::from_secs(1));
    let mut sink = live.sink.clone();
    loop {
        tokio::select! {
            () = dropped.cancelled() => return,
            () = live.dead.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
            Ok(Ok(_)) => {}
            outcome => {
                tracing::debug!(
                    ?outcome,
                    "redis pub/sub connection does not answer pings; candidates poll"
                );
                live.close();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{announced, granted, wakes};
    use leasehold_core::{EndReason, LeaseName, Term};

    #[test]
    fn an_end_of_a_term_reads_as_the_lease_free() {
        let lease = LeaseName::new("jobs").unwrap();
        for (payload, reason) in [
            ("released 17", EndReason::Released),
            ("released 17 host a 42", EndReason::Released),
            ("broken 17 c", EndReason::Broken),
            ("handed_over 17 b", EndReason::HandedOver),
        ] {
            let seen = announced(&lease, payload.as_bytes()).unwrap();
            assert_eq!(
                (seen.holder, seen.last_term, seen.previous_end),
                (None, Term(17), Some(reason))
            );
        }
        assert!(announced(&lease, b"released x").is_err());
        assert!(
            announced(&lease, b"granted 1795 2000 00112233aabbccdd a")
                .unwrap()
                .holder
                .is_some()
        );
    }

    #[test]
    fn a_grant_announcement_reads_as_an_observation() {
        let lease = LeaseName::new("jobs").unwrap();
        let seen = granted(&lease, b"granted 1795 2000 00112233aabbccdd host a 42").unwrap();
        let holder = seen.holder.unwrap();
        assert_eq!(
            (holder.id.as_str(), holder.term, seen.last_term),
            ("host a 42", Term(1795), Term(1795))
        );
        assert_eq!(holder.ttl, std::time::Duration::from_secs(2));
        assert_eq!(holder.store_remaining, Some(holder.ttl));
        assert!(!holder.reserved);
        for bad in [
            &b"granted 1795 2000"[..],
            b"granted x 2000 00112233aabbccdd a",
            b"released 1 a",
            b"\xff",
        ] {
            assert!(granted(&lease, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_messages_naming_nobody_wake() {
        for payload in [
            "released 17",
            "broken 17",
            "handed_over 17",
            "withdrawn 0",
            "granted 17",
            "",
        ] {
            assert!(wakes(payload.as_bytes()), "{payload:?}");
        }
        for payload in [
            "released 17 c-1",
            "released 17 host a 42",
            "granted 17 b",
            "handed_over 17 c",
            "probe",
        ] {
            assert!(!wakes(payload.as_bytes()), "{payload:?}");
        }
    }
}
