//! How DynamoDB's answers become leasehold errors: one line each, naming the operation, the
//! service's error code and message (or the transport's innermost cause), and what to check.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::RequestId;
use leasehold_core::Error;

pub(crate) const STORE: &str = "dynamodb";

/// Why the lease table cannot be used: the source of the [`Error::Refused`] from
/// [`DynamoDbStore::connect`](crate::DynamoDbStore::connect).
///
/// A table of the same name with another key schema is reported as
/// [`Error::CorruptRecord`] naming the table, and left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// The table does not exist and `create_table` is off.
    #[error(
        "table {table:?} does not exist: create it with `create_table=true` in the URL, \
         DynamoDbStore::create_table_if_missing, or your infrastructure code \
         (key schema: lease (S) HASH, sk (S) RANGE)"
    )]
    Missing {
        /// The table.
        table: String,
    },
    /// The table did not become `ACTIVE` in time (it is being created, updated or deleted).
    #[error("table {table:?} is {status}, not ACTIVE, after waiting {}", leasehold_core::time::Human(*waited))]
    NotActive {
        /// The table.
        table: String,
        /// Its status.
        status: String,
        /// How long we waited.
        waited: Duration,
    },
    /// No credentials are configured and the standard AWS chain is not compiled in.
    #[error(
        "no credentials: give access_key_id and secret_access_key in the URL, or enable the \
         `aws-config` feature of leasehold-dynamodb for the standard AWS credential chain"
    )]
    NoCredentials,
    /// No region is configured and the standard AWS chain is not compiled in or found none.
    #[error(
        "no region: give region=... in the URL, or enable the `aws-config` feature of \
         leasehold-dynamodb and set AWS_REGION or a profile"
    )]
    NoRegion,
}

impl TableError {
    /// As the [`Error::Refused`] of `connect`.
    pub(crate) fn refused(self) -> Error {
        Error::refused_because(STORE, "connect", self.to_string(), self)
    }
}

/// A condition failed: the item was not what the request required.
pub(crate) fn is_condition_failed<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|code| code == "ConditionalCheckFailedException")
}

/// The service's "no such table".
pub(crate) fn is_missing_table<E: ProvideErrorMetadata, R>(error: &SdkError<E, R>) -> bool {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|code| code == "ResourceNotFoundException")
}

/// Service error codes that no retry fixes: the credentials or the permissions.
const REFUSED: &[&str] = &[
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "IncompleteSignatureException",
    "MissingAuthenticationTokenException",
    "ExpiredTokenException",
    "InvalidClientTokenId",
];

/// Service error codes of a busy or failing service: the request may be retried.
const TRANSIENT: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "LimitExceededException",
];

/// Maps a failed request: what may have been applied (connection trouble, timeouts, throttling,
/// server errors) is transient; refused credentials and permissions are [`Error::Refused`];
/// everything else is definite.
pub(crate) fn map<E>(error: SdkError<E, HttpResponse>, operation: &'static str, timeout: Duration) -> Error
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let described = Described::new(operation, &error);
    match &error {
        SdkError::TimeoutError(_) => {
            return Error::Timeout {
                store: STORE,
                operation,
                after: timeout,
            };
        }
        SdkError::DispatchFailure(failure) if failure.is_timeout() => {
            return Error::Timeout {
                store: STORE,
                operation,
                after: timeout,
            };
        }
        SdkError::DispatchFailure(failure) if failure.is_user() => return Error::store(STORE, described),
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => return Error::unreachable(STORE, described),
        SdkError::ConstructionFailure(_) => return Error::store(STORE, described),
        _ => {}
    }
    let code = error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .unwrap_or_default();
    let status = error.raw_response().map(|r| r.status().as_u16()).unwrap_or_default();
    if REFUSED.contains(&code) || status == 403 {
        Error::refused_because(STORE, operation, described.reason.clone(), described)
    } else if TRANSIENT.contains(&code) || status >= 500 {
        Error::unreachable(STORE, described)
    } else {
        Error::store(STORE, described)
    }
}

/// Whether a request reached something that answered, but not as DynamoDB: the connection
/// closed before a response, or the response could not be read.
pub(crate) fn is_foreign_answer<E, R>(error: &SdkError<E, R>) -> bool {
    match error {
        SdkError::DispatchFailure(failure) => failure.is_other(),
        SdkError::ResponseError(_) => true,
        _ => false,
    }
}

/// A failed request in one line: `describe_table: UnrecognizedClientException: The security
/// token included in the request is invalid. (check ...) (request id ...)`. The SDK's own
/// `Display` says only "service error", and its `Debug` is a page. Credentials never appear in
/// SDK errors.
#[derive(Debug)]
pub(crate) struct Described {
    operation: &'static str,
    /// Everything but the operation.
    pub(crate) reason: String,
}

impl Described {
    pub(crate) fn new<E, R>(operation: &'static str, error: &SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + StdError + 'static,
        R: fmt::Debug + 'static,
    {
        let mut reason = match error {
            SdkError::ServiceError(_) => {
                let meta = error.as_service_error().map(ProvideErrorMetadata::meta);
                let code = meta.and_then(|m| m.code()).unwrap_or("an unknown error");
                let message = meta.and_then(|m| m.message()).map(first_line).unwrap_or_default();
                let hint = if REFUSED.contains(&code) {
                    " (check access_key_id, secret_access_key, session_token and region, or the IAM policy)"
                } else {
                    ""
                };
                if message.is_empty() {
                    format!("{code}{hint}")
                } else {
                    format!("{code}: {message}{hint}")
                }
            }
            SdkError::DispatchFailure(failure) if failure.is_io() => {
                format!(
                    "{} (check the endpoint and that the service is up)",
                    leasehold_core::innermost_message(error)
                )
            }
            _ => leasehold_core::innermost_message(error),
        };
        if let Some(id) = error.as_service_error().and_then(|e| e.meta().request_id()) {
            reason.push_str(&format!(" (request id {id})"));
        }
        Described { operation, reason }
    }
}

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.operation, self.reason)
    }
}

impl StdError for Described {}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().chars().take(300).collect()
}
