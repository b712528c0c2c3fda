//! Which table, where, and with which credentials: `dynamodb://` URLs and their options.

use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::{Secret, StoreUrl, percent_decode, redact_url_and_user};
use leasehold_core::{Error, Result};

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["dynamodb"];

/// The default time one request may take before it fails as [`Error::Timeout`]: a backstop for
/// callers outside the engine (the engine gives up on a request at its own `request_timeout`,
/// which is shorter, so the two do not stack).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default number of operations a store has in flight at once
/// ([`DynamoDbConfig::max_in_flight`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

const MAX_IN_FLIGHT: usize = 10_000;
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const OPTIONS: &[&str] = &[
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "create_table",
    "timeout",
    "max_in_flight",
];

/// Static credentials given in the URL. `Debug` never shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticCredentials {
    /// The access key id.
    pub access_key_id: Secret,
    /// The secret access key.
    pub secret_access_key: Secret,
    /// A session token of temporary credentials.
    pub session_token: Option<Secret>,
}

/// Where the lease table is and how to reach it.
///
/// Build one with [`DynamoDbConfig::new`] and the fields, or parse a URL:
///
/// ```text
/// dynamodb://TABLE?region=eu-west-1
/// dynamodb://TABLE?endpoint=http://127.0.0.1:28000&region=us-east-1&access_key_id=AK&secret_access_key=SK&create_table=true
/// ```
///
/// Query options (values may be `%XX`-escaped; each at most once; any other is an error naming it):
///
/// - `endpoint`: the service URL, for DynamoDB Local, dynalite or a VPC endpoint. Default: the
///   regional AWS endpoint.
/// - `region`: the AWS region. Default `us-east-1` when an `endpoint` is given, otherwise the
///   standard AWS chain (feature `aws-config`).
/// - `access_key_id`, `secret_access_key` (both or neither) and `session_token`: static
///   credentials. Without them the standard AWS credential chain is used (environment, profile,
///   web identity, ECS/EC2 roles), which needs the crate feature `aws-config`.
/// - `create_table`: `true` creates the table (on-demand capacity) when it is missing. Default
///   `false`.
/// - `timeout`: how long one request may take, `30s` by default (a backstop: the engine gives up
///   at its own `request_timeout` first); a number and a unit (`500ms`, `5s`, `1m`), 10 ms to
///   10 min.
/// - `max_in_flight`: how many operations one store sends at once, 1 to 10,000; the others wait
///   their turn, renewals and releases first. Default 32.
///
/// `Debug`, `Display` and every error replace the credentials with `***`.
///
/// # Examples
///
/// ```
/// use leasehold_dynamodb::DynamoDbConfig;
///
/// let config: DynamoDbConfig =
///     "dynamodb://leases?endpoint=http://127.0.0.1:28000&access_key_id=AK&secret_access_key=s3cret".parse()?;
/// assert_eq!(config.table, "leases");
/// assert_eq!(config.region.as_deref(), Some("us-east-1"));
/// assert!(!format!("{config:?} {config}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DynamoDbConfig {
    /// The table: 3 to 255 ASCII letters, digits, `_`, `-` or `.`.
    pub table: String,
    /// The service endpoint, or `None` for the regional AWS endpoint.
    pub endpoint: Option<String>,
    /// The region, or `None` for the standard AWS chain.
    pub region: Option<String>,
    /// Static credentials, or `None` for the standard AWS chain.
    pub credentials: Option<StaticCredentials>,
    /// Whether [`DynamoDbStore::connect`](crate::DynamoDbStore::connect) creates a missing table.
    pub create_table: bool,
    /// How long one request may take.
    pub timeout: Duration,
    /// How many operations one store has in flight at once (renewals and releases are let in
    /// first when they queue).
    pub max_in_flight: usize,
}

