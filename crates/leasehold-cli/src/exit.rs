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
            _ => UNREACHABLE,
        };
        Failure::new(code, format!("cannot connect to {}: {error}", leasehold::redact(url)))
    }

    /// Prints the line and returns the exit code.
    pub(crate) fn report(self) -> i32 {
        eprintln!("leasehold: {}", self.message);
        self.code
    }
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
        Error::Unreachable { .. } | Error::Timeout { .. } => UNREACHABLE,
        Error::Unsupported { .. } => UNSUPPORTED,
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
