//! Where the etcd cluster is and how to talk to it: `etcd://` and `etcds://` URLs.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use etcd_client::ConnectOptions;
use leasehold_core::config::{Secret, StoreUrl, parse_bool, parse_duration, percent_encode, redact_url};
use leasehold_core::{Error, Result};

use crate::error::STORE;

/// The URL schemes this backend handles: `etcd` (plain gRPC) and `etcds` (gRPC over TLS).
pub const URL_SCHEMES: &[&str] = &["etcd", "etcds"];

/// The default key prefix under which every lease lives.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// The default time limit of one etcd request made by the store on its own (lookups of a
/// waiting candidate, keepalives). The engine bounds the requests it makes itself.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const DEFAULT_PORT: u16 = 2379;

const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// How to reach an etcd cluster: endpoints, key prefix, credentials, TLS.
///
/// Parse a URL (see [`docs`](crate::docs) for every form):
///
/// | URL | meaning |
/// |---|---|
/// | `etcd://10.0.0.5:2379` | one endpoint, keys under `leasehold/` |
/// | `etcd://h1:2379,h2:2379,h3:2379/myapp` | three endpoints, keys under `myapp/` |
/// | `etcd://alice:s3cret@h1/myapp` | user and password (also `?user=..&password=..`) |
/// | `etcds://h1:2379/myapp?ca=/etc/etcd/ca.pem` | TLS, server verified against this CA |
/// | `etcds://h1/myapp?ca=ca.pem&cert=client.pem&key=client.key` | TLS with a client certificate |
///
/// Query options: `user`, `password`, `tls` (`true`/`false`), `ca` (a PEM file; implies TLS),
/// `cert` and `key` (PEM files of a client certificate and its private key, for etcd's
/// `--client-cert-auth`; both or neither; imply TLS),
/// `timeout` (`5s`, `500ms`, or bare milliseconds). `Debug` and `Display` never show the
/// password. `@`, `/`, `?` and `#` in a user name or password are written `%40`, `%2F`, `%3F`,
/// `%23`: a URL with an unescaped `@` after the hosts is refused (a password holding `/` or `?`
/// looks like that), quoting none of it.
///
/// # Examples
///
/// ```
/// use leasehold_etcd::EtcdConfig;
///
/// let config: EtcdConfig = "etcd://alice:s3cret@h1:2379,h2/myapp".parse()?;
/// assert_eq!(config.endpoints, ["h1:2379", "h2:2379"]);
/// assert_eq!(config.prefix, "myapp");
/// assert!(!format!("{config:?} {config}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// `host:port` of each endpoint; the client balances over them and fails over between them.
    pub endpoints: Vec<String>,
    /// The key prefix (no leading or trailing `/`): a lease `L` lives under `{prefix}/L/`.
    pub prefix: String,
    /// User name for etcd authentication.
    pub user: Option<String>,
    /// Password for etcd authentication. Never printed.
    pub password: Option<Secret>,
    /// Whether to speak TLS.
    pub tls: bool,
    /// A PEM file with the CA that signed the servers' certificates (otherwise the system roots).
    pub ca: Option<PathBuf>,
    /// A PEM file with the client certificate shown to the servers (with [`key`](Self::key)).
    pub cert: Option<PathBuf>,
    /// A PEM file with the private key of [`cert`](Self::cert). Its content is never read
    /// into any message.
    pub key: Option<PathBuf>,
    /// The time limit of one request the store makes on its own. Default 5 s.
    pub timeout: Duration,
}

