//! The secured test servers (`scripts/services up etcd-tls postgres-tls redis-tls mariadb-tls
//! azurite-tls zookeeper-auth`, see `scripts/secured.bash`): what a backend's client must make of them.
//!
//! [`secured!`](crate::secured!) runs, per secured server, a small section of the suite:
//! election, handover and failover over TLS with the least-privilege user; each wrong setting
//! (CA, host, expired client certificate, password, privilege) refused at `connect` or at the
//! first request with [`Error::Refused`](leasehold_core::Error::Refused) naming what to check,
//! in one line; and no secret in any error, log line, `Debug` output or metric label.

use std::sync::Arc;

use crate::backend::Backend;

pub mod capture;

/// A secured server and what must be refused there.
pub struct Secured {
    /// Clients with TLS and the least-privilege user (faulty ones through the proxy).
    pub backend: Arc<dyn Backend>,
    /// What must show nowhere: the password (as written and as escaped in the URL) and the
    /// body of the client's private key.
    pub secrets: Vec<String>,
    /// URLs each with one thing wrong.
    pub refusals: Vec<Refusal>,
}

impl std::fmt::Debug for Secured {
    /// The secrets and the URLs (which hold the password) do not show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secured")
            .field("backend", &self.backend)
            .field("refusals", &self.refusals)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Refusal {
    /// The URL (which may hold the password) does not show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusal")
            .field("what", &self.what)
            .field("says", &self.says)
            .finish_non_exhaustive()
    }
}

/// A URL with one thing wrong, and what its error must name.
pub struct Refusal {
    /// What is wrong, e.g. `"wrong CA"`.
    pub what: &'static str,
    /// The URL.
    pub url: String,
    /// A part of the error's one line, e.g. `"check ca="`.
    pub says: &'static str,
}

/// The settings every TLS server shares: the good URL and the `LEASEHOLD_PKI_DIR`.
#[derive(Debug)]
pub struct Tls {
    /// The good URL (it holds the password).
    pub url: String,
    /// The directory of the private CA and the certificates (`scripts/secured.bash`).
    pub pki: String,
}

impl Tls {
    /// The URL in `url_var` and the `LEASEHOLD_PKI_DIR`; `None` (after the loud message of
    /// [`require_server`](crate::require_server)) when `service` is not running.
    pub fn from_env(service: &str, url_var: &str) -> Option<Tls> {
        let url = crate::backend::require_server(service, url_var)?;
        let pki = crate::configured_url("LEASEHOLD_PKI_DIR")?;
        Some(Tls { url, pki })
    }

    /// The refusals of TLS itself: a CA that signed nothing here, a host the server's
    /// certificate does not name (it names 127.0.0.1; the server also listens on 127.0.0.2),
    /// a client certificate that has expired.
    pub fn refusals(&self) -> Vec<Refusal> {
        let pki = &self.pki;
        vec![
            Refusal {
                what: "wrong CA",
                url: self
                    .url
                    .replace(&format!("{pki}/ca.pem"), &format!("{pki}/other-ca.pem")),
                says: "check ca=",
            },
            Refusal {
                what: "wrong host",
                url: self.url.replacen("127.0.0.1:", "127.0.0.2:", 1),
                says: "not valid for the host",
            },
            Refusal {
                what: "expired client certificate",
                url: self
                    .url
                    .replace(&format!("{pki}/client.pem"), &format!("{pki}/expired.pem"))
                    .replace(&format!("{pki}/client.key"), &format!("{pki}/expired.key")),
                says: "check cert=",
            },
        ]
    }

    /// The body of the client's private key (its first base64 line): it must show nowhere.
    pub fn key_body(&self) -> String {
        let path = format!("{}/client.key", self.pki);
        let pem = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        pem.lines()
            .find(|l| !l.starts_with("-----") && !l.is_empty())
            .unwrap_or_else(|| panic!("{path} has no body"))
            .to_string()
    }
}

