//! `zk://` URLs: hosts, chroot and digest auth, with the password kept out of every message.

use std::fmt;

use leasehold_core::Result;
use leasehold_core::config::{Secret, StoreUrl, percent_encode};

/// The store's name in errors and metrics.
pub(crate) const STORE: &str = "zookeeper";

/// The URL schemes this backend handles: `zk://` and `zookeeper://`.
pub const URL_SCHEMES: &[&str] = &["zk", "zookeeper"];

/// The znode under which leases live when the URL names no chroot.
pub const DEFAULT_CHROOT: &str = "/leasehold";

/// The port of a host that names none.
const DEFAULT_PORT: u16 = 2181;

/// Where and how to reach a ZooKeeper ensemble.
///
/// Parsed from `zk://h1:2181,h2:2181/chroot?auth=digest:user:pass`:
///
/// - one or more `host:port` (port 2181 when left out), tried in turn by the client;
/// - an optional chroot path under which every lease lives (default [`DEFAULT_CHROOT`]),
///   `%`-escapes decoded;
/// - `auth=digest:user:pass` adds digest authentication to every session.
///
/// `Debug` and `Display` show `***` in place of passwords.
///
/// # Examples
///
/// ```
/// use leasehold_zookeeper::ZookeeperConfig;
///
/// let config = ZookeeperConfig::parse("zk://10.0.0.1,10.0.0.2:2182/apps/billing?auth=digest:app:s3cret")?;
/// assert_eq!(config.hosts(), ["10.0.0.1:2181", "10.0.0.2:2182"]);
/// assert_eq!(config.chroot(), "/apps/billing");
/// assert!(!format!("{config} {config:?}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ZookeeperConfig {
    hosts: Vec<String>,
    chroot: String,
    auth: Vec<(String, Secret)>,
}

impl ZookeeperConfig {
    /// Parses a `zk://` or `zookeeper://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](leasehold_core::Error::InvalidUrl) (with the URL redacted) for
    /// another scheme, no host, a bad port, a chroot that is not a valid znode path, an unknown
    /// option, or an unescaped `@` after the hosts (write it `%40`; a password holding an
    /// unescaped `/` or `?` looks like that), which quotes none of the URL.
    pub fn parse(url: &str) -> Result<Self> {
        let parsed = StoreUrl::parse(url, STORE)?;
        parsed.require_scheme(URL_SCHEMES)?;
        if parsed.username().is_some() || parsed.password().is_some() {
            return Err(parsed.invalid("credentials go in ?auth=digest:user:pass, not before the host"));
        }
        if !parsed.has_authority() || parsed.hosts().is_empty() {
            return Err(parsed.invalid("empty host: expected zk://host:port[,host:port][/chroot]"));
        }
        let hosts = parsed
            .hosts()
            .iter()
            .map(|host| format!("{}:{}", host.name, host.port.unwrap_or(DEFAULT_PORT)))
            .collect();
        let path = parsed.path();
        let chroot = if path.trim_matches('/').is_empty() {
            DEFAULT_CHROOT.to_string()
        } else {
            let path = format!("/{}", path.trim_matches('/'));
            if path
                .split('/')
                .skip(1)
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
                || path.chars().any(char::is_control)
            {
                return Err(parsed.invalid("the chroot must be a valid znode path"));
            }
            path
        };
        let mut options = parsed.options();
        let mut auth = Vec::new();
        if let Some(value) = options.secret("auth") {
            // Quotes nothing of the value: it holds the password.
            let (scheme, credential) = value
                .expose()
                .split_once(':')
                .ok_or_else(|| parsed.invalid("option auth must be scheme:credential, e.g. digest:user:pass"))?;
            if scheme != "digest" || !credential.contains(':') {
                return Err(parsed.invalid("option auth must be digest:user:pass"));
            }
            auth.push((scheme.to_string(), Secret::new(credential)));
        }
        options.finish()?;
        Ok(ZookeeperConfig { hosts, chroot, auth })
    }

    /// The servers, as `host:port`.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The znode path under which every lease lives.
    pub fn chroot(&self) -> &str {
        &self.chroot
    }

    /// The connect string for the client: `h1:p1,h2:p2` (the chroot is applied by the store).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// `(scheme, credential)` pairs to authenticate every session with.
    pub(crate) fn auth(&self) -> &[(String, Secret)] {
        &self.auth
    }
}

