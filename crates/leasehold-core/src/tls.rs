//! What a failed TLS handshake means, in one line that names what to check (feature `rustls`).
//!
//! Every backend that speaks TLS does so through rustls (etcd's tonic, Redis, sqlx), so one
//! reading serves them all: a certificate the client rejected (wrong CA, wrong host, expired)
//! or an alert from the server that rejected ours. Such a failure is permanent: retrying the
//! same handshake cannot succeed ([`Error::Refused`](crate::Error::Refused)).

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;

use rustls::{AlertDescription, CertificateError, Error as TlsError};

/// The one-line reason of a TLS failure found in `error` or its sources, or `None` when the
/// failure was not a TLS one.
///
/// ```
/// use leasehold_core::tls::refusal;
///
/// let e = std::io::Error::new(
///     std::io::ErrorKind::InvalidData,
///     rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
/// );
/// assert!(refusal(&e).unwrap().contains("check ca="));
/// assert!(refusal(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)).is_none());
/// ```
pub fn refusal(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(mut e) = next {
        // A client that keeps its cause in an `Arc` (redis) hides the cause's type behind it.
        if let Some(shared) = e.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
            e = shared.as_ref();
        }
        if let Some(tls) = e.downcast_ref::<TlsError>() {
            return Some(describe(tls));
        }
        // An `io::Error`'s `source()` skips the error it wraps: look inside, also through an
        // `io::Error` that wraps another (reqwest's connector wraps tokio-rustls's).
        let mut wrapped = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref);
        while let Some(inner) = wrapped {
            if let Some(tls) = inner.downcast_ref::<TlsError>() {
                return Some(describe(tls));
            }
            wrapped = inner.downcast_ref::<io::Error>().and_then(io::Error::get_ref);
        }
        next = e.source();
    }
    None
}

/// The one-line reason of an error that is known to be a failed TLS set-up or handshake:
/// [`refusal`]'s when rustls says why, else the error's own text (a certificate file that
/// cannot be read, ...) with the options to check.
///
/// ```
/// let e = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file: /etc/ca.pem");
/// assert_eq!(
///     leasehold_core::tls::failure(&e),
///     "TLS: no such file: /etc/ca.pem; check ca=, cert= and key="
/// );
/// ```
pub fn failure(error: &(dyn StdError + 'static)) -> String {
    refusal(error).unwrap_or_else(|| format!("TLS: {}; check ca=, cert= and key=", one_line(&error.to_string())))
}

fn describe(error: &TlsError) -> String {
    match error {
        TlsError::InvalidCertificate(why) => match why {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                "TLS: the server's certificate is not signed by a trusted CA; check ca=".into()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "TLS: the server's certificate is not valid for the host in the URL; check the host name or the server's certificate".into()
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "TLS: the server's certificate has expired; renew the server's certificate".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "TLS: the server's certificate is not valid yet; check the clocks and the certificate".into()
            }
            other => format!("TLS: the server's certificate was rejected ({other:?}); check ca= and the server's certificate"),
        },
        TlsError::AlertReceived(alert) => match alert {
            AlertDescription::CertificateExpired => {
                "TLS: the server rejected our client certificate as expired; check cert=".into()
            }
            AlertDescription::CertificateRequired => {
                "TLS: the server requires a client certificate; set cert= and key=".into()
            }
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::AccessDenied => {
                format!("TLS: the server rejected our client certificate ({alert:?}); check cert= and key=")
            }
            other => format!("TLS: the server ended the handshake ({other:?}); check the server's TLS settings"),
        },
        TlsError::NoCertificatesPresented => {
            "TLS: the server showed no certificate; check that the port speaks TLS".into()
        }
        TlsError::InvalidMessage(_) | TlsError::InappropriateHandshakeMessage { .. } => {
            "TLS: the server does not speak TLS on this port; check the URL's scheme and port".into()
        }
        other => format!("TLS: the handshake failed ({}); check ca=, cert= and key=", one_line(&other.to_string())),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_name_what_to_check() {
        for (error, says) in [
            (
                TlsError::InvalidCertificate(CertificateError::UnknownIssuer),
                "check ca=",
            ),
            (TlsError::InvalidCertificate(CertificateError::NotValidForName), "host"),
            (TlsError::InvalidCertificate(CertificateError::Expired), "expired"),
            (TlsError::AlertReceived(AlertDescription::CertificateExpired), "cert="),
            (TlsError::AlertReceived(AlertDescription::BadCertificate), "key="),
        ] {
            let wrapped = io::Error::new(io::ErrorKind::InvalidData, error);
            let text = refusal(&wrapped).expect("a TLS error");
            assert!(text.contains(says) && !text.contains('\n'), "{text}");
            let twice = io::Error::other(wrapped);
            assert_eq!(refusal(&twice).as_deref(), Some(text.as_str()));
        }
    }
}