/// A client backend of the secured section at `url`, its stores made by `connect`; it writes
/// no garbage (`corrupt` is not part of the section).
pub fn secured_backend(
    name: &'static str,
    url: &str,
    connect: impl Fn(
        String,
    )
        -> futures::future::BoxFuture<'static, leasehold_core::Result<Arc<dyn leasehold_core::LeaseStore>>>
    + Send
    + Sync
    + 'static,
) -> Option<Arc<dyn Backend>> {
    let corrupt = move |_| -> futures::future::BoxFuture<'static, leasehold_core::Result<()>> {
        Box::pin(async move {
            Err(leasehold_core::Error::Unsupported {
                store: name,
                operation: "corrupt (not part of the secured section)",
            })
        })
    };
    let upstream = crate::host_port(url)?;
    Some(Arc::new(crate::server::ServerBackend::new(
        name, url, upstream, connect, corrupt,
    )))
}

/// The users of a TLS server with a password: the store's (whose password is in
/// `password_var`) and a read-only one (its URL in `readonly_var`), and what their refusals say.
#[derive(Debug)]
pub struct Users {
    /// The variable holding the store's user's password.
    pub password_var: &'static str,
    /// The variable holding the read-only user's URL.
    pub readonly_var: &'static str,
    /// What a wrong password's error names.
    pub wrong_password_says: &'static str,
    /// The read-only user (`"read-only role"`, ...) and what its refusal names.
    pub readonly: (&'static str, &'static str),
}

impl Tls {
    /// The secured section of `backend` (its clients use [`Tls::url`](Tls)): the TLS refusals,
    /// a wrong password, the read-only user; the password and the client key as secrets.
    pub fn with_users(self, backend: Arc<dyn Backend>, users: Users) -> Option<Secured> {
        let mut secrets = password_secrets(users.password_var)?;
        let readonly = crate::configured_url(users.readonly_var)?;
        let mut refusals = self.refusals();
        refusals.push(Refusal {
            what: "wrong password",
            url: self.url.replacen(&secrets[1], "wrong-password", 1),
            says: users.wrong_password_says,
        });
        refusals.push(Refusal {
            what: users.readonly.0,
            url: readonly,
            says: users.readonly.1,
        });
        secrets.push(self.key_body());
        Some(Secured {
            backend,
            secrets,
            refusals,
        })
    }
}

/// The password's secrets: as written, and as the URL escapes it (`@` and `/`, as
/// scripts/secured.bash does), in that order.
pub fn password_secrets(password_var: &str) -> Option<Vec<String>> {
    let password = crate::configured_url(password_var)?;
    let escaped = password.replace('@', "%40").replace('/', "%2F");
    Some(vec![password, escaped])
}

/// Expands to a module `$name` with the secured section of the suite against `$secured`, an
/// `Option<`[`Secured`]`>` (see [`secured`](mod@crate::secured); e.g.
/// `secured!(etcd_tls, etcd_tls())` with the store's own factory beside it; items of the
/// enclosing module are in scope): a handful of tests, short TTLs. With `None` each test skips
/// (fails under `CI=true`).
#[macro_export]
macro_rules! secured {
    ($name:ident, $secured:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::__private::tokio;

            fn secured() -> ::std::option::Option<$crate::secured::Secured> {
                $secured
            }

            $crate::__secured_tests! {
                elected_secured: |s: $crate::secured::Secured| $crate::scenarios::acquire_release_reacquire(s.backend),
                handover_secured: |s: $crate::secured::Secured| $crate::scenarios::graceful_release_fast_handover(s.backend),
                failover_secured: |s: $crate::secured::Secured| $crate::scenarios::crash_successor_after_valid_until(s.backend),
                refusals_name_what_to_check: |s: $crate::secured::Secured| $crate::scenarios::secured::refusals_name_what_to_check(s),
                no_secret_in_errors_logs_debug_or_metrics: |s: $crate::secured::Secured| $crate::scenarios::secured::no_secret_in_errors_logs_debug_or_metrics(s),
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __secured_tests {
    ($($test:ident: $run:expr),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some(secured) = secured() else {
                eprintln!("SKIPPED: {}::{}", module_path!(), stringify!($test));
                return;
            };
            ($run)(secured).await;
        }
    )*};
}
