//! Azure SDK errors, sorted into what the store acts on, with secrets scrubbed.

use std::fmt;

use azure_core::error::ErrorKind;
use leasehold_core::Error;

use crate::config::scrub;
use crate::record::STORE;

/// An Azure request that failed, as leasehold reports it: the operation, the HTTP status and the
/// service's error code, and the client's message with any SAS removed.
#[derive(Debug)]
pub struct AzureError {
    /// The blob operation, e.g. `"acquire_lease"`.
    pub operation: &'static str,
    /// The HTTP status, if the service answered.
    pub status: Option<u16>,
    /// The service's error code, e.g. `LeaseAlreadyPresent`.
    pub code: Option<String>,
    /// The client's message, scrubbed of secrets.
    pub message: String,
}

impl fmt::Display for AzureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.operation)?;
        if let Some(status) = self.status {
            write!(f, ": HTTP {status}")?;
        }
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for AzureError {}

/// What a failed request means to the store.
#[derive(Debug)]
pub(crate) enum Failure {
    /// 404: the blob (or container) does not exist.
    NotFound(AzureError),
    /// 409 or 412: a lease or precondition says no; the answer to a compare-and-set.
    Conflict(AzureError),
    /// Anything else, already a leasehold error (transient or not).
    Other(Error),
}

impl Failure {
    pub(crate) fn from_sdk(operation: &'static str, error: &azure_core::Error, secrets: &[String]) -> Failure {
        let (status, code) = match error.kind() {
            ErrorKind::HttpResponse { status, error_code, .. } => (Some(u16::from(*status)), error_code.clone()),
            _ => (None, None),
        };
        let detail = AzureError {
            operation,
            status,
            code,
            message: scrub(&error.to_string(), secrets),
        };
        match (error.kind(), status) {
            (_, Some(404)) => Failure::NotFound(detail),
            (_, Some(409 | 412)) => Failure::Conflict(detail),
            (_, Some(408 | 429 | 500 | 502 | 503 | 504)) => Failure::Other(Error::unreachable(STORE, detail)),
            (ErrorKind::Io | ErrorKind::Connection, _) => Failure::Other(Error::unreachable(STORE, detail)),
            _ => Failure::Other(Error::store(STORE, detail)),
        }
    }

    /// The failure as a leasehold error, for operations where a 404 or 409 is not expected.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::NotFound(e) | Failure::Conflict(e) => Error::store(STORE, e),
            Failure::Other(e) => e,
        }
    }
}
