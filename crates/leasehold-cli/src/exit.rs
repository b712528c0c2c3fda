//! Exit codes, and the one line printed for a failure.

use std::fmt::Display;

use leasehold::Error;

/// A runtime error: the store failed mid-operation, a record is corrupt, ...
pub(crate) const RUNTIME: i32 = 1;
/// A usage or configuration error: bad arguments, a bad URL, an unknown scheme, a bad lease name,
/// timing that does not fit. (clap's own usage errors exit with 2 as well.)
pub(crate) const USAGE: i32 = 2;
/// The store could not be reached or opened.
pub(crate) const UNREACHABLE: i32 = 3;
/// The store does not support the operation (e.g. breaking a lease).
pub(crate) const UNSUPPORTED: i32 = 4;
/// `run --wait`: not elected in time; the command was not run.
pub(crate) const NOT_ELECTED: i32 = 5;
/// The store refused: the credentials or the permissions (a wrong password, key or SAS token, a
/// user without the rights), or it is not the service the URL names, or a table or container
/// is missing and may not be created ([`Error::Refused`]). Retrying will not help until someone
/// fixes it.
pub(crate) const AUTH: i32 = 6;
/// `run --http ADDR`: the address cannot be listened on (in use, not permitted, not local).
pub(crate) const LISTEN: i32 = 7;
/// `handover`: nobody holds the lease, so there is nothing to hand over.
pub(crate) const NOBODY_HOLDS: i32 = 8;
/// `handover`: the successor did not take the lease: not within `--within`, another candidate
/// took it, or another handover is in progress.
pub(crate) const NOT_HANDED_OVER: i32 = 9;
/// `run`: the command cannot be executed (shell convention).
pub(crate) const NOT_EXECUTABLE: i32 = 126;
/// `run`: the command was not found (shell convention).
pub(crate) const NOT_FOUND: i32 = 127;

/// Why the `leasehold` command failed: an exit code and one line for stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: i32,
    message: String,
}

impl Failure {
    pub(crate) fn new(code: i32, message: impl Display) -> Self {
        // One line, whatever the cause's text holds.
        let message = message.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        Failure { code, message }
    }

    pub(crate) fn usage(message: impl Display) -> Self {
        Failure::new(USAGE, message)
    }

    pub(crate) fn runtime(message: impl Display) -> Self {
        Failure::new(RUNTIME, message)
    }

    /// A failed store operation: `context` says what was being done.
    pub(crate) fn store(context: impl Display, error: &Error) -> Self {
        Failure::new(code_of(error), format!("{context}: {error}"))
    }

    /// A failed `leasehold::connect`: anything but a bad URL or configuration means the store
    /// could not be reached or opened.
    pub(crate) fn connect(url: &str, error: &Error) -> Self {
        let code = match code_of(error) {
            USAGE => USAGE,
            AUTH => AUTH,
            _ => UNREACHABLE,
        };
        Failure::new(code, format!("cannot connect to {}: {error}", leasehold::redact(url)))
    }

