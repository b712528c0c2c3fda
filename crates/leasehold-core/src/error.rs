//! The one error type of leasehold.

use std::fmt;
use std::time::Duration;

use crate::ids::{LeaseName, Term};
use crate::time::Human;

/// A boxed error from a store's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in leasehold.
///
/// A lost race is not an error: [`LeaseStore::acquire`](crate::LeaseStore::acquire) answers
/// [`Acquired::Held`](crate::Acquired::Held) and [`LeaseStore::renew`](crate::LeaseStore::renew)
/// answers [`Renewed::Lost`](crate::Renewed::Lost). Errors are for what is wrong or unknown.
///
/// Every error's `Display` is one line (newlines in a client's message are folded), naming the
/// store and what to check; the client's own error stays reachable through
/// [`source`](std::error::Error::source).
///
/// # What the caller can do
///
/// An error is *transient* ([`Error::is_transient`]: the request may or may not have been
/// applied; read back and retry), *permanent* ([`Error::is_permanent`]: retrying the same thing
/// cannot help until someone changes the configuration, credentials or the store), or else
/// *definite* (the request was not applied; the answer may differ later).
///
/// | variant | kind | what to do |
/// |---|---|---|
/// | [`Unreachable`](Error::Unreachable), [`Timeout`](Error::Timeout) | transient | retry (the engine reads back and retries by itself) |
/// | [`Refused`](Error::Refused) | permanent | fix the credentials, permissions, endpoint or missing table the reason names |
/// | [`InvalidUrl`](Error::InvalidUrl), [`UnsupportedScheme`](Error::UnsupportedScheme), [`InvalidConfig`](Error::InvalidConfig), [`InvalidLeaseName`](Error::InvalidLeaseName), [`InvalidCandidateId`](Error::InvalidCandidateId), [`InvalidTtl`](Error::InvalidTtl) | permanent | fix the configuration |
/// | [`Unsupported`](Error::Unsupported) | permanent | do not ask this store for it (see [`Capabilities`](crate::Capabilities)) |
/// | [`CorruptRecord`](Error::CorruptRecord) | definite | look at the record; break or delete it if it is not leasehold's |
/// | [`Store`](Error::Store) | definite | retry later; report it if it persists |
/// | [`NotLeader`](Error::NotLeader), [`LeaseEnding`](Error::LeaseEnding) | definite | stop side effects: leadership ended |
/// | [`Engine`](Error::Engine) | definite | the election stopped; see the reason |
///
/// # Examples
///
/// ```
/// use leasehold_core::Error;
///
/// let err = Error::refused("postgres", "connect", "password authentication failed for user app: check the URL's user and password");
/// assert!(err.is_permanent() && !err.is_transient());
/// assert_eq!(
///     err.to_string(),
///     "postgres store refused connect: password authentication failed for user app: check the URL's user and password"
/// );
///
/// let err = Error::unreachable("redis", "connection refused\n(os error 111)");
/// assert!(err.is_transient() && !err.is_permanent());
/// assert_eq!(err.to_string(), "redis store unreachable: connection refused (os error 111)");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lease name that no store accepts.
    #[error("invalid lease name {}: {reason}", Quoted(name))]
    InvalidLeaseName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A candidate id that is empty, too long or contains control characters.
    #[error("invalid candidate id {}: {reason}", Quoted(id))]
    InvalidCandidateId {
        /// The rejected id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A TTL outside the range the store supports.
    #[error("ttl {ttl:?} is outside the range {min:?}..={max:?} that the {store} store supports")]
    InvalidTtl {
        /// The store that rejected it.
        store: &'static str,
        /// The rejected TTL.
        ttl: Duration,
        /// The smallest TTL the store supports.
        min: Duration,
        /// The largest TTL the store supports.
        max: Duration,
    },

    /// An election configuration whose invariants do not hold.
    #[error("invalid configuration: {field} = {}, allowed: {}", OneLine(value), OneLine(allowed))]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The allowed range, in words.
        allowed: String,
    },

    /// A store URL that cannot be parsed or has bad options. The URL is redacted.
    #[error("invalid store URL {}: {}", OneLine(url), OneLine(reason))]
    InvalidUrl {
        /// The URL with any password, key or token replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A URL scheme that no compiled-in backend handles.
    #[error("unsupported store scheme {}: {}", Quoted(scheme), OneLine(hint))]
    UnsupportedScheme {
        /// The scheme.
        scheme: String,
        /// What to do about it, e.g. the Cargo feature to enable.
        hint: String,
    },

    /// The store could not be reached, or the connection broke mid-request. The request may or
    /// may not have been applied.
    #[error("{store} store unreachable: {}", OneLine(source))]
    Unreachable {
        /// The store.
        store: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },

    /// The store did not answer in time. The request may or may not have been applied.
    #[error("{store} store did not answer {operation} within {}", Human(*after))]
    Timeout {
        /// The store.
        store: &'static str,
        /// The operation that timed out.
        operation: &'static str,
        /// How long the caller waited.
        after: Duration,
    },

    /// A record in the store that leasehold did not write or cannot read: another program's data,
    /// garbage, or a table of the same name with another shape. Nothing was changed.
    #[error(
        "{store} store: corrupt or foreign record for lease {}: {}",
        OneLine(lease),
        OneLine(detail)
    )]
    CorruptRecord {
        /// The store.
        store: &'static str,
        /// The lease (or table) concerned.
        lease: String,
        /// What was found.
        detail: String,
    },

    /// The operation is not available on this store (e.g. breaking a lease).
    #[error("{store} store does not support {operation}")]
    Unsupported {
        /// The store.
        store: &'static str,
        /// The operation.
        operation: &'static str,
    },

    /// The caller is not (or no longer, or not for long enough) the leader.
    #[error("not the leader of {lease} (term {term}): {}", OneLine(reason))]
    NotLeader {
        /// The lease.
        lease: LeaseName,
        /// The term the caller held.
        term: Term,
        /// Why, e.g. "deposed: renew failed" or "only 120ms left, 2s required".
        reason: String,
    },

    /// The leader is not deposed, but less of its lease is left than the work asked for before
    /// a side effect (renewals were late). The leadership ends: the work is cancelled, the
    /// lease released once the work has returned, and [`Elector::run`](crate::Elector::run)
    /// campaigns again.
    #[error(
        "lease {lease} (term {term}) has only {} left but {} was required{}: stepping down to campaign again",
        Human(*remaining),
        Human(*required),
        if *never { " (more than a renewal can ever give: lower min_remaining or raise the ttl)" } else { "" }
    )]
    LeaseEnding {
        /// The lease.
        lease: LeaseName,
        /// The term that ends.
        term: Term,
        /// How much of the lease was left.
        remaining: Duration,
        /// How much the caller required.
        required: Duration,
        /// `required` is at least `ttl * (1 - drift)`: no renewal can ever meet it.
        never: bool,
    },

    /// The store refused the request for a reason that retrying cannot change: wrong
    /// credentials, no permission, another service on that port, a missing table or container
    /// when creating it is off. Nothing was applied. The engine reports it at once (at warn and
    /// in events and metrics) instead of retrying silently.
    #[error("{store} store refused {operation}: {}", OneLine(reason))]
    Refused {
        /// The store.
        store: &'static str,
        /// The operation refused, e.g. `"connect"` or `"acquire"`.
        operation: &'static str,
        /// Why, and what to check, in one line, e.g. `"authentication failed: check the URL's
        /// user and password"`.
        reason: String,
        /// The client's error, if there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// The election engine itself failed (not a store): e.g. its driver stopped before electing.
    #[error("the election engine failed: {}", OneLine(reason))]
    Engine {
        /// What happened.
        reason: String,
    },

    /// Any other error from a store's client, definite (not transient).
    #[error("{store} store error: {}", OneLine(source))]
    Store {
        /// The store.
        store: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether the outcome is ambiguous or temporary: the store could not be reached or did not
    /// answer, so the request may have been applied. The engine settles such outcomes by reading
    /// the record back and retrying; every other error is definite.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::Error;
    ///
    /// let timeout = Error::Timeout { store: "etcd", operation: "renew", after: Duration::from_secs(1) };
    /// assert!(timeout.is_transient());
    /// assert!(!Error::corrupt("etcd", "jobs", "not a leasehold record").is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unreachable { .. } | Error::Timeout { .. })
    }

    /// Whether retrying the same request cannot help until someone changes something: the store
    /// refused it ([`Error::Refused`]), the configuration is invalid, or the store does not
    /// support the operation. See the table on [`Error`].
    ///
    /// ```
    /// use leasehold_core::Error;
    ///
    /// assert!(Error::refused("azure", "acquire", "the SAS does not allow write: check sp=").is_permanent());
    /// assert!(Error::Unsupported { store: "redis", operation: "break_lease" }.is_permanent());
    /// assert!(!Error::store("azure", "HTTP 500").is_permanent());
    /// ```
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::Refused { .. }
                | Error::InvalidUrl { .. }
                | Error::UnsupportedScheme { .. }
                | Error::InvalidConfig { .. }
                | Error::InvalidLeaseName { .. }
                | Error::InvalidCandidateId { .. }
                | Error::InvalidTtl { .. }
                | Error::Unsupported { .. }
        )
    }

    /// Builds an [`Error::Refused`] without a client error.
    pub fn refused(store: &'static str, operation: &'static str, reason: impl Into<String>) -> Self {
        Error::Refused {
            store,
            operation,
            reason: reason.into(),
            source: None,
        }
    }

    /// Builds an [`Error::Refused`] keeping the client's error as its
    /// [`source`](std::error::Error::source) (not shown by `Display`: say what matters in `reason`).
    ///
    /// ```
    /// use std::error::Error as _;
    /// use leasehold_core::Error;
    ///
    /// let err = Error::refused_because("redis", "connect", "WRONGPASS: check the URL's password", "WRONGPASS invalid username-password pair");
    /// assert_eq!(err.to_string(), "redis store refused connect: WRONGPASS: check the URL's password");
    /// assert!(err.source().is_some());
    /// ```
    pub fn refused_because(
        store: &'static str,
        operation: &'static str,
        reason: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Refused {
            store,
            operation,
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// Builds an [`Error::Engine`].
    pub fn engine(reason: impl Into<String>) -> Self {
        Error::Engine { reason: reason.into() }
    }

    /// Wraps a client error as [`Error::Unreachable`].
    pub fn unreachable(store: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unreachable {
            store,
            source: source.into(),
        }
    }

    /// Wraps a client error as [`Error::Store`].
    pub fn store(store: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Store {
            store,
            source: source.into(),
        }
    }

    /// Builds an [`Error::CorruptRecord`].
    pub fn corrupt(store: &'static str, lease: impl std::fmt::Display, detail: impl Into<String>) -> Self {
        Error::CorruptRecord {
            store,
            lease: lease.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn config(field: &'static str, value: impl std::fmt::Debug, allowed: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            value: format!("{value:?}"),
            allowed: allowed.into(),
        }
    }
}

/// Shows a value's `Display` on one line: every run of whitespace that holds a line break
/// becomes one space, and leading and trailing whitespace goes.
struct OneLine<'a, T: ?Sized>(&'a T);

impl<T: fmt::Display + ?Sized> fmt::Display for OneLine<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        if !text.contains(['\n', '\r']) {
            return f.write_str(text.trim());
        }
        let mut first = true;
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            if !first {
                f.write_str(" ")?;
            }
            f.write_str(line)?;
            first = false;
        }
        Ok(())
    }
}

