//! The one config layer every backend parses its URL with: [`StoreUrl`] and its [`Options`],
//! one duration grammar ([`parse_duration`]), one bool grammar ([`parse_bool`]), a [`Secret`]
//! that never prints, and the URL redactor ([`redact_url`]).
//!
//! A backend's `from_url` is a few lines of mapping:
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::config::StoreUrl;
//!
//! let url = StoreUrl::parse("redis://:s3cret@cache:6379/0?timeout=2s&tls=false", "redis")?;
//! url.require_scheme(&["redis", "rediss"])?;
//! let mut options = url.options();
//! let timeout = options.duration("timeout")?.unwrap_or(Duration::from_secs(5));
//! let tls = options.bool("tls")?.unwrap_or(false);
//! options.finish()?; // every other option is an error naming it
//!
//! assert_eq!((url.host(), url.port(), url.path()), (Some("cache"), Some(6379), "/0"));
//! assert_eq!(url.password().unwrap().expose(), "s3cret");
//! assert_eq!((timeout, tls), (Duration::from_secs(2), false));
//! assert_eq!(url.to_string(), "redis://:***@cache:6379/0?timeout=2s&tls=false");
//! # Ok::<(), leasehold_core::Error>(())
//! ```

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// A password, key, SAS or token: its `Debug` and `Display` print `***`, so a config that holds
/// one can derive `Debug` and be logged. [`Secret::expose`] is the only way to read it.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::Secret;
///
/// let secret = Secret::new("hunter2");
/// assert_eq!(secret.expose(), "hunter2");
/// assert_eq!(format!("{secret} {secret:?}"), "*** ***");
/// assert_eq!(secret, Secret::from("hunter2"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, to hand to a client library. Never log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_string())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Parses a duration: a number (digits, optionally a `.` and more digits) and a unit, one of
/// `ms`, `s`, `m` and `h`, without spaces. The unit is required: a bare `10` is an error.
///
/// It is the only duration grammar of leasehold: every backend's URL options and the CLI use it.
///
/// # Errors
///
/// A reason in words, e.g. `needs a unit, e.g. 10s or 10ms`; it quotes nothing but the digits
/// of a bare number.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::config::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
/// assert!(parse_duration("10").unwrap_err().contains("needs a unit, e.g. 10s"));
/// assert!(parse_duration("5 s").is_err());
/// assert!(parse_duration("-1s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected a number and a unit: 250ms, 10s, 1.5s, 2m or 1h";
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return Err(EXPECTED.to_string());
    }
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => return Err(format!("needs a unit, e.g. {number}s or {number}ms")),
        _ => return Err(EXPECTED.to_string()),
    };
    if fraction.len() > 9 {
        return Err("at most 9 digits after the '.'".to_string());
    }
    let too_large = || "too large".to_string();
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_large())?
    };
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(fraction * unit_nanos / scale))
        .ok_or_else(too_large)?;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_large())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Parses `true` or `false`, and nothing else: the only bool grammar of leasehold.
///
/// # Errors
///
/// `expected true or false`.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::parse_bool;
///
/// assert_eq!(parse_bool("true"), Ok(true));
/// assert_eq!(parse_bool("false"), Ok(false));
/// assert!(parse_bool("1").is_err());
/// assert!(parse_bool("yes").is_err());
/// ```
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".to_string()),
    }
}

