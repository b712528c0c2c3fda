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
