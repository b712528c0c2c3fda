//! `zk://` URLs: hosts, chroot and digest auth, with the password kept out of every message.

use std::fmt;

use leasehold_core::url_options::percent_decode;
use leasehold_core::{Error, Result};

/// The URL schemes this backend handles: `zk://` and `zookeeper://`.
pub const URL_SCHEMES: &[&str] = &["zk", "zookeeper"];

/// The znode under which leases live when the URL names no chroot.
pub const DEFAULT_CHROOT: &str = "/leasehold";

/// Why a URL with an '@' after its hosts is refused. Quotes nothing: the text around that '@'
/// may be a password.
const AT_AFTER_HOSTS: &str = "an unescaped '@' after the hosts (a user name or password holding '/', '?' or '#' \
     ends the hosts early): credentials go in ?auth=digest:user:pass, with '@' written %40, '/' %2F, \
     '?' %3F and '#' %23; an '@' in the chroot is written %40 too";

/// Where and how to reach a ZooKeeper ensemble.
///
/// Parsed from `zk://h1:2181,h2:2181/chroot?auth=digest:user:pass`:
///
/// - one or more `host:port` (port 2181 when left out), tried in turn by the client;
/// - an optional chroot path under which every lease lives (default [`DEFAULT_CHROOT`]),
///   `%`-escapes decoded;
/// - `auth=digest:user:pass` adds digest authentication to every session (repeatable).
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
    auth: Vec<(String, String)>,
}

impl ZookeeperConfig {
    /// Parses a `zk://` or `zookeeper://` URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the URL redacted) for another scheme, no host, a bad port, a
    /// chroot that is not a valid znode path, an unknown option, or an unescaped `@` after the
    /// hosts (write it `%40`; a password holding an unescaped `/` or `?` looks like that), which
    /// quotes none of the URL.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidUrl {
            url: leasehold_core::url_options::redact_url(url),
            reason: reason.to_string(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected zk://host:port[/chroot]"))?;
        if !URL_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
            return Err(bad("the scheme must be zk:// or zookeeper://"));
        }
        // A user name or password holding an unescaped '/', '?' or '#' ends the hosts early: its
        // first part would be read as a host and its rest as the chroot (shown by `Display`) or
        // an option. An '@' after the hosts is that, or an '@' that must be escaped anyway:
        // refused, quoting none of it.
        let hosts_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if rest[hosts_end..].contains('@') {
            return Err(bad(AT_AFTER_HOSTS));
        }
        let (rest, query) = rest.split_once('?').map_or((rest, None), |(r, q)| (r, Some(q)));
        if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(bad("a fragment (#) is not allowed"));
        }
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.contains('@') {
            return Err(bad("credentials go in ?auth=digest:user:pass, not before the host"));
        }
        let mut hosts = Vec::new();
        for host in authority.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(bad("empty host"));
            }
            let with_port = if let Some(v6) = host.strip_prefix('[') {
                match v6.split_once("]:") {
                    Some((_, port)) => {
                        port.parse::<u16>().map_err(|_| bad("invalid port"))?;
                        host.to_string()
                    }
                    None if v6.ends_with(']') => format!("{host}:2181"),
                    None => return Err(bad("invalid host")),
                }
            } else if let Some((name, port)) = host.rsplit_once(':') {
                if name.is_empty() {
                    return Err(bad("invalid host"));
                }
                port.parse::<u16>().map_err(|_| bad("invalid port"))?;
                host.to_string()
            } else {
                format!("{host}:2181")
            };
            hosts.push(with_port);
        }
        let path = percent_decode(path).map_err(|e| bad(&format!("chroot: {e}")))?;
        let chroot = if path.trim_matches('/').is_empty() {
            DEFAULT_CHROOT.to_string()
        } else {
            let path = format!("/{}", path.trim_end_matches('/'));
            if path
                .split('/')
                .skip(1)
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
                || path.chars().any(char::is_control)
            {
                return Err(bad("the chroot must be a valid znode path"));
            }
            path
        };
        let mut auth = Vec::new();
        // Once an `auth=` was read, the URL in an error shows nothing after it: a pair after it
        // may be its password's rest (an unescaped '&' in it). Reasons quote nothing anyway.
        let mut auth_end: Option<usize> = None;
        let mut pair_end = url.len() - query.map_or(0, str::len);
        for pair in query.unwrap_or("").split('&') {
            let pair_start = pair_end;
            pair_end = pair_start + pair.len() + 1;
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |reason: &str| match auth_end {
                Some(end) => Error::InvalidUrl {
                    url: format!("{}&***", leasehold_core::url_options::redact_url(&url[..end])),
                    reason: format!("{reason} (if a password holds an '&', write it as %26)"),
                },
                None => bad(reason),
            };
            match key {
                "auth" => {
                    let (scheme, credential) = value
                        .split_once(':')
                        .ok_or_else(|| bad("auth must be scheme:credential, e.g. digest:user:pass"))?;
                    if scheme != "digest" || !credential.contains(':') {
                        return Err(bad("auth must be digest:user:pass"));
                    }
                    let credential = percent_decode(credential).map_err(|e| bad(&format!("auth: {e}")))?;
                    auth.push((scheme.to_string(), credential));
                    auth_end = Some(pair_start + pair.len());
                }
                _ => return Err(bad("unknown option (known: auth)")),
            }
        }
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
    pub(crate) fn auth(&self) -> &[(String, String)] {
        &self.auth
    }
}

impl fmt::Display for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zk://{}{}", self.hosts.join(","), escape(&self.chroot))?;
        for (i, (scheme, credential)) in self.auth.iter().enumerate() {
            let user = escape(credential.split(':').next().unwrap_or(""));
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
            .map(|(scheme, credential)| format!("{scheme}:{}:***", credential.split(':').next().unwrap_or("")))
            .collect();
        f.debug_struct("ZookeeperConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("auth", &auth)
            .finish()
    }
}

/// `text` with `%`, `@`, `?`, `#` and `&` %-escaped, so that the URL it goes into parses back
/// to it.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "%@?#&".contains(c) {
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_and_auth() {
        let c = ZookeeperConfig::parse("zk://a:1,b/x/y/?auth=digest:u:p%40ss").unwrap();
        assert_eq!(c.hosts(), ["a:1", "b:2181"]);
        assert_eq!(c.chroot(), "/x/y");
        assert_eq!(c.auth(), [("digest".to_string(), "u:p@ss".to_string())]);
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
    fn display_and_debug_redact() {
        let c = ZookeeperConfig::parse("zk://a:1/app?auth=digest:alice:topsecret").unwrap();
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("topsecret"), "{shown}");
            assert!(shown.contains("alice"), "{shown}");
        }
        assert_eq!(c.to_string(), "zk://a:1/app?auth=digest:alice:***");
        assert_eq!(
            leasehold_core::url_options::redact_url("zk://a?auth=digest:alice:topsecret"),
            "zk://a?auth=***"
        );
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
            [("digest".to_string(), "alice:SECRETA/?@SECRETB".to_string())]
        );
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        assert_eq!(ZookeeperConfig::parse(&c.to_string()).unwrap().chroot(), "/team@app");
    }
}
