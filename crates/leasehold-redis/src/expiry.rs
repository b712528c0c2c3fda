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

/// Maps an expired key to the change channel of its lease: `<prefix>lease:{name}` (an abandoned
/// lease) and `<prefix>woken:{name}` (a woken waiter that did not take the lease) ->
/// `<prefix>changes:{name}`, which wakes every follower. Other keys (another prefix, another
/// application) map to nothing.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    /// The key-event channel subscribed to.
    pub(crate) channel: String,
    /// The database whose keys it announces.
    pub(crate) db: u32,
    lease_prefix: String,
    woken_prefix: String,
    changes_prefix: String,
}

impl Route {
    pub(crate) fn new(db: u32, prefix: &str) -> Self {
        Route {
            channel: channel(db),
            db,
            lease_prefix: format!("{prefix}lease:{{"),
            woken_prefix: format!("{prefix}woken:{{"),
            changes_prefix: format!("{prefix}changes:{{"),
        }
    }

    /// The change channel of the lease whose record or woken waiter `key` is.
    pub(crate) fn lease_channel(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key
            .strip_prefix(&self.lease_prefix)
            .or_else(|| key.strip_prefix(&self.woken_prefix))?;
        Some(format!("{}{rest}", self.changes_prefix))
    }
}

/// What the server said about expiry events.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// They are on (`set`: because this store turned them on); `scan`: how long the server may
    /// take to find an expired key, when it can be estimated.
    On { set: bool, scan: Option<Scan> },
    /// They are off, or the server will not say or turn them on: why, for the log.
    Off(String),
    /// The server could not be asked (a broken connection, a timeout): why.
    Unknown(String),
}

/// What makes an expiry event late: Redis deletes an expired key that nobody reads when its
/// active expiry cycle finds it, and that cycle looks at about 20 keys with a TTL per database,
/// `hz` times a second (more only while many of them have expired).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Keys with a TTL in the store's database (`INFO keyspace`), the held leases among them.
    pub(crate) expires: u64,
    /// The server's `hz`.
    pub(crate) hz: u64,
}

impl Scan {
    /// About how long one pass over every key with a TTL takes: the longest an expiry event of
    /// a lease nobody reads can come after its TTL.
    pub(crate) fn pass(&self) -> Duration {
        Duration::from_secs_f64(self.expires as f64 / (20.0 * self.hz.max(1) as f64))
    }

    async fn read(conn: &mut redis::aio::MultiplexedConnection, db: u32) -> Option<Scan> {
        let info: String = redis::cmd("INFO").arg("keyspace").query_async(conn).await.ok()?;
        let hz: Vec<(String, String)> = redis::cmd("CONFIG").arg("GET").arg("hz").query_async(conn).await.ok()?;
        let hz = hz.first()?.1.parse().ok()?;
        Some(Scan {
            expires: keyspace_expires(&info, db),
            hz,
        })
    }
}

/// The `expires` count of database `db` in an `INFO keyspace` answer (0 when it has no keys).
pub(crate) fn keyspace_expires(info: &str, db: u32) -> u64 {
    let line = format!("db{db}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(line.as_str()))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("expires="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Reads `notify-keyspace-events` on a connection of its own (the command connection pairs
/// replies by the nonce its scripts echo, and `CONFIG` cannot run in a script), and for
/// [`ExpiryEvents::Enable`] adds `Ex` when expired events are off.
///
/// Never fails: a refusal (`CONFIG` renamed away or denied by an ACL, as managed services do) is
/// [`Probe::Off`], a connection that fails or times out [`Probe::Unknown`]. Takes at most about
/// two timeouts.
pub(crate) async fn probe(client: &redis::Client, mode: ExpiryEvents, db: u32, timeout: Duration) -> Probe {
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
            let scan = Scan::read(&mut conn, db).await;
            return Ok(Probe::On { set: false, scan });
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
            let scan = Scan::read(&mut conn, db).await;
            Ok(Probe::On { set: true, scan })
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

/// Logs the outcome of a probe: the first time a process falls back to polling, turns events on,
/// or finds them slow, at info level, later ones at debug level, so that a process with many
/// stores says it once.
pub(crate) fn log(probe: &Probe, mode: ExpiryEvents, db: u32) {
    static SAID: AtomicBool = AtomicBool::new(false);
    static SLOW: AtomicBool = AtomicBool::new(false);
    let first = || !SAID.swap(true, Ordering::Relaxed);
    match probe {
        Probe::On { set, scan } => {
            if *set && first() {
                tracing::info!(
                    "turned on redis expiry events (CONFIG SET notify-keyspace-events, expiry_events=enable): \
                     idle followers wait for them instead of polling"
                );
            } else {
                tracing::debug!(
                    set,
                    "redis expiry events are on: idle followers wait for them instead of polling"
                );
            }
            if let Some(scan) = scan.as_ref().filter(|scan| scan.pass() >= Duration::from_secs(1)) {
                let pass = scan.pass();
                if !SLOW.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        db,
                        keys_with_ttl = scan.expires,
                        hz = scan.hz,
                        ?pass,
                        "redis may announce an expired lease up to about {pass:?} late: it finds expired keys \
                         by scanning about 20 * hz keys with a TTL per second. A crashed leader's successor \
                         waits that long (at most the engine's safety poll). Keep leases in a database of \
                         their own, raise hz, or use expiry_events=off"
                    );
                } else {
                    tracing::debug!(
                        db,
                        keys_with_ttl = scan.expires,
                        hz = scan.hz,
                        ?pass,
                        "redis expiry events may be late"
                    );
                }
            }
        }
        Probe::Off(why) if mode == ExpiryEvents::Off => {
            tracing::debug!(%why, "redis expiry events not used; followers poll when the holder's PTTL runs out");
        }
        Probe::Off(why) if first() => tracing::info!(
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
    fn scan_estimate() {
        let info = "# Keyspace\r\ndb0:keys=4118,expires=12,avg_ttl=0\r\ndb2:keys=9,expires=2000,avg_ttl=5\r\n";
        assert_eq!(keyspace_expires(info, 0), 12);
        assert_eq!(keyspace_expires(info, 2), 2000);
        assert_eq!(keyspace_expires(info, 1), 0);
        assert_eq!(keyspace_expires("", 0), 0);
        let scan = Scan { expires: 2000, hz: 10 };
        assert_eq!(scan.pass(), Duration::from_secs(10));
        assert_eq!(Scan { expires: 2000, hz: 0 }.pass(), Duration::from_secs(100));
    }

    #[test]
    fn routes_lease_keys_only() {
        let route = Route::new(3, "app:");
        assert_eq!(route.channel, "__keyevent@3__:expired");
        assert_eq!(
            route.lease_channel(b"app:lease:{compactor}").as_deref(),
            Some("app:changes:{compactor}")
        );
        assert_eq!(
            route.lease_channel(b"app:woken:{compactor}").as_deref(),
            Some("app:changes:{compactor}")
        );
        for other in [
            &b"app:state:{compactor}"[..],
            b"app:queue:{compactor}",
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
