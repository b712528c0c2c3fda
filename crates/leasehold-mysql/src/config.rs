//! Where the server is and how to use it: `mysql://` and `mariadb://` URLs and their options,
//! with every password redacted whenever a config is shown.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::{Secret, StoreUrl, percent_encode};
use leasehold_core::{Error, Result};
use sqlx::ConnectOptions;
use sqlx::mysql::MySqlConnectOptions;
use url::Url;

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["mysql", "mariadb"];

/// The default number of pooled connections each store keeps for reads and operator requests
/// (the lock session has its own connection).
pub const DEFAULT_POOL_SIZE: u32 = 4;

/// The default bound on opening a connection (and on waiting for a pooled one).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default number of terms kept per lease in the history table.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

const MAX_POOL_SIZE: u32 = 64;
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// The query options passed to the driver (sqlx), with its spelling variants.
const DRIVER_OPTIONS: &[&str] = &[
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "statement-cache-capacity",
    "socket",
];

/// The spelling every leasehold backend shares for a private CA and a client certificate, and
/// the driver's options they stand for.
const SHARED_TLS_OPTIONS: [(&str, &str); 3] = [("ca", "ssl-ca"), ("cert", "ssl-cert"), ("key", "ssl-key")];

/// Every option a URL may carry: leasehold's own, then the driver's.
const ALL_OPTIONS: &[&str] = &[
    "pool_size",
    "connect_timeout",
    "history_limit",
    "ca",
    "cert",
    "key",
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "statement-cache-capacity",
    "socket",
];

/// How to reach the MySQL or MariaDB server; leasehold's tables live in the URL's database.
///
/// Parse it from a URL (`mysql://` or `mariadb://`, the same driver):
///
/// ```text
/// mysql://user:password@host:3306/database?ssl-mode=REQUIRED&connect_timeout=5s
/// ```
///
/// | option | default | meaning |
/// |---|---|---|
/// | `pool_size` | `4` | pooled connections for reads, 1 to 64 |
/// | `connect_timeout` | `5s` | bound on opening a connection, with its unit: `500ms`, `5s`, `1m`; at most 5 min |
/// | `history_limit` | `1000` | terms kept per lease in the history table; `0` keeps all |
/// | `ssl-mode` | `PREFERRED` (`VERIFY_IDENTITY` with a CA) | `DISABLED`, `PREFERRED`; `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY` need the `tls-rustls` feature |
/// | `ca`, `cert`, `key` | | certificate files (PEM): a private CA, a client certificate and its key, in the spelling every leasehold backend shares |
/// | `ssl-ca`, `ssl-cert`, `ssl-key` | | the same, in the driver's spelling |
/// | `statement-cache-capacity`, `socket` | | as sqlx |
///
/// The database is required. Unknown and repeated options are rejected, naming them.
/// A CA is only ever given to be checked: with `ca=` (or `ssl-ca=`) and no `ssl-mode`, the
/// mode is `VERIFY_IDENTITY`; a mode that would not check it (`DISABLED`, `PREFERRED`,
/// `REQUIRED`) is rejected. `Debug` and `Display` show the URL with any password replaced by
/// `***`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_mysql::MysqlConfig;
///
/// let config: MysqlConfig = "mariadb://app:hunter2@db.internal:3306/jobs?connect_timeout=2s".parse()?;
/// assert_eq!(config.database(), "jobs");
/// assert_eq!(config.connect_timeout(), Duration::from_secs(2));
/// assert_eq!(config.to_string(), "mariadb://app:***@db.internal:3306/jobs?connect_timeout=2s");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MysqlConfig {
    /// The URL as given; shown redacted.
    url: StoreUrl,
    /// The `mysql://` URL handed to the driver.
    driver: Secret,
    database: String,
    pool_size: u32,
    connect_timeout: Duration,
    history_limit: u32,
}

