//! How DynamoDB's answers become leasehold errors.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::RequestId;
use leasehold_core::Error;

pub(crate) const STORE: &str = "dynamodb";

/// Why the lease table cannot be used: the source of an [`Error::Store`] from
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
    #[error("table {table:?} is {status}, not ACTIVE, after waiting {waited:?}")]
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

/// Maps a failed request: what may have been applied (connection trouble, timeouts, throttling,
/// server errors) is transient; everything else is definite.
pub(crate) fn map<E>(error: SdkError<E, HttpResponse>, operation: &'static str, timeout: Duration) -> Error
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
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
        SdkError::DispatchFailure(failure) if failure.is_user() => {
            return Error::store(STORE, Described::new(operation, &error));
        }
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            return Error::unreachable(STORE, Described::new(operation, &error));
        }
        SdkError::ConstructionFailure(_) => return Error::store(STORE, Described::new(operation, &error)),
        _ => {}
    }
    let code = error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .unwrap_or_default();
    let status = error.raw_response().map(|r| r.status().as_u16()).unwrap_or_default();
    let transient = matches!(
        code,
        "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "InternalServerError"
            | "ServiceUnavailable"
            | "TransactionConflictException"
            | "LimitExceededException"
    ) || status >= 500;
    if transient {
        Error::unreachable(STORE, Described::new(operation, &error))
    } else {
        Error::store(STORE, Described::new(operation, &error))
    }
}

/// A client error described in full (the SDK's own `Display` says only "service error"), with
/// the operation. Credentials never appear in SDK errors.
#[derive(Debug)]
pub(crate) struct Described {
    text: String,
}

impl Described {
    fn new<E, R>(operation: &'static str, error: &SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + StdError + 'static,
        R: fmt::Debug,
    {
        let mut text = format!("{operation}: {}", DisplayErrorContext(error));
        if let Some(id) = error.as_service_error().and_then(|e| e.meta().request_id()) {
            text.push_str(&format!(" (request id {id})"));
        }
        Described { text }
    }
}

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl StdError for Described {}
