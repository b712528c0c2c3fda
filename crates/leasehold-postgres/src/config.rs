//! Where the server is and how to use it: `postgres://` URLs and their options, with every
//! password redacted whenever a config is shown.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::{Secret, StoreUrl, percent_encode};
use leasehold_core::{Error, Result};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use url::Url;

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The default schema of leasehold's tables.
pub const DEFAULT_SCHEMA: &str = "leasehold";

/// The default number of pooled connections each store keeps for reads and operator requests
/// (the lock session and the listener have their own connection).
pub const DEFAULT_POOL_SIZE: u32 = 4;

/// The default bound on opening a connection (and on waiting for a pooled one).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default number of terms kept per lease in the history table.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

const MAX_POOL_SIZE: u32 = 64;
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// Every option a URL may carry: leasehold's own, then the driver's.
const ALL_OPTIONS: &[&str] = &[
    "schema",
    "pool_size",
    "connect_timeout",
    "history_limit",
    "ca",
    "cert",
    "key",
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The query options passed to the driver (sqlx), with its spelling variants.
const DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// How to reach the Postgres server and where leasehold keeps its tables.
///
/// Parse it from a URL (`postgres://` or `postgresql://`):
///
/// ```text
/// postgres://user:password@host:5432/database?schema=leasehold&sslmode=require&connect_timeout=5s
/// ```
///
/// | option | default | meaning |
/// |---|---|---|
/// | `schema` | `leasehold` | the schema of leasehold's tables (created if absent); letters, digits, `_` |
/// | `pool_size` | `4` | pooled connections for reads, 1 to 64 |
/// | `connect_timeout` | `5s` | bound on opening a connection, with its unit: `500ms`, `5s`, `1m`; at most 5 min |
/// | `history_limit` | `1000` | terms kept per lease in the history table; `0` keeps all |
/// | `sslmode` | `prefer` | `disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full` (the last three need the `tls-rustls` feature) |
/// | `sslrootcert`, `sslcert`, `sslkey` | | certificate files, as libpq |
/// | `ca`, `cert`, `key` | | the same files in the spelling every leasehold backend shares (a private CA; a client certificate and its key) |
/// | `application_name`, `options`, `host`, `hostaddr`, `port`, `dbname`, `user`, `password`, `statement-cache-capacity` | | as libpq and sqlx |
///
/// Unknown and repeated options are rejected, naming them. As with libpq, `PGPASSWORD`, `PGSSLMODE` and the
/// other `PG*` variables and `~/.pgpass` fill in what the URL leaves out.
///
/// `Debug` and `Display` show the URL with any password replaced by `***`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_postgres::PostgresConfig;
///
/// let config: PostgresConfig =
///     "postgres://app:hunter2@db.internal:5432/jobs?schema=elections&connect_timeout=2s".parse()?;
/// assert_eq!(config.schema(), "elections");
/// assert_eq!(config.connect_timeout(), Duration::from_secs(2));
/// assert_eq!(config.to_string(), "postgres://app:***@db.internal:5432/jobs?schema=elections&connect_timeout=2s");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// The URL as given; shown redacted.
    url: StoreUrl,
    /// The URL handed to the driver (host, user, password, database and the driver's options).
    driver: Secret,
    schema: String,
    pool_size: u32,
    connect_timeout: Duration,
    history_limit: u32,
}

