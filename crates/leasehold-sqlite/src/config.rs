//! Where the lease file is and how to open it: `sqlite://` URLs and their options.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::StoreUrl;
use leasehold_core::{Error, Result};

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["sqlite"];

/// The default `busy_timeout`: how long a request waits for another process's write lock.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The default number of connections each [`SqliteStore`](crate::SqliteStore) keeps open.
pub const DEFAULT_POOL_SIZE: u32 = 4;

/// The default number of terms kept per lease in the history table.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

const MAX_POOL_SIZE: u32 = 64;
const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(3600);

/// How commits reach the disk (SQLite's `PRAGMA synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is synced to disk: a granted term survives a power loss, so a term is never
    /// granted twice. The default.
    #[default]
    Full,
    /// Commits survive a process crash but the last ones may be lost with a power loss or an
    /// operating-system crash, after which a term could be granted a second time. Faster.
    Normal,
}

/// How to open a lease file: its path and options.
///
/// Build one with [`SqliteConfig::new`] and the setters, or parse a URL:
///
/// | URL | file |
/// |---|---|
/// | `sqlite:///var/lib/app/leases.db` | `/var/lib/app/leases.db` |
/// | `sqlite://leases.db`, `sqlite:leases.db` | `leases.db`, relative to the working directory |
/// | `sqlite:/var/lib/app/leases.db` | `/var/lib/app/leases.db` |
///
/// Query options: `busy_timeout` (a duration with its unit: `5s`, `500ms`, `2m`; at most `1h`),
/// `pool_size` (1 to 64), `history_limit` (terms kept per lease, `0` keeps all) and
/// `synchronous` (`full` or `normal`). `%XX` escapes in the path are decoded, so a `?` in a file
/// name is written `%3F`. In-memory databases (`sqlite::memory:`, `mode=memory`) are rejected:
/// they are private to one process, and candidates in other processes would never see them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_sqlite::SqliteConfig;
///
/// let config: SqliteConfig = "sqlite:///var/lib/app/leases.db?busy_timeout=2s&pool_size=2".parse()?;
/// assert_eq!(config.path.to_str(), Some("/var/lib/app/leases.db"));
/// assert_eq!(config.busy_timeout, Duration::from_secs(2));
/// assert!("sqlite::memory:".parse::<SqliteConfig>().is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteConfig {
    /// The lease file, created if it does not exist. Its directory must be writable: SQLite
    /// keeps the write-ahead log (`-wal`, `-shm`) next to it.
    pub path: PathBuf,
    /// How long a request waits for another connection's write lock before it fails as
    /// [`Error::Timeout`]. Default 5 s; at most 1 h.
    pub busy_timeout: Duration,
    /// How many connections the store keeps open, 1 to 64. Default 4.
    pub pool_size: u32,
    /// How many terms of each lease the history table keeps; `0` keeps all. Default 1000.
    pub history_limit: u32,
    /// How commits reach the disk. Default [`Synchronous::Full`].
    pub synchronous: Synchronous,
}

impl SqliteConfig {
    /// The defaults for the lease file at `path` (created if it does not exist).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            history_limit: DEFAULT_HISTORY_LIMIT,
            synchronous: Synchronous::Full,
        }
    }

    /// Parses a `sqlite:` URL (see the [type docs](SqliteConfig)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming what is wrong: another scheme, an empty path, an in-memory
    /// database, an unknown option or a bad option value. The URL in it is redacted: a URL meant
    /// for another store (or a `key=` option) may carry a password.
    pub fn from_url(url: &str) -> Result<Self> {
        let after_scheme = url.get(URL_SCHEMES[0].len() + 1..).unwrap_or_default();
        if url.len() > URL_SCHEMES[0].len()
            && url[..URL_SCHEMES[0].len()].eq_ignore_ascii_case(URL_SCHEMES[0])
            && after_scheme.trim_start_matches('/').starts_with(":memory:")
        {
            return Err(Error::InvalidUrl {
                url: url.to_string(),
                reason: IN_MEMORY.into(),
            });
        }
        let url = StoreUrl::parse(url, STORE)?;
        url.require_scheme(URL_SCHEMES)?;
        // `sqlite://leases.db`: what the grammar reads as a host is the start of a relative path.
        let mut path: String = url
            .hosts()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        path.push_str(url.path());
        if path.is_empty() {
            return Err(url.invalid("no file path (e.g. sqlite:///var/lib/app/leases.db)"));
        }
        if path == ":memory:" {
            return Err(url.invalid(IN_MEMORY));
        }
        let mut config = SqliteConfig::new(path);
        let mut options = url.options();
        match options.string("mode").as_deref() {
            Some("memory") => return Err(url.invalid(IN_MEMORY)),
            Some(_) => return Err(options.invalid("mode", "not an option of the sqlite store (leave it out)")),
            None => {}
        }
        if let Some(timeout) = options.duration("busy_timeout")? {
            if timeout > MAX_BUSY_TIMEOUT {
                return Err(options.invalid("busy_timeout", "at most 1h"));
            }
            config.busy_timeout = timeout;
        }
        if let Some(size) = options.string("pool_size") {
            config.pool_size = size
                .parse()
                .ok()
                .filter(|size| (1..=MAX_POOL_SIZE).contains(size))
                .ok_or_else(|| options.invalid("pool_size", "expected a number of connections from 1 to 64"))?;
        }
        if let Some(limit) = options.string("history_limit") {
            config.history_limit = limit
                .parse()
                .map_err(|_| options.invalid("history_limit", "expected a number of terms (0 keeps all)"))?;
        }
        if let Some(synchronous) = options.string("synchronous") {
            config.synchronous = match synchronous.to_ascii_lowercase().as_str() {
                "full" => Synchronous::Full,
                "normal" => Synchronous::Normal,
                _ => return Err(options.invalid("synchronous", "expected full or normal")),
            };
        }
        options.finish()?;
        Ok(config)
    }

    /// Checks the ranges of the fields.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, value: String, allowed: &str| {
            Err(Error::InvalidConfig {
                field,
                value,
                allowed: allowed.to_string(),
            })
        };
        if self.busy_timeout > MAX_BUSY_TIMEOUT {
            return invalid("busy_timeout", format!("{:?}", self.busy_timeout), "at most 1h");
        }
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return invalid("pool_size", self.pool_size.to_string(), "1 to 64 connections");
        }
        if self.path.as_os_str().is_empty() || self.path == Path::new(":memory:") {
            return invalid(
                "path",
                format!("{:?}", self.path),
                "a file path (in-memory databases are private to one process)",
            );
        }
        Ok(())
    }
}