impl DynamoDbConfig {
    /// The defaults for `table`: the AWS endpoint, region and credentials from the standard chain.
    pub fn new(table: impl Into<String>) -> Self {
        DynamoDbConfig {
            table: table.into(),
            endpoint: None,
            region: None,
            credentials: None,
            create_table: false,
            timeout: DEFAULT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Parses a `dynamodb://` URL (see the [type docs](DynamoDbConfig)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the URL's secrets replaced by `***`) naming what is wrong:
    /// another scheme, a missing or invalid table name, an unknown or repeated option or a bad
    /// value.
    pub fn from_url(text: &str) -> Result<Self> {
        // User info would be an AWS key: refused before parsing, with all of it hidden (a secret
        // holding '/', '?' or '#' would otherwise end the host early and show in the error).
        let authority = text.split_once("://").map_or("", |(_, rest)| rest);
        let before_options = authority.split('=').next().unwrap_or_default();
        let before_query = authority.split('?').next().unwrap_or_default();
        if before_options.contains('@') || before_query.contains(['@', ':']) {
            return Err(Error::InvalidUrl {
                url: redact_url_and_user(text),
                reason: "credentials go in the query (access_key_id=...&secret_access_key=...), not before '@'".into(),
            });
        }
        let url = StoreUrl::parse(text, STORE)?.known_options(OPTIONS).user_is_secret();
        url.require_scheme(URL_SCHEMES)?;
        if !url.has_authority() {
            return Err(url.invalid("expected dynamodb://TABLE (e.g. dynamodb://leases?region=eu-west-1)"));
        }
        if url.username().is_some() || url.password().is_some() {
            return Err(
                url.invalid("credentials go in the query (access_key_id=...&secret_access_key=...), not before '@'")
            );
        }
        if url.hosts().len() > 1 || url.port().is_some() || !matches!(url.path(), "" | "/") {
            return Err(url.invalid("expected dynamodb://TABLE: one table name, no port or path"));
        }
        let table = url
            .host()
            .ok_or_else(|| url.invalid("no table name (e.g. dynamodb://leases)"))?;
        let table = percent_decode(table).map_err(|why| url.invalid(format!("the table name: {why}")))?;
        let mut config = DynamoDbConfig::new(table);
        let mut options = url.options();
        if let Some(endpoint) = options.http_url("endpoint")? {
            config.endpoint = Some(endpoint);
        }
        if let Some(region) = options.string("region") {
            if region.is_empty() || !region.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(options.invalid("region", "expected a region such as eu-west-1"));
            }
            config.region = Some(region);
        }
        config.credentials = options
            .key_pair("access_key_id", "secret_access_key", "session_token")?
            .map(|(access_key_id, secret_access_key, session_token)| StaticCredentials {
                access_key_id,
                secret_access_key,
                session_token,
            });
        if let Some(create) = options.bool("create_table")? {
            config.create_table = create;
        }
        if let Some(timeout) = options.duration_in("timeout", MIN_TIMEOUT..=MAX_TIMEOUT, "expected 10ms to 10m")? {
            config.timeout = timeout;
        }
        if let Some(max) = options.parse_in("max_in_flight", 1..=MAX_IN_FLIGHT, "expected 1 to 10000")? {
            config.max_in_flight = max;
        }
        options.finish()?;
        if config.endpoint.is_some() && config.region.is_none() {
            // Local servers ignore the region, but requests must still be signed for one.
            config.region = Some("us-east-1".into());
        }
        config.validate().map_err(|e| url.invalid(e.to_string()))?;
        Ok(config)
    }

    /// Checks the fields.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the field: a table name DynamoDB would reject, or a
    /// timeout outside 10 ms..=10 min.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, value: String, allowed: &str| {
            Err(Error::InvalidConfig {
                field,
                value,
                allowed: allowed.to_string(),
            })
        };
        let table_ok = (3..=255).contains(&self.table.len())
            && self
                .table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !table_ok {
            return invalid(
                "table",
                format!("{:?}", self.table),
                "3 to 255 ASCII letters, digits, '_', '-' or '.'",
            );
        }
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&self.timeout) {
            return invalid("timeout", format!("{:?}", self.timeout), "10ms..=10m");
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return invalid("max_in_flight", self.max_in_flight.to_string(), "1..=10000");
        }
        Ok(())
    }
}

impl FromStr for DynamoDbConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        DynamoDbConfig::from_url(url)
    }
}