impl PostgresConfig {
    /// Parses a `postgres://` or `postgresql://` URL (see the [type docs](PostgresConfig)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] with the URL redacted, naming what is wrong: another scheme, a
    /// malformed URL, an unknown option, a bad option value, or a TLS mode this build cannot do.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = StoreUrl::parse(url, STORE)?.known_options(ALL_OPTIONS);
        url.require_scheme(URL_SCHEMES)?;
        if !url.has_authority() {
            return Err(url.invalid("the scheme must be followed by // (e.g. postgres://user@host:5432/db)"));
        }
        if url.hosts().len() > 1 {
            return Err(url.invalid("one host only (the driver connects to a single server)"));
        }
        let mut options = url.options();
        let mut config = PostgresConfig {
            url: url.clone(),
            driver: Secret::default(),
            schema: DEFAULT_SCHEMA.to_string(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            history_limit: DEFAULT_HISTORY_LIMIT,
        };
        if let Some(schema) = options.string("schema") {
            check_schema(&schema).map_err(|why| options.invalid("schema", format!("expected {why}")))?;
            config.schema = schema;
        }
        if let Some(size) = options.string("pool_size") {
            config.pool_size = size
                .parse()
                .ok()
                .filter(|size| (1..=MAX_POOL_SIZE).contains(size))
                .ok_or_else(|| options.invalid("pool_size", "expected a number of connections from 1 to 64"))?;
        }
        if let Some(timeout) = options.duration("connect_timeout")? {
            if timeout.is_zero() || timeout > MAX_CONNECT_TIMEOUT {
                return Err(options.invalid("connect_timeout", "expected more than 0 and at most 5m"));
            }
            config.connect_timeout = timeout;
        }
        if let Some(limit) = options.string("history_limit") {
            config.history_limit = limit
                .parse()
                .map_err(|_| options.invalid("history_limit", "expected a number of terms (0 keeps all)"))?;
        }
        // The driver's URL: what the user wrote, minus leasehold's own options.
        let mut driver = format!("{}://", url.scheme());
        if let Some(user) = url.username() {
            driver.push_str(&percent_encode(user));
        }
        if let Some(password) = url.password() {
            driver.push(':');
            driver.push_str(&percent_encode(password.expose()));
        }
        if url.username().is_some() || url.password().is_some() {
            driver.push('@');
        }
        if let Some(host) = url.hosts().first() {
            driver.push_str(&host.to_string());
        }
        if let Some(database) = url.path().strip_prefix('/').filter(|db| !db.is_empty()) {
            driver.push('/');
            driver.push_str(&percent_encode(database));
        }
        let mut separator = '?';
        for name in DRIVER_OPTIONS {
            let value = match *name {
                "password" => options.secret(name).map(|secret| secret.expose().to_string()),
                _ => options.string(name),
            };
            let Some(value) = value else { continue };
            check_driver_option(name, &value).map_err(|why| options.invalid(name, why))?;
            driver.push(separator);
            separator = '&';
            driver.push_str(name);
            driver.push('=');
            driver.push_str(&percent_encode(&value));
        }
        // The spelling every leasehold backend shares for a private CA and a client certificate.
        let mut aliases = Vec::new();
        for (alias, name) in [("ca", "sslrootcert"), ("cert", "sslcert"), ("key", "sslkey")] {
            if let Some(value) = options.string(alias) {
                if driver.contains(&format!("?{name}=")) || driver.contains(&format!("&{name}=")) {
                    return Err(options.invalid(alias, format!("{alias}= and {name}= say the same: give one")));
                }
                aliases.push((name, value));
            }
        }
        for (name, value) in aliases {
            driver.push(separator);
            separator = '&';
            driver.push_str(name);
            driver.push('=');
            driver.push_str(&percent_encode(&value));
        }
        options.finish()?;
        // sqlx's messages name a bad value (a port, an escape), never the password.
        let parsed = Url::parse(&driver).map_err(|e| url.invalid(format!("malformed URL: {e}")))?;
        PgConnectOptions::from_url(&parsed).map_err(|e| url.invalid(format!("the driver rejects it: {e}")))?;
        config.driver = Secret::new(driver);
        Ok(config)
    }

    /// The schema of leasehold's tables. Default `leasehold`.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Uses another schema for leasehold's tables: 1 to 63 ASCII letters, digits or `_`, not
    /// starting with a digit or `pg_`. Checked by [`PostgresConfig::validate`].
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How many pooled connections the store keeps for reads. Default 4.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// Sets the number of pooled connections, 1 to 64.
    #[must_use]
    pub fn with_pool_size(mut self, pool_size: u32) -> Self {
        self.pool_size = pool_size;
        self
    }

    /// The bound on opening a connection. Default 5 s.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Sets the bound on opening a connection, up to 5 minutes.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many terms of each lease the history table keeps; `0` keeps all. Default 1000.
    pub fn history_limit(&self) -> u32 {
        self.history_limit
    }

    /// Sets how many terms of each lease the history table keeps; `0` keeps all.
    #[must_use]
    pub fn with_history_limit(mut self, limit: u32) -> Self {
        self.history_limit = limit;
        self
    }

    /// `host:port` of the server (or the socket directory), for errors.
    pub(crate) fn endpoint(&self) -> String {
        let options = self.connect_options();
        format!("{}:{}", options.get_host(), options.get_port())
    }

    /// The driver's connection options (they hold the password: never print them).
    pub(crate) fn connect_options(&self) -> PgConnectOptions {
        let url = Url::parse(self.driver.expose()).expect("checked when parsed");
        PgConnectOptions::from_url(&url).expect("checked when parsed")
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
        if let Err(why) = check_schema(&self.schema) {
            return invalid("schema", format!("{:?}", self.schema), why);
        }
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return invalid("pool_size", self.pool_size.to_string(), "1 to 64 connections");
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_CONNECT_TIMEOUT {
            return invalid(
                "connect_timeout",
                format!("{:?}", self.connect_timeout),
                "more than 0 and at most 5 minutes",
            );
        }
        Ok(())
    }
}