impl MysqlConfig {
    /// Parses a `mysql://` or `mariadb://` URL (see the [type docs](MysqlConfig)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] with the URL redacted, naming what is wrong: another scheme, a
    /// malformed URL, no database, an unknown option, a bad option value, or a TLS mode this
    /// build cannot do.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = StoreUrl::parse(url, STORE)?.known_options(ALL_OPTIONS);
        url.require_scheme(URL_SCHEMES)?;
        if !url.has_authority() {
            return Err(url.invalid("the scheme must be followed by // (e.g. mysql://user@host:3306/db)"));
        }
        if url.hosts().len() > 1 {
            return Err(url.invalid("one host only (the driver connects to a single server)"));
        }
        let database = url.path().strip_prefix('/').unwrap_or_default().to_string();
        if database.is_empty() || database.contains('/') {
            return Err(url.invalid("name the database in the path (mysql://user@host:3306/database)"));
        }
        let mut options = url.options();
        let mut config = MysqlConfig {
            url: url.clone(),
            driver: Secret::default(),
            database: database.clone(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            history_limit: DEFAULT_HISTORY_LIMIT,
        };
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
        let mut driver = String::from("mysql://");
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
        driver.push('/');
        driver.push_str(&percent_encode(&database));
        let mut driver_options = Vec::new();
        for name in DRIVER_OPTIONS {
            let Some(value) = options.string(name) else { continue };
            check_driver_option(name, &value).map_err(|why| options.invalid(name, why))?;
            driver_options.push((name.to_string(), value));
        }
        let given = |driver_options: &[(String, String)], names: &[&str]| {
            driver_options
                .iter()
                .find(|(name, _)| names.contains(&name.as_str()))
                .map(|(name, value)| (name.clone(), value.clone()))
        };
        for (alias, name) in SHARED_TLS_OPTIONS {
            let Some(value) = options.string(alias) else { continue };
            let spellings = [name, &name.replace('-', "")];
            if let Some((other, _)) = given(&driver_options, &spellings) {
                return Err(options.invalid(alias, format!("{alias}= and {other}= say the same: give one")));
            }
            driver_options.push((name.to_string(), value));
        }
        // A CA given is a CA to check the server with: never silently unused.
        if given(&driver_options, &["ssl-ca", "sslca"]).is_some() {
            match given(&driver_options, &["ssl-mode", "sslmode"]) {
                None => {
                    check_driver_option("ssl-mode", "VERIFY_IDENTITY").map_err(|why| options.invalid("ca", why))?;
                    driver_options.push(("ssl-mode".to_string(), "VERIFY_IDENTITY".to_string()));
                }
                Some((name, mode)) if !mode.to_ascii_uppercase().starts_with("VERIFY_") => {
                    return Err(options.invalid(
                        &name,
                        format!(
                            "{name}={mode} does not check the server's certificate, so the CA (ca=) would be unused: \
                             use VERIFY_IDENTITY (the default with a CA) or VERIFY_CA"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let mut separator = '?';
        for (name, value) in driver_options {
            driver.push(separator);
            separator = '&';
            driver.push_str(&name);
            driver.push('=');
            driver.push_str(&percent_encode(&value));
        }
        options.finish()?;
        let parsed = Url::parse(&driver).map_err(|e| url.invalid(format!("malformed URL: {e}")))?;
        MySqlConnectOptions::from_url(&parsed).map_err(|e| url.invalid(format!("the driver rejects it: {e}")))?;
        config.driver = Secret::new(driver);
        Ok(config)
    }

    /// The database of leasehold's tables (the URL's path).
    pub fn database(&self) -> &str {
        &self.database
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

    /// `host:port` of the server (or the socket), for errors.
    pub(crate) fn endpoint(&self) -> String {
        let options = self.connect_options();
        match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        }
    }

    /// The driver's connection options (they hold the password: never print them).
    pub(crate) fn connect_options(&self) -> MySqlConnectOptions {
        let url = Url::parse(self.driver.expose()).expect("checked when parsed");
        MySqlConnectOptions::from_url(&url).expect("checked when parsed")
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

/// Checks the TLS mode, which sqlx would otherwise accept silently or fail on only when
/// connecting.
fn check_driver_option(key: &str, value: &str) -> Result<(), String> {
    if matches!(key, "ssl-mode" | "sslmode") {
        let tls_needed = match value.to_ascii_uppercase().as_str() {
            "DISABLED" | "PREFERRED" => false,
            "REQUIRED" | "VERIFY_CA" | "VERIFY_IDENTITY" => true,
            _ => return Err("expected DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY".to_string()),
        };
        if tls_needed && !cfg!(feature = "tls-rustls") {
            return Err(format!(
                "{key}={value} needs TLS, which this build of leasehold-mysql lacks: enable its `tls-rustls` feature"
            ));
        }
    }
    Ok(())
}

impl FromStr for MysqlConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        MysqlConfig::from_url(url)
    }
}

impl fmt::Display for MysqlConfig {
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
            "mysql://leasehold:pw@127.0.0.1:23306/leasehold",
            "mariadb://app@db.internal/jobs",
            "MYSQL://app@db/jobs?ssl-mode=DISABLED",
            "mysql://app@[::1]:3307/jobs?statement-cache-capacity=10",
        ] {
            let config = MysqlConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(config.pool_size(), DEFAULT_POOL_SIZE);
            config.validate().unwrap();
        }
        let config = MysqlConfig::from_url("mariadb://app@db.internal:6000/jobs").unwrap();
        let options = config.connect_options();
        assert_eq!(
            (options.get_host(), options.get_port(), options.get_username()),
            ("db.internal", 6000, "app")
        );
        assert_eq!(options.get_database(), Some("jobs"));
        assert_eq!(config.endpoint(), "db.internal:6000");
    }

    #[test]
    fn own_options() {
        let config: MysqlConfig = "mysql://h/db?pool_size=2&connect_timeout=750ms&history_limit=0"
            .parse()
            .unwrap();
        assert_eq!(config.pool_size(), 2);
        assert_eq!(config.connect_timeout(), Duration::from_millis(750));
        assert_eq!(config.history_limit(), 0);
    }

    #[test]
    fn malformed_urls_name_the_problem_and_hide_the_password() {
        for (url, why) in [
            ("postgres://u:topsecret@h/db", "scheme"),
            ("mysql:/h/db", "scheme"),
            ("mysql://u:topsecret@h", "database"),
            ("mysql://u:topsecret@h/", "database"),
            ("mysql://u:topsecret@h:notaport/db", "port"),
            ("mysql://u:topsecret@h/db?pool_size=0", "pool_size"),
            ("mysql://u:topsecret@h/db?connect_timeout=5", "needs a unit"),
            ("mysql://u:topsecret@h/db?connect_timeout=1h", "connect_timeout"),
            ("mysql://u:topsecret@h/db?history_limit=-1", "history_limit"),
            ("mysql://u:topsecret@h/db?ssl-mode=sometimes", "ssl-mode"),
            (
                "mysql://u:topsecret@h/db?busy_timeout=1s",
                "unknown option busy_timeout",
            ),
        ] {
            match MysqlConfig::from_url(url) {
                Err(e @ Error::InvalidUrl { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(why), "{url}: {text}");
                    assert!(!text.contains("topsecret") && !format!("{e:?}").contains("topsecret"));
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[cfg(not(feature = "tls-rustls"))]
    #[test]
    fn tls_modes_need_the_feature() {
        for mode in ["REQUIRED", "VERIFY_CA", "verify_identity"] {
            let err = MysqlConfig::from_url(&format!("mysql://h/db?ssl-mode={mode}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("tls-rustls"), "{err}");
        }
    }

    #[cfg(feature = "tls-rustls")]
    #[test]
    fn the_shared_tls_spelling_and_a_ca_that_is_always_checked() {
        let driver = |url: &str| MysqlConfig::from_url(url).unwrap().driver.expose().to_string();
        assert_eq!(
            driver("mysql://u:pw@h/db?ca=/a.pem&cert=/c.pem&key=/c.key"),
            "mysql://u:pw@h/db?ssl-ca=%2Fa.pem&ssl-cert=%2Fc.pem&ssl-key=%2Fc.key&ssl-mode=VERIFY_IDENTITY"
        );
        let options = MysqlConfig::from_url("mysql://u@h/db?ssl-mode=VERIFY_CA&ca=/a.pem")
            .unwrap()
            .connect_options();
        assert!(format!("{options:?}").contains("VerifyCa"), "{options:?}");
        assert!(driver("mysql://u@h/db?ssl-ca=/a.pem").ends_with("ssl-mode=VERIFY_IDENTITY"));
        for (url, why) in [
            ("mysql://h/db?ca=/a.pem&ssl-ca=/b.pem", "ca= and ssl-ca= say the same"),
            ("mysql://h/db?key=/a.key&sslkey=/b.key", "key= and sslkey= say the same"),
            (
                "mysql://h/db?ca=/a.pem&ssl-mode=REQUIRED",
                "the CA (ca=) would be unused",
            ),
            (
                "mysql://h/db?ssl-ca=/a.pem&sslmode=preferred",
                "the CA (ca=) would be unused",
            ),
        ] {
            let err = MysqlConfig::from_url(url).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
        }
    }

    #[test]
    fn passwords_are_never_shown() {
        let config = MysqlConfig::from_url("mysql://app:s3cret@db/x?ssl-mode=DISABLED").unwrap();
        for shown in [config.to_string(), format!("{config:?}")] {
            assert!(shown.contains("mysql://app:***@db/x?ssl-mode=DISABLED"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: MysqlConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        let ok = MysqlConfig::from_url("mysql://h/db").unwrap();
        assert_eq!(field(ok.clone().with_pool_size(0)), "pool_size");
        assert_eq!(
            field(ok.clone().with_connect_timeout(Duration::ZERO)),
            "connect_timeout"
        );
        ok.with_history_limit(0).validate().unwrap();
    }
}