impl fmt::Display for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chroot: Vec<String> = self.chroot.split('/').map(percent_encode).collect();
        write!(f, "zk://{}{}", self.hosts.join(","), chroot.join("/"))?;
        for (i, (scheme, credential)) in self.auth.iter().enumerate() {
            let user = percent_encode(credential.expose().split(':').next().unwrap_or(""));
            write!(f, "{}auth={scheme}:{user}:***", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

impl fmt::Debug for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth: Vec<String> = self
            .auth
            .iter()
            .map(|(scheme, credential)| format!("{scheme}:{}:***", credential.expose().split(':').next().unwrap_or("")))
            .collect();
        f.debug_struct("ZookeeperConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("auth", &auth)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::Error;

    use super::*;

    #[test]
    fn parses_hosts_chroot_and_auth() {
        let c = ZookeeperConfig::parse("zk://a:1,b/x/y/?auth=digest:u:p%40ss").unwrap();
        assert_eq!(c.hosts(), ["a:1", "b:2181"]);
        assert_eq!(c.chroot(), "/x/y");
        assert_eq!(c.auth(), [("digest".to_string(), Secret::new("u:p@ss"))]);
        let d = ZookeeperConfig::parse("zookeeper://127.0.0.1:22181").unwrap();
        assert_eq!(d.chroot(), DEFAULT_CHROOT);
        assert_eq!(d.connect_string(), "127.0.0.1:22181");
    }

    #[test]
    fn rejects_bad_urls_without_leaking() {
        for bad in [
            "redis://a:1",
            "zk://",
            "zk://a:notaport",
            "zk://a:1/x//y",
            "zk://a:1?auth=digest:u:topsecret&what=1",
            "zk://a:1?auth=sasl:topsecret",
            "zk://u:topsecret@a:1",
            "no-scheme",
        ] {
            let err = ZookeeperConfig::parse(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{bad}: {err}");
            assert!(!err.to_string().contains("topsecret"), "{bad}: {err}");
            assert!(!format!("{err:?}").contains("topsecret"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn unknown_and_repeated_options_are_named() {
        let err = ZookeeperConfig::parse("zk://h:2181?bogus_option=1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown option bogus_option (known: auth)"), "{err}");
        let err = ZookeeperConfig::parse("zk://h?auth=digest:a:b&auth=digest:c:d")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("option auth is given twice") && !err.contains(":b"),
            "{err}"
        );
    }

    #[test]
    fn display_and_debug_redact() {
        let c = ZookeeperConfig::parse("zk://a:1/app?auth=digest:alice:topsecret").unwrap();
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("topsecret"), "{shown}");
            assert!(shown.contains("alice"), "{shown}");
        }
        assert_eq!(c.to_string(), "zk://a:1/app?auth=digest:alice:***");
        // The URL as core's config layer shows it (in every InvalidUrl error): the whole
        // credential hidden, user name included.
        let url = StoreUrl::parse("zk://a?auth=digest:alice:topsecret", STORE).unwrap();
        assert_eq!(url.to_string(), "zk://a?auth=***");
        assert_eq!(url.options().secret("auth").unwrap().expose(), "digest:alice:topsecret");
    }

    /// Finding 11 of issue 12: a password with an unescaped '/', '?' or '#' ends the authority
    /// early; `zk://alice:12/ss@h1:2181/app` parsed (chroot `/ss@h1:2181/app`) and `Display`
    /// printed the whole URL, password included.
    #[test]
    fn passwords_holding_url_delimiters_are_never_shown() {
        for url in [
            "zk://alice:12/SECRETB@h1:2181/app",
            "zk://alice:SECRETA/SECRETB@h1:2181/app",
            "zk://alice:12?SECRETB@h1:2181/app",
            "zk://alice:12?auth=digest:SECRETA:SECRETB@h1:2181/app",
            "zk://alice:SECRETA#SECRETB@h1:2181/app",
            "zk://h1:2181/app?auth=digest:alice:SECRETA@SECRETB",
            "zk://h1:2181/app?auth=digest:alice:SECRETA&SECRETB=1@x",
            "zookeeper://alice:12/SECRETB@h1,h2/app",
        ] {
            let err = ZookeeperConfig::parse(url).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("SECRET") && !shown.contains("12/"), "{url}: {shown}");
                assert!(shown.contains("%40") && shown.contains("%2F"), "{url}: {shown}");
            }
        }
        // An unescaped '&' in a password: nothing after it is shown.
        for url in [
            "zk://h1:2181/app?auth=digest:alice:SECRETA&SECRETB",
            "zk://h1:2181/app?auth=digest:alice:SECRETA&SECRETB=1",
            "zk://h1:2181/app?auth=digest:alice:SECRETA&auth=SECRETB",
            "zk://h1:2181/app?auth=digest:alice:SECRETA&auth=digest:SECRETB",
        ] {
            let err = ZookeeperConfig::parse(url).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("SECRET"), "{url}: {shown}");
            }
        }
        // Escaped, '@', '/' and '?' parse, in the credential and in the chroot.
        let c = ZookeeperConfig::parse("zk://h1/team%40app?auth=digest:alice:SECRETA%2F%3F%40SECRETB").unwrap();
        assert_eq!(c.chroot(), "/team@app");
        assert_eq!(
            c.auth(),
            [("digest".to_string(), Secret::new("alice:SECRETA/?@SECRETB"))]
        );
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        assert_eq!(ZookeeperConfig::parse(&c.to_string()).unwrap().chroot(), "/team@app");
    }
}