/// Decodes `%XX` escapes (a `+` stays a `+`).
///
/// The error never quotes the text: it may be a password.
///
/// # Errors
///
/// A malformed escape, or bytes that are not UTF-8, described by position only.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::percent_decode;
///
/// assert_eq!(percent_decode("p%40ss").unwrap(), "p@ss");
/// assert!(!percent_decode("s3cret%zz").unwrap_err().contains("s3cret"));
/// ```
pub fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(byte.ok_or_else(|| format!("bad %-escape at byte {i}"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a %-escape does not decode to UTF-8".to_string())
}

/// Escapes every byte that is not an RFC 3986 unreserved character (`A-Z a-z 0-9 - . _ ~`) as
/// `%XX`, so the text can be put back into a URL as a user name, path segment or option value.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::{percent_decode, percent_encode};
///
/// assert_eq!(percent_encode("a b/c@d"), "a%20b%2Fc%40d");
/// assert_eq!(percent_decode(&percent_encode("p@ss/w?rd")).unwrap(), "p@ss/w?rd");
/// ```
#[must_use]
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// One host of a [`StoreUrl`]'s host list, as written (an IPv6 address keeps its brackets).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Host {
    /// The host name or address, e.g. `db.internal`, `10.0.0.7` or `[::1]`.
    pub name: String,
    /// The port, if the URL gives one.
    pub port: Option<u16>,
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Why an `@` after the host list is refused. Quotes nothing: the text around it may be a
/// password holding an unescaped `/`, `?` or `#`.
const AT_AFTER_HOSTS: &str = "an unescaped '@' after the host (a user name or password holding '/', '?' or '#' \
     ends the host early): write '@' as %40, '/' as %2F, '?' as %3F and '#' as %23 in user names and \
     passwords, and '@' as %40 in paths and option values";

/// A parsed store URL: `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?options]`,
/// or `scheme:path[?options]` without an authority.
///
/// One grammar for every backend:
/// - the scheme is case-insensitive ([`StoreUrl::scheme`] is lower case);
/// - the host list ends at the first `/`, `?` or `#` after `//`; the user info ends at its last `@`;
/// - user name, password, path, option names and values are `%`-decoded (`+` stays `+`);
/// - an `@` after the host list, a `#`, an option without `=`, and a repeated option are errors
///   (the first three are what an unescaped password looks like);
/// - [`Options::finish`] rejects every option nobody asked for, naming it.
///
/// `Display` and `Debug` show the URL redacted ([`redact_url`]); errors built by
/// [`StoreUrl::invalid`] and [`Options`] carry that form in [`Error::InvalidUrl`].
///
/// # Examples
///
/// ```
/// use leasehold_core::config::StoreUrl;
///
/// let url = StoreUrl::parse("ETCD://app:pw%2F1@h1:2379,[::1]:2380/leases?timeout=1s", "etcd")?;
/// assert_eq!(url.scheme(), "etcd");
/// assert_eq!(url.username(), Some("app"));
/// assert_eq!(url.password().unwrap().expose(), "pw/1");
/// let hosts: Vec<String> = url.hosts().iter().map(ToString::to_string).collect();
/// assert_eq!(hosts, ["h1:2379", "[::1]:2380"]);
/// assert_eq!(url.path(), "/leases");
///
/// let file = StoreUrl::parse("sqlite:leases.db", "sqlite")?;
/// assert!(!file.has_authority());
/// assert_eq!(file.path(), "leases.db");
///
/// let err = StoreUrl::parse("redis://h/0?timeout=1s&timeout=2s", "redis").unwrap_err();
/// assert!(err.to_string().contains("option timeout is given twice"), "{err}");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone)]
pub struct StoreUrl {
    text: String,
    store: &'static str,
    scheme: String,
    authority: bool,
    username: Option<String>,
    password: Option<Secret>,
    hosts: Vec<Host>,
    path: String,
    options: Vec<(String, String)>,
    known: &'static [&'static str],
    user_is_secret: bool,
}

impl StoreUrl {
    /// Parses `text` for the store named `store` (used in errors only).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] with the redacted URL and a reason: no scheme, a bad port, an empty
    /// host in a host list, an `@` after the host list, a `#`, a bad `%`-escape, an option without
    /// `=` or a repeated option (named).
    pub fn parse(text: &str, store: &'static str) -> Result<StoreUrl> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact_url(text),
            reason,
        };
        let (scheme, rest) = text
            .split_once(':')
            .filter(|(scheme, _)| is_scheme(scheme))
            .ok_or_else(|| invalid(format!("expected SCHEME://... (a URL for the {store} store)")))?;
        let (authority, rest) = match rest.strip_prefix("//") {
            Some(after) => {
                let end = after.find(['/', '?', '#']).unwrap_or(after.len());
                (Some(&after[..end]), &after[end..])
            }
            None => (None, rest),
        };
        if rest.contains('@') {
            return Err(invalid(AT_AFTER_HOSTS.into()));
        }
        if rest.contains('#') {
            return Err(invalid("a '#' (a fragment): write '#' as %23".into()));
        }
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut url = StoreUrl {
            text: text.to_string(),
            store,
            scheme: scheme.to_ascii_lowercase(),
            authority: authority.is_some(),
            username: None,
            password: None,
            hosts: Vec::new(),
            path: percent_decode(path).map_err(|why| invalid(format!("the path: {why}")))?,
            options: Vec::new(),
            known: &[],
            user_is_secret: false,
        };
        if let Some(authority) = authority {
            let (userinfo, hosts) = match authority.rsplit_once('@') {
                Some((userinfo, hosts)) => (Some(userinfo), hosts),
                None => (None, authority),
            };
            if let Some(userinfo) = userinfo {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = percent_decode(user).map_err(|why| invalid(format!("the user name: {why}")))?;
                url.username = Some(user).filter(|user| !user.is_empty());
                if let Some(password) = password {
                    let password = percent_decode(password).map_err(|why| invalid(format!("the password: {why}")))?;
                    url.password = Some(Secret(password)).filter(|p| !p.is_empty());
                }
            }
            if !hosts.is_empty() {
                for host in hosts.split(',') {
                    url.hosts.push(parse_host(host).map_err(invalid)?);
                }
            }
        }
        let mut previous_secret: Option<String> = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(invalid(match previous_secret {
                    Some(secret) => format!("the value of option {secret} holds an unescaped '&': write it as %26"),
                    None => format!("option {} has no value (write NAME=VALUE)", shown_key(pair)),
                }));
            };
            let key = percent_decode(key).map_err(|why| invalid(format!("an option name: {why}")))?;
            let value = percent_decode(value).map_err(|why| invalid(format!("option {key}: {why}")))?;
            if url.options.iter().any(|(seen, _)| *seen == key) {
                return Err(invalid(format!("option {key} is given twice")));
            }
            previous_secret = is_secret_option(&key).then(|| key.clone());
            url.options.push((key, value));
        }
        Ok(url)
    }

    /// Declares the option names the store knows, for two things: [`Options::finish`] lists them
    /// in its error, and the redacted form shows an option after a secret value again from the
    /// first known name on (without it, everything after a secret value is hidden: it may be the
    /// rest of a password that held an unescaped `&`).
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let text = "etcd://h/p?password=pa&ss=x&timeout=1s";
    /// assert_eq!(StoreUrl::parse(text, "etcd")?.to_string(), "etcd://h/p?password=***");
    /// let url = StoreUrl::parse(text, "etcd")?.known_options(&["password", "timeout"]);
    /// assert_eq!(url.to_string(), "etcd://h/p?password=***&timeout=1s");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    #[must_use]
    pub fn known_options(mut self, names: &'static [&'static str]) -> Self {
        self.known = names;
        self
    }

    /// Hides the user name too wherever the URL is shown: for stores whose user name is itself a
    /// credential, such as an AWS access key id.
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("dynamodb://AKID:key@leases", "dynamodb")?.user_is_secret();
    /// assert_eq!(url.to_string(), "dynamodb://***@leases");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    #[must_use]
    pub fn user_is_secret(mut self) -> Self {
        self.user_is_secret = true;
        self
    }

    /// Checks that the scheme is one of `schemes` (lower case) and returns it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] listing the schemes.
    pub fn require_scheme(&self, schemes: &[&str]) -> Result<&str> {
        if schemes.contains(&self.scheme.as_str()) {
            Ok(&self.scheme)
        } else {
            let listed: Vec<String> = schemes.iter().map(|s| format!("{s}:")).collect();
            Err(self.invalid(format!("the scheme must be {}", listed.join(" or "))))
        }
    }

    /// The scheme, in lower case.
    #[must_use]
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The store the URL is for (as given to [`StoreUrl::parse`]).
    #[must_use]
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// Whether the URL has an authority (`scheme://...`), even an empty one (`sqlite:///path`).
    #[must_use]
    pub fn has_authority(&self) -> bool {
        self.authority
    }

    /// The decoded user name, if any and not empty.
    #[must_use]
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The decoded password, if any and not empty.
    #[must_use]
    pub fn password(&self) -> Option<Secret> {
        self.password.clone()
    }

    /// Every host of the host list (`h1:2379,h2:2379`), in order; empty for `scheme:///path`.
    #[must_use]
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The first host's name, if any.
    #[must_use]
    pub fn host(&self) -> Option<&str> {
        self.hosts.first().map(|host| host.name.as_str())
    }

    /// The first host's port, if any.
    #[must_use]
    pub fn port(&self) -> Option<u16> {
        self.hosts.first().and_then(|host| host.port)
    }

    /// The decoded path: `/0` for `redis://h/0`, `leases.db` for `sqlite:leases.db`, empty for
    /// `etcd://h`.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The options, to read with typed getters and [`Options::finish`].
    #[must_use]
    pub fn options(&self) -> Options<'_> {
        Options {
            url: self,
            asked: Vec::new(),
        }
    }

    /// An [`Error::InvalidUrl`] about this URL (shown redacted) with `reason`.
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("redis://:pw@h/x", "redis")?;
    /// let err = url.invalid("the database must be a number");
    /// assert_eq!(err.to_string(), "invalid store URL redis://:***@h/x: the database must be a number");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: self.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.text, self.user_is_secret, self.known))
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.to_string()).finish()
    }
}

