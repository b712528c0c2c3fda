//! Where the etcd cluster is and how to talk to it: `etcd://` and `etcds://` URLs.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use etcd_client::ConnectOptions;
use leasehold_core::url_options::percent_decode;
use leasehold_core::{Error, Result};

/// The URL schemes this backend handles: `etcd` (plain gRPC) and `etcds` (gRPC over TLS).
pub const URL_SCHEMES: &[&str] = &["etcd", "etcds"];

/// The default key prefix under which every lease lives.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// The default time limit of one etcd request made by the store on its own (lookups of a
/// waiting candidate, keepalives). The engine bounds the requests it makes itself.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const DEFAULT_PORT: u16 = 2379;

/// Why a URL with an '@' after its hosts is refused. Quotes nothing: the text around that '@'
/// may be a password.
const AT_AFTER_HOSTS: &str = "an unescaped '@' after the hosts (a user name or password holding '/', '?' or '#' \
     ends the hosts early): write '@' as %40, '/' as %2F, '?' as %3F and '#' as %23 in user names \
     and passwords, and '@' as %40 in the prefix and in option values";

/// Shown in place of an option's name or value that follows `password=`.
const NOT_SHOWN: &str = "(not shown: it follows password=, whose value it may be part of; write an '&' in a \
     password as %26)";
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
///
/// Query options: `user`, `password`, `tls` (`true`/`false`), `ca` (a PEM file; implies TLS),
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
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// `host:port` of each endpoint; the client balances over them and fails over between them.
    pub endpoints: Vec<String>,
    /// The key prefix (no leading or trailing `/`): a lease `L` lives under `{prefix}/L/`.
    pub prefix: String,
    /// User name for etcd authentication.
    pub user: Option<String>,
    /// Password for etcd authentication. Never printed.
    pub password: Option<String>,
    /// Whether to speak TLS.
    pub tls: bool,
    /// A PEM file with the CA that signed the servers' certificates (otherwise the system roots).
    pub ca: Option<PathBuf>,
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
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Parses an `etcd://` or `etcds://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the password redacted) naming what is wrong, or
    /// [`Error::UnsupportedScheme`] for another scheme.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidUrl {
            url: leasehold_core::url_options::redact_url(url),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected etcd://host:port[,host:port]/prefix".into()))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(Error::UnsupportedScheme {
                    scheme: other.to_string(),
                    hint: "the etcd backend handles etcd:// and etcds://".into(),
                });
            }
        };
        // A user name or password holding an unescaped '/', '?' or '#' ends the hosts early: its
        // first part would be read as a host and its rest as the prefix or options, quoted by
        // errors and shown by `Debug`. An '@' after the hosts is that, or an '@' that must be
        // escaped anyway: refused, quoting none of it.
        let hosts_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if rest[hosts_end..].contains('@') {
            return Err(bad(AT_AFTER_HOSTS.into()));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        if before_query.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(bad("fragments (#) are not allowed".into()));
        }
        let (authority, path) = match before_query.split_once('/') {
            Some((a, p)) => (a, p),
            None => (before_query, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut config = EtcdConfig::new(Vec::<String>::new());
        config.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = percent_decode(user)
                .ok()
                .ok_or_else(|| bad("bad %-escape in the user name".into()))?;
            if !user.is_empty() {
                config.user = Some(user);
            }
            if let Some(p) = password {
                config.password = Some(
                    percent_decode(p)
                        .ok()
                        .ok_or_else(|| bad("bad %-escape in the password".into()))?,
                );
            }
        }
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(bad("an empty host in the endpoint list".into()));
            }
            if host.chars().any(|c| c.is_whitespace() || c == '/' || c == '@') {
                return Err(bad(format!("invalid host {host:?}")));
            }
            check_port(host).map_err(bad)?;
            config.endpoints.push(with_port(host));
        }
        let prefix = percent_decode(path.trim_matches('/')).map_err(|_| bad("bad %-escape in the prefix".into()))?;
        if !prefix.is_empty() {
            if prefix.chars().any(char::is_control) {
                return Err(bad("the prefix must not contain control characters".into()));
            }
            config.prefix = prefix;
        }
        // Once a `password=` was read, nothing after it is quoted, in the reason or in the URL:
        // it may be the password's rest (an unescaped '&' in it).
        let mut password_end: Option<usize> = None;
        let mut pair_end = url.len() - query.map_or(0, str::len);
        for pair in query.unwrap_or("").split('&') {
            let pair_start = pair_end;
            pair_end = pair_start + pair.len() + 1;
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |reason: String| match password_end {
                Some(end) => Error::InvalidUrl {
                    url: format!("{}&***", leasehold_core::url_options::redact_url(&url[..end])),
                    reason,
                },
                None => bad(reason),
            };
            let quote = |text: &str| {
                if password_end.is_some() {
                    NOT_SHOWN.to_string()
                } else {
                    format!("{text:?}")
                }
            };
            let value = percent_decode(value).map_err(|_| bad(format!("bad %-escape in option {}", quote(key))))?;
            match key {
                "user" | "username" => config.user = Some(value).filter(|v| !v.is_empty()),
                "password" => config.password = Some(value),
                "tls" => {
                    config.tls = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => {
                            if tls {
                                return Err(bad("etcds:// always uses TLS: tls=false contradicts it".into()));
                            }
                            false
                        }
                        _ => return Err(bad(format!("tls must be true or false, not {}", quote(&value)))),
                    }
                }
                "ca" | "cacert" => {
                    if value.is_empty() {
                        return Err(bad("ca needs a file path".into()));
                    }
                    config.ca = Some(PathBuf::from(value));
                    config.tls = true;
                }
                "timeout" => {
                    config.timeout = parse_duration(&value)
                        .filter(|d| !d.is_zero() && *d <= MAX_TIMEOUT)
                        .ok_or_else(|| {
                            bad(format!(
                                "timeout must be a duration in 1ms..=1h, like 5s or 500ms, not {}",
                                quote(&value)
                            ))
                        })?;
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {} (known: user, password, tls, ca, timeout)",
                        quote(other)
                    )));
                }
            }
            if key == "password" {
                password_end = Some(pair_start + pair.len());
            }
        }
        if config.password.is_some() && config.user.is_none() {
            return Err(bad("a password needs a user".into()));
        }
        Ok(config)
    }

    /// The URL of this configuration, with the password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{}:***@", escape(u, ":/")),
            (Some(u), None) => format!("{}@", escape(u, ":/")),
            _ => String::new(),
        };
        let ca = self
            .ca
            .as_ref()
            .map(|ca| format!("?ca={}", escape(&ca.display().to_string(), "")))
            .unwrap_or_default();
        format!(
            "{scheme}://{user}{}/{}{ca}",
            self.endpoints.join(","),
            escape(&self.prefix, "")
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
            options = options.with_user(user.clone(), password.clone().unwrap_or_default());
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

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_url())
    }
}

/// `text` with `%`, `@`, `?`, `#`, `&` and each of `also` %-escaped, so that the URL it goes
/// into parses back to it.
fn escape(text: &str, also: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "%@?#&".contains(c) || also.contains(c) {
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
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

fn check_port(host: &str) -> std::result::Result<(), String> {
    let port = if host.starts_with('[') {
        host.split_once("]:").map(|(_, p)| p)
    } else {
        host.rsplit_once(':').map(|(_, p)| p)
    };
    match port {
        Some(p) if p.parse::<u16>().map_or(true, |p| p == 0) => Err(format!("invalid port in {host:?}")),
        _ => Ok(()),
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => s.split_at(at),
        None => (s, "ms"),
    };
    let n: f64 = number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
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
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.ca, Some(PathBuf::from("/tmp/ca.pem")));
        let c: EtcdConfig = "etcd://h/app?user=bob&password=pw&tls=true&timeout=2s".parse().unwrap();
        assert_eq!(
            (c.user.as_deref(), c.password.as_deref(), c.tls),
            (Some("bob"), Some("pw"), true)
        );
        assert_eq!(c.timeout, Duration::from_secs(2));
        let c: EtcdConfig = "etcd://[::1]:2379,[::1]".parse().unwrap();
        assert_eq!(c.endpoints, ["[::1]:2379", "[::1]:2379"]);
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, why) in [
            ("etcd://", "empty host"),
            ("etcd://h1,,h2", "empty host"),
            ("etcd://h:99999", "port"),
            ("etcd://h:x", "port"),
            ("etcd://h?colour=red", "unknown option"),
            ("etcd://h?timeout=soon", "timeout"),
            ("etcd://h?tls=maybe", "tls"),
            ("etcds://h?tls=false", "TLS"),
            ("etcd://h?password=x", "needs a user"),
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
            assert_eq!(c.password.as_deref(), Some("hunter2"));
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
        assert_eq!(c.password.as_deref(), Some("SECRETA/?#@SECRETB"));
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