const IN_MEMORY: &str = "an in-memory database is private to one process, so candidates in other processes \
                         would never see its leases; use a file path";

impl FromStr for SqliteConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        SqliteConfig::from_url(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        for (url, path) in [
            ("sqlite:///var/lib/app/leases.db", "/var/lib/app/leases.db"),
            ("sqlite://leases.db", "leases.db"),
            ("sqlite:leases.db", "leases.db"),
            ("sqlite:/abs/leases.db", "/abs/leases.db"),
            ("sqlite:///tmp/a%3Fb%20c.db", "/tmp/a?b c.db"),
            ("sqlite://./dir/x.db?", "./dir/x.db"),
            ("SQLite:///Var/Leases.db", "/Var/Leases.db"),
        ] {
            let config = SqliteConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(config.path, Path::new(path), "{url}");
            assert_eq!(config.busy_timeout, DEFAULT_BUSY_TIMEOUT);
        }
    }

    #[test]
    fn options() {
        let config: SqliteConfig = "sqlite:x.db?busy_timeout=250ms&pool_size=2&history_limit=0&synchronous=NORMAL"
            .parse()
            .unwrap();
        assert_eq!(config.busy_timeout, Duration::from_millis(250));
        assert_eq!(config.pool_size, 2);
        assert_eq!(config.history_limit, 0);
        assert_eq!(config.synchronous, Synchronous::Normal);
        for (value, expected) in [
            ("5s", 5_000),
            ("5000ms", 5_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("0ms", 0),
        ] {
            let config = SqliteConfig::from_url(&format!("sqlite:x.db?busy_timeout={value}")).unwrap();
            assert_eq!(config.busy_timeout, Duration::from_millis(expected), "{value}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem() {
        for (url, why) in [
            ("postgres://localhost/db", "scheme"),
            ("sqlitex:foo.db", "scheme"),
            ("leases.db", "SCHEME"),
            ("sqlite:", "no file path"),
            ("sqlite://", "no file path"),
            ("sqlite://?busy_timeout=1s", "no file path"),
            ("sqlite::memory:", "in-memory"),
            ("sqlite://:memory:", "in-memory"),
            ("sqlite:x.db?mode=memory", "in-memory"),
            ("sqlite:x.db?busy_timeout=soon", "busy_timeout"),
            ("sqlite:x.db?busy_timeout=5000", "needs a unit"),
            ("sqlite:x.db?busy_timeout=1s&busy_timeout=2s", "given twice"),
            ("sqlite:x.db?busy_timeout=5d", "busy_timeout"),
            ("sqlite:x.db?busy_timeout=2h", "busy_timeout"),
            ("sqlite:x.db?pool_size=0", "pool_size"),
            ("sqlite:x.db?pool_size=1000", "pool_size"),
            ("sqlite:x.db?pool_size=-1", "a number of connections from 1 to 64"),
            ("sqlite:x.db?history_limit=-1", "history_limit"),
            ("sqlite:x.db?synchronous=off", "synchronous"),
            ("sqlite:x.db?journal_mode=delete", "unknown option journal_mode"),
            ("sqlite:x%zz.db", "%-escape"),
            ("sqlite:x%ff.db", "UTF-8"),
        ] {
            match SqliteConfig::from_url(url) {
                Err(Error::InvalidUrl { url: shown, reason }) => {
                    assert_eq!(shown, url);
                    assert!(reason.contains(why), "{url}: {reason}");
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    /// Finding 11 of issue 12: errors quoted the URL as given.
    #[test]
    fn errors_never_show_a_password() {
        for url in [
            "postgres://app:hunter2@db.internal/jobs",
            "postgres://app:hun/ter2@db.internal/jobs",
            "sqlite://app:hunter2@host/x.db?pool_size=0",
            "sqlite:x.db?key=hunter2",
            "sqlite:x.db?password=hunter2&busy_timeout=soon",
        ] {
            let err = SqliteConfig::from_url(url).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(
                    !text.contains("hunter2") && !text.contains("ter2"),
                    "{url}: leaked in {text}"
                );
                assert!(text.contains("***"), "{text}");
            }
        }
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: SqliteConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        let ok = SqliteConfig::new("x.db");
        ok.validate().unwrap();
        assert_eq!(
            field(SqliteConfig {
                pool_size: 0,
                ..ok.clone()
            }),
            "pool_size"
        );
        assert_eq!(
            field(SqliteConfig {
                busy_timeout: Duration::from_secs(7200),
                ..ok.clone()
            }),
            "busy_timeout"
        );
        assert_eq!(
            field(SqliteConfig {
                path: ":memory:".into(),
                ..ok.clone()
            }),
            "path"
        );
        assert_eq!(field(SqliteConfig { path: "".into(), ..ok }), "path");
    }
}