impl FromStr for StoreUrl {
    type Err = Error;

    /// Parses a URL for an unnamed store (errors say "a URL for the store store"); prefer
    /// [`StoreUrl::parse`].
    fn from_str(text: &str) -> Result<Self> {
        StoreUrl::parse(text, "store")
    }
}

fn parse_host(host: &str) -> Result<Host, String> {
    let (name, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => match &host[end + 1..] {
                "" => (&host[..=end], None),
                after => match after.strip_prefix(':') {
                    Some(port) => (&host[..=end], Some(port)),
                    None => return Err(format!("unexpected text after the IPv6 address {}", &host[..=end])),
                },
            },
            None => return Err("an IPv6 address without its closing ']'".into()),
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err("an empty host in the host list".into());
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("host {:?} holds a space or control character", name.trim()));
    }
    let port = match port {
        None => None,
        Some(port) => Some(
            port.parse::<u16>()
                .ok()
                .filter(|_| port.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("the port of host {name} must be a number from 0 to 65535"))?,
        ),
    };
    Ok(Host {
        name: name.to_string(),
        port,
    })
}

/// An option name as it may be quoted in an error: at most 40 characters.
fn shown_key(key: &str) -> String {
    let shown: String = key.chars().take(40).collect();
    if shown.len() < key.len() {
        format!("{shown}...")
    } else {
        shown
    }
}

