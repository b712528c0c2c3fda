//! Which table, where, and with which credentials: `dynamodb://` URLs and their options.

use leasehold_core::url_options::{parse_duration, percent_decode};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::{Error, Result};

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["dynamodb"];

/// The default time one request may take before it fails as [`Error::Timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The default number of operations a store has in flight at once
/// ([`DynamoDbStore::with_max_in_flight`](crate::DynamoDbStore::with_max_in_flight)).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

const MAX_IN_FLIGHT: usize = 10_000;
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const OPTIONS: &str =
    "endpoint, region, access_key_id, secret_access_key, session_token, create_table, timeout, max_in_flight";
const REDACTED: &str = "***";

/// Static credentials given in the URL. `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// A session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &REDACTED)
            .field("secret_access_key", &REDACTED)
            .field("session_token", &self.session_token.as_ref().map(|_| REDACTED))
            .finish()
    }
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
/// Query options (values may be `%XX`-escaped):
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
/// - `timeout`: how long one request may take, `2s` by default; `500ms`, `5s`, `1m` or a bare
///   number of milliseconds; 10 ms to 10 min.
/// - `max_in_flight`: how many operations one store sends at once, 1 to 10,000; the others wait
///   their turn in order. Default 32.
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
#[derive(Clone, PartialEq, Eq)]
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
    /// How many operations one store has in flight at once.
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
    /// another scheme, a missing or invalid table name, an unknown option or a bad value.
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact_url(url),
            reason,
        };
        let rest = URL_SCHEMES
            .iter()
            .find_map(|scheme| {
                let (head, rest) = url.split_at_checked(scheme.len())?;
                let rest = rest.strip_prefix("://").filter(|_| head.eq_ignore_ascii_case(scheme))?;
                Some(rest)
            })
            .ok_or_else(|| {
                invalid("the scheme must be dynamodb:// (e.g. dynamodb://leases?region=eu-west-1)".into())
            })?;
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        // An '@' before any option value, or a ':' in the table, is user info (whose password
        // may hold a '?' and so reach into the query): rejected without quoting any of it.
        let first_value = rest.find('=').unwrap_or(rest.len());
        if table.contains(['@', ':']) || rest[..first_value].contains('@') {
            return Err(invalid(
                "credentials go in the query (access_key_id=...&secret_access_key=...), not before '@'".into(),
            ));
        }
        let table = table.strip_suffix('/').unwrap_or(table);
        if table.is_empty() {
            return Err(invalid("no table name (e.g. dynamodb://leases)".into()));
        }
        let mut config = DynamoDbConfig::new(percent_decode(table).map_err(invalid)?);
        let (mut key_id, mut secret, mut token) = (None, None, None);
        let mut after_secret = false;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            if after_secret && !pair.contains('=') {
                return Err(invalid(
                    "a credential option's value holds an unescaped '&' (write it as %26)".into(),
                ));
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let follows_secret = std::mem::replace(&mut after_secret, is_secret(key));
            let value = percent_decode(value).map_err(invalid)?;
            let bad = |allowed: &str| {
                let shown = if is_secret(key) { REDACTED } else { value.as_str() };
                invalid(format!("option {key}={shown:?}: expected {allowed}"))
            };
            match key {
                "endpoint" => {
                    if !(value.starts_with("http://") || value.starts_with("https://")) || value.len() <= 8 {
                        return Err(bad("an http:// or https:// URL"));
                    }
                    config.endpoint = Some(value);
                }
                "region" => {
                    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                        return Err(bad("a region such as eu-west-1"));
                    }
                    config.region = Some(value);
                }
                "access_key_id" if !value.is_empty() => key_id = Some(value),
                "secret_access_key" if !value.is_empty() => secret = Some(value),
                "session_token" if !value.is_empty() => token = Some(value),
                "access_key_id" | "secret_access_key" | "session_token" => return Err(bad("a non-empty value")),
                "create_table" => {
                    config.create_table = match value.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        _ => return Err(bad("true or false")),
                    };
                }
                "timeout" => {
                    config.timeout = parse_duration(&value)
                        .filter(|d| (MIN_TIMEOUT..=MAX_TIMEOUT).contains(d))
                        .ok_or_else(|| bad("a duration from 10ms to 10m such as 2s, 500ms or 2000 (milliseconds)"))?;
                }
                "max_in_flight" => {
                    config.max_in_flight = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_IN_FLIGHT).contains(n))
                        .ok_or_else(|| bad("a whole number from 1 to 10000"))?;
                }
                // Perhaps the rest of a secret value: not quoted.
                _ if follows_secret => {
                    return Err(invalid(format!(
                        "an unknown option follows a credential; if the credential holds an '&', write it as %26 (known options: {OPTIONS})"
                    )));
                }
                _ => return Err(invalid(format!("unknown option {key:?} (known: {OPTIONS})"))),
            }
        }
        config.credentials = match (key_id, secret) {
            (Some(access_key_id), Some(secret_access_key)) => Some(StaticCredentials {
                access_key_id,
                secret_access_key,
                session_token: token,
            }),
            (None, None) if token.is_none() => None,
            _ => {
                return Err(invalid(
                    "access_key_id and secret_access_key go together (session_token needs both)".into(),
                ));
            }
        };
        if config.endpoint.is_some() && config.region.is_none() {
            // Local servers ignore the region, but requests must still be signed for one.
            config.region = Some("us-east-1".into());
        }
        config.validate().map_err(|e| invalid(e.to_string()))?;
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
impl fmt::Display for DynamoDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dynamodb://{}?", self.table)?;
        if let Some(endpoint) = &self.endpoint {
            write!(f, "endpoint={endpoint}&")?;
        }
        if let Some(region) = &self.region {
            write!(f, "region={region}&")?;
        }
        if let Some(credentials) = &self.credentials {
            write!(f, "access_key_id={REDACTED}&secret_access_key={REDACTED}&")?;
            if credentials.session_token.is_some() {
                write!(f, "session_token={REDACTED}&")?;
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

impl fmt::Debug for DynamoDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbConfig")
            .field("table", &self.table)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials", &self.credentials)
            .field("create_table", &self.create_table)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn is_secret(key: &str) -> bool {
    matches!(key, "access_key_id" | "secret_access_key" | "session_token")
}

/// `url` with the user info (all of it: the user part would be an AWS access key id) and the
/// values of credential options replaced by `***`: core's
/// [`redact_url_and_user`](leasehold_core::url_options::redact_url_and_user), which also hides
/// passwords typed with `/`, `?`, `#` or `@` in them.
pub(crate) fn redact_url(url: &str) -> String {
    leasehold_core::url_options::redact_url_and_user(url)
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
        assert_eq!(credentials.access_key_id, "AKIDSECRETID");
        assert_eq!(credentials.secret_access_key, "wJalrSECRETKEY");
        assert_eq!(credentials.session_token.as_deref(), Some("TOKENSECRET"));
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
            ("dynamodb:leases", "scheme"),
            ("dynamodb://", "no table"),
            ("dynamodb://?region=x", "no table"),
            ("dynamodb://ab", "table"),
            ("dynamodb://a/b", "table"),
            ("dynamodb://leases?endpoint=localhost:8000", "endpoint"),
            ("dynamodb://leases?region=eu_west", "region"),
            ("dynamodb://leases?create_table=maybe", "create_table"),
            ("dynamodb://leases?timeout=5ms", "timeout"),
            ("dynamodb://leases?timeout=1h", "timeout"),
            ("dynamodb://leases?max_in_flight=0", "max_in_flight"),
            ("dynamodb://leases?max_in_flight=lots", "max_in_flight"),
            ("dynamodb://leases?access_key_id=AK", "go together"),
            ("dynamodb://leases?session_token=T", "go together"),
            ("dynamodb://leases?table=x", "unknown option \"table\""),
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
