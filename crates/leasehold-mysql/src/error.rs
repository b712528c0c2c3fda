//! How the driver's errors become leasehold's, and which of them end a session.

use std::time::Duration;

use leasehold_core::{BoxError, Error};
use sqlx::mysql::MySqlDatabaseError;

pub(crate) const STORE: &str = "mysql";

/// The server's error number (`ER_*`) of a database error, if it is one.
pub(crate) fn number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db.try_downcast_ref::<MySqlDatabaseError>().map(|e| e.number()),
        _ => None,
    }
}

/// What a person reads about `error`: one line, without the driver's debug forms.
pub(crate) fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => match number(error) {
            Some(number) => format!("{} (error {number})", db.message()),
            None => db.message().to_string(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Protocol(detail) => format!("the server's answer is not the MySQL protocol ({detail})"),
        other => other.to_string(),
    }
}

/// A permanent refusal behind error `number`, with what to check.
fn refusal(number: u16) -> Option<&'static str> {
    match number {
        // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
        1045 | 1698 => Some("check the URL's user and password"),
        // ER_DBACCESS_DENIED_ERROR
        1044 => Some("grant the user access to the database (see docs: privileges)"),
        // ER_BAD_DB_ERROR
        1049 => Some("check the database name in the URL's path (leasehold does not create databases)"),
        // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR
        1142 | 1143 | 1227 => Some("grant the user the privileges leasehold needs (see docs: privileges)"),
        // ER_HOST_NOT_PRIVILEGED, ER_HOST_IS_BLOCKED
        1130 | 1129 => Some("the server does not accept this client's host: check the user's host part"),
        _ => None,
    }
}

/// Errors after which the request may have been applied, or may work on a retry: too many
/// connections (1040), shutdown (1053), a killed connection or query (1317, 1927), a lock wait
/// timeout (1205), a deadlock (1213), a read-only server during failover (1290, 1836).
fn is_transient_number(number: u16) -> bool {
    matches!(number, 1040 | 1053 | 1205 | 1213 | 1290 | 1317 | 1836 | 1927)
}

/// Maps an error of an operation.
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
        sqlx::Error::Database(_) => match number(error) {
            Some(1205) => Error::Timeout {
                store: STORE,
                operation,
                after: waited,
            },
            Some(n) if is_transient_number(n) => Error::unreachable(STORE, source()),
            Some(n) if refusal(n).is_some() => Error::refused(
                STORE,
                operation,
                format!("{}: {}", describe(error), refusal(n).unwrap_or_default()),
            ),
            _ => Error::store(STORE, source()),
        },
        _ => Error::store(STORE, source()),
    }
}

/// Maps an error of opening a connection to `endpoint`: like [`map`], but a server that answers
/// in another protocol is [`Error::Refused`], and what cannot reach it names it.
pub(crate) fn map_connect(error: &sqlx::Error, endpoint: &str, waited: Duration) -> Error {
    if let Some(why) = tls_refusal(error) {
        return Error::refused(STORE, "connect", format!("{why} (server {endpoint})"));
    }
    match error {
        sqlx::Error::Protocol(_) => Error::refused(
            STORE,
            "connect",
            format!("the server at {endpoint} does not speak the MySQL protocol: check the host and port"),
        ),
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => Error::refused(
            STORE,
            "connect",
            format!(
                "the server at {endpoint} closed the connection without a MySQL greeting: it does not speak the \
                 MySQL protocol (or refuses this client at once): check the host and port"
            ),
        ),
        sqlx::Error::Io(io) => Error::unreachable(
            STORE,
            format!("cannot connect to {endpoint}: {io}: check the host and port, and that the server is up"),
        ),
        _ => map(error, "connect", waited),
    }
}

/// A failed TLS handshake: the client rejected the server's certificate (wrong CA, wrong host,
/// expired), the server ended the handshake rejecting ours (an alert), the server offers no TLS
/// at all, or a certificate file could not be used. Permanent: the same handshake fails again.
#[cfg(feature = "tls-rustls")]
fn tls_refusal(error: &sqlx::Error) -> Option<String> {
    match error {
        // sqlx's words when the server's greeting lacks the SSL capability.
        sqlx::Error::Tls(e) if e.to_string().contains("does not support TLS") => Some(
            "TLS: the server does not offer TLS, which the URL's ssl-mode (or ca=) requires; check the host and \
             port, or the server's ssl-cert and ssl-key settings"
                .to_string(),
        ),
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
            "no MySQL greeting from {endpoint} within {} while connecting: check that a MySQL or MariaDB \
             server listens there (a server of another protocol waits for the client to speak first)",
            leasehold_core::time::Human(after)
        ),
    )
}

/// Whether the session behind a connection can no longer be trusted after `error`: the
/// connection broke or the protocol state is unknown. Such a connection is dropped (and with it
/// every named lock it held). A plain SQL error leaves the session as it was.
pub(crate) fn ends_session(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => matches!(number(error), None | Some(1053 | 1317 | 1927)),
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
            &sqlx::Error::Protocol("unsupported protocol version 72".into()),
            "127.0.0.1:2379",
            Duration::from_secs(5),
        );
        assert!(wrong.is_permanent(), "{wrong:?}");
        assert!(
            wrong
                .to_string()
                .contains("127.0.0.1:2379 does not speak the MySQL protocol"),
            "{wrong}"
        );
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
    fn credentials_databases_and_privileges_are_refusals() {
        for number in [1045, 1044, 1049, 1142, 1227] {
            assert!(refusal(number).is_some(), "{number}");
        }
        for number in [1040, 1205, 1213, 1062, 1146] {
            assert!(refusal(number).is_none(), "{number}");
        }
    }
}
