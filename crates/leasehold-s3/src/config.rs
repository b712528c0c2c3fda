//! Which bucket and prefix, where, and with which credentials: `s3://` URLs and their options.

use std::str::FromStr;
use std::time::Duration;

use leasehold_core::config::{Secret, StoreUrl, percent_decode, redact_url_and_user};
use leasehold_core::{Error, Result};

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["s3"];

/// The default time one request may take before it fails as [`Error::Timeout`]: a backstop for
/// callers outside the engine (the engine gives up on a request at its own `request_timeout`,
/// which is shorter, so the two do not stack).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default number of operations a store has in flight at once
/// ([`S3Config::max_in_flight`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

const MAX_IN_FLIGHT: usize = 10_000;
const MAX_PREFIX_LEN: usize = 512;
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const OPTIONS: &[&str] = &[
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "path_style",
    "create_bucket",
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

/// Where the lease objects are and how to reach them.
///
/// Build one with [`S3Config::new`] and the fields, or parse a URL:
///
/// ```text
/// s3://BUCKET?region=eu-west-1
/// s3://BUCKET/PREFIX/MORE?endpoint=http://127.0.0.1:27000&access_key_id=AK&secret_access_key=SK&create_bucket=true
/// ```
///
/// Each lease is the object `PREFIX/LEASE` (just `LEASE` without a prefix).
///
/// Query options (values may be `%XX`-escaped; each at most once; any other is an error naming it):
///
/// - `endpoint`: the service URL, for moto, a VPC endpoint or another S3-compatible store.
///   Default: the regional AWS endpoint.
/// - `region`: the region. Default `us-east-1` when an `endpoint` is given, otherwise the
///   standard AWS chain (feature `aws-config`).
/// - `access_key_id`, `secret_access_key` (both or neither) and `session_token`: static
///   credentials. Without them the standard AWS credential chain is used (environment, profile,
///   web identity, ECS/EC2 roles), which needs the crate feature `aws-config`.
/// - `path_style`: `true` addresses the bucket in the path (`endpoint/BUCKET/KEY`), as most
///   S3-compatible servers want; `false` in the host name (`BUCKET.endpoint/KEY`). Default:
///   `true` with an `endpoint`, `false` without.
/// - `create_bucket`: `true` creates the bucket when it is missing (for local servers). Default
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
/// use leasehold_s3::S3Config;
///
/// let config: S3Config =
///     "s3://leases/app/prod?endpoint=http://127.0.0.1:27000&access_key_id=AK&secret_access_key=s3cret".parse()?;
/// assert_eq!((config.bucket.as_str(), config.prefix.as_str()), ("leases", "app/prod"));
/// assert_eq!(config.region.as_deref(), Some("us-east-1"));
/// assert!(config.path_style);
/// assert!(!format!("{config:?} {config}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Config {
    /// The bucket: 3 to 63 lowercase ASCII letters, digits, `.` or `-`.
    pub bucket: String,
    /// The key prefix of the lease objects, without leading or trailing `/` (empty: none).
    pub prefix: String,
    /// The service endpoint, or `None` for the regional AWS endpoint.
    pub endpoint: Option<String>,
    /// The region, or `None` for the standard AWS chain.
    pub region: Option<String>,
    /// Static credentials, or `None` for the standard AWS chain.
    pub credentials: Option<StaticCredentials>,
    /// Whether the bucket is addressed in the path rather than the host name.
    pub path_style: bool,
    /// Whether [`S3Store::connect`](crate::S3Store::connect) creates a missing bucket.
    pub create_bucket: bool,
    /// How long one request may take.
    pub timeout: Duration,
    /// How many operations one store has in flight at once (renewals and releases are let in
    /// first when they queue).
    pub max_in_flight: usize,
}

