//! How etcd's failures become leasehold errors: by the client's error variant and the gRPC
//! status code (never by the text of a message), each described in one line that names the
//! operation, the endpoints and what to check. The client's own `Display` dumps debug output
//! (`tonic::transport::Error(Transport, ConnectError(...))`); nothing of it is shown.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use etcd_client::Error as ClientError;
use leasehold_core::Error;
use tonic::Code;

/// The store's name in errors and metrics.
pub(crate) const STORE: &str = "etcd";

/// The operation of [`EtcdStore::connect`](crate::EtcdStore::connect) in errors.
pub(crate) const CONNECT: &str = "connect";

/// A failed etcd request, in one line.
#[derive(Debug)]
pub(crate) struct RequestError {
    operation: &'static str,
    text: String,
}

impl RequestError {
    pub(crate) fn new(operation: &'static str, text: impl Into<String>) -> Self {
        RequestError {
            operation,
            text: text.into(),
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.operation, self.text)
    }
}

impl StdError for RequestError {}

/// What a client error means for the caller.
#[derive(Debug, PartialEq, Eq)]
enum Meaning {
    /// The request may or may not have been applied: read back, retry.
    Transient,
    /// Retrying will not help until someone fixes the configuration or the server.
    Permanent,
    /// The server answered with a definite refusal of this request.
    Definite,
}

/// Converts a client error of `operation` against `endpoints` (`h1:2379,h2:2379`).
pub(crate) fn map(error: &ClientError, operation: &'static str, endpoints: &str) -> Error {
    let (meaning, text) = describe(operation, endpoints, error);
    let source = RequestError { operation, text };
    match meaning {
        Meaning::Transient => Error::unreachable(STORE, source),
        Meaning::Permanent => permanent(operation, source),
        Meaning::Definite => Error::store(STORE, source),
    }
}

/// Converts a client error of `connect`. With a client certificate, a connection that the
/// server ends right after the handshake (TLS 1.3 checks the client's certificate then: the
/// client sees an alert in an I/O error, or just a closed connection) is the server rejecting
/// that certificate, and permanent.
pub(crate) fn map_connect(error: &ClientError, endpoints: &str, client_cert: bool) -> Error {
    // (Without a client certificate, a peer that hangs up at connect is no etcd: see `Cause`.)
    let ended = match error {
        ClientError::GRpcStatus(status) => matches!(status.code(), Code::Cancelled | Code::Unknown),
        _ => matches!(
            transport_cause(error),
            Some(Cause::Io(
                io::ErrorKind::InvalidData
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::UnexpectedEof
            ))
        ),
    };
    if client_cert && ended {
        return Error::refused(
            STORE,
            CONNECT,
            format!(
                "TLS: {endpoints} ended the connection after the handshake, rejecting our client certificate; check cert= and key= (expired? signed by the CA the server trusts?)"
            ),
        );
    }
    map(error, CONNECT, endpoints)
}

/// A failure that retrying will not mend.
fn permanent(operation: &'static str, source: RequestError) -> Error {
    Error::refused(STORE, operation, source.text)
}

/// Whether the error says that an etcd lease (a session) does not exist (any more): a keepalive
/// answered with TTL 0 (the client's `LeaseKeepAliveError`, its only cause once the stream is
/// open), or a put bound to a lease etcd does not know (gRPC `NotFound`).
pub(crate) fn lease_gone(error: &ClientError) -> bool {
    match error {
        ClientError::LeaseKeepAliveError(_) => true,
        ClientError::GRpcStatus(status) => status.code() == Code::NotFound,
        _ => false,
    }
}

