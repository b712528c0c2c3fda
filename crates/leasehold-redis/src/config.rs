//! Where the Redis server is and how to talk to it: `redis://` and `rediss://` URLs, their
//! options, the key names, and redaction of the password.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::{Secret, StoreUrl};
use leasehold_core::{Error, LeaseName, Result};

use crate::error::STORE;

/// The URL schemes this backend handles: `redis` (plain TCP) and `rediss` (TLS, with the `tls`
/// feature).
pub const URL_SCHEMES: &[&str] = &["redis", "rediss"];

/// The port used when a URL names none (for both schemes, as the `redis` crate does).
pub const DEFAULT_PORT: u16 = 6379;

/// The default prefix of every key and channel leasehold uses.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// The default time a request (or a connection attempt) may take before its outcome counts as
/// unknown and the connection is replaced.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The default number of terms kept per lease in the history stream.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_PREFIX_LEN: usize = 64;
const KNOWN_OPTIONS: &[&str] = &[
    "prefix",
    "timeout",
    "history_limit",
    "restart_guard",
    "expiry_events",
    "ca",
    "cert",
    "key",
];

/// How to reach a Redis server and how to lay out leasehold's keys on it.
///
/// Build one with [`RedisConfig::new`] and adjust the fields, or parse a URL:
///
/// | URL | server |
/// |---|---|
/// | `redis://127.0.0.1:6379` | plain TCP, database 0 |
/// | `redis://:secret@cache.internal:6380/2` | password only (`AUTH secret`), database 2 |
/// | `redis://app:secret@cache.internal/0?prefix=billing:` | ACL user `app`, keys `billing:...` |
/// | `rediss://cache.example.com:6380` | TLS (needs the `tls` feature) |
///
/// The user name and password are percent-decoded. The path is the database number (`/` or
/// none means 0). Query options:
///
/// - `prefix`: the prefix of every key and channel, default `leasehold:`; up to 64 printable
///   ASCII characters, no spaces or braces (braces are used as hash tags).
/// - `timeout`: how long one request or connection attempt may take, default `1s`; a duration
///   with its unit (`500ms`, `2s`, `1m`), from 10 ms to 10 min. A request that takes longer fails as
///   [`Error::Timeout`] and its connection is replaced.
/// - `history_limit`: terms kept per lease in the history stream, default 1000; `0` keeps all.
/// - `restart_guard`: `true` (default) or `false`; see the [crate docs](crate::docs).
///
/// Unknown and repeated options are rejected, naming them.
/// - `expiry_events`: `auto` (default), `off` or `enable`: whether followers wait for the
///   server's keyspace notification of an expired lease instead of polling when the holder's
///   `PTTL` runs out; see [`ExpiryEvents`].
///
/// `Debug` and `Display` never show the password; errors about a URL show it as `***`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_redis::RedisConfig;
///
/// let config: RedisConfig = "redis://app:s3cret@cache.internal:6380/2?prefix=billing:&timeout=250ms".parse()?;
/// assert_eq!((config.host.as_str(), config.port, config.db), ("cache.internal", 6380, 2));
/// assert_eq!(config.timeout, Duration::from_millis(250));
/// assert_eq!(
///     config.to_string(),
///     "redis://app:***@cache.internal:6380/2?prefix=billing:&timeout=250ms&history_limit=1000&restart_guard=true&expiry_events=auto"
/// );
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server's host name or IP address.
    pub host: String,
    /// The server's port. Default 6379.
    pub port: u16,
    /// Whether to connect with TLS (`rediss://`). Needs the `tls` feature.
    pub tls: bool,
    /// A PEM file with the CA that signed the server's certificate (URL option `ca`; otherwise
    /// the platform's roots). TLS only.
    pub ca: Option<std::path::PathBuf>,
    /// PEM files of a client certificate and its private key (URL options `cert` and `key`,
    /// both or neither), for a server with `tls-auth-clients yes`. TLS only.
    pub cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The ACL user, if any (Redis 6 and later).
    pub username: Option<String>,
    /// The password, if any. Never printed.
    pub password: Option<Secret>,
    /// The database number. Default 0.
    pub db: u32,
    /// The prefix of every key and channel. Default `leasehold:`.
    pub prefix: String,
    /// How long a request or a connection attempt may take. Default 1 s.
    pub timeout: Duration,
    /// How many terms of each lease the history stream keeps; `0` keeps all. Default 1000.
    pub history_limit: u32,
    /// Whether a lease is granted only once the server has been up for the requested TTL, so
    /// that a restart that lost the lease (no persistence) cannot hand it to someone else while
    /// the old holder still believes it leads. Default `true`.
    pub restart_guard: bool,
    /// Whether to use the server's keyspace notifications of expired keys, so that followers
    /// need not poll for the expiry of an abandoned lease. Default [`ExpiryEvents::Auto`].
    pub expiry_events: ExpiryEvents,
}