impl S3Config {
    /// The defaults for `bucket`: no prefix, the AWS endpoint, region and credentials from the
    /// standard chain.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Config {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            credentials: None,
            path_style: false,
            create_bucket: false,
            timeout: DEFAULT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Parses an `s3://` URL (see the [type docs](S3Config)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the URL's secrets replaced by `***`) naming what is wrong:
    /// another scheme, a missing or invalid bucket or prefix, an unknown or repeated option or a
    /// bad value.
    pub fn from_url(text: &str) -> Result<Self> {
        // User info would be an AWS key: refused before parsing, with all of it hidden (a secret
        // holding '/', '?' or '#' would otherwise end the host early and show in the error).
        let authority = text.split_once("://").map_or("", |(_, rest)| rest);
        let before_options = authority.split('=').next().unwrap_or_default();
        let before_path = authority.split(['/', '?']).next().unwrap_or_default();
        if before_options.contains('@') || before_path.contains(':') {
            return Err(Error::InvalidUrl {
                url: redact_url_and_user(text),
                reason: "credentials go in the query (access_key_id=...&secret_access_key=...), not before '@'".into(),
            });
        }
        let url = StoreUrl::parse(text, STORE)?.known_options(OPTIONS).user_is_secret();
        url.require_scheme(URL_SCHEMES)?;
        if !url.has_authority() {
            return Err(url.invalid("expected s3://BUCKET/PREFIX (e.g. s3://leases/app?region=eu-west-1)"));
        }
        if url.hosts().len() > 1 || url.port().is_some() {
            return Err(url.invalid("expected s3://BUCKET/PREFIX: one bucket name, no port"));
        }
        let bucket = url
            .host()
            .ok_or_else(|| url.invalid("no bucket name (e.g. s3://leases)"))?;
        let bucket = percent_decode(bucket).map_err(|why| url.invalid(format!("the bucket name: {why}")))?;
        let mut config = S3Config::new(bucket);
        config.prefix = url.path().trim_matches('/').to_string();
        let mut options = url.options();
        if let Some(endpoint) = options.http_url("endpoint")? {
            config.endpoint = Some(endpoint);
            config.path_style = true;
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
        if let Some(path_style) = options.bool("path_style")? {
            config.path_style = path_style;
        }
        if let Some(create) = options.bool("create_bucket")? {
            config.create_bucket = create;
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
    /// [`Error::InvalidConfig`] naming the field: a bucket name S3 would reject, a prefix with
    /// empty segments or characters outside letters, digits and `-_.!*'()/`, or a timeout or
    /// `max_in_flight` out of range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, value: String, allowed: &str| {
            Err(Error::InvalidConfig {
                field,
                value,
                allowed: allowed.to_string(),
            })
        };
        let bucket_ok = (3..=63).contains(&self.bucket.len())
            && self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-'))
            && !self.bucket.starts_with(['.', '-'])
            && !self.bucket.ends_with(['.', '-']);
        if !bucket_ok {
            return invalid(
                "bucket",
                format!("{:?}", self.bucket),
                "3 to 63 lowercase ASCII letters, digits, '.' or '-', starting and ending with a letter or digit",
            );
        }
        let prefix_ok = self.prefix.is_empty()
            || (self.prefix.len() <= MAX_PREFIX_LEN
                && self.prefix.split('/').all(|segment| {
                    !segment.is_empty()
                        && segment != "."
                        && segment != ".."
                        && segment
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_.!*'()".contains(&b))
                }));
        if !prefix_ok {
            return invalid(
                "prefix",
                format!("{:?}", self.prefix),
                "empty, or at most 512 bytes of '/'-separated segments of ASCII letters, digits and -_.!*'() \
                 (no empty, '.' or '..' segments)",
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

impl FromStr for S3Config {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        S3Config::from_url(url)
    }
}

/// The URL form, with the credentials replaced by `***`.
impl std::fmt::Display for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}?", self.bucket, self.prefix)?;
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
            "path_style={}&create_bucket={}&timeout={}ms&max_in_flight={}",
            self.path_style,
            self.create_bucket,
            self.timeout.as_millis(),
            self.max_in_flight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = "s3://leases/app/prod?endpoint=http://127.0.0.1:27000&region=eu-west-1\
                         &access_key_id=AKIDSECRETID&secret_access_key=wJalrSECRETKEY&session_token=TOKENSECRET\
                         &create_bucket=true&timeout=250ms&max_in_flight=8";

    #[test]
    fn url_forms() {
        let config = S3Config::from_url(LOCAL).unwrap();
        assert_eq!(config.bucket, "leases");
        assert_eq!(config.prefix, "app/prod");
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:27000"));
        assert_eq!(config.region.as_deref(), Some("eu-west-1"));
        let credentials = config.credentials.as_ref().unwrap();
        assert_eq!(credentials.access_key_id.expose(), "AKIDSECRETID");
        assert_eq!(credentials.secret_access_key.expose(), "wJalrSECRETKEY");
        assert_eq!(
            credentials.session_token.as_ref().map(Secret::expose),
            Some("TOKENSECRET")
        );
        assert!(config.path_style && config.create_bucket);
        assert_eq!(config.timeout, Duration::from_millis(250));
        assert_eq!(config.max_in_flight, 8);

        let config = S3Config::from_url("S3://my.leases-1").unwrap();
        assert_eq!(config, S3Config::new("my.leases-1"));
        assert_eq!((config.region, config.path_style), (None, false));
        let config = S3Config::from_url("s3://b-1/p/?endpoint=http%3A%2F%2Flocalhost%3A9000&path_style=false").unwrap();
        assert_eq!(config.endpoint.as_deref(), Some("http://localhost:9000"));
        assert_eq!(config.prefix, "p");
        assert!(!config.path_style);
        assert_eq!(
            config.region.as_deref(),
            Some("us-east-1"),
            "local endpoints get a default region"
        );
        // Display round-trips everything but the (redacted) credentials.
        let shown = S3Config::from_url(LOCAL).unwrap().to_string();
        let mut back = S3Config::from_url(&shown.replace("***", "x")).unwrap();
        back.credentials = S3Config::from_url(LOCAL).unwrap().credentials;
        assert_eq!(back, S3Config::from_url(LOCAL).unwrap());
    }

    #[test]
    fn secrets_never_show() {
        let config = S3Config::from_url(LOCAL).unwrap();
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
        for url in [
            format!("{LOCAL}&bogus=1"),
            format!("{LOCAL}&timeout=forever"),
            LOCAL.replace("s3://leases", "s3://X"),
            LOCAL.replace("s3:", "s4:"),
            "s3://AKIDSECRETID:wJalrSECRETKEY@leases".to_string(),
            "s3://AKIDSECRETID:wJalr/SECRETKEY@leases".to_string(),
            "s3://AKIDSECRETID:wJalr?SECRETKEY@leases".to_string(),
            "s3://leases?access_key_id=AKIDSECRETID".to_string(),
            "s3://leases?secret_access_key=wJalrSECRETKEY&access_key_id=".to_string(),
        ] {
            let err = S3Config::from_url(&url).unwrap_err();
            let text = format!("{err} {err:?}");
            for secret in ["AKIDSECRETID", "wJalrSECRETKEY", "SECRETKEY", "TOKENSECRET"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem() {
        for (url, why) in [
            ("redis://leases", "scheme"),
            ("s3:leases", "expected s3://BUCKET"),
            ("s3://", "no bucket"),
            ("s3://?region=x", "no bucket"),
            ("s3://ab", "bucket"),
            ("s3://Leases", "bucket"),
            ("s3://leases-", "bucket"),
            ("s3://leases/a//b", "prefix"),
            ("s3://leases/a/../b", "prefix"),
            ("s3://leases/a%20b", "prefix"),
            ("s3://leases?endpoint=localhost:9000", "endpoint"),
            ("s3://leases?region=eu_west", "region"),
            ("s3://leases?create_bucket=maybe", "create_bucket"),
            ("s3://leases?path_style=1", "path_style"),
            ("s3://leases?timeout=5ms", "timeout"),
            ("s3://leases?timeout=2000", "needs a unit"),
            ("s3://leases?max_in_flight=0", "max_in_flight"),
            ("s3://leases?access_key_id=AK", "go together"),
            ("s3://leases?session_token=T", "go together"),
            ("s3://leases?bucket=x", "unknown option bucket"),
            ("s3://leases?region=a&region=b", "option region is given twice"),
        ] {
            match S3Config::from_url(url) {
                Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains(why), "{url}: {reason}"),
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn validate_names_the_field() {
        let field = |config: S3Config| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        S3Config::new("leases").validate().unwrap();
        assert_eq!(field(S3Config::new("x")), "bucket");
        assert_eq!(
            field(S3Config {
                prefix: "/a".into(),
                ..S3Config::new("leases")
            }),
            "prefix"
        );
        assert_eq!(
            field(S3Config {
                timeout: Duration::ZERO,
                ..S3Config::new("leases")
            }),
            "timeout"
        );
        assert_eq!(
            field(S3Config {
                max_in_flight: 0,
                ..S3Config::new("leases")
            }),
            "max_in_flight"
        );
    }
}
