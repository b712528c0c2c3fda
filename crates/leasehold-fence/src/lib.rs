#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod key;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod table;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub mod recipes;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use error::FenceError;
pub use key::FenceKey;
pub use leasehold_core::Term;
/// The sqlx (0.9) whose connections the fence takes: a service on another sqlx version can open
/// the fence's connections with this one (see the crate docs).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sqlx;

/// `term` as the tables store it, or [`FenceError::TermOutOfRange`].
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn term_to_i64(key: &FenceKey, term: Term) -> Result<i64, FenceError> {
    i64::try_from(term.0).map_err(|_| FenceError::TermOutOfRange {
        key: key.to_string(),
        term,
    })
}

/// A stored value as a term, or [`FenceError::CorruptRecord`].
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn stored_to_term(key: &FenceKey, stored: i64) -> Result<Term, FenceError> {
    u64::try_from(stored).map(Term).map_err(|_| FenceError::CorruptRecord {
        key: key.to_string(),
        stored,
    })
}

/// The error for a term the upsert did not accept: [`FenceError::Stale`] naming the stored
/// term, or [`FenceError::Conflict`] if the row does not hold a higher one.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn stale_or_conflict(key: &FenceKey, term: Term, stored: Option<i64>) -> Result<(), FenceError> {
    match stored.map(|s| stored_to_term(key, s)).transpose()? {
        Some(highest) if highest > term => Err(FenceError::Stale {
            key: key.to_string(),
            term,
            highest,
        }),
        _ => Err(FenceError::Conflict {
            key: key.to_string(),
            term,
        }),
    }
}
