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

mod redact;
mod url;

use std::fmt;
use std::time::Duration;

pub use redact::{is_secret_option, redact_url, redact_url_and_user};
pub use url::{Host, Options, StoreUrl};

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