fn describe(operation: &str, endpoints: &str, error: &ClientError) -> (Meaning, String) {
    // A failed handshake (certificate rejected either way) is permanent: the same handshake
    // fails again. It shows as an I/O error underneath, so it is looked for first.
    if let Some(why) = tls_refusal(error) {
        return (Meaning::Permanent, format!("{why} (endpoints {endpoints})"));
    }
    if let Some(found) = transport_cause(error) {
        return found.describe(operation, endpoints);
    }
    match error {
        ClientError::GRpcStatus(status) => {
            let said = one_line(status.message());
            match status.code() {
                Code::Unauthenticated => (
                    Meaning::Permanent,
                    format!("etcd refused the credentials ({said}); check the user and password in the URL"),
                ),
                Code::PermissionDenied => (
                    Meaning::Permanent,
                    format!(
                        "etcd denied the request ({said}); check that the user's role may read and write the key prefix"
                    ),
                ),
                // While connecting, the client's only call with arguments is `Authenticate`.
                Code::InvalidArgument | Code::FailedPrecondition if operation == CONNECT => (
                    Meaning::Permanent,
                    format!("etcd refused to authenticate ({said}); check the user and password in the URL"),
                ),
                Code::Unavailable
                | Code::Unknown
                | Code::Cancelled
                | Code::Aborted
                | Code::Internal
                | Code::ResourceExhausted
                | Code::DeadlineExceeded => (
                    Meaning::Transient,
                    format!(
                        "{} ({said}) from {endpoints}; check that the cluster has a leader",
                        code_text(status.code())
                    ),
                ),
                code => (Meaning::Definite, format!("etcd answered {} ({said})", code_text(code))),
            }
        }
        ClientError::TransportError(_) | ClientError::IoError(_) => (
            Meaning::Transient,
            format!("the connection to {endpoints} failed; check that etcd runs there"),
        ),
        ClientError::WatchError(_) | ClientError::LeaseKeepAliveError(_) => (
            Meaning::Transient,
            format!("a stream to {endpoints} ended; check that the cluster has a leader"),
        ),
        ClientError::InvalidUri(_) | ClientError::EndpointError(_) => (
            Meaning::Permanent,
            format!("the endpoints {endpoints} are not valid addresses; check the URL"),
        ),
        ClientError::InvalidMetadataValue(_) => (
            Meaning::Permanent,
            "the user name or password cannot be sent as gRPC metadata; check them for control characters".into(),
        ),
        other => (
            Meaning::Definite,
            format!("the etcd client failed: {}", one_line(&other.to_string())),
        ),
    }
}

/// What broke underneath a request, found by walking the error's sources.
#[derive(Debug, PartialEq, Eq)]
enum Cause {
    Io(io::ErrorKind),
    /// The peer spoke something other than HTTP/2 (an HTTP/2 connection error from the peer).
    NotHttp2,
}

impl Cause {
    fn describe(&self, operation: &str, endpoints: &str) -> (Meaning, String) {
        match self {
            Cause::Io(io::ErrorKind::ConnectionRefused) => (
                Meaning::Transient,
                format!("{endpoints} refused the connection; check that etcd runs there and listens on that port"),
            ),
            Cause::Io(io::ErrorKind::TimedOut) => (
                Meaning::Transient,
                format!("{endpoints} did not accept a connection in time; check the address and any firewall"),
            ),
            // At connect, a peer that accepted the connection and hung up before any HTTP/2
            // answer is no etcd (which never does that): another service that answered and
            // closed while the client was still writing, or a proxy with nothing behind it. Which
            // of the two errors the client sees (this, or NotHttp2 below) is a race: both say the
            // same, so that the same address gives the same answer every time.
            Cause::Io(io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof)
                if operation == CONNECT =>
            {
                (
                    Meaning::Permanent,
                    format!(
                        "{endpoints} does not answer gRPC over HTTP/2 (it hung up); check that the URL names an etcd \
                         client port (2379), not another service or a proxy with no etcd behind it"
                    ),
                )
            }
            Cause::Io(kind) => (
                Meaning::Transient,
                format!("the connection to {endpoints} failed ({kind}); check that etcd runs there"),
            ),
            // `connect` has checked that the port speaks gRPC over HTTP/2: garbage on a
            // connection that worked is a connection that broke (bytes lost in between), and a
            // request under way may or may not have been applied.
            Cause::NotHttp2 if operation != CONNECT => (
                Meaning::Transient,
                format!("the connection to {endpoints} broke (an HTTP/2 protocol error); check the network in between"),
            ),
            Cause::NotHttp2 => (
                Meaning::Permanent,
                format!(
                    "{endpoints} does not answer gRPC over HTTP/2; check that the URL names an etcd client port (2379), not another service"
                ),
            ),
        }
    }
}