impl EtcdConfig {
    /// A configuration for these endpoints (`host:port`, port 2379 if missing), with the
    /// default prefix and no credentials.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(|e| with_port(&e.into())).collect(),
            prefix: DEFAULT_PREFIX.to_string(),
            user: None,
            password: None,
            tls: false,
            ca: None,
            cert: None,
            key: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Parses an `etcd://` or `etcds://` URL (the grammar of [`StoreUrl`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the password redacted) naming what is wrong, or
    /// [`Error::UnsupportedScheme`] for another scheme.
    pub fn from_url(url: &str) -> Result<Self> {
        // Without `known_options`: a URL in an error shows nothing after a password's value (it
        // may go on past an unescaped '&').
        // StoreUrl names an option without '=' unless it follows the secret right away
        // (`password=a&ca=&b`): after a password, name nothing.
        let after_password = url
            .split_once('?')
            .and_then(|(_, q)| q.find("password=").map(|at| &q[at..]));
        if after_password.is_some_and(|rest| rest.split('&').skip(1).any(|p| !p.is_empty() && !p.contains('='))) {
            return Err(Error::InvalidUrl {
                url: redact_url(url),
                reason: "the value of option password holds an unescaped '&': write it as %26".into(),
            });
        }
        let parsed = StoreUrl::parse(url, STORE)?;
        if !parsed.has_authority() || parsed.hosts().is_empty() {
            return Err(parsed.invalid("no endpoint: expected etcd://host:port[,host:port]/prefix"));
        }
        let tls = match parsed.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(Error::UnsupportedScheme {
                    scheme: other.to_string(),
                    hint: "the etcd backend handles etcd:// and etcds://".into(),
                });
            }
        };
        let mut config = EtcdConfig::new(Vec::<String>::new());
        config.tls = tls;
        for host in parsed.hosts() {
            if host.port == Some(0) {
                return Err(parsed.invalid(format!("invalid port in {host}")));
            }
            config
                .endpoints
                .push(format!("{}:{}", host.name, host.port.unwrap_or(DEFAULT_PORT)));
        }
        let prefix = parsed.path().trim_matches('/');
        if prefix.chars().any(char::is_control) {
            return Err(parsed.invalid("the prefix must not contain control characters"));
        }
        if !prefix.is_empty() {
            config.prefix = prefix.to_string();
        }
        // After a password option, no value is quoted: it may be the rest of a password that
        // holds an unescaped '&'.
        let mut options = parsed.options();
        let hide = options.string("password").is_some();
        let invalid = |options: &leasehold_core::config::Options<'_>, name: &str, why: &str| {
            if hide {
                parsed.invalid(format!("option {name}: {why}"))
            } else {
                options.invalid(name, why)
            }
        };
        config.user = options
            .string("user")
            .or(options.string("username"))
            .or(parsed.username().map(str::to_string))
            .filter(|user| !user.is_empty());
        config.password = options.secret("password").or(parsed.password());
        if let Some(text) = options.string("tls") {
            match parse_bool(&text) {
                Ok(true) => config.tls = true,
                Ok(false) if tls => return Err(parsed.invalid("etcds:// always uses TLS: tls=false contradicts it")),
                Ok(false) => config.tls = false,
                Err(why) => return Err(invalid(&options, "tls", &why)),
            }
        }
        if let Some(ca) = options.string("ca") {
            if ca.is_empty() {
                return Err(parsed.invalid("option ca needs a file path"));
            }
            config.ca = Some(PathBuf::from(ca));
            config.tls = true;
        }
        for (name, slot) in [("cert", &mut config.cert), ("key", &mut config.key)] {
            if let Some(path) = options.string(name) {
                if path.is_empty() {
                    return Err(parsed.invalid(format!("option {name} needs a file path")));
                }
                *slot = Some(PathBuf::from(path));
                config.tls = true;
            }
        }
        if config.cert.is_some() != config.key.is_some() {
            return Err(parsed.invalid("a client certificate needs both cert= and key="));
        }
        if let Some(text) = options.string("timeout") {
            let timeout = parse_duration(&text).map_err(|why| invalid(&options, "timeout", &why))?;
            if timeout.is_zero() || timeout > MAX_TIMEOUT {
                return Err(invalid(&options, "timeout", "expected a duration in 1ms..=1h"));
            }
            config.timeout = timeout;
        }
        options.finish()?;
        if config.password.is_some() && config.user.is_none() {
            return Err(parsed.invalid("a password needs a user"));
        }
        Ok(config)
    }

    /// The URL of this configuration, with the password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{}:***@", percent_encode(u)),
            (Some(u), None) => format!("{}@", percent_encode(u)),
            _ => String::new(),
        };
        let files: Vec<String> = [("ca", &self.ca), ("cert", &self.cert), ("key", &self.key)]
            .into_iter()
            .filter_map(|(name, path)| {
                path.as_ref()
                    .map(|p| format!("{name}={}", percent_encode(&p.display().to_string())))
            })
            .collect();
        let ca = if files.is_empty() {
            String::new()
        } else {
            format!("?{}", files.join("&"))
        };
        format!(
            "{scheme}://{user}{}/{}{ca}",
            self.endpoints.join(","),
            self.prefix.split('/').map(percent_encode).collect::<Vec<_>>().join("/")
        )
    }
}