/// Whether a [`RedisStore`](crate::RedisStore) listens for the server's keyspace notifications of
/// expired keys (the `__keyevent@<db>__:expired` channel), the URL option `expiry_events`.
///
/// With them, the store reports
/// [`Notifications::ReleaseAndExpiry`](leasehold_core::Notifications::ReleaseAndExpiry) and an
/// idle follower makes no requests at all while a leader renews: it is woken when the lease is
/// released, taken over, broken, or when the server deletes the expired record of a holder that
/// stopped renewing. Without them it reports
/// [`Notifications::Release`](leasehold_core::Notifications::Release) and a follower reads the
/// lease again whenever the holder's `PTTL` runs out (about once per TTL while a leader renews).
///
/// The server sends expiry events only when its `notify-keyspace-events` setting contains `E`
/// (key-event channels) and `x` (expired events) or `A` (all events). See the
/// [crate docs](crate::docs#expiry-events) for the trade-offs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExpiryEvents {
    /// Use expiry events if the server already sends them (`CONFIG GET notify-keyspace-events`);
    /// otherwise, or when `CONFIG` is not allowed, poll. The default.
    #[default]
    Auto,
    /// Never use them: followers poll when the holder's `PTTL` runs out.
    Off,
    /// Turn them on if they are off (`CONFIG SET notify-keyspace-events`, adding `Ex` to the
    /// flags already set), then use them. This changes the server's setting for every client and
    /// database until the server restarts. When `CONFIG SET` is refused, the store polls.
    Enable,
}

impl ExpiryEvents {
    /// The option's value in a URL: `auto`, `off` or `enable`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryEvents::Auto => "auto",
            ExpiryEvents::Off => "off",
            ExpiryEvents::Enable => "enable",
        }
    }
}

impl fmt::Display for ExpiryEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ExpiryEvents {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value.to_ascii_lowercase().as_str() {
            "auto" => Ok(ExpiryEvents::Auto),
            "off" => Ok(ExpiryEvents::Off),
            "enable" => Ok(ExpiryEvents::Enable),
            _ => Err(format!("{value:?} is not one of auto, off, enable")),
        }
    }
}

/// The Redis keys and the channel of one lease (see the [crate docs](crate::docs) for what each
/// holds).
///
/// The lease name is wrapped in braces, a hash tag, so that all keys of a lease would live in one
/// slot of a cluster.
///
/// # Examples
///
/// ```
/// use leasehold_core::LeaseName;
/// use leasehold_redis::RedisConfig;
///
/// let keys = RedisConfig::new("localhost", 6379).keys(&LeaseName::new("compactor")?);
/// assert_eq!(keys.lease, "leasehold:lease:{compactor}");
/// assert_eq!(keys.history, "leasehold:history:{compactor}");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LeaseKeys {
    /// The lease record (a hash that expires): holder, term, TTL, version.
    pub lease: String,
    /// The lease's state that outlives each grant (a hash without expiry): the last term, its
    /// holder, when it expires, how it ended.
    pub state: String,
    /// The history (a stream): one entry per grant and one per end.
    pub history: String,
    /// The pub/sub channel of the lease: a message naming nobody (`released <term>`: no waiter
    /// was listening) wakes every follower; one naming a candidate (`released <term> <woken>`,
    /// `granted <term> <holder>`, `handed_over <term> <successor>`) wakes nobody but tells who
    /// was woken or took the lease.
    pub channel: String,
    /// The waiters (a sorted set without expiry, scored by the server's time in µs when each
    /// started waiting): candidates that found the lease held, in the order they are woken.
    pub queue: String,
    /// The waiter woken by the last release (a string with `PX` of the lease's TTL), deleted by
    /// the next grant: when it expires untaken, its expiry event wakes every follower.
    pub woken: String,
    /// The start of each waiter's own channel (`waiters` followed by the candidate id), on
    /// which a release wakes that waiter alone ([`LeaseKeys::waiter_channel`]).
    pub waiters: String,
}

