//! Keyspace notifications of expired keys: whether the server sends them
//! (`notify-keyspace-events`), turning them on for [`ExpiryEvents::Enable`], and which lease an
//! expired key belongs to.
//!
//! Only ever a wake-up for followers: a follower that is woken reads the lease with the acquire
//! script, which decides on its own whether the lease is free.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::AsyncConnectionConfig;

use crate::config::ExpiryEvents;

/// The channel on which the server announces, in database `db`, every key it expired; each
/// message is the key's name.
pub(crate) fn channel(db: u32) -> String {
    format!("__keyevent@{db}__:expired")
}

/// Whether `notify-keyspace-events` flags make the server publish expired events on the
/// key-event channels: `E` (key-event channels) and `x` (expired) or `A` (every class).
pub(crate) fn expired_events_on(flags: &str) -> bool {
    flags.contains('E') && (flags.contains('x') || flags.contains('A'))
}

/// `flags` with what expired key-events need added, everything else kept.
pub(crate) fn with_expired_events(flags: &str) -> String {
    let mut out = flags.to_string();
    if !out.contains('E') {
        out.push('E');
    }
    if !out.contains('x') && !out.contains('A') {
        out.push('x');
    }
    out
}

/// Maps an expired key to the change channel of its lease: `<prefix>lease:{name}` ->
/// `<prefix>changes:{name}`. Other keys (another prefix, another application) map to nothing.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    /// The key-event channel subscribed to.
    pub(crate) channel: String,
    lease_prefix: String,
    changes_prefix: String,
}

impl Route {
    pub(crate) fn new(db: u32, prefix: &str) -> Self {
        Route {
            channel: channel(db),
            lease_prefix: format!("{prefix}lease:{{"),
            changes_prefix: format!("{prefix}changes:{{"),
        }
    }

    /// The change channel of the lease whose record `key` is.
    pub(crate) fn lease_channel(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.lease_prefix)?;
        Some(format!("{}{rest}", self.changes_prefix))
    }
}

/// What the server said about expiry events.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// They are on (`set`: because this store turned them on).
    On { set: bool },
    /// They are off, or the server will not say or turn them on: why, for the log.
    Off(String),
    /// The server could not be asked (a broken connection, a timeout): why.
    Unknown(String),
}

/// Reads `notify-keyspace-events` on a connection of its own (the command connection pairs
/// replies by the nonce its scripts echo, and `CONFIG` cannot run in a script), and for
/// [`ExpiryEvents::Enable`] adds `Ex` when expired events are off.
///
/// Never fails: a refusal (`CONFIG` renamed away or denied by an ACL, as managed services do) is
/// [`Probe::Off`], a connection that fails or times out [`Probe::Unknown`]. Takes at most about
/// two timeouts.
pub(crate) async fn probe(client: &redis::Client, mode: ExpiryEvents, timeout: Duration) -> Probe {
    if mode == ExpiryEvents::Off {
        return Probe::Off("expiry_events=off".into());
    }
    let failed = |what: String| {
        move |e: redis::RedisError| {
            let why = format!("{what}: {e}");
            if crate::error::is_connection_error(&e) {
                Probe::Unknown(why)
            } else {
                Probe::Off(why)
            }
        }
    };
    let work = async {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(failed("cannot connect to read notify-keyspace-events".into()))?;
        let flags = config_get(&mut conn)
            .await
            .map_err(failed("CONFIG GET notify-keyspace-events failed".into()))?;
        if expired_events_on(&flags) {
            return Ok(Probe::On { set: false });
        }
        if mode != ExpiryEvents::Enable {
            return Ok(Probe::Off(format!(
                "the server's notify-keyspace-events is {flags:?}, without expired key-events (Ex)"
            )));
        }
        let wanted = with_expired_events(&flags);
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&wanted)
            .query_async::<()>(&mut conn)
            .await
            .map_err(failed(format!("CONFIG SET notify-keyspace-events {wanted:?} failed")))?;
        let now = config_get(&mut conn)
            .await
            .map_err(failed("CONFIG GET notify-keyspace-events failed".into()))?;
        if expired_events_on(&now) {
            Ok(Probe::On { set: true })
        } else {
            Ok(Probe::Off(format!(
                "notify-keyspace-events is {now:?} after setting it to {wanted:?}"
            )))
        }
    };
    // Connecting (with AUTH and SELECT) and up to three commands, each bounded by `timeout`.
    match tokio::time::timeout(timeout * 2, work).await {
        Ok(Ok(probe) | Err(probe)) => probe,
        Err(_) => Probe::Unknown(format!(
            "reading notify-keyspace-events took longer than {:?}",
            timeout * 2
        )),
    }
}

