//! How SQLite's errors become leasehold's.

use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::{BoxError, Error};

pub(crate) const STORE: &str = "sqlite";

/// Why a lease file could not be opened.
///
/// It reaches callers as the source of [`Error::Store`]; downcast to inspect it:
///
/// ```
/// # use leasehold_core::{BoxError, Error};
/// # use leasehold_sqlite::OpenError;
/// fn is_not_a_database(error: &Error) -> bool {
///     matches!(error, Error::Store { source, .. }
///         if matches!(source.downcast_ref::<OpenError>(), Some(OpenError::NotADatabase { .. })))
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The file exists but is not a SQLite database (or is encrypted).
    #[error("{} is not a SQLite database: {detail}", path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// The file cannot be opened or created for writing: a missing or read-only directory, a
    /// directory in its place, missing permissions.
    #[error("cannot open {} for writing: {detail}", path.display())]
    CannotWrite {
        /// The file.
        path: PathBuf,
        /// What SQLite or the operating system said.
        detail: String,
    },
}

/// The SQLite primary result codes leasehold tells apart (<https://www.sqlite.org/rescode.html>).
mod code {
    pub(super) const PERM: i32 = 3;
    pub(super) const BUSY: i32 = 5;
    pub(super) const LOCKED: i32 = 6;
    pub(super) const READONLY: i32 = 8;
    pub(super) const IOERR: i32 = 10;
    pub(super) const CORRUPT: i32 = 11;
    pub(super) const FULL: i32 = 13;
    pub(super) const CANTOPEN: i32 = 14;
    pub(super) const PROTOCOL: i32 = 15;
    pub(super) const AUTH: i32 = 23;
    pub(super) const NOTADB: i32 = 26;
}

/// The primary result code of a database error, if it is one.
fn primary_code(error: &sqlx::Error) -> Option<i32> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    let extended: i32 = db.code()?.parse().ok()?;
    Some(extended & 0xff)
}

/// Maps an error of a lease operation.
///
/// What may have been applied, or may work on a retry, is transient: I/O, a lock held too long by
/// another process (busy timeout), no free connection in the pool. Everything else is definite.
/// Takes a reference because one failed transaction answers every request it carried.
pub(crate) fn map(error: &sqlx::Error, operation: &'static str, busy_timeout: Duration) -> Error {
    let source = || -> BoxError { error.to_string().into() };
    match error {
        sqlx::Error::PoolTimedOut => Error::Timeout {
            store: STORE,
            operation,
            after: busy_timeout,
        },
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            Error::unreachable(STORE, source())
        }
        sqlx::Error::Database(_) => match primary_code(error) {
            Some(code::BUSY | code::LOCKED) => Error::Timeout {
                store: STORE,
                operation,
                after: busy_timeout,
            },
            Some(code::IOERR | code::FULL | code::CANTOPEN | code::PROTOCOL) => Error::unreachable(STORE, source()),
            _ => Error::store(STORE, source()),
        },
        _ => Error::store(STORE, source()),
    }
}

/// Maps an error while opening the file, naming it where the file itself is the problem.
pub(crate) fn map_open(error: sqlx::Error, path: &std::path::Path, busy_timeout: Duration) -> Error {
    let detail = error.to_string();
    match primary_code(&error) {
        Some(code::NOTADB | code::CORRUPT) => Error::store(
            STORE,
            OpenError::NotADatabase {
                path: path.to_path_buf(),
                detail,
            },
        ),
        Some(code::CANTOPEN | code::READONLY | code::PERM | code::AUTH) => Error::store(
            STORE,
            OpenError::CannotWrite {
                path: path.to_path_buf(),
                detail,
            },
        ),
        _ => map(&error, "open", busy_timeout),
    }
}

/// Whether the error is SQLite's "database is locked", which is worth waiting out while opening.
pub(crate) fn is_busy(error: &sqlx::Error) -> bool {
    matches!(primary_code(error), Some(code::BUSY | code::LOCKED))
}
