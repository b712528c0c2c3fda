//! The URL redactor: what of a store URL may be shown.

use std::ops::Range;

use super::percent_decode;

/// A store URL safe to print: the password of the user info, and every query value whose name
/// suggests a secret (`password`, `pass`, `secret`, `token`, `auth`, `key`, `sig`, `sas`,
/// `credential`, in any case, also as part of a longer name such as `secret_access_key`, also
/// `%`-escaped), replaced by `***`, together with everything after that value up to the end of
/// the query (it may be the rest of a secret that held an unescaped `&`: `password=pa&ss=x`).
/// [`StoreUrl::known_options`](super::StoreUrl::known_options) shows known options after a secret again. Works on text that does
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

pub(super) fn redact(url: &str, hide_user: bool, known: &[&str]) -> String {
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
pub(super) fn is_scheme(text: &str) -> bool {
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
