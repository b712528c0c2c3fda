//! The one error type of leasehold.

use std::time::Duration;

use crate::types::{LeaseName, Term};

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
/// [`Error::is_transient`] tells the engine whether an outcome is *ambiguous* (the request may or
/// may not have been applied) and worth a read-back and a retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lease name that no store accepts.
    #[error("invalid lease name {name:?}: {reason}")]
    InvalidLeaseName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A candidate id that is empty, too long or contains control characters.
    #[error("invalid candidate id {id:?}: {reason}")]
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
    #[error("invalid configuration: {field} = {value}, allowed: {allowed}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The allowed range, in words.
        allowed: String,
    },

    /// A store URL that cannot be parsed or has bad options. The URL is redacted.
    #[error("invalid store URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with any password, key or token replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A URL scheme that no compiled-in backend handles.
    #[error("unsupported store scheme {scheme:?}: {hint}")]
    UnsupportedScheme {
        /// The scheme.
        scheme: String,
        /// What to do about it, e.g. the Cargo feature to enable.
        hint: String,
    },

    /// The store could not be reached, or the connection broke mid-request. The request may or
    /// may not have been applied.
    #[error("{store} store unreachable: {source}")]
    Unreachable {
        /// The store.
        store: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },

    /// The store did not answer in time. The request may or may not have been applied.
    #[error("{store} store did not answer {operation} within {after:?}")]
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
    #[error("{store} store: corrupt or foreign record for lease {lease}: {detail}")]
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
    #[error("not the leader of {lease} (term {term}): {reason}")]
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
        "lease {lease} (term {term}) has only {remaining:?} left but {required:?} was required{}: stepping down to campaign again",
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

    /// Any other error from a store's client, definite (not transient).
    #[error("{store} store error: {source}")]
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
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unreachable { .. } | Error::Timeout { .. })
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