    /// The line, without the `leasehold: ` in front.
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// Prints the line and returns the exit code.
    pub(crate) fn report(self) -> i32 {
        crate::output::log(&self.message);
        self.code
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether an error's text (with its sources) says that the store refused the credentials or
/// the permissions, as each backend's client words it: Postgres SQLSTATE 28xxx and 42501,
/// Redis `WRONGPASS`/`NOAUTH`/`NOPERM`, etcd and gRPC `Unauthenticated`/`PermissionDenied`,
/// ZooKeeper `AuthFailed`/`NoAuth`, DynamoDB `AccessDenied`/`UnrecognizedClient`/signature and
/// token errors, Azure HTTP 401/403 (`AuthenticationFailed`, `AuthorizationFailure`), and
/// "permission denied"/"read-only" from the file system (SQLite).
///
/// Backends report these as [`Error::Refused`] (checked first); the text is read as well for
/// client errors a backend still passes through as [`Error::Store`] or [`Error::Unreachable`].
pub(crate) fn is_auth_failure(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    const WORDS: &[&str] = &[
        "password authentication failed",
        "authentication failed",
        "authenticationfailed",
        "authorizationfailure",
        "authorizationpermissionmismatch",
        "not authorized",
        "unauthorized",
        "unauthenticated",
        "permission denied",
        "permissiondenied",
        "access denied",
        "accessdenied",
        "wrongpass",
        "noauth",
        "noperm",
        "no permissions to run",
        "can't run this command",
        "authfailed",
        "auth failed",
        "invalid auth token",
        "invalidsignature",
        "signaturedoesnotmatch",
        "unrecognizedclient",
        "security token included in the request is invalid",
        "expiredtoken",
        "no pg_hba.conf entry",
        "insufficient_privilege",
        "must be owner of",
        "readonly database",
        "read-only file system",
        "forbidden",
        "(28p01)",
        "(28000)",
        "(42501)",
        "sqlstate 28p01",
        "sqlstate 28000",
        "sqlstate 42501",
    ];
    if WORDS.iter().any(|w| text.contains(w)) {
        return true;
    }
    // HTTP status codes, only where they are named as such.
    ["401", "403"].iter().any(|code| {
        text.contains(&format!("status {code}"))
            || text.contains(&format!("status: {code}"))
            || text.contains(&format!("status code {code}"))
            || text.contains(&format!("statuscode: {code}"))
            || text.contains(&format!("http {code}"))
            || text.contains(&format!("{code} forbidden"))
            || text.contains(&format!("{code} unauthorized"))
    })
}

/// The text of `error` and of every source under it.
fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The exit code for a store or configuration error.
pub(crate) fn code_of(error: &Error) -> i32 {
    match error {
        Error::InvalidLeaseName { .. }
        | Error::InvalidCandidateId { .. }
        | Error::InvalidTtl { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidUrl { .. }
        | Error::UnsupportedScheme { .. } => USAGE,
        Error::Unsupported { .. } => UNSUPPORTED,
        // The store refused: credentials, permissions, another service on that port, a missing
        // table or container. Retrying will not help until someone fixes it.
        Error::Refused { .. } => AUTH,
        Error::Unreachable { .. } | Error::Store { .. } | Error::Timeout { .. } | Error::NotLeader { .. }
            if is_auth_failure(&chain_text(error)) =>
        {
            AUTH
        }
        Error::Unreachable { .. } | Error::Timeout { .. } => UNREACHABLE,
        _ => RUNTIME,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_by_kind() {
        let bad_url = Error::InvalidUrl {
            url: "x".into(),
            reason: "y".into(),
        };
        assert_eq!(Failure::connect("x", &bad_url).code, USAGE);
        let unreachable = Error::unreachable("redis", "connection refused");
        assert_eq!(Failure::connect("redis://h", &unreachable).code, UNREACHABLE);
        let open = Error::store("sqlite", "cannot open /x/y.db for writing");
        assert_eq!(Failure::connect("sqlite:///x/y.db", &open).code, UNREACHABLE);
        assert_eq!(code_of(&open), RUNTIME);
        assert_eq!(
            code_of(&Error::Unsupported {
                store: "redis",
                operation: "break_lease"
            }),
            UNSUPPORTED
        );
        // Typed: no words to match.
        let refused = Error::refused("postgres", "connect", "the server at 127.0.0.1:6379 is not Postgres");
        assert_eq!(code_of(&refused), AUTH);
        assert_eq!(Failure::connect("postgres://h", &refused).code, AUTH);
    }

    #[test]
    fn authentication_and_permission_failures_have_their_own_code() {
        let cases = [
            "password authentication failed for user \"app\"",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User app has no permissions to run the 'eval' command",
            "ResponseError: The user executing the script can't run this command or subcommand script: 6d31ee",
            "status: PermissionDenied, message: \"etcdserver: permission denied\"",
            "AuthFailed",
            "service error: AccessDeniedException: User is not authorized",
            "UnrecognizedClientException: The security token included in the request is invalid.",
            "HTTP status 403 (AuthenticationFailed): Server failed to authenticate the request",
            "attempt to write a readonly database",
        ];
        for text in cases {
            let error = Error::store("x", text.to_string());
            assert_eq!(code_of(&error), AUTH, "{text}");
            assert_eq!(Failure::connect("x://h", &error).code, AUTH, "{text}");
        }
        let nested = Error::unreachable("redis", std::io::Error::other("WRONGPASS"));
        assert_eq!(code_of(&nested), AUTH);
        for text in [
            "connection refused",
            "127.0.0.1:4031: timed out",
            "no such table: leases403",
            "corrupt record",
        ] {
            assert_ne!(code_of(&Error::store("x", text.to_string())), AUTH, "{text}");
        }
    }

    #[test]
    fn messages_are_one_line_and_redacted() {
        let error = Error::unreachable("postgres", "refused\nsecond line");
        let failure = Failure::connect("postgres://app:hunter2@db/x", &error);
        assert!(!failure.message.contains('\n'), "{}", failure.message);
        assert!(!failure.message.contains("hunter2"), "{}", failure.message);
        assert!(
            failure
                .message
                .starts_with("cannot connect to postgres://app:***@db/x: "),
            "{}",
            failure.message
        );
    }
}
