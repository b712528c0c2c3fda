//! Azure SDK errors as one line a person can read (operation, status, the service's error code
//! and the first line of its message, what to check), sorted into what the store acts on.

use std::error::Error as StdError;
use std::fmt;

use azure_core::error::ErrorKind;
use leasehold_core::Error;

pub(crate) const STORE: &str = "azure";

/// An Azure request that failed, as leasehold reports it: the operation, the HTTP status, the
/// service's error code and the first line of its message (never the XML body), or what went
/// wrong on the way there. Nothing secret: request URLs are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AzureError {
    /// The blob operation, e.g. `"acquire_lease"`.
    pub operation: &'static str,
    /// The HTTP status, if the service answered.
    pub status: Option<u16>,
    /// The service's error code, e.g. `LeaseAlreadyPresent`.
    pub code: Option<String>,
    /// The service's message (its first line), or the transport's.
    pub message: String,
    /// The blob service endpoint (without query), named when it could not be reached.
    pub endpoint: String,
}

impl AzureError {
    /// What to check, for the failures a person has to fix.
    fn hint(&self) -> Option<&'static str> {
        match (self.status, self.code.as_deref()) {
            (Some(401 | 403), _) => Some(
                "check the credential: the SAS (its sig, expiry se= and permissions sp=racwl), the account_key, \
                 or the identity's role on the container",
            ),
            (_, Some("ContainerNotFound")) => Some("check the container name"),
            (Some(400), Some("InvalidQueryParameterValue" | "InvalidHeaderValue")) => {
                Some("check the SAS: a parameter is malformed")
            }
            (None, _) => Some("check the endpoint and that the service is up"),
            _ => None,
        }
    }
}

impl fmt::Display for AzureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.operation, self.reason())
    }
}

impl AzureError {
    /// The description without the operation: status, code, message, what to check.
    pub(crate) fn reason(&self) -> String {
        let mut text = String::new();
        if let Some(status) = self.status {
            text.push_str(&format!("HTTP {status}"));
        }
        if let Some(code) = &self.code {
            text.push_str(&format!(" {code}"));
        }
        if self.status.is_none() {
            text.push_str(&format!("cannot reach {}", self.endpoint));
        }
        if !self.message.is_empty() {
            text.push_str(&format!(": {}", self.message));
        }
        if let Some(hint) = self.hint() {
            text.push_str(&format!(" ({hint})"));
        }
        text
    }
}

impl StdError for AzureError {}

/// A failed request, sorted by what the store does with it.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// 404: the blob (or container) does not exist.
    NotFound(AzureError),
    /// 409 or 412: a lease or precondition says no; the answer to a compare-and-set.
    Conflict(AzureError),
    /// Anything else, already a leasehold error (transient or not).
    Failed(Error),
}

impl Refusal {
    pub(crate) fn from_sdk(operation: &'static str, error: &azure_core::Error, endpoint: &url::Url) -> Refusal {
        // A TLS handshake that failed (the server's certificate, our trust in it) fails again.
        if let Some(why) = leasehold_core::tls::refusal(error) {
            let endpoint = without_urls(endpoint.as_str());
            return Refusal::Failed(Error::refused(STORE, operation, format!("{why} (endpoint {endpoint})")));
        }
        let detail = describe(operation, error, endpoint);
        match (error.kind(), detail.status) {
            (_, Some(404)) => Refusal::NotFound(detail),
            (_, Some(409 | 412)) => Refusal::Conflict(detail),
            // Wrong or expired credentials, missing permissions: nothing a retry fixes.
            (_, Some(401 | 403)) => Refusal::Failed(refused(operation, detail)),
            (_, Some(408 | 429 | 500 | 502 | 503 | 504)) => Refusal::Failed(Error::unreachable(STORE, detail)),
            (ErrorKind::Io | ErrorKind::Connection, _) => Refusal::Failed(Error::unreachable(STORE, detail)),
            _ => Refusal::Failed(Error::store(STORE, detail)),
        }
    }

    /// The failure as a leasehold error, for operations where a 404 or 409 is not expected.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Refusal::NotFound(e) | Refusal::Conflict(e) => Error::store(STORE, e),
            Refusal::Failed(e) => e,
        }
    }
}

/// A permanent refusal: the credential or the permissions, or something that is not an Azure
/// blob service at the endpoint.
pub(crate) fn refused(operation: &'static str, detail: AzureError) -> Error {
    Error::refused_because(STORE, operation, detail.reason(), detail)
}