/// The URL form, with the credentials replaced by `***`.
impl std::fmt::Display for DynamoDbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dynamodb://{}?", self.table)?;
        if let Some(endpoint) = &self.endpoint {
            write!(f, "endpoint={endpoint}&")?;
        }
        if let Some(region) = &self.region {
            write!(f, "region={region}&")?;
        }
        if let Some(credentials) = &self.credentials {
            write!(
                f,
                "access_key_id={}&secret_access_key={}&",
                credentials.access_key_id, credentials.secret_access_key
            )?;
            if let Some(token) = &credentials.session_token {
                write!(f, "session_token={token}&")?;
            }
        }
        write!(
            f,
            "create_table={}&timeout={}ms&max_in_flight={}",
            self.create_table,
            self.timeout.as_millis(),
            self.max_in_flight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = "dynamodb://leases?endpoint=http://127.0.0.1:28000&region=eu-west-1\
                         &access_key_id=AKIDSECRETID&secret_access_key=wJalrSECRETKEY&session_token=TOKENSECRET\
                         &create_table=true&timeout=250ms&max_in_flight=8";

    #[test]
    fn url_forms() {
        let config = DynamoDbConfig::from_url(LOCAL).unwrap();
        assert_eq!(config.table, "leases");
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:28000"));
        assert_eq!(config.region.as_deref(), Some("eu-west-1"));
        let credentials = config.credentials.as_ref().unwrap();
        assert_eq!(credentials.access_key_id.expose(), "AKIDSECRETID");
        assert_eq!(credentials.secret_access_key.expose(), "wJalrSECRETKEY");
        assert_eq!(
            credentials.session_token.as_ref().map(Secret::expose),
            Some("TOKENSECRET")
        );
        assert!(config.create_table);
        assert_eq!(config.timeout, Duration::from_millis(250));
        assert_eq!(config.max_in_flight, 8);

        let config = DynamoDbConfig::from_url("DynamoDB://app.leases_1").unwrap();
        assert_eq!(config, DynamoDbConfig::new("app.leases_1"));
        assert_eq!(config.region, None);
        let config = DynamoDbConfig::from_url("dynamodb://t-1/?endpoint=http%3A%2F%2Flocalhost%3A8000").unwrap();
        assert_eq!(config.endpoint.as_deref(), Some("http://localhost:8000"));
        assert_eq!(
            config.region.as_deref(),
            Some("us-east-1"),
            "local endpoints get a default region"
        );
        // Display round-trips everything but the (redacted) credentials.
        let shown = DynamoDbConfig::from_url(LOCAL).unwrap().to_string();
        let mut back = DynamoDbConfig::from_url(&shown.replace("***", "x")).unwrap();
        back.credentials = DynamoDbConfig::from_url(LOCAL).unwrap().credentials;
        assert_eq!(back, DynamoDbConfig::from_url(LOCAL).unwrap());
    }

    #[test]
    fn secrets_never_show() {
        let config = DynamoDbConfig::from_url(LOCAL).unwrap();
        for text in [
            format!("{config:?}"),
            config.to_string(),
            format!("{:?}", config.credentials),
        ] {
            for secret in ["AKIDSECRETID", "wJalrSECRETKEY", "TOKENSECRET"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(text.contains("***"), "{text}");
        }
        // Errors about any part of a URL that carries secrets redact them too.
        for url in [
            format!("{LOCAL}&bogus=1"),
            format!("{LOCAL}&timeout=forever"),
            format!("{LOCAL}&timeout=1s"),
            LOCAL.replace("dynamodb://leases", "dynamodb://x"),
            LOCAL.replace("dynamodb:", "dynamo:"),
            "dynamodb://AKIDSECRETID:wJalrSECRETKEY@leases".to_string(),
            "dynamodb://leases?access_key_id=AKIDSECRETID".to_string(),
            "dynamodb://leases?secret_access_key=wJalrSECRETKEY&access_key_id=".to_string(),
        ] {
            let err = DynamoDbConfig::from_url(&url).unwrap_err();
            let text = format!("{err} {err:?}");
            for secret in ["AKIDSECRETID", "wJalrSECRETKEY", "TOKENSECRET"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
        }
    }

    /// Finding 11 of issue 12: a secret holding `/`, `?`, `#`, `@` or `&` must not show in an error.
    #[test]
    fn secrets_holding_url_delimiters_never_show() {
        for url in [
            "dynamodb://AKIDSECRETID:wJalr/SECRETKEY@leases",
            "dynamodb://AKIDSECRETID:wJalr?SECRETKEY@leases",
            "dynamodb://AKIDSECRETID:wJalr#SECRETKEY@leases?region=eu-west-1",
            "dynamodb://AKIDSECRETID:wJalr@SECRETKEY@leases",
            "dynamodb://AKIDSECRETID:wJalr?x=SECRETKEY@leases",
            "dynamodb://leases?access_key_id=AKIDSECRETID&secret_access_key=wJalr&SECRETKEY",
        ] {
            let err = DynamoDbConfig::from_url(url).unwrap_err();
            let text = format!("{err} {err:?}");
            for secret in ["AKIDSECRETID", "wJalr", "SECRETKEY"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem() {
        for (url, why) in [
            ("redis://leases", "scheme"),
            ("dynamodb:leases", "expected dynamodb://TABLE"),
            ("dynamodb://", "no table"),
            ("dynamodb://?region=x", "no table"),
            ("dynamodb://ab", "table"),
            ("dynamodb://a/b", "expected dynamodb://TABLE"),
            ("dynamodb://leases?endpoint=localhost:8000", "endpoint"),
            ("dynamodb://leases?region=eu_west", "region"),
            ("dynamodb://leases?create_table=maybe", "create_table"),
            ("dynamodb://leases?create_table=1", "create_table"),
            ("dynamodb://leases?timeout=5ms", "timeout"),
            ("dynamodb://leases?timeout=1h", "timeout"),
            ("dynamodb://leases?timeout=2000", "needs a unit"),
            ("dynamodb://leases?max_in_flight=0", "max_in_flight"),
            ("dynamodb://leases?max_in_flight=lots", "max_in_flight"),
            ("dynamodb://leases?access_key_id=AK", "go together"),
            ("dynamodb://leases?session_token=T", "go together"),
            ("dynamodb://leases?table=x", "unknown option table"),
            ("dynamodb://leases?region=a&region=b", "option region is given twice"),
            ("dynamodb://lea%zzses", "%-escape"),
        ] {
            match DynamoDbConfig::from_url(url) {
                Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains(why), "{url}: {reason}"),
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: DynamoDbConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        DynamoDbConfig::new("leases").validate().unwrap();
        assert_eq!(field(DynamoDbConfig::new("x")), "table");
        assert_eq!(
            field(DynamoDbConfig {
                timeout: Duration::ZERO,
                ..DynamoDbConfig::new("leases")
            }),
            "timeout"
        );
        assert_eq!(
            field(DynamoDbConfig {
                max_in_flight: 0,
                ..DynamoDbConfig::new("leases")
            }),
            "max_in_flight"
        );
    }
}