/// The options of a [`StoreUrl`], read by name with typed getters. Each getter marks its name
/// as known; [`Options::finish`] then rejects every option nobody asked for.
///
/// Errors quote the value of an option, except for options whose name suggests a secret
/// (`password`, `key`, `token`, ...), which are never quoted.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::config::StoreUrl;
///
/// let url = StoreUrl::parse("sqlite:x.db?busy_timeout=2s&pool_size=4&mode=fast", "sqlite")?;
/// let mut options = url.options();
/// assert_eq!(options.duration("busy_timeout")?, Some(Duration::from_secs(2)));
/// assert_eq!(options.parse::<u32>("pool_size")?, Some(4));
/// assert_eq!(options.string("history_limit"), None);
/// let err = options.finish().unwrap_err().to_string();
/// assert!(err.ends_with("unknown option mode (known: busy_timeout, pool_size, history_limit)"), "{err}");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
pub struct Options<'a> {
    url: &'a StoreUrl,
    asked: Vec<&'static str>,
}

impl Options<'_> {
    fn value(&mut self, name: &'static str) -> Option<&str> {
        if !self.asked.contains(&name) {
            self.asked.push(name);
        }
        let url = self.url;
        url.options
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn typed<T>(&mut self, name: &'static str, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>> {
        let Some(value) = self.value(name) else {
            return Ok(None);
        };
        parse(value).map(Some).map_err(|why| self.invalid(name, why))
    }

    /// The value of option `name`, decoded.
    pub fn string(&mut self, name: &'static str) -> Option<String> {
        self.value(name).map(str::to_string)
    }

    /// The value of option `name` as a [`Secret`].
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("azblob://acct/c?sig=abc%2Bdef", "azure")?;
    /// assert_eq!(url.options().secret("sig").unwrap().expose(), "abc+def");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn secret(&mut self, name: &'static str) -> Option<Secret> {
        self.value(name).map(Secret::from)
    }

    /// The value of option `name` as a duration ([`parse_duration`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option, e.g. `option timeout="10": needs a unit, e.g. 10s or 10ms`.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("redis://h?timeout=10", "redis")?;
    /// let err = url.options().duration("timeout").unwrap_err();
    /// assert!(err.to_string().ends_with(r#"option timeout="10": needs a unit, e.g. 10s or 10ms"#), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn duration(&mut self, name: &'static str) -> Result<Option<Duration>> {
        self.typed(name, parse_duration)
    }

    /// The value of option `name` as a bool ([`parse_bool`]: `true` or `false`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("zk://h?create=yes", "zookeeper")?;
    /// assert!(url.options().bool("create").unwrap_err().to_string().contains("option create"));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn bool(&mut self, name: &'static str) -> Result<Option<bool>> {
        self.typed(name, parse_bool)
    }

    /// The value of option `name` parsed with [`FromStr`] (numbers, enums of the backend).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option, with the parser's error as the reason.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("sqlite:x.db?pool_size=many", "sqlite")?;
    /// let err = url.options().parse::<u32>("pool_size").unwrap_err();
    /// assert!(err.to_string().contains(r#"option pool_size="many""#), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn parse<T>(&mut self, name: &'static str) -> Result<Option<T>>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.typed(name, |value| value.parse::<T>().map_err(|err| err.to_string()))
    }

    /// An [`Error::InvalidUrl`] about option `name` with reason `why`: for checks of the
    /// backend's own (ranges, combinations). The value is quoted unless the name suggests a secret.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("sqlite:x.db?pool_size=99", "sqlite")?;
    /// let mut options = url.options();
    /// assert_eq!(options.parse::<u32>("pool_size")?, Some(99));
    /// let err = options.invalid("pool_size", "expected 1 to 64");
    /// assert!(err.to_string().ends_with(r#"option pool_size="99": expected 1 to 64"#), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn invalid(&self, name: &str, why: impl fmt::Display) -> Error {
        let value = self.url.options.iter().find(|(key, _)| key == name).map(|(_, v)| v);
        match value {
            Some(value) if !is_secret_option(name) => {
                let shown: String = value.chars().take(80).collect();
                self.url.invalid(format!("option {name}={shown:?}: {why}"))
            }
            _ => self.url.invalid(format!("option {name}: {why}")),
        }
    }

    /// Rejects every option that no getter asked for (and that [`StoreUrl::known_options`] does
    /// not list), naming each and listing the known ones.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`]: `unknown option NAME (known: a, b, c)`. An unknown option right
    /// after a secret one is not named (it is likely the rest of a password holding an unescaped
    /// `&`): the error says to write `&` as `%26`.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("etcd://h?password=pa&zq=xy", "etcd")?;
    /// let mut options = url.options();
    /// options.secret("password");
    /// let err = options.finish().unwrap_err().to_string();
    /// assert!(err.contains("value of option password holds an unescaped '&'"), "{err}");
    /// assert!(!err.contains("zq") && !err.contains("xy"), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn finish(self) -> Result<()> {
        let mut known = self.asked.clone();
        known.extend(self.url.known.iter().filter(|name| !self.asked.contains(name)));
        let mut unknown = Vec::new();
        let mut after_secret: Option<&str> = None;
        for (key, _) in &self.url.options {
            if known.contains(&key.as_str()) {
                after_secret = is_secret_option(key).then_some(key.as_str());
            } else if let Some(secret) = after_secret {
                return Err(self.url.invalid(format!(
                    "the value of option {secret} holds an unescaped '&': write it as %26"
                )));
            } else {
                unknown.push(shown_key(key));
                after_secret = is_secret_option(key).then_some(key.as_str());
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let plural = if unknown.len() == 1 { "" } else { "s" };
        let known = if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        };
        Err(self.url.invalid(format!(
            "unknown option{plural} {} (known: {known})",
            unknown.join(", ")
        )))
    }
}