impl EtcdConfig {
    /// The client's options: credentials, TLS, connection time limits.
    pub(crate) fn connect_options(&self) -> Result<ConnectOptions> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            // etcd refuses pings more often than every 5 s, and pings without a stream.
            .with_keep_alive(Duration::from_secs(10), self.timeout)
            .with_keep_alive_while_idle(false);
        if let (Some(user), password) = (&self.user, &self.password) {
            options = options.with_user(user.clone(), password.as_ref().map(Secret::expose).unwrap_or_default());
        }
        if self.tls {
            let mut tls = etcd_client::TlsOptions::new();
            match &self.ca {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| Error::InvalidUrl {
                        url: self.redacted_url(),
                        reason: format!("cannot read the CA file {}: {e}", path.display()),
                    })?;
                    tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
                }
                None => tls = tls.with_native_roots(),
            }
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                let read = |what: &str, path: &PathBuf| {
                    std::fs::read(path).map_err(|e| Error::InvalidUrl {
                        url: self.redacted_url(),
                        reason: format!("cannot read the {what} file {}: {}", path.display(), e.kind()),
                    })
                };
                tls = tls.identity(etcd_client::Identity::from_pem(read("cert", cert)?, read("key", key)?));
            }
            options = options.with_tls(tls);
        }
        if self.endpoints.is_empty() {
            return Err(Error::InvalidUrl {
                url: self.redacted_url(),
                reason: "no endpoint".into(),
            });
        }
        Ok(options)
    }
}

impl FromStr for EtcdConfig {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        EtcdConfig::from_url(s)
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_url())
    }
}