/// A failed TLS handshake under a client error: rustls's error, also where it hides as the I/O
/// error of an HTTP/2 error (whose `source` does not show it).
fn tls_refusal(error: &ClientError) -> Option<String> {
    let mut next = inner(error);
    while let Some(e) = next {
        if let Some(why) = leasehold_core::tls::refusal(e) {
            return Some(why);
        }
        if let Some(io) = e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io)
            && let Some(why) = leasehold_core::tls::refusal(io)
        {
            return Some(why);
        }
        next = e.source();
    }
    None
}

/// The error under a client error, where it has one.
fn inner(error: &ClientError) -> Option<&(dyn StdError + 'static)> {
    match error {
        ClientError::GRpcStatus(status) => status.source(),
        ClientError::TransportError(e) => Some(e),
        ClientError::IoError(e) => Some(e),
        _ => None,
    }
}

fn transport_cause(error: &ClientError) -> Option<Cause> {
    let mut next = inner(error);
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if (h2.is_go_away() || h2.is_reset())
                && let Some(reason) = h2.reason()
                && (reason == h2::Reason::FRAME_SIZE_ERROR || reason == h2::Reason::PROTOCOL_ERROR)
            {
                return Some(Cause::NotHttp2);
            }
            if let Some(io) = h2.get_io() {
                return Some(Cause::Io(io.kind()));
            }
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(Cause::Io(io.kind()));
        }
        next = e.source();
    }
    None
}

fn code_text(code: Code) -> &'static str {
    match code {
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "a timeout",
        Code::Cancelled => "cancelled",
        Code::Aborted => "aborted",
        Code::Internal => "an internal error",
        Code::ResourceExhausted => "overloaded",
        Code::NotFound => "not found",
        Code::InvalidArgument => "invalid argument",
        Code::FailedPrecondition => "failed precondition",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        _ => "an unknown error",
    }
}

/// A server's message on one line, shortened.
fn one_line(text: &str) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > 160 {
        format!("{}...", line.chars().take(160).collect::<String>())
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_gone_is_typed() {
        assert!(lease_gone(&ClientError::LeaseKeepAliveError(String::new())));
        assert!(lease_gone(&ClientError::GRpcStatus(tonic::Status::not_found("x"))));
        assert!(!lease_gone(&ClientError::GRpcStatus(tonic::Status::unavailable(
            "lease not found"
        ))));
    }

    #[test]
    fn status_codes_decide_the_kind() {
        let e = map(
            &ClientError::GRpcStatus(tonic::Status::unavailable("no leader")),
            "txn",
            "h:2379",
        );
        assert!(e.is_transient(), "{e}");
        let e = map(
            &ClientError::GRpcStatus(tonic::Status::permission_denied("etcdserver: permission denied")),
            "txn",
            "h:2379",
        );
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains("role"), "{e}");
        let e = map(
            &ClientError::GRpcStatus(tonic::Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            )),
            CONNECT,
            "h:2379",
        );
        assert!(!e.is_transient() && e.to_string().contains("password"), "{e}");
        let e = map(
            &ClientError::GRpcStatus(tonic::Status::out_of_range("x")),
            "txn",
            "h:2379",
        );
        assert!(!e.is_transient(), "{e}");
    }

    #[test]
    fn a_protocol_error_is_permanent_only_when_connecting() {
        let not_http2 = Cause::NotHttp2;
        let (meaning, text) = not_http2.describe(CONNECT, "h:2379");
        assert_eq!(meaning, Meaning::Permanent, "{text}");
        assert!(text.contains("2379"), "{text}");
        let (meaning, text) = not_http2.describe("acquire (grant)", "h:2379");
        assert_eq!(meaning, Meaning::Transient, "{text}");
        assert!(text.contains("broke"), "{text}");
    }

    #[test]
    fn messages_are_one_line() {
        let e = map(
            &ClientError::GRpcStatus(tonic::Status::unavailable("line one\nline two")),
            "txn",
            "h:2379",
        );
        assert!(!e.to_string().contains('\n'), "{e}");
        assert!(e.to_string().contains("txn"), "{e}");
    }
}
