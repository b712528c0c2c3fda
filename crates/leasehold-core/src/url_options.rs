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
/// `credential`, in any case, also as part of a longer name such as `secret_access_key`, also
/// `%`-escaped), replaced by `***`. Works on text that does not parse as a URL too.
///
/// URL parsers disagree on where an unescaped password ends: the WHATWG parser (the `url`
/// crate) ends the authority at the first `/`, `?` or `#` and the user info at the last `@`
/// before it; libpq-style parsers take everything up to an `@`. A password typed with a `/`,
/// `?`, `#` or `@` in it must be hidden whichever way the text is read, so the password is
/// taken to run from the first `:` after `scheme://` (or after the start of text that has no
/// scheme) to the **last** `@` of the whole text, and query options are read both from the
/// first `?` and from the first `?` after that last `@`. A value after a secret option that has
/// no `=` of its own is hidden too (an unescaped `&` in a password). The price is that a URL
/// with an `@` after its host (in the path or a query value) is shown with everything from the
/// first `:` to that `@` hidden: the redactor cannot tell it from a password holding `/` and
/// `?`, and errs on the side of hiding.
///
/// ```
/// use leasehold_core::url_options::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:hunter2@db:5432/x?sig=abc&mode=y"),
///     "postgres://app:***@db:5432/x?sig=***&mode=y"
/// );
/// assert_eq!(redact_url("postgres://app:pa/ss?w#d@db.internal/jobs"), "postgres://app:***@db.internal/jobs");
/// assert_eq!(redact_url("postgres://a:b@c@h/db"), "postgres://a:***@h/db");
/// assert_eq!(redact_url("etcd://h1,h2/p?password=s3&timeout=1s"), "etcd://h1,h2/p?password=***&timeout=1s");
/// assert_eq!(redact_url("redis://:s3cret@h/0"), "redis://:***@h/0");
/// assert_eq!(redact_url("no scheme:pw@host"), "no scheme:***@host");
/// assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    render(url, secret_ranges(url, false))
}

/// Like [`redact_url`], and hides the user name too (everything before the last `@`): for
/// stores whose user name is itself a credential, such as an AWS access key id.
///
/// ```
/// use leasehold_core::url_options::redact_url_and_user;
///
/// assert_eq!(
///     redact_url_and_user("dynamodb://AKID:wJalr/x?y@leases?region=eu-west-1&secret_access_key=k"),
///     "dynamodb://***@leases?region=eu-west-1&secret_access_key=***"
/// );
/// ```
#[must_use]
pub fn redact_url_and_user(url: &str) -> String {
    render(url, secret_ranges(url, true))
}

/// The byte ranges of `url` to hide (ASCII delimiters only, so always on `char` boundaries).
fn secret_ranges(url: &str, hide_user: bool) -> Vec<std::ops::Range<usize>> {
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
            secret_options(url, from + question + 1, &mut ranges);
        }
    }
    ranges
}

/// Pushes the ranges of the values of secret options in the query starting at `query`.
fn secret_options(url: &str, query: usize, ranges: &mut Vec<std::ops::Range<usize>>) {
    let mut pos = query;
    let mut hiding = false;
    for pair in url[query..].split('&') {
        match pair.split_once('=') {
            Some((key, _)) => {
                hiding = is_secret_option(key);
                if hiding {
                    ranges.push(pos + key.len() + 1..pos + pair.len());
                }
            }
            // No '=': the rest of a secret value that held an unescaped '&' (hidden with it).
            None if hiding => ranges.push(pos - 1..pos + pair.len()),
            None => {}
        }
        pos += pair.len() + 1;
    }
}

/// `url` with each range (merged where they overlap or touch) replaced by `***`.
fn render(url: &str, mut ranges: Vec<std::ops::Range<usize>>) -> String {
    ranges.sort_by_key(|range| range.start);
    let mut out = String::with_capacity(url.len());
    let mut shown_to = 0;
    let mut current: Option<std::ops::Range<usize>> = None;
    for range in ranges {
        match &mut current {
            Some(open) if range.start <= open.end => open.end = open.end.max(range.end),
            _ => {
                if let Some(done) = current.take() {
                    out.push_str(&url[shown_to..done.start]);
                    out.push_str("***");
                    shown_to = done.end;
                }
                current = Some(range);
            }
        }
    }
    if let Some(done) = current {
        out.push_str(&url[shown_to..done.start]);
        out.push_str("***");
        shown_to = done.end;
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

fn is_secret_option(key: &str) -> bool {
    const SECRET: &[&str] = &["pass", "secret", "token", "auth", "key", "sig", "sas", "credential"];
    let key = percent_decode(key)
        .unwrap_or_else(|_| key.to_string())
        .to_ascii_lowercase();
    SECRET.iter().any(|s| key.contains(s))
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
            ("etcd://h/p?PassWord=s3&x=1", "etcd://h/p?PassWord=***&x=1"),
            ("etcd://h/p?p%61ssword=s3&x=1", "etcd://h/p?p%61ssword=***&x=1"),
            ("etcd://h/p?password=s3&cr3t&x=1", "etcd://h/p?password=***&x=1"),
            ("etcd://h/p?password=s3#cr3t&x=1", "etcd://h/p?password=***&x=1"),
            ("etcd://h/p?password=s3?cr3t&x=1", "etcd://h/p?password=***&x=1"),
            ("etcd://h/p?password=s3@cr:3t&x=1", "etcd://h/p?password=***&x=1"),
            (
                "azure://acct/c?sv=2022&sig=abc%2Bdef&se=1",
                "azure://acct/c?sv=2022&sig=***&se=1",
            ),
            ("etcd://h/p?password=", "etcd://h/p?password=***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
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
}