impl fmt::Debug for Options<'_> {
    /// The option names only: values may be secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.url.options.iter().map(|(key, _)| key))
            .finish()
    }
}

/// A store URL safe to print: the password of the user info, and every query value whose name
/// suggests a secret (`password`, `pass`, `secret`, `token`, `auth`, `key`, `sig`, `sas`,
/// `credential`, in any case, also as part of a longer name such as `secret_access_key`, also
/// `%`-escaped), replaced by `***`, together with everything after that value up to the end of
/// the query (it may be the rest of a secret that held an unescaped `&`: `password=pa&ss=x`).
/// [`StoreUrl::known_options`] shows known options after a secret again. Works on text that does
/// not parse as a URL too.
///
/// URL parsers disagree on where an unescaped password ends: the WHATWG parser (the `url`
/// crate) ends the authority at the first `/`, `?` or `#` and the user info at the last `@`
/// before it; libpq-style parsers take everything up to an `@`. A password typed with a `/`,
/// `?`, `#` or `@` in it must be hidden whichever way the text is read, so the password is
/// taken to run from the first `:` after `scheme://` (or after the start of text that has no
/// scheme) to the **last** `@` of the whole text, and query options are read both from the
/// first `?` and from the first `?` after that last `@`. The price is that a URL with an `@`
/// after its host (in the path or a query value) is shown with everything from the first `:` to
/// that `@` hidden: the redactor cannot tell it from a password holding `/` and `?`, and errs on
/// the side of hiding.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:hunter2@db:5432/x?mode=y&sig=abc"),
///     "postgres://app:***@db:5432/x?mode=y&sig=***"
/// );
/// assert_eq!(redact_url("postgres://app:pa/ss?w#d@db.internal/jobs"), "postgres://app:***@db.internal/jobs");
/// assert_eq!(redact_url("postgres://a:b@c@h/db"), "postgres://a:***@h/db");
/// assert_eq!(redact_url("etcd://h1,h2/p?timeout=1s&password=pa&ss=x"), "etcd://h1,h2/p?timeout=1s&password=***");
/// assert_eq!(redact_url("redis://:s3cret@h/0"), "redis://:***@h/0");
/// assert_eq!(redact_url("no scheme:pw@host"), "no scheme:***@host");
/// assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    redact(url, false, &[])
}

/// Like [`redact_url`], and hides the user name too (everything before the last `@`): for
/// stores whose user name is itself a credential, such as an AWS access key id.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::redact_url_and_user;
///
/// assert_eq!(
///     redact_url_and_user("dynamodb://AKID:wJalr/x?y@leases?region=eu-west-1&secret_access_key=k"),
///     "dynamodb://***@leases?region=eu-west-1&secret_access_key=***"
/// );
/// ```
#[must_use]
pub fn redact_url_and_user(url: &str) -> String {
    redact(url, true, &[])
}

fn redact(url: &str, hide_user: bool, known: &[&str]) -> String {
    render(url, secret_ranges(url, hide_user, known))
}

