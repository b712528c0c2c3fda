//! Change notifications: one pub/sub connection per store, shared by every lease it watches.
//!
//! Each watched lease is one channel subscription; every [`Changes`] stream of that lease gets a
//! wake-up per message. When the connection breaks, stops answering pings, or the store is
//! dropped, every stream ends and the engine falls back to polling; the next `changes()` call
//! opens a new connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use leasehold_core::{Changes, Error, Result};
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{self, STORE};

/// The pub/sub side of one store.
pub(crate) struct Hub {
    client: redis::Client,
    timeout: Duration,
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
    /// Cancelled when the store is dropped: stops the connection's tasks.
    dropped: CancellationToken,
}

/// One pub/sub connection and its subscriptions.
struct Live {
    sink: PubSubSink,
    channels: Mutex<HashMap<String, watch::Sender<()>>>,
    /// Cancelled when the connection is given up.
    dead: CancellationToken,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

impl Hub {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        Hub {
            client,
            timeout,
            live: tokio::sync::Mutex::new(None),
            dropped: CancellationToken::new(),
        }
    }

    /// A stream that yields whenever a message arrives on `channel`.
    ///
    /// Takes at most about two timeouts: one to connect (or wait for another caller connecting),
    /// one for the subscription to be confirmed.
    pub(crate) async fn changes(&self, channel: String) -> Result<Changes> {
        let timed_out = |operation| Error::Timeout {
            store: STORE,
            operation,
            after: self.timeout,
        };
        let live = tokio::time::timeout(self.timeout, self.live())
            .await
            .map_err(|_| timed_out("subscribe"))??;
        let (rx, subscribing) = live.join(&channel);
        if let Some(subscribing) = subscribing {
            match tokio::time::timeout(self.timeout, subscribing).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    live.dead.cancel();
                    return Err(error::map(e));
                }
                Err(_) => {
                    live.dead.cancel();
                    return Err(timed_out("subscribe"));
                }
            }
        }
        let subscription = Subscription { live, channel, rx };
        let stream = futures::stream::unfold(subscription, |mut s| async move {
            s.rx.changed().await.ok()?;
            Some(((), s))
        });
        Ok(stream.boxed())
    }

    /// The live connection, opened if there is none.
    async fn live(&self) -> Result<Arc<Live>> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref().filter(|live| !live.dead.is_cancelled()) {
            return Ok(live.clone());
        }
        let pubsub = self.client.get_async_pubsub().await.map_err(error::map)?;
        let (sink, stream) = pubsub.split();
        let live = Arc::new(Live {
            sink,
            channels: Mutex::new(HashMap::new()),
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
    /// A receiver for `channel`, and the pending subscription if this is its first receiver.
    fn join(&self, channel: &str) -> (watch::Receiver<()>, Option<Subscribing>) {
        let mut channels = self.channels.lock().expect("channels lock poisoned");
        if let Some(tx) = channels.get(channel) {
            return (tx.subscribe(), None);
        }
        let (tx, rx) = watch::channel(());
        channels.insert(channel.to_string(), tx);
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
        if channels.get(channel).is_some_and(|tx| tx.receiver_count() <= 1) {
            channels.remove(channel);
            let mut sink = self.sink.clone();
            let channel = channel.to_string();
            // Queued now; nobody waits for the confirmation.
            let _ = async move { sink.unsubscribe(channel).await }.boxed().now_or_never();
        }
    }

    fn notify(&self, channel: &str) {
        if let Some(tx) = self.channels.lock().expect("channels lock poisoned").get(channel) {
            tx.send_replace(());
        }
    }

    /// Gives the connection up: every stream ends.
    fn close(&self) {
        self.dead.cancel();
        self.channels.lock().expect("channels lock poisoned").clear();
    }
}

/// One stream's hold on a channel.
struct Subscription {
    live: Arc<Live>,
    channel: String,
    rx: watch::Receiver<()>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.live.leave(&self.channel);
    }
}

/// Hands each message to the streams of its channel, until the connection or the store goes.
async fn read(live: Arc<Live>, mut stream: PubSubStream, dropped: CancellationToken) {
    loop {
        tokio::select! {
            () = dropped.cancelled() => break,
            () = live.dead.cancelled() => break,
            message = stream.next() => match message {
                Some(message) => live.notify(message.get_channel_name()),
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
