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
            Failure::Redis(error) => map(error),
        }
    }
}

/// Whether an error came from the connection rather than from the server's answer: such an
/// error makes the store replace the connection.
pub(crate) fn is_connection_error(error: &redis::RedisError) -> bool {
    !matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

/// Maps an error of a request.
///
/// What may have been applied, or may work when tried again, is transient: I/O, a broken or
/// garbled connection, a server that is loading its data or busy with a script. Everything else
/// (authentication, permissions, a read-only replica, out of memory, a script error) is definite.
pub(crate) fn map(error: redis::RedisError) -> Error {
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
        Error::unreachable(STORE, error)
    } else {
        Error::store(STORE, error)
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