impl LeaseKeys {
    /// The channel on which `candidate` alone is woken when it is the next waiter.
    pub fn waiter_channel(&self, candidate: &leasehold_core::CandidateId) -> String {
        format!("{}{candidate}", self.waiters)
    }
}

impl RedisConfig {
    /// The defaults for the server at `host:port`: database 0, no credentials, no TLS.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisConfig {
            host: host.into(),
            port,
            tls: false,
            ca: None,
            cert: None,
            username: None,
            password: None,
            db: 0,
            prefix: DEFAULT_PREFIX.to_string(),
            timeout: DEFAULT_TIMEOUT,
            history_limit: DEFAULT_HISTORY_LIMIT,
            restart_guard: true,
            expiry_events: ExpiryEvents::Auto,
        }
    }

    /// Parses a `redis://` or `rediss://` URL (see the [type docs](RedisConfig)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the password replaced by `***`) naming what is wrong: another
    /// scheme, no host, a path that is not a database number, an unknown option or a bad value;
    /// [`Error::UnsupportedScheme`] for `rediss://` when the `tls` feature is off.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = StoreUrl::parse(url, STORE)?.known_options(KNOWN_OPTIONS);
        let tls = url.require_scheme(URL_SCHEMES)? == "rediss";
        if tls && !cfg!(feature = "tls") {
            return Err(Error::UnsupportedScheme {
                scheme: "rediss".into(),
                hint: "TLS needs the `tls` feature of the leasehold-redis crate".into(),
            });
        }
        let host = match url.hosts() {
            [host] => host,
            [] => return Err(url.invalid("no host (e.g. redis://127.0.0.1:6379)")),
            _ => return Err(url.invalid("one host only (e.g. redis://127.0.0.1:6379)")),
        };
        let name = host.name.trim_start_matches('[').trim_end_matches(']');
        let mut config = RedisConfig::new(name, host.port.unwrap_or(DEFAULT_PORT));
        config.tls = tls;
        config.username = url.username().map(str::to_string);
        config.password = url.password();
        let db = url.path().trim_start_matches('/');
        if !db.is_empty() {
            config.db = db.parse().map_err(|_| {
                url.invalid(format!(
                    "the path must be a database number such as /0, not {:?}",
                    url.path()
                ))
            })?;
        }
        let mut options = url.options();
        if let Some(prefix) = options.string("prefix") {
            config.prefix = prefix;
        }
        let expected = "expected a duration from 10ms to 10m";
        if let Some(timeout) = options.duration_in("timeout", MIN_TIMEOUT..=MAX_TIMEOUT, expected)? {
            config.timeout = timeout;
        }
        if let Some(limit) = options.string("history_limit") {
            config.history_limit = limit
                .parse()
                .map_err(|_| options.invalid("history_limit", "expected a number of terms (0 keeps all)"))?;
        }
        if let Some(guard) = options.bool("restart_guard")? {
            config.restart_guard = guard;
        }
        if let Some(events) = options.parse::<ExpiryEvents>("expiry_events")? {
            config.expiry_events = events;
        }
        let file = |options: &mut leasehold_core::config::Options<'_>, name: &'static str| -> Result<_> {
            match options.string(name) {
                Some(path) if path.is_empty() => Err(options.invalid(name, "expected a file path")),
                Some(_) if !tls => Err(options.invalid(name, "TLS files need a rediss:// URL")),
                other => Ok(other.map(std::path::PathBuf::from)),
            }
        };
        config.ca = file(&mut options, "ca")?;
        config.cert = match (file(&mut options, "cert")?, file(&mut options, "key")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(url.invalid("a client certificate needs both cert= and key=")),
        };
        options.finish()?;
        config.validate().map_err(|e| match e {
            Error::InvalidConfig { field, value, allowed } => {
                url.invalid(format!("{field} = {value}: allowed {allowed}"))
            }
            other => other,
        })?;
        Ok(config)
    }

    /// Checks the fields.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the field: an empty host, a timeout outside 10 ms..=10 min,
    /// a prefix that is too long or has spaces, braces or non-ASCII characters.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, value: String, allowed: &str| {
            Err(Error::InvalidConfig {
                field,
                value,
                allowed: allowed.to_string(),
            })
        };
        if self.host.is_empty() {
            return invalid("host", "\"\"".into(), "a host name or IP address");
        }
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&self.timeout) {
            return invalid("timeout", format!("{:?}", self.timeout), "10ms..=10m");
        }
        if self.prefix.len() > MAX_PREFIX_LEN
            || !self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return invalid(
                "prefix",
                format!("{:?}", self.prefix),
                "up to 64 printable ASCII characters without spaces or braces",
            );
        }
        Ok(())
    }

    /// The keys and the channel of `lease`.
    pub fn keys(&self, lease: &LeaseName) -> LeaseKeys {
        let prefix = &self.prefix;
        LeaseKeys {
            lease: format!("{prefix}lease:{{{lease}}}"),
            state: format!("{prefix}state:{{{lease}}}"),
            history: format!("{prefix}history:{{{lease}}}"),
            channel: format!("{prefix}changes:{{{lease}}}"),
            queue: format!("{prefix}queue:{{{lease}}}"),
            woken: format!("{prefix}woken:{{{lease}}}"),
            waiters: format!("{prefix}waiter:{{{lease}}}:"),
        }
    }

    /// The URL of this configuration with the password replaced by `***` (also what `Display`
    /// prints).
    pub fn redacted_url(&self) -> String {
        self.to_string()
    }
}