/// The byte ranges of `url` to hide (ASCII delimiters only, so always on `char` boundaries).
fn secret_ranges(url: &str, hide_user: bool, known: &[&str]) -> Vec<Range<usize>> {
    let start = match url.find("://") {
        Some(end) if is_scheme(&url[..end]) => end + 3,
        _ => 0,
    };
    let rest = &url[start..];
    let mut ranges = Vec::new();
    let last_at = rest.rfind('@').map(|at| start + at);
    if let Some(at) = last_at {
        if hide_user {
            ranges.push(start..at);
        } else if let Some(colon) = url[start..at].find(':') {
            ranges.push(start + colon + 1..at);
        }
    }
    // The query as the WHATWG parser sees it, and as a parser that took the last '@' sees it.
    for from in [Some(start), last_at].into_iter().flatten() {
        if let Some(question) = url[from..].find('?') {
            secret_options(url, from + question + 1, known, &mut ranges);
        }
    }
    ranges
}

/// Pushes the ranges of the values of secret options in the query starting at `query`, each
/// with everything after it up to the next known option.
fn secret_options(url: &str, query: usize, known: &[&str], ranges: &mut Vec<Range<usize>>) {
    let mut pos = query;
    let mut hiding = false;
    for pair in url[query..].split('&') {
        let key = pair.split_once('=').map(|(key, _)| key);
        let decoded = key.map(|key| percent_decode(key).unwrap_or_else(|_| key.to_string()));
        let secret = decoded.as_deref().is_some_and(is_secret_option);
        let known_name = decoded.as_deref().is_some_and(|key| known.contains(&key));
        if hiding && !known_name {
            // The rest of a secret value that held an unescaped '&', key included.
            ranges.push(pos - 1..pos + pair.len());
        } else if let (true, Some(key)) = (secret, key) {
            ranges.push(pos + key.len() + 1..pos + pair.len());
        }
        hiding = secret || (hiding && !known_name);
        pos += pair.len() + 1;
    }
}

/// `url` with each range (merged where they overlap or touch) replaced by `***`.
fn render(url: &str, mut ranges: Vec<Range<usize>>) -> String {
    ranges.sort_by_key(|range| range.start);
    let mut merged: Vec<Range<usize>> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(open) if range.start <= open.end => open.end = open.end.max(range.end),
            _ => merged.push(range),
        }
    }
    let mut out = String::with_capacity(url.len());
    let mut shown_to = 0;
    for range in merged {
        out.push_str(&url[shown_to..range.start]);
        out.push_str("***");
        shown_to = range.end;
    }
    out.push_str(&url[shown_to..]);
    out
}

