//! How the driver's errors become leasehold's, and which of them end a session.

use std::time::Duration;

use leasehold_core::{BoxError, Error};

pub(crate) const STORE: &str = "postgres";

/// The SQLSTATE of a database error, if it is one.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Maps an error of an operation.
///
/// What may have been applied, or may work on a retry, is transient: I/O, a broken or refused
/// connection, a server shutting down or starting, too many connections, a pool that had no
/// connection in time, a lock or statement timeout, a serialization failure. Everything else
/// (a bad privilege, a table of another shape, ...) is definite.
pub(crate) fn map(error: &sqlx::Error, operation: &'static str, waited: Duration) -> Error {
    let source = || -> BoxError { error.to_string().into() };
    match error {
        sqlx::Error::PoolTimedOut => Error::Timeout {
            store: STORE,
            operation,
            after: waited,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unreachable(STORE, source()),
        sqlx::Error::Database(_) => match sqlstate(error).as_deref() {
            // 55P03 lock_not_available (lock_timeout), 57014 query_canceled (statement_timeout)
            Some("55P03" | "57014") => Error::Timeout {
                store: STORE,
                operation,
                after: waited,
            },
            Some(code) if is_transient_state(code) => Error::unreachable(STORE, source()),
            _ => Error::store(STORE, source()),
        },
        _ => Error::store(STORE, source()),
    }
}

/// Classes 08 (connection exception), 57P (operator intervention: shutdown, terminated backend,
/// cannot connect now, idle-session timeout), 53 (insufficient resources, e.g. too many
/// connections), 40 (serialization failure, deadlock) and 58 (system error: I/O).
fn is_transient_state(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("57P")
        || code.starts_with("53")
        || code.starts_with("40")
        || code.starts_with("58")
}

/// Whether the session behind a connection can no longer be trusted after `error`: the
/// connection broke, the server ended the session, or the protocol state is unknown. Such a
/// connection is dropped (with it, every advisory lock it held is gone). A plain SQL error
/// leaves the session as it was.
pub(crate) fn ends_session(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => match sqlstate(error) {
            Some(code) => {
                code.starts_with("08") || code.starts_with("57P") || code.starts_with("58") || code.starts_with("XX")
            }
            None => true,
        },
        sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::Encode(_)
        | sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. } => false,
        _ => true,
    }
}