impl FromStr for RedisConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        RedisConfig::from_url(url)
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{}:***@", percent_encode(user))?,
            (Some(user), None) => write!(f, "{}@", percent_encode(user))?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        write!(
            f,
            ":{}/{}?prefix={}&timeout={}ms&history_limit={}&restart_guard={}&expiry_events={}",
            self.port,
            self.db,
            percent_encode(&self.prefix),
            self.timeout.as_millis(),
            self.history_limit,
            self.restart_guard,
            self.expiry_events
        )?;
        if let Some(ca) = &self.ca {
            write!(f, "&ca={}", percent_encode(&ca.display().to_string()))?;
        }
        if let Some((cert, key)) = &self.cert {
            write!(
                f,
                "&cert={}&key={}",
                percent_encode(&cert.display().to_string()),
                percent_encode(&key.display().to_string())
            )?;
        }
        Ok(())
    }
}

/// `text` %-escaped for the redacted URL (`:` kept, so that prefixes read as written).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        for (url, host, port, db, user, password) in [
            ("redis://127.0.0.1:24379", "127.0.0.1", 24379, 0, None, None),
            ("redis://localhost", "localhost", 6379, 0, None, None),
            ("redis://localhost/", "localhost", 6379, 0, None, None),
            ("REDIS://Cache.Internal:1/15", "Cache.Internal", 1, 15, None, None),
            ("redis://:pw@h:2/3", "h", 2, 3, None, Some("pw")),
            (
                "redis://app:p%40ss%3Aw0rd@h/0",
                "h",
                6379,
                0,
                Some("app"),
                Some("p@ss:w0rd"),
            ),
            ("redis://app@h", "h", 6379, 0, Some("app"), None),
            ("redis://[::1]:7000/1", "::1", 7000, 1, None, None),
        ] {
            let config = RedisConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (config.host.as_str(), config.port, config.db),
                (host, port, db),
                "{url}"
            );
            assert_eq!(config.username.as_deref(), user, "{url}");
            assert_eq!(config.password.as_ref().map(Secret::expose), password, "{url}");
            assert!(!config.tls);
            assert_eq!(config.prefix, DEFAULT_PREFIX);
            assert_eq!(config.timeout, DEFAULT_TIMEOUT);
            // What Display prints parses back to the same configuration (minus the password).
            let again = RedisConfig::from_url(&config.to_string()).unwrap();
            assert_eq!(again.password.is_some(), config.password.is_some());
            assert_eq!(
                RedisConfig {
                    password: None,
                    ..again
                },
                RedisConfig {
                    password: None,
                    ..config
                }
            );
        }
    }

    #[test]
    fn options() {
        let config: RedisConfig =
            "redis://h/1?prefix=app%3Aleases:&timeout=250ms&history_limit=0&restart_guard=false&expiry_events=off"
                .parse()
                .unwrap();
        assert_eq!(config.expiry_events, ExpiryEvents::Off);
        assert_eq!(config.prefix, "app:leases:");
        assert_eq!(config.timeout, Duration::from_millis(250));
        assert_eq!(config.history_limit, 0);
        assert!(!config.restart_guard);
        let config: RedisConfig = "redis://h?prefix=".parse().unwrap();
        assert_eq!(config.prefix, "");
        assert_eq!(config.expiry_events, ExpiryEvents::Auto);
        for (value, mode) in [
            ("auto", ExpiryEvents::Auto),
            ("off", ExpiryEvents::Off),
            ("enable", ExpiryEvents::Enable),
            ("Enable", ExpiryEvents::Enable),
        ] {
            let config = RedisConfig::from_url(&format!("redis://h?expiry_events={value}")).unwrap();
            assert_eq!(config.expiry_events, mode, "{value}");
            assert!(
                config
                    .to_string()
                    .ends_with(&format!("&expiry_events={}", mode.as_str()))
            );
            assert_eq!(RedisConfig::from_url(&config.to_string()).unwrap(), config);
        }
        for (value, ms) in [
            ("2s", 2000),
            ("1500ms", 1500),
            ("1.5s", 1500),
            ("1m", 60_000),
            ("10ms", 10),
        ] {
            let config = RedisConfig::from_url(&format!("redis://h?timeout={value}")).unwrap();
            assert_eq!(config.timeout, Duration::from_millis(ms), "{value}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem() {
        for (url, why) in [
            ("http://h:1", "scheme"),
            ("h:6379", "scheme"),
            ("redis://", "no host"),
            ("redis:///0", "no host"),
            ("redis://h/x", "database number"),
            ("redis://h/0/1", "database number"),
            ("redis://h/-1", "database number"),
            ("redis://h/1#insecure", "fragment"),
            ("redis://h?timeout=soon", "timeout"),
            ("redis://h?timeout=1500", "needs a unit"),
            ("redis://h?restart_guard=off", "restart_guard"),
            ("redis://h?timeout=0", "timeout"),
            ("redis://h?timeout=11m", "timeout"),
            ("redis://h?history_limit=-1", "history_limit"),
            ("redis://h?restart_guard=maybe", "restart_guard"),
            ("redis://h?expiry_events=on", "expiry_events"),
            ("redis://h?expiry_events=", "expiry_events"),
            ("redis://h?prefix=a%20b", "prefix"),
            ("redis://h?prefix=%7Bx%7D", "prefix"),
            ("redis://h?db=2", "unknown option db"),
            ("redis://h?timeout=1s&timeout=2s", "twice"),
            ("redis://:p%zz@h", "%-escape"),
        ] {
            match RedisConfig::from_url(url) {
                Err(Error::InvalidUrl { url: shown, reason }) => {
                    assert!(reason.contains(why), "{url}: {reason}");
                    assert!(!shown.contains("p%zz"), "{shown}");
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
        let long = format!("redis://h?prefix={}", "x".repeat(65));
        assert!(RedisConfig::from_url(&long).is_err());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn ca_cert_and_key_are_tls_files() {
        let c: RedisConfig = "rediss://u@h:1?ca=/ca.pem&cert=/c.pem&key=/c.key".parse().unwrap();
        assert_eq!(c.ca.as_deref(), Some("/ca.pem".as_ref()));
        assert_eq!(c.cert, Some(("/c.pem".into(), "/c.key".into())));
        assert_eq!(c.to_string().parse::<RedisConfig>().unwrap(), c);
        for (url, says) in [
            ("redis://h?ca=/ca.pem", "rediss://"),
            ("rediss://h?cert=/c.pem", "both cert= and key="),
            ("rediss://h?ca=", "file path"),
        ] {
            let err = url.parse::<RedisConfig>().unwrap_err();
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn rediss_needs_the_tls_feature() {
        let result = RedisConfig::from_url("rediss://:pw@cache.example.com:6380");
        if cfg!(feature = "tls") {
            let config = result.unwrap();
            assert!(config.tls);
            assert!(config.to_string().starts_with("rediss://:***@cache.example.com:6380/0"));
        } else {
            match result {
                Err(e @ Error::UnsupportedScheme { .. }) => {
                    assert!(e.to_string().contains("`tls` feature"), "{e}");
                }
                other => panic!("expected UnsupportedScheme, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_password_is_never_shown() {
        let secret = "hunter2-Secret";
        let config = RedisConfig::from_url(&format!("redis://app:{secret}@h:1/2")).unwrap();
        for shown in [format!("{config:?}"), config.to_string(), config.redacted_url()] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        for url in [
            format!("redis://app:{secret}@h:1/2?nope=1"),
            format!("redis://app:{secret}@h:1/x"),
            format!("redis://app:{secret}@h:1?password={secret}&prefix=a%20b"),
            format!("redis://app:{secret}@:1"),
            format!("redis://app:{secret}@h:99999"),
            format!("ftp://app:{secret}@h"),
        ] {
            let err = RedisConfig::from_url(&url).unwrap_err();
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains(secret), "{url}: {shown}");
            }
        }
    }

    /// Finding 11 of issue 12: a password with an unescaped '/' or '?' ends the URL's authority
    /// early, and its rest was quoted as the path (or an option) in the error.
    #[test]
    fn a_password_holding_url_delimiters_is_never_quoted() {
        for url in [
            "redis://alice:12/s3cr3t@h1:6379/0",
            "redis://:12/s3cr3t@h1:6379/0",
            "redis://alice:12?s3cr3t@h1:6379/0",
            "redis://alice:12?s3cr3t=x@h1:6379/0",
            "redis://alice:pa/s3cr3t@h1:6379/0",
        ] {
            let err = RedisConfig::from_url(url).unwrap_err();
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("s3cr3t"), "{url}: {shown}");
            }
        }
        let config = RedisConfig::from_url("redis://h1/0?prefix=team%40app:").unwrap();
        assert_eq!(config.prefix, "team@app:");
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: RedisConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        RedisConfig::new("h", 1).validate().unwrap();
        assert_eq!(field(RedisConfig::new("", 1)), "host");
        let mut config = RedisConfig::new("h", 1);
        config.timeout = Duration::ZERO;
        assert_eq!(field(config), "timeout");
        let mut config = RedisConfig::new("h", 1);
        config.prefix = "é".into();
        assert_eq!(field(config), "prefix");
    }

    #[test]
    fn keys_use_the_prefix_and_a_hash_tag() {
        let mut config = RedisConfig::new("h", 1);
        config.prefix = "app:".into();
        let keys = config.keys(&LeaseName::new("a.b-c").unwrap());
        assert_eq!(keys.lease, "app:lease:{a.b-c}");
        assert_eq!(keys.state, "app:state:{a.b-c}");
        assert_eq!(keys.history, "app:history:{a.b-c}");
        assert_eq!(keys.channel, "app:changes:{a.b-c}");
    }
}
