//! Helpers every backend's URL parser needs, written once.

use std::time::Duration;

/// Parses `500ms`, `5s`, `2m`, `1h`, or a bare number of milliseconds.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::url_options::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
/// assert_eq!(parse_duration("100"), Some(Duration::from_millis(100)));
/// assert_eq!(parse_duration("5 s"), None);
/// ```
pub fn parse_duration(value: &str) -> Option<Duration> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number.parse().ok()?;
    match unit {
        "" | "ms" => Some(Duration::from_millis(number)),
        "s" => Some(Duration::from_secs(number)),
        "m" => number.checked_mul(60).map(Duration::from_secs),
        "h" => number.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

/// Decodes `%XX` escapes (a `+` stays a `+`).
///
/// The error never quotes the text: it may be a password.
///
/// ```
/// use leasehold_core::url_options::percent_decode;
///
/// assert_eq!(percent_decode("p%40ss").unwrap(), "p@ss");
/// assert!(!percent_decode("s3cret%zz").unwrap_err().contains("s3cret"));
/// ```
///
/// # Errors
///
/// A malformed escape, or bytes that are not UTF-8, described by position only.
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

/// A store URL safe to print: the password of the user info, and every query value whose name
/// suggests a secret (`password`, `pass`, `secret`, `token`, `auth`, `key`, `sig`, `sas`,
/// `credential`, in any case, also as part of a longer name such as `secret_access_key`),
/// replaced by `***`. Works on text that does not parse as a URL too: user info is whatever
/// precedes the last `@` of the authority.
///
/// ```
/// use leasehold_core::url_options::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:hunter2@db:5432/x?sig=abc&mode=y"),
///     "postgres://app:***@db:5432/x?sig=***&mode=y"
/// );
/// assert_eq!(redact_url("etcd://h1,h2/p?password=s3&timeout=1s"), "etcd://h1,h2/p?password=***&timeout=1s");
/// assert_eq!(redact_url("redis://:s3cret@h/0"), "redis://:***@h/0");
/// assert_eq!(redact_url("no scheme:pw@host"), "no scheme:***@host");
/// assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    // The user info ends at the last '@' of the authority (before the path) or, in text too
    // malformed to have one, at the last '@'.
    let at = match head.split_once("://") {
        Some((scheme, rest)) => {
            let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
            authority.rfind('@').map(|at| scheme.len() + 3 + at)
        }
        None => head.rfind('@'),
    };
    let mut out = match at {
        Some(at) => {
            let start = head[..at].rfind('/').map_or(0, |slash| slash + 1);
            match head[start..at].find(':') {
                Some(colon) => format!("{}:***{}", &head[..start + colon], &head[at..]),
                None => head.to_string(),
            }
        }
        None => head.to_string(),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if is_secret_option(key) => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

fn is_secret_option(key: &str) -> bool {
    const SECRET: &[&str] = &["pass", "secret", "token", "auth", "key", "sig", "sas", "credential"];
    let key = key.to_ascii_lowercase();
    SECRET.iter().any(|s| key.contains(s))
}