/// An RFC 3986 scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Whether an option's name suggests that its value is a secret.
///
/// # Examples
///
/// ```
/// use leasehold_core::config::is_secret_option;
///
/// assert!(is_secret_option("secret_access_key"));
/// assert!(is_secret_option("PassWord"));
/// assert!(!is_secret_option("timeout"));
/// ```
#[must_use]
pub fn is_secret_option(name: &str) -> bool {
    const SECRET: &[&str] = &["pass", "secret", "token", "auth", "key", "sig", "sas", "credential"];
    let name = name.to_ascii_lowercase();
    SECRET.iter().any(|s| name.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 11 of issue 12: a password with `/` or `?` was printed whole.
    #[test]
    fn redact_url_hides_passwords_holding_url_delimiters() {
        for (url, shown) in [
            (
                "postgres://app:pa/ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            (
                "postgres://app:pa?ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            (
                "postgres://app:pa#ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            (
                "postgres://app:pa@ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            (
                "redis://:pa/ss?x#y@h:6379/0?timeout=1s",
                "redis://:***@h:6379/0?timeout=1s",
            ),
            // Read from its first '?', the query's `password` runs to the end.
            (
                "postgres://app:pa?password=x@db/jobs?sslmode=require",
                "postgres://app:***",
            ),
            (
                "postgres://app:pa/ss@db/jobs?password=pa/ss",
                "postgres://app:***@db/jobs?password=***",
            ),
            ("app:pa/ss@db.internal/jobs", "app:***@db.internal/jobs"),
            ("not a url app:pa/ss@db", "not a url app:***@db"),
        ] {
            let redacted = redact_url(url);
            assert_eq!(redacted, shown, "{url}");
            assert!(!redacted.contains("pa/ss") && !redacted.contains("ss@"), "{redacted}");
        }
    }

    #[test]
    fn redact_url_hides_secret_options_whatever_their_spelling() {
        for (url, shown) in [
            ("etcd://h/p?x=1&PassWord=s3", "etcd://h/p?x=1&PassWord=***"),
            ("etcd://h/p?x=1&p%61ssword=s3", "etcd://h/p?x=1&p%61ssword=***"),
            ("etcd://h/p?password=s3&cr3t&x=1", "etcd://h/p?password=***"),
            ("etcd://h/p?password=s3#cr3t&x=1", "etcd://h/p?password=***"),
            ("etcd://h/p?password=s3?cr3t&x=1", "etcd://h/p?password=***"),
            ("etcd://h/p?password=s3@cr:3t&x=1", "etcd://h/p?password=***"),
            ("azure://acct/c?sv=2022&sig=abc%2Bdef", "azure://acct/c?sv=2022&sig=***"),
            ("etcd://h/p?password=", "etcd://h/p?password=***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    /// The leak this layer fixes: the key of an `&`-split password fragment (`pa&ss=x`) was
    /// shown, in the user info's query reading and in a `password=` option.
    #[test]
    fn redact_url_hides_the_key_of_an_ampersand_split_secret() {
        for (url, shown) in [
            ("postgres://u:pa&ss=x@h/db", "postgres://u:***@h/db"),
            ("postgres://u:pa?x&ss=y@h/db", "postgres://u:***@h/db"),
            ("postgres://h/db?password=pa&ss", "postgres://h/db?password=***"),
            ("postgres://h/db?password=pa&ss=x", "postgres://h/db?password=***"),
            (
                "postgres://h/db?password=pa&ss=x&sslmode=require",
                "postgres://h/db?password=***",
            ),
            ("azblob://a/c?sig=ab&cd=ef&se=1", "azblob://a/c?sig=***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        // With the store's option names, known options after the secret are shown again.
        assert_eq!(
            redact("postgres://h/db?password=pa&ss=x&sslmode=require", false, &["sslmode"]),
            "postgres://h/db?password=***&sslmode=require"
        );
        // A known secret option after a secret is hidden too.
        assert_eq!(
            redact("h?password=a&b&token=c&x=1", false, &["token", "x"]),
            "h?password=***&token=***&x=1"
        );
    }

    #[test]
    fn redact_url_leaves_urls_without_secrets_alone() {
        for url in [
            "postgres://app@db:5432/jobs?sslmode=require",
            "postgres://db:5432/jobs",
            "postgres://app@[::1]:5433/jobs",
            "sqlite:///var/lib/app/leases.db?busy_timeout=1s",
            "sqlite::memory:",
            "dynamodb://leases?endpoint=http://127.0.0.1:8000&region=eu-west-1",
            "postgres://h/db@x",
        ] {
            assert_eq!(redact_url(url), url);
        }
        // The price of hiding passwords that hold '/' and '?': an '@' after the host hides
        // everything from the first ':' to it.
        assert_eq!(
            redact_url("postgres://u:pw@h/a:b@c?sslmode=require"),
            "postgres://u:***@c?sslmode=require"
        );
    }

    #[test]
    fn redact_url_and_user_hides_the_whole_user_info() {
        assert_eq!(
            redact_url_and_user("dynamodb://AKID:pa/ss@t?x=1"),
            "dynamodb://***@t?x=1"
        );
        assert_eq!(redact_url_and_user("dynamodb://AKID@t"), "dynamodb://***@t");
        assert_eq!(redact_url_and_user("dynamodb://t?session_token=a@b"), "dynamodb://***");
        assert_eq!(redact_url_and_user("dynamodb://t?region=x"), "dynamodb://t?region=x");
    }

    #[test]
    fn durations_need_a_unit() {
        for (text, millis) in [
            ("0ms", 0),
            ("250ms", 250),
            ("10s", 10_000),
            ("1.5s", 1_500),
            ("0.25s", 250),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1.5ms", 1),
        ] {
            assert_eq!(parse_duration(text).map(|d| d.as_millis()), Ok(millis), "{text}");
        }
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("10"), Err("needs a unit, e.g. 10s or 10ms".to_string()));
        for bad in [
            "", "s", "1.s", ".5s", "1..5s", "1.2.3s", "5 s", "-1s", "1d", "1S", "1sec", "1e3ms",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("expected a number and a unit"), "{bad:?}: {err}");
        }
        assert_eq!(parse_duration("99999999999999999999999h"), Err("too large".to_string()));
        assert!(parse_duration("1.0000000001s").is_err());
    }

    #[test]
    fn bools_are_true_or_false() {
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("false"), Ok(false));
        for bad in ["", "1", "0", "yes", "no", "TRUE", "on"] {
            assert!(parse_bool(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        let shown = format!("{secret} {secret:?} {:?}", Some(secret.clone()));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(secret.expose(), "hunter2");
    }

    fn reason(err: Error) -> String {
        match err {
            Error::InvalidUrl { reason, .. } => reason,
            other => panic!("not InvalidUrl: {other}"),
        }
    }

    #[test]
    fn store_urls_parse_the_common_forms() {
        let url = StoreUrl::parse("Postgres://app:p%40ss@db.internal:5432/jobs?schema=x", "postgres").unwrap();
        assert_eq!(url.scheme(), "postgres");
        assert_eq!(url.username(), Some("app"));
        assert_eq!(url.password().unwrap().expose(), "p@ss");
        assert_eq!(url.host(), Some("db.internal"));
        assert_eq!(url.port(), Some(5432));
        assert_eq!(url.path(), "/jobs");
        assert_eq!(url.options().string("schema").as_deref(), Some("x"));

        let url = StoreUrl::parse("zk://a:2181,b,[::1]:2182/app", "zookeeper").unwrap();
        let hosts: Vec<(&str, Option<u16>)> = url.hosts().iter().map(|h| (h.name.as_str(), h.port)).collect();
        assert_eq!(hosts, [("a", Some(2181)), ("b", None), ("[::1]", Some(2182))]);

        let url = StoreUrl::parse("sqlite:///var/lib/x.db", "sqlite").unwrap();
        assert!(url.has_authority() && url.hosts().is_empty());
        assert_eq!(url.path(), "/var/lib/x.db");
        let url = StoreUrl::parse("sqlite::memory:", "sqlite").unwrap();
        assert_eq!((url.has_authority(), url.path()), (false, ":memory:"));
        let url = StoreUrl::parse("redis://:pw@h", "redis").unwrap();
        assert_eq!((url.username(), url.path()), (None, ""));
        let url = StoreUrl::parse("dynamodb://leases?endpoint=http://127.0.0.1:8000", "dynamodb").unwrap();
        assert_eq!(
            url.options().string("endpoint").as_deref(),
            Some("http://127.0.0.1:8000")
        );
    }

    #[test]
    fn malformed_store_urls_name_the_problem_and_hide_the_password() {
        for (text, expected) in [
            ("no scheme here", "expected SCHEME://"),
            ("redis://h:port/0", "the port of host h must be a number"),
            ("redis://h:99999", "the port of host h must be a number"),
            ("etcd://a,,b", "an empty host"),
            ("etcd://[::1/x", "closing ']'"),
            ("postgres://u:pa/ss@h/db", "an unescaped '@' after the host"),
            ("postgres://u:pa#ss@h/db", "an unescaped '@' after the host"),
            ("etcd://h/p#frag", "a '#'"),
            ("redis://u:s3cr%zz@h", "the password: bad %-escape"),
            ("redis://h?timeout", "option timeout has no value"),
            (
                "redis://h?password=s3&cr3t",
                "the value of option password holds an unescaped '&'",
            ),
            ("redis://h?timeout=1s&timeout=2s", "option timeout is given twice"),
            ("redis://h?t%41=1&tA=2", "option tA is given twice"),
        ] {
            let err = StoreUrl::parse(text, "redis").unwrap_err();
            let shown = err.to_string();
            assert!(shown.contains(expected), "{text}: {shown}");
            for secret in ["pa/ss", "pa#ss", "s3cr", "cr3t"] {
                assert!(
                    !shown.contains(secret) && !format!("{err:?}").contains(secret),
                    "{shown}"
                );
            }
        }
    }

    #[test]
    fn options_are_typed_and_unknown_ones_named() {
        let url = StoreUrl::parse("redis://h?timeout=10&tls=yes&size=7&token=s3cr3t&prefix=a%26b", "redis").unwrap();
        let mut options = url.options();
        assert_eq!(
            reason(options.duration("timeout").unwrap_err()),
            "option timeout=\"10\": needs a unit, e.g. 10s or 10ms"
        );
        assert_eq!(
            reason(options.bool("tls").unwrap_err()),
            "option tls=\"yes\": expected true or false"
        );
        assert_eq!(options.parse::<u8>("size").unwrap(), Some(7));
        let err = options.parse::<u8>("token").unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert_eq!(options.string("prefix").as_deref(), Some("a&b"));
        assert_eq!(options.string("absent"), None);
        assert!(options.finish().is_ok());

        let url = StoreUrl::parse("redis://h?tls=true&colour=blue&shape=round", "redis")
            .unwrap()
            .known_options(&["timeout"]);
        let mut options = url.options();
        assert_eq!(options.bool("tls").unwrap(), Some(true));
        assert_eq!(
            reason(options.finish().unwrap_err()),
            "unknown options colour, shape (known: tls, timeout)"
        );
        assert!(!format!("{:?}", url.options()).contains("blue"));
    }

    #[test]
    fn an_unknown_option_after_a_secret_is_not_named() {
        let url = StoreUrl::parse("redis://h?password=pa&zq=xy&timeout=1s", "redis").unwrap();
        let mut options = url.options();
        assert!(options.secret("password").is_some());
        assert!(options.duration("timeout").unwrap().is_some());
        let err = options.finish().unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("option password holds an unescaped '&'"), "{shown}");
        assert!(!shown.contains("zq") && !shown.contains("xy"), "{shown}");
    }
}