async fn config_get(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
    // RESP2 answers [name, value]; a map answers {name: value}: both read as pairs.
    let pairs: Vec<(String, String)> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await?;
    Ok(pairs.into_iter().next().map(|(_, flags)| flags).unwrap_or_default())
}

/// Logs the outcome of a probe: the first time a process falls back to polling (or turns events
/// on) at info level, later ones at debug level, so that a process with many stores says it
/// once.
pub(crate) fn log(probe: &Probe, mode: ExpiryEvents) {
    static SAID: AtomicBool = AtomicBool::new(false);
    let first = !SAID.swap(true, Ordering::Relaxed);
    match probe {
        Probe::On { set: false } => {
            tracing::debug!("redis expiry events are on: idle followers wait for them instead of polling");
        }
        Probe::On { set: true } if first => tracing::info!(
            "turned on redis expiry events (CONFIG SET notify-keyspace-events, expiry_events=enable): \
             idle followers wait for them instead of polling"
        ),
        Probe::On { set: true } => tracing::debug!("turned on redis expiry events (expiry_events=enable)"),
        Probe::Off(why) if mode == ExpiryEvents::Off => {
            tracing::debug!(%why, "redis expiry events not used; followers poll when the holder's PTTL runs out");
        }
        Probe::Off(why) if first => tracing::info!(
            %why,
            %mode,
            "redis expiry events are not available; followers poll when the holder's PTTL runs out \
             (set notify-keyspace-events to include Ex on the server, or use expiry_events=enable, \
             for idle followers that make no requests)"
        ),
        Probe::Off(why) => tracing::debug!(%why, %mode, "redis expiry events are not available; followers poll"),
        Probe::Unknown(why) => tracing::debug!(%why, "cannot ask the redis server about expiry events"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        for (flags, on) in [
            ("", false),
            ("x", false),
            ("E", false),
            ("Ex", true),
            ("xE", true),
            ("AKE", true),
            ("KEA", true),
            ("Kx", false),
            ("gE", false),
            ("Elshz", false),
        ] {
            assert_eq!(expired_events_on(flags), on, "{flags:?}");
            let more = with_expired_events(flags);
            assert!(expired_events_on(&more), "{flags:?} -> {more:?}");
            // Nothing that was set is lost.
            assert!(flags.chars().all(|c| more.contains(c)), "{flags:?} -> {more:?}");
            if on {
                assert_eq!(more, flags);
            }
        }
        assert_eq!(with_expired_events(""), "Ex");
        assert_eq!(with_expired_events("K$"), "K$Ex");
        assert_eq!(with_expired_events("AK"), "AKE");
    }

    #[test]
    fn routes_lease_keys_only() {
        let route = Route::new(3, "app:");
        assert_eq!(route.channel, "__keyevent@3__:expired");
        assert_eq!(
            route.lease_channel(b"app:lease:{compactor}").as_deref(),
            Some("app:changes:{compactor}")
        );
        for other in [
            &b"app:state:{compactor}"[..],
            b"other:lease:{compactor}",
            b"session:42",
            b"app:lease:",
            b"\xff\xfe",
        ] {
            assert_eq!(route.lease_channel(other), None, "{other:?}");
        }
        let bare = Route::new(0, "");
        assert_eq!(bare.lease_channel(b"lease:{x}").as_deref(), Some("changes:{x}"));
    }
}