/// Quotes a value given by the user (`{:?}`), at most 80 characters of it.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(80).collect();
        if shown.len() < self.0.len() {
            write!(f, "{shown:?}...")
        } else {
            write!(f, "{shown:?}")
        }
    }
}

/// The most specific message in an error's chain, for a client library whose outer errors say
/// little (`dispatch failure`): its last two links joined (`tcp connect error: Connection
/// refused (os error 111)`), the first line only, at most 300 characters.
///
/// ```
/// use leasehold_core::innermost_message;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused\nmore");
/// assert_eq!(innermost_message(&io), "connection refused");
/// ```
pub fn innermost_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut texts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(inner) = source {
        texts.push(inner.to_string());
        source = inner.source();
    }
    let mut specific: Vec<&str> = texts.iter().rev().take(2).map(String::as_str).collect();
    specific.reverse();
    specific.dedup();
    specific
        .join(": ")
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations in messages are rounded as people read them, not Debug's nanoseconds.
    #[test]
    fn durations_in_messages_are_rounded() {
        let timeout = Error::Timeout {
            store: "redis",
            operation: "inspect",
            after: Duration::from_nanos(668_174_553),
        };
        assert_eq!(timeout.to_string(), "redis store did not answer inspect within 668ms");
    }

    /// Every variant's `Display` is one line, whatever its parts hold.
    #[test]
    fn every_error_displays_on_one_line() {
        let text = "first line\n  second line\r\n\nthird";
        let lease = LeaseName::new("jobs").unwrap();
        let errors = [
            Error::InvalidLeaseName {
                name: text.into(),
                reason: "bad",
            },
            Error::InvalidCandidateId {
                id: text.into(),
                reason: "bad",
            },
            Error::config("ttl", text, text),
            Error::InvalidUrl {
                url: text.into(),
                reason: text.into(),
            },
            Error::UnsupportedScheme {
                scheme: text.into(),
                hint: text.into(),
            },
            Error::unreachable("s", text),
            Error::corrupt("s", text, text),
            Error::NotLeader {
                lease: lease.clone(),
                term: Term(1),
                reason: text.into(),
            },
            Error::refused_because("s", "connect", text, text),
            Error::engine(text),
            Error::store("s", text),
            Error::LeaseEnding {
                lease,
                term: Term(1),
                remaining: Duration::from_millis(1),
                required: Duration::from_secs(1),
                never: true,
            },
        ];
        for err in errors {
            let shown = err.to_string();
            assert!(!shown.contains(['\n', '\r']), "{shown:?}");
        }
        assert_eq!(
            Error::unreachable("s", text).to_string(),
            "s store unreachable: first line second line third"
        );
    }

    #[test]
    fn long_user_values_are_cut() {
        let err = Error::InvalidLeaseName {
            name: "x".repeat(1000),
            reason: "too long",
        };
        assert!(err.to_string().len() < 120, "{err}");
    }

    #[test]
    fn kinds() {
        let refused = Error::refused("s", "acquire", "no permission");
        assert!(refused.is_permanent() && !refused.is_transient());
        let unreachable = Error::unreachable("s", "down");
        assert!(unreachable.is_transient() && !unreachable.is_permanent());
        for definite in [
            Error::corrupt("s", "l", "x"),
            Error::store("s", "x"),
            Error::engine("x"),
        ] {
            assert!(!definite.is_transient() && !definite.is_permanent(), "{definite}");
        }
    }
}
