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

/// What a person reads about `error`: one line, without the driver's debug forms or the
/// server's source positions (sqlx appends `at line N` of the server's C source).
pub(crate) fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_string(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Protocol(detail) => format!("the server's answer is not the Postgres protocol ({detail})"),
        other => other.to_string(),
    }
}

/// A permanent refusal behind SQLSTATE `code`, with what to check: authentication (class 28),
/// a database that does not exist (3D000), a missing privilege (42501).
fn refusal(code: &str) -> Option<&'static str> {
    if code.starts_with("28") {
        Some("check the URL's user and password (and the server's pg_hba.conf)")
    } else if code == "3D000" {
        Some("check the database name in the URL's path")
    } else if code == "42501" {
        Some("grant the role the privileges leasehold needs (see docs: permissions)")
    } else {
        None
    }
}

/// Maps an error of an operation.
///
/// What may have been applied, or may work on a retry, is transient: I/O, a broken or refused
/// connection, a server shutting down or starting, too many connections, a pool that had no
/// connection in time, a lock or statement timeout, a serialization failure. Wrong credentials,
/// a missing database or privilege are permanent ([`Error::Refused`]). Everything else (a table
/// of another shape, ...) is definite.
pub(crate) fn map(error: &sqlx::Error, operation: &'static str, waited: Duration) -> Error {
    let source = || -> BoxError { describe(error).into() };
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
            Some(code) if refusal(code).is_some() => Error::refused(
                STORE,
                operation,
                format!("{}: {}", describe(error), refusal(code).unwrap_or_default()),
            ),
            _ => Error::store(STORE, source()),
        },
        _ => Error::store(STORE, source()),
    }
}

/// Maps an error of opening a connection to `endpoint` (`host:port`): like [`map`], but a server
/// that answers in another protocol is [`Error::Refused`], and what cannot reach it names it.
pub(crate) fn map_connect(error: &sqlx::Error, endpoint: &str, waited: Duration) -> Error {
    if let Some(why) = tls_refusal(error) {
        return Error::refused(STORE, "connect", format!("{why} (server {endpoint})"));
    }
    match error {
        sqlx::Error::Protocol(_) => Error::refused(
            STORE,
            "connect",
            format!("the server at {endpoint} does not speak the Postgres protocol: check the host and port"),
        ),
        sqlx::Error::Io(io) => Error::unreachable(
            STORE,
            format!("cannot connect to {endpoint}: {io}: check the host and port, and that the server is up"),
        ),
        _ => map(error, "connect", waited),
    }
}

/// A failed TLS handshake: the client rejected the server's certificate (wrong CA, wrong host,
/// expired), or the server ended the handshake rejecting ours (an alert), or a certificate file
/// could not be used. Permanent: the same handshake fails again.
#[cfg(feature = "tls-rustls")]
fn tls_refusal(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Tls(e) => Some(leasehold_core::tls::failure(e.as_ref())),
        sqlx::Error::Io(e) => leasehold_core::tls::refusal(e),
        _ => None,
    }
}

#[cfg(not(feature = "tls-rustls"))]
fn tls_refusal(_: &sqlx::Error) -> Option<String> {
    None
}

/// Opening a connection to `endpoint` got no answer within `after`.
pub(crate) fn connect_timeout(endpoint: &str, after: Duration) -> Error {
    Error::unreachable(
        STORE,
        format!(
            "no answer from {endpoint} within {} while connecting: check that a Postgres server listens \
             there (another service on that port may not answer at all)",
            leasehold_core::time::Human(after)
        ),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_protocol_is_refused_and_unreachable_names_the_server() {
        let wrong = map_connect(
            &sqlx::Error::Protocol("expected to read 1414811696 bytes".into()),
            "127.0.0.1:2379",
            Duration::from_secs(5),
        );
        assert!(wrong.is_permanent(), "{wrong:?}");
        let text = wrong.to_string();
        assert!(
            text.contains("127.0.0.1:2379 does not speak the Postgres protocol"),
            "{text}"
        );
        assert!(!text.contains("1414811696"), "{text}");

        let refused = map_connect(
            &sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            "127.0.0.1:1",
            Duration::from_secs(5),
        );
        assert!(refused.is_transient(), "{refused:?}");
        assert!(
            refused.to_string().contains("cannot connect to 127.0.0.1:1"),
            "{refused}"
        );
        let silent = connect_timeout("127.0.0.1:6379", Duration::from_secs(5));
        assert!(
            silent.is_transient() && silent.to_string().contains("127.0.0.1:6379"),
            "{silent}"
        );
    }

    #[test]
    fn authentication_missing_databases_and_privileges_are_refusals() {
        for code in ["28P01", "28000", "3D000", "42501"] {
            assert!(refusal(code).is_some(), "{code}");
        }
        for code in ["08006", "40001", "57P01", "42P01", "23505"] {
            assert!(refusal(code).is_none(), "{code}");
        }
    }
}
