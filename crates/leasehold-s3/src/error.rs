//! How S3's answers become leasehold errors: one line each, naming the operation, the HTTP
//! status, the service's error code and message (or the transport's innermost cause), and what
//! to check. A lost race (412, or 404 to a write on `If-Match`) is no error: the store answers
//! it as `Held` or `Lost`.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::RequestId;
use leasehold_core::Error;

pub(crate) const STORE: &str = "s3";

/// Why the bucket cannot be used: the source of the [`Error::Refused`] from
/// [`S3Store::connect`](crate::S3Store::connect).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The store answered a conditional write as if it had no condition: it cannot keep a lease.
    #[error(
        "the store does not honour conditional writes: {what}; leasehold needs PutObject with \
         If-None-Match: * and If-Match: <etag> (AWS S3 since 2024; see the leasehold-s3 docs for \
         stores known to honour them)"
    )]
    ConditionalWritesIgnored {
        /// Which probe the store got wrong.
        what: String,
    },
    /// The bucket does not exist and `create_bucket` is off.
    #[error(
        "bucket {bucket:?} does not exist: create it, or set `create_bucket=true` in the URL \
         (local servers)"
    )]
    BucketMissing {
        /// The bucket.
        bucket: String,
    },
    /// No credentials are configured and the standard AWS chain is not compiled in.
    #[error(
        "no credentials: give access_key_id and secret_access_key in the URL, or enable the \
         `aws-config` feature of leasehold-s3 for the standard AWS credential chain"
    )]
    NoCredentials,
    /// No region is configured and the standard AWS chain is not compiled in or found none.
    #[error(
        "no region: give region=... in the URL, or enable the `aws-config` feature of \
         leasehold-s3 and set AWS_REGION or a profile"
    )]
    NoRegion,
}

impl ConnectError {
    /// As the [`Error::Refused`] of `connect`.
    pub(crate) fn refused(self) -> Error {
        Error::refused_because(STORE, "connect", self.to_string(), self)
    }
}

/// The HTTP status of a failed request, 0 when none arrived.
pub(crate) fn status<E>(error: &SdkError<E, HttpResponse>) -> u16 {
    error.raw_response().map(|r| r.status().as_u16()).unwrap_or_default()
}

/// A write's condition failed: 412, or 404 to a write on `If-Match` (the object is gone).
pub(crate) fn is_lost_race<E>(error: &SdkError<E, HttpResponse>, if_match: bool) -> bool {
    match status(error) {
        412 => true,
        404 => if_match,
        _ => false,
    }
}

/// The object (or the bucket) is not there.
pub(crate) fn is_not_found<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> bool {
    status(error) == 404 || code(error) == "NoSuchKey"
}

/// The bucket is not there.
pub(crate) fn is_missing_bucket<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> bool {
    code(error) == "NoSuchBucket"
}

fn code<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> &str {
    error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .unwrap_or_default()
}

/// Service error codes that no retry fixes: the credentials or the permissions.
const REFUSED: &[&str] = &[
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccountProblem",
    "InvalidSecurity",
];

/// Service error codes of a busy or failing service, or of a write that raced another and was
/// not applied: the request may be retried.
const TRANSIENT: &[&str] = &[
    "ConditionalRequestConflict",
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "OperationAborted",
];

/// Maps a failed request: what may have been applied (connection trouble, timeouts, throttling,
/// server errors) and 409 `ConditionalRequestConflict` (a concurrent write won; try again) are
/// transient; 403 and refused credentials are [`Error::Refused`] saying what to check; a
/// missing bucket is [`Error::Refused`] naming it; everything else is definite.
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
    let code = code(&error);
    let status = status(&error);
    if is_missing_bucket(&error) || REFUSED.contains(&code) || status == 403 {
        Error::refused_because(STORE, operation, described.reason.clone(), described)
    } else if TRANSIENT.contains(&code) || status == 409 || status == 429 || status >= 500 {
        Error::unreachable(STORE, described)
    } else {
        Error::store(STORE, described)
    }
}

/// A failed request in one line: `put_object: HTTP 403 AccessDenied: Access Denied (check ...)
/// (request id ...)`. The SDK's own `Display` says only "service error", and its `Debug` is a
/// page. Credentials never appear in SDK errors.
#[derive(Debug)]
pub(crate) struct Described {
    operation: &'static str,
    /// Everything but the operation.
    pub(crate) reason: String,
}

impl Described {
    pub(crate) fn new<E>(operation: &'static str, error: &SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + StdError + 'static,
    {
        let mut reason = match error {
            SdkError::ServiceError(_) => {
                let status = status(error);
                let meta = error.as_service_error().map(ProvideErrorMetadata::meta);
                let code = meta.and_then(|m| m.code()).unwrap_or("an unknown error");
                let message = meta.and_then(|m| m.message()).map(first_line).unwrap_or_default();
                let hint = if code == "NoSuchBucket" {
                    " (check the bucket name, or set create_bucket=true for a local server)"
                } else if REFUSED.contains(&code) || status == 403 {
                    " (check access_key_id, secret_access_key, session_token and region, and that the \
                     policy allows s3:GetObject, s3:PutObject, s3:ListBucket and s3:DeleteObject on the prefix)"
                } else if code == "ConditionalRequestConflict" {
                    " (a concurrent conditional write to the same key; try again)"
                } else {
                    ""
                };
                let code = if code == "an unknown error" && status == 403 {
                    "Forbidden"
                } else {
                    code
                };
                if message.is_empty() {
                    format!("HTTP {status} {code}{hint}")
                } else {
                    format!("HTTP {status} {code}: {message}{hint}")
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
