//! How the `redis` crate's errors and the scripts' refusals become leasehold's errors.

use std::time::Duration;

use leasehold_core::Error;
use redis::{ErrorKind, ServerErrorKind};

pub(crate) const STORE: &str = "redis";

/// Why the Redis store refused a request that is neither a lost race nor a corrupt record.
///
/// It reaches callers as the source of [`Error::Store`]; downcast to inspect it:
///
/// ```
/// # use leasehold_core::Error;
/// # use leasehold_redis::RedisStoreError;
/// fn server_just_restarted(error: &Error) -> bool {
///     matches!(error, Error::Store { source, .. }
///         if matches!(source.downcast_ref::<RedisStoreError>(), Some(RedisStoreError::RecentRestart { .. })))
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The server started less than the requested TTL ago, so it may have lost a lease that a
    /// holder still believes in (a restart without persistence). Leases are granted again once
    /// the server has been up for `ttl` plus a second (its uptime is counted in whole seconds).
    #[error(
        "the Redis server has been up for only {} s; free leases are granted once it has been up for {} s \
         (the TTL plus 1 s), so that a holder from before a restart has stepped down (restart_guard)",
        uptime.as_secs(),
        needed.as_secs()
    )]
    RecentRestart {
        /// How long the server has been up, in whole seconds.
        uptime: Duration,
        /// How long it must have been up.
        needed: Duration,
    },
    /// The server is too old: leasehold needs Redis 5.0 or later (streams, effect replication
    /// of scripts).
    #[error("Redis {version} is not supported: leasehold needs Redis 5.0 or later")]
    UnsupportedServer {
        /// The `redis_version` the server reported.
        version: String,
    },
    /// The server answered something the store did not ask for or cannot read.
    #[error("unexpected reply to {operation}: {detail}")]
    UnexpectedReply {
        /// The operation.
        operation: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },
}

/// The error of a script that failed as a whole, once for each grant it carried, of the same
/// kind (a timeout, transient, a refusal or neither).
pub(crate) fn for_each_grant(error: &Error) -> Error {
    match error {
        Error::Timeout { operation, after, .. } => Error::Timeout {
            store: STORE,
            operation,
            after: *after,
        },
        Error::Refused { operation, reason, .. } => Error::refused(STORE, operation, reason.clone()),
        error if error.is_transient() => Error::unreachable(STORE, error.to_string()),
        error => Error::store(STORE, error.to_string()),
    }
}

/// Why one request failed, before it is told to the caller.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No answer within the configured timeout; the connection was replaced.
    Timeout(Duration),
    /// The reply belonged to another request: replies were lost without the connection breaking
    /// (a network that drops data). The connection was replaced.
    OutOfStep,
    /// An error from the client or the server.
    Redis(redis::RedisError),
}

impl Failure {
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        match self {
            Failure::Timeout(after) => Error::Timeout {
                store: STORE,
                operation,
                after,
            },
            Failure::OutOfStep => Error::unreachable(
                STORE,
                "the reply did not answer the request (replies were lost on a live connection); reconnecting",
            ),
            Failure::Redis(error) => map(error, operation),
        }
    }
}

/// Whether an error came from the connection rather than from the server's answer: such an
/// error makes the store replace the connection.
pub(crate) fn is_connection_error(error: &redis::RedisError) -> bool {
    !matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

/// What a person reads about `error`: one line, the server's or the client's words without the
/// client's kind names (`- AuthenticationFailed`).
pub(crate) fn describe(error: &redis::RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (None, Some(detail)) => detail.to_string(),
        (Some(code), None) => code.to_string(),
        (None, None) => error.to_string(),
    }
}

/// Maps an error of `operation`.
///
/// What may have been applied, or may work when tried again, is transient: I/O, a broken or
/// garbled connection, a server that is loading its data or busy with a script. Wrong
/// credentials and missing ACL permissions are permanent ([`Error::Refused`]), and so is an
/// answer in another protocol to `connect`. Everything else (a read-only replica, out of
/// memory, a script error) is definite.
pub(crate) fn map(error: redis::RedisError, operation: &'static str) -> Error {
    // A failed TLS handshake: the same handshake fails again.
    #[cfg(feature = "tls")]
    if let Some(why) = leasehold_core::tls::refusal(&error) {
        return Error::refused(STORE, operation, why);
    }
    let refused = |what: &str| Error::refused(STORE, operation, format!("{}: {what}", describe(&error)));
    if matches!(error.kind(), ErrorKind::AuthenticationFailed) || matches!(error.code(), Some("WRONGPASS" | "NOAUTH")) {
        return Error::refused(
            STORE,
            operation,
            "authentication failed (a wrong or missing user name or password): check the URL's user name and password",
        );
    }
    if matches!(error.kind(), ErrorKind::Server(ServerErrorKind::NoPerm)) || error.code() == Some("NOPERM") {
        return refused("grant the user the ACL permissions leasehold needs (see docs: permissions)");
    }
    if operation == "connect" && matches!(error.kind(), ErrorKind::Parse) {
        return Error::refused(
            STORE,
            operation,
            "the server's answer is not the Redis protocol: check the host and port (and rediss:// for TLS)",
        );
    }
    let transient = match error.kind() {
        ErrorKind::Io | ErrorKind::Parse => true,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown,
        ) => true,
        ErrorKind::Extension => matches!(error.code(), Some("BUSY")),
        _ => false,
    };
    if transient {
        Error::unreachable(STORE, describe(&error))
    } else {
        Error::store(STORE, describe(&error))
    }
}

/// Maps an error of the first request to `endpoint` (`host:port`), naming the server and what
/// to check when it cannot be reached or hangs up during the handshake.
pub(crate) fn map_connect(error: Error, endpoint: &str) -> Error {
    match error {
        Error::Unreachable { source, .. } => Error::unreachable(
            STORE,
            format!(
                "cannot talk to {endpoint}: {source}: check the host and port, that a Redis server listens there \
                 (another service may hang up), and rediss:// if it needs TLS"
            ),
        ),
        other => other,
    }
}

pub(crate) fn unexpected(operation: &'static str, detail: impl Into<String>) -> Error {
    Error::store(
        STORE,
        RedisStoreError::UnexpectedReply {
            operation,
            detail: detail.into(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_another_protocol_are_refused_with_what_to_check() {
        let auth = map(
            redis::RedisError::from((ErrorKind::AuthenticationFailed, "Password authentication failed")),
            "connect",
        );
        assert!(
            matches!(
                auth,
                Error::Refused {
                    operation: "connect",
                    ..
                }
            ) && auth.is_permanent(),
            "{auth:?}"
        );
        let text = auth.to_string();
        assert!(text.contains("check the URL's user name and password"), "{text}");
        assert!(!text.contains("AuthenticationFailed"), "{text}");

        let garbled = || redis::RedisError::from((ErrorKind::Parse, "invalid response"));
        let wrong_service = map(garbled(), "connect");
        assert!(wrong_service.is_permanent(), "{wrong_service:?}");
        assert!(
            wrong_service.to_string().contains("not the Redis protocol"),
            "{wrong_service}"
        );
        // Mid-session, a garbled reply is a broken connection: transient.
        assert!(map(garbled(), "renew").is_transient());

        let closed = map(
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
            "connect",
        );
        let closed = map_connect(closed, "127.0.0.1:5432");
        assert!(closed.is_transient(), "{closed:?}");
        assert!(closed.to_string().contains("127.0.0.1:5432"), "{closed}");
    }
}
