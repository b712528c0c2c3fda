//! [`StoreUrl`] and its [`Options`]: one URL grammar for every backend.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use super::redact::{is_scheme, is_secret_option, redact, redact_url};
use super::{Secret, parse_bool, parse_duration, percent_decode};
use crate::error::{Error, Result};

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

    /// The value of option `name` parsed with [`FromStr`], within `range`; `expected` says the
    /// range in the error (`expected 1 to 64`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("sqlite:x.db?pool_size=99", "sqlite")?;
    /// let err = url.options().parse_in("pool_size", 1u32..=64, "expected 1 to 64").unwrap_err();
    /// assert!(err.to_string().ends_with(r#"option pool_size="99": expected 1 to 64"#), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn parse_in<T>(&mut self, name: &'static str, range: RangeInclusive<T>, expected: &str) -> Result<Option<T>>
    where
        T: FromStr + PartialOrd,
        T::Err: fmt::Display,
    {
        let value = self.parse::<T>(name)?;
        self.check_range(name, value, &range, expected)
    }

    /// The value of option `name` as a duration ([`parse_duration`]) within `range`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option.
    pub fn duration_in(
        &mut self,
        name: &'static str,
        range: RangeInclusive<Duration>,
        expected: &str,
    ) -> Result<Option<Duration>> {
        let value = self.duration(name)?;
        self.check_range(name, value, &range, expected)
    }

    /// An `http://` or `https://` URL (a service endpoint).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming the option.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("s3://bucket?endpoint=localhost:9000", "s3")?;
    /// let err = url.options().http_url("endpoint").unwrap_err();
    /// assert!(err.to_string().ends_with("expected an http:// or https:// URL"), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn http_url(&mut self, name: &'static str) -> Result<Option<String>> {
        self.typed(name, |value| {
            let scheme = ["http://", "https://"].into_iter().find(|s| value.starts_with(s));
            match scheme {
                Some(scheme) if value.len() > scheme.len() => Ok(value.to_string()),
                _ => Err("expected an http:// or https:// URL".to_string()),
            }
        })
    }

    /// A key id and its secret, which go together, and an optional token that needs both (a
    /// cloud service's static credentials: `access_key_id`, `secret_access_key`,
    /// `session_token`). Empty values count as not given; `None` when none is given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] naming `key` when only some are given.
    ///
    /// ```
    /// use leasehold_core::config::StoreUrl;
    ///
    /// let url = StoreUrl::parse("s3://bucket?access_key_id=AK", "s3")?;
    /// let err = url.options().key_pair("access_key_id", "secret_access_key", "session_token").unwrap_err();
    /// assert!(err.to_string().ends_with("access_key_id and secret_access_key go together (session_token needs both)"), "{err}");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn key_pair(
        &mut self,
        key: &'static str,
        secret: &'static str,
        token: &'static str,
    ) -> Result<Option<(Secret, Secret, Option<Secret>)>> {
        let key_id = self.secret(key).filter(|s| !s.is_empty());
        let secret_value = self.secret(secret).filter(|s| !s.is_empty());
        let token_value = self.secret(token).filter(|s| !s.is_empty());
        match (key_id, secret_value) {
            (Some(key_id), Some(secret_value)) => Ok(Some((key_id, secret_value, token_value))),
            (None, None) if token_value.is_none() => Ok(None),
            _ => Err(self.invalid(key, format!("{key} and {secret} go together ({token} needs both)"))),
        }
    }

    fn check_range<T: PartialOrd>(
        &self,
        name: &str,
        value: Option<T>,
        range: &RangeInclusive<T>,
        expected: &str,
    ) -> Result<Option<T>> {
        match value {
            Some(v) if !range.contains(&v) => Err(self.invalid(name, expected)),
            v => Ok(v),
        }
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