fn with_port(host: &str) -> String {
    let has_port = if host.starts_with('[') {
        host.contains("]:")
    } else {
        host.contains(':')
    };
    if has_port {
        host.to_string()
    } else {
        format!("{host}:{DEFAULT_PORT}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c: EtcdConfig = "etcd://127.0.0.1:22479,127.0.0.1:22579,h3/app/x".parse().unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:22479", "127.0.0.1:22579", "h3:2379"]);
        assert_eq!(c.prefix, "app/x");
        assert!(!c.tls);
        let c: EtcdConfig = "etcd://h".parse().unwrap();
        assert_eq!(
            (c.endpoints.as_slice(), c.prefix.as_str()),
            (&["h:2379".to_string()][..], "leasehold")
        );
        let c: EtcdConfig = "etcds://u:p%40ss@h:1/?ca=/tmp/ca.pem&timeout=250ms".parse().unwrap();
        assert!(c.tls);
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.ca, Some(PathBuf::from("/tmp/ca.pem")));
        let c: EtcdConfig = "etcd://h/app?ca=/c.pem&cert=/client.pem&key=/client.key"
            .parse()
            .unwrap();
        assert!(c.tls);
        assert_eq!(
            (c.cert.as_deref(), c.key.as_deref()),
            (Some("/client.pem".as_ref()), Some("/client.key".as_ref()))
        );
        assert_eq!(c.to_string().parse::<EtcdConfig>().unwrap(), c);
        let c: EtcdConfig = "etcd://h/app?user=bob&password=pw&tls=true&timeout=2s".parse().unwrap();
        assert_eq!(
            (c.user.as_deref(), c.password.as_ref().map(Secret::expose), c.tls),
            (Some("bob"), Some("pw"), true)
        );
        assert_eq!(c.timeout, Duration::from_secs(2));
        let c: EtcdConfig = "etcd://[::1]:2379,[::1]".parse().unwrap();
        assert_eq!(c.endpoints, ["[::1]:2379", "[::1]:2379"]);
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, why) in [
            ("etcd://", "no endpoint"),
            ("etcd://h1,,h2", "empty host"),
            ("etcd://h:99999", "port"),
            ("etcd://h:x", "port"),
            ("etcd://h?colour=red", "unknown option colour"),
            ("etcd://h?timeout=1s&timeout=2s", "option timeout is given twice"),
            ("etcd://h?timeout=10", "needs a unit"),
            ("etcd://h?timeout=2h", "1ms..=1h"),
            ("etcd://h?timeout=soon", "timeout"),
            ("etcd://h?tls=maybe", "tls"),
            ("etcds://h?tls=false", "TLS"),
            ("etcd://h?password=x", "needs a user"),
            ("etcd://h?cert=/c.pem", "both cert= and key="),
            ("etcd://h?key=/c.key", "both cert= and key="),
            ("etcd://h/a#b", "fragment"),
            ("h:2379", "expected"),
        ] {
            let err = url.parse::<EtcdConfig>().unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            assert!(err.to_string().contains(why), "{url}: {err}");
        }
        assert!(matches!(
            "redis://h".parse::<EtcdConfig>(),
            Err(Error::UnsupportedScheme { .. })
        ));
    }

    #[test]
    fn secrets_are_redacted() {
        for url in [
            "etcd://alice:hunter2@h:2379/app",
            "etcd://h:2379/app?user=alice&password=hunter2",
            "etcds://alice:hunter2@h1,h2/app?timeout=1s",
        ] {
            let c: EtcdConfig = url.parse().unwrap();
            assert_eq!(c.password.as_ref().map(Secret::expose), Some("hunter2"));
            for shown in [format!("{c:?}"), c.to_string(), c.redacted_url()] {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(shown.contains("alice"), "{shown}");
            }
            let bad = format!("{url}&colour=red").replacen("/app&", "/app?", 1);
            let err = bad.parse::<EtcdConfig>().unwrap_err();
            for shown in [format!("{err:?}"), err.to_string()] {
                assert!(!shown.contains("hunter2"), "{shown}");
            }
        }
    }

    /// Finding 11 of issue 12: a password with an unescaped '/', '?' or '#' ends the authority
    /// early; its first part was quoted as a host (`invalid port in "alice:pass"`), or the URL
    /// parsed with its rest taken for the prefix (shown by `Debug`) or an option (quoted).
    #[test]
    fn passwords_holding_url_delimiters_are_never_shown() {
        for url in [
            "etcd://alice:SECRETA/SECRETB@h1:2379/app",
            "etcd://alice:12/SECRETB@h1:2379/app",
            "etcd://alice:SECRETA?SECRETB@h1:2379/app",
            "etcd://alice:12?SECRETB@h1:2379/app",
            "etcd://alice:12?SECRETB=x@h1:2379/app",
            "etcd://alice:12?user=SECRETB@h1:2379/app",
            "etcd://alice:12?password=SECRETB@h1:2379/app",
            "etcd://alice:SECRETA#SECRETB@h1:2379/app",
            "etcds://alice:12/SECRETB@h1,h2/app?timeout=1s",
            "etcd://:SECRETA/SECRETB@h1/app",
            "etcd://h1/app?password=SECRETA@SECRETB&user=alice",
        ] {
            let err = url.parse::<EtcdConfig>().unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("SECRET") && !shown.contains("12/"), "{url}: {shown}");
                assert!(shown.contains("%40") && shown.contains("%2F"), "{url}: {shown}");
            }
        }
        // An unescaped '&' in a `password=` option: what follows is not quoted either.
        for url in [
            "etcd://h1/app?user=alice&password=SECRETA&SECRETB",
            "etcd://h1/app?user=alice&password=SECRETA&SECRETB=1",
            "etcd://h1/app?user=alice&password=SECRETA&tls=SECRETB",
            "etcd://h1/app?user=alice&password=SECRETA&timeout=SECRETB",
            "etcd://h1/app?user=alice&password=SECRETA&ca=&SECRETB",
        ] {
            let err = url.parse::<EtcdConfig>().unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("SECRET"), "{url}: {shown}");
            }
        }
        // Escaped, such a password parses, and is shown nowhere; an '@' in the prefix or an
        // option is written %40.
        let c: EtcdConfig = "etcd://alice:SECRETA%2F%3F%23%40SECRETB@h1/team%40app?ca=/ca%40x.pem"
            .parse()
            .unwrap();
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("SECRETA/?#@SECRETB"));
        assert_eq!(
            (c.prefix.as_str(), c.endpoints.as_slice()),
            ("team@app", &["h1:2379".to_string()][..])
        );
        assert_eq!(c.ca, Some(PathBuf::from("/ca@x.pem")));
        for shown in [c.to_string(), format!("{c:?}"), c.redacted_url()] {
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        assert_eq!(c.to_string().parse::<EtcdConfig>().unwrap().prefix, "team@app");
    }
}