/// The one-line description of an SDK error.
pub(crate) fn describe(operation: &'static str, error: &azure_core::Error, endpoint: &url::Url) -> AzureError {
    let endpoint = without_urls(endpoint.as_str());
    match error.kind() {
        ErrorKind::HttpResponse {
            status,
            error_code,
            raw_response,
        } => {
            let body = raw_response
                .as_ref()
                .map(|raw| String::from_utf8_lossy(raw.body().as_ref()).into_owned())
                .unwrap_or_default();
            let code = error_code.clone().or_else(|| xml_element(&body, "Code"));
            let message = xml_element(&body, "Message").unwrap_or_default();
            AzureError {
                operation,
                status: Some(u16::from(*status)),
                code,
                message,
                endpoint,
            }
        }
        _ => AzureError {
            operation,
            status: None,
            code: None,
            message: innermost(error),
            endpoint,
        },
    }
}

/// Whether the request reached a server whose answer broke off (the connection closed before a
/// response, or what came back was not HTTP), rather than never reaching one.
pub(crate) fn broke_after_sending(error: &azure_core::Error) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(inner) = source {
        if let Some(http) = inner.downcast_ref::<reqwest::Error>() {
            return !(http.is_connect() || http.is_timeout())
                && (http.is_request() || http.is_body() || http.is_decode());
        }
        source = inner.source();
    }
    false
}

/// The first line of the text of `<name>` in an XML error body, if there is one.
fn xml_element(body: &str, name: &str) -> Option<String> {
    let start = body.find(&format!("<{name}>"))? + name.len() + 2;
    let end = body[start..].find(&format!("</{name}>"))? + start;
    let text = body[start..end].lines().next().unwrap_or_default().trim();
    let text: String = text.chars().take(300).collect();
    (!text.is_empty()).then_some(text)
}

/// The most specific message in an error's chain (`Connection refused (os error 111)` rather
/// than `failed to execute request`), without any URL (it would carry the SAS).
fn innermost(error: &(dyn StdError + 'static)) -> String {
    let mut texts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(inner) = source {
        texts.push(inner.to_string());
        source = inner.source();
    }
    let best = texts
        .iter()
        .rev()
        .find(|t| !t.trim().is_empty())
        .cloned()
        .unwrap_or_default();
    without_urls(&best)
}

/// `text` with every `http(s)://...` URL replaced by its scheme, host and path (no query: a SAS
/// lives there), and any `sig=` value hidden as well.
pub(crate) fn without_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("http") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        if !(from.starts_with("http://") || from.starts_with("https://")) {
            out.push_str("http");
            rest = &from[4..];
            continue;
        }
        let end = from
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '>'))
            .unwrap_or(from.len());
        let url = &from[..end];
        out.push_str(url.split(['?', '#']).next().unwrap_or_default());
        rest = &from[end..];
    }
    out.push_str(rest);
    // Belt and braces: a signature outside a URL.
    let mut scrubbed = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find("sig=") {
        scrubbed.push_str(&rest[..at + 4]);
        scrubbed.push_str("***");
        let tail = &rest[at + 4..];
        rest = &tail[tail.find(['&', ' ', ')', '"', '\'']).unwrap_or(tail.len())..];
    }
    scrubbed.push_str(rest);
    scrubbed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_from_an_xml_body() {
        let body = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error>\n  <Code>AuthenticationFailed</Code>\n  \
                    <Message>Server failed to authenticate the request. Make sure the value of the Authorization header is formed correctly.\nRequestId:1\nTime:2026</Message>\n\
                    <AuthenticationErrorDetail>Signature did not match. String to sign used was r\nsecret</AuthenticationErrorDetail>\n</Error>";
        assert_eq!(xml_element(body, "Code").as_deref(), Some("AuthenticationFailed"));
        let message = xml_element(body, "Message").unwrap();
        assert!(message.ends_with("formed correctly."), "{message}");
        let error = AzureError {
            operation: "get_properties",
            status: Some(403),
            code: Some("AuthenticationFailed".into()),
            message,
            endpoint: "http://127.0.0.1:10000/devstoreaccount1/".into(),
        };
        let shown = error.to_string();
        assert!(
            !shown.contains('\n')
                && shown.contains("HTTP 403 AuthenticationFailed")
                && shown.contains("check the credential"),
            "{shown}"
        );
    }

    #[test]
    fn urls_lose_their_query() {
        assert_eq!(
            without_urls("error sending request for url (http://127.0.0.1:1/acct/c/b?sv=1&sig=abc%3D)"),
            "error sending request for url (http://127.0.0.1:1/acct/c/b)"
        );
        assert_eq!(
            without_urls("failed to execute `reqwest` request"),
            "failed to execute `reqwest` request"
        );
        assert_eq!(without_urls("x sig=abc&y=1 https"), "x sig=***&y=1 https");
    }
}