/// Checks the options sqlx would otherwise accept silently or fail on only when connecting.
fn check_driver_option(key: &str, value: &str) -> Result<(), String> {
    if matches!(key, "sslmode" | "ssl-mode") {
        let tls_needed = match value.to_ascii_lowercase().as_str() {
            "disable" | "allow" | "prefer" => false,
            "require" | "verify-ca" | "verify-full" => true,
            _ => {
                return Err("expected disable, allow, prefer, require, verify-ca or verify-full".to_string());
            }
        };
        if tls_needed && !cfg!(feature = "tls-rustls") {
            return Err(format!(
                "{key}={value} needs TLS, which this build of leasehold-postgres lacks: enable its `tls-rustls` feature"
            ));
        }
    }
    Ok(())
}

/// A schema name leasehold accepts: it is always quoted in SQL, but kept simple so that it reads
/// the same in `psql` and in the notification payloads.
fn check_schema(schema: &str) -> Result<(), &'static str> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && !schema.to_ascii_lowercase().starts_with("pg_")
        && schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err("1 to 63 ASCII letters, digits or '_', not starting with a digit or pg_")
    }
}

impl FromStr for PostgresConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        PostgresConfig::from_url(url)
    }
}

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.url.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        for url in [
            "postgres://postgres@127.0.0.1:25432/leasehold",
            "postgresql://app:pw@db.internal/jobs",
            "POSTGRES://app@db/jobs?sslmode=disable",
            "postgres:///jobs?host=/var/run/postgresql",
            "postgres://app@[::1]:5433/jobs?application_name=svc&options=-c%20search_path%3Dx",
        ] {
            let config = PostgresConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(config.schema(), DEFAULT_SCHEMA);
            assert_eq!(config.pool_size(), DEFAULT_POOL_SIZE);
            config.validate().unwrap();
        }
        let config = PostgresConfig::from_url("postgres://app@db.internal:6000/jobs").unwrap();
        let options = config.connect_options();
        assert_eq!(
            (options.get_host(), options.get_port(), options.get_username()),
            ("db.internal", 6000, "app")
        );
        assert_eq!(options.get_database(), Some("jobs"));
    }

    #[test]
    fn own_options() {
        let config: PostgresConfig =
            "postgres://h/db?schema=elections_2&pool_size=2&connect_timeout=750ms&history_limit=0&sslmode=prefer"
                .parse()
                .unwrap();
        assert_eq!(config.schema(), "elections_2");
        assert_eq!(config.pool_size(), 2);
        assert_eq!(config.connect_timeout(), Duration::from_millis(750));
        assert_eq!(config.history_limit(), 0);
        let err = PostgresConfig::from_url("postgres://h/db?connect_timeout=5").unwrap_err();
        assert!(err.to_string().contains("needs a unit"), "{err}");
        let err = PostgresConfig::from_url("postgres://h/db?schema=a&schema=b").unwrap_err();
        assert!(err.to_string().contains("option schema is given twice"), "{err}");
        for (value, expected) in [("5s", 5_000), ("1.5s", 1_500), ("250ms", 250), ("2m", 120_000)] {
            let config = PostgresConfig::from_url(&format!("postgres://h/db?connect_timeout={value}")).unwrap();
            assert_eq!(config.connect_timeout(), Duration::from_millis(expected), "{value}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem_and_hide_the_password() {
        for (url, why) in [
            ("sqlite:///x.db", "scheme"),
            ("postgres:/h/db", "scheme"),
            ("mysql://u:topsecret@h/db", "scheme"),
            ("postgres://u:topsecret@h:notaport/db", "port"),
            ("postgres://u:topsecret@h/db?schema=a-b", "schema"),
            ("postgres://u:topsecret@h/db?schema=pg_catalog", "schema"),
            ("postgres://u:topsecret@h/db?schema=", "schema"),
            ("postgres://u:topsecret@h/db?pool_size=0", "pool_size"),
            ("postgres://u:topsecret@h/db?pool_size=65", "pool_size"),
            (
                "postgres://u:topsecret@h/db?pool_size=-1",
                "a number of connections from 1 to 64",
            ),
            ("postgres://u:topsecret@h/db?connect_timeout=soon", "connect_timeout"),
            ("postgres://u:topsecret@h/db?connect_timeout=0", "connect_timeout"),
            ("postgres://u:topsecret@h/db?connect_timeout=1h", "connect_timeout"),
            ("postgres://u:topsecret@h/db?history_limit=-1", "history_limit"),
            ("postgres://u:topsecret@h/db?sslmode=sometimes", "sslmode"),
            (
                "postgres://u:topsecret@h/db?busy_timeout=1s",
                "unknown option busy_timeout",
            ),
            (
                "postgres://u@h/db?password=topsecret&bogus=1",
                // Perhaps the rest of a password holding an unescaped '&': not named.
                "unescaped '&'",
            ),
        ] {
            match PostgresConfig::from_url(url) {
                Err(e @ Error::InvalidUrl { .. }) => {
                    let Error::InvalidUrl { url: shown, reason } = &e else {
                        unreachable!()
                    };
                    assert!(reason.contains(why), "{url}: {reason}");
                    for text in [shown.clone(), e.to_string(), format!("{e:?}")] {
                        assert!(!text.contains("topsecret"), "{url}: leaked in {text}");
                    }
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn ca_cert_and_key_are_the_ssl_files() {
        let config =
            PostgresConfig::from_url("postgres://u:pw@h/db?ca=/a.pem&cert=/c.pem&key=/c.key&sslmode=disable").unwrap();
        let driver = config.driver.expose();
        assert!(
            driver.contains("sslrootcert=%2Fa.pem")
                && driver.contains("sslcert=%2Fc.pem")
                && driver.contains("sslkey=%2Fc.key"),
            "{driver}"
        );
        let err = PostgresConfig::from_url("postgres://h/db?ca=/a.pem&sslrootcert=/b.pem").unwrap_err();
        assert!(err.to_string().contains("say the same"), "{err}");
    }

    #[cfg(not(feature = "tls-rustls"))]
    #[test]
    fn tls_modes_need_the_feature() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let err = PostgresConfig::from_url(&format!("postgres://h/db?sslmode={mode}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("tls-rustls"), "{err}");
        }
    }

    #[test]
    fn passwords_are_never_shown() {
        let config = PostgresConfig::from_url("postgres://app:s3cret@db/x?password=s3cret&sslmode=disable").unwrap();
        for shown in [config.to_string(), format!("{config:?}")] {
            assert!(
                shown.contains("postgres://app:***@db/x?password=***&sslmode=disable"),
                "{shown}"
            );
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    /// Finding 11 of issue 12: the CLI printed `cannot connect to postgres://app:pa/ss@db.internal/jobs`.
    #[test]
    fn passwords_holding_url_delimiters_are_never_shown() {
        for url in [
            "postgres://app:pa/ss@db.internal/jobs",
            "postgres://app:pa?ss@db.internal/jobs",
            "postgres://app:pa#ss@db.internal/jobs",
            "postgresql://app:pa/s?s#@db.internal:5432/jobs?sslmode=disable",
        ] {
            let err = PostgresConfig::from_url(url).unwrap_err();
            for text in [
                err.to_string(),
                format!("{err:?}"),
                leasehold_core::config::redact_url(url),
            ] {
                assert!(
                    !text.contains("pa/") && !text.contains("ss@") && !text.contains("s#"),
                    "{url}: leaked in {text}"
                );
                assert!(text.contains("app:***@db.internal"), "{text}");
            }
        }
        // Read by the parser as host:port, the password's rest is neither the database nor an
        // option, and never quoted.
        for url in [
            "postgres://app:12/s3cr3t@db.internal/jobs",
            "postgres://app:12?s3cr3t@db.internal/jobs",
            "postgres://app:12?s3cr3t=x@db.internal/jobs",
        ] {
            let err = PostgresConfig::from_url(url).unwrap_err();
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(!text.contains("s3cr3t"), "{url}: leaked in {text}");
            }
        }
        let config = PostgresConfig::from_url("postgres://app@db/jobs%40eu?application_name=me%40box").unwrap();
        assert_eq!(config.connect_options().get_database(), Some("jobs@eu"));
        // Escaped, the same password parses, and is hidden too.
        let config = PostgresConfig::from_url("postgres://app:pa%2Fss@db.internal/jobs").unwrap();
        for text in [config.to_string(), format!("{config:?}")] {
            assert!(!text.contains("pa%2Fss"), "{text}");
        }
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: PostgresConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        let ok = PostgresConfig::from_url("postgres://h/db").unwrap();
        assert_eq!(field(ok.clone().with_schema("1x")), "schema");
        assert_eq!(field(ok.clone().with_pool_size(0)), "pool_size");
        assert_eq!(
            field(ok.clone().with_connect_timeout(Duration::ZERO)),
            "connect_timeout"
        );
        ok.with_history_limit(0).validate().unwrap();
    }
}
