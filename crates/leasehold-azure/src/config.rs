//! `azblob://` URLs, the account endpoint and the credentials. Secrets are [`Secret`]s, so
//! `Debug` and `Display` never show them.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use leasehold_core::config::{Options, Secret, StoreUrl};
use leasehold_core::{Error, Result};
use url::Url;

use crate::error::STORE;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["azblob"];

/// The lease durations Azure Blob Storage accepts for a finite lease: 15 to 60 seconds.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(15)..=Duration::from_secs(60);

/// How long one HTTP request (also the one of [`AzureBlobStore::connect`](crate::AzureBlobStore::connect)
/// that checks the credential) may take, unless the URL says `timeout=`: a backstop for callers
/// outside the engine (the engine gives up at its own `request_timeout`, at most TTL/4 = 15 s,
/// so the two do not stack).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How many operations of any kind one store runs at once (each with its own HTTP connection),
/// unless the URL says `max_requests=`; renewals and releases have slots of their own on top
/// ([`DEFAULT_MAX_RENEWALS`]). A thousand leases campaigning at once must not open a thousand
/// connections, which overflows the server's accept queue and stalls requests for seconds.
pub const DEFAULT_MAX_REQUESTS: usize = 64;

/// How many slots one store keeps for renewals and releases alone, on top of
/// [`DEFAULT_MAX_REQUESTS`], unless the URL says `max_renewals=`: a renewal is admitted at once
/// even while campaigns fill every other slot (core's
/// [`RequestLimit::reserve_urgent`](leasehold_core::RequestLimit::reserve_urgent)).
pub const DEFAULT_MAX_RENEWALS: usize = 64;

/// How many terms of each lease keep their history blob, unless the URL says `history_limit=`
/// (`0` keeps all). Older ones are deleted as new terms are granted.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

/// The query parameters of a Shared Access Signature (gathered into the SAS when they appear
/// directly in the store URL).
const SAS_KEYS: &[&str] = &[
    "sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "sig", "sr", "si", "ses", "sdd", "skoid", "sktid", "skt", "ske",
    "sks", "skv", "saoid", "suoid", "scid", "rscc", "rscd", "rsce", "rscl", "rsct",
];

/// The options of the store URL, for error messages and redaction.
const OPTIONS: &[&str] = &[
    "prefix",
    "endpoint",
    "sas",
    "account_key",
    "auth",
    "timeout",
    "max_requests",
    "max_renewals",
    "history_limit",
    "ca",
];

/// How requests are authorised.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Auth {
    /// A Shared Access Signature appended to every request URL (account, container or
    /// user-delegation SAS): its query string, `sv=...&sig=...`.
    Sas(Secret),
    /// The storage account key (base64, as the portal shows it): the store signs an account SAS
    /// for every request itself.
    AccountKey(Secret),
    /// An Entra ID (Azure AD) token credential, e.g. from `azure_identity` (https only).
    Credential(Arc<dyn TokenCredential>),
    /// No authorisation (a public container, or a proxy that adds it).
    Anonymous,
}

/// Where the leases live and how to reach them.
///
/// Parse one from a URL (`"azblob://...".parse()` or [`AzureConfig::from_url`]):
///
/// ```text
/// azblob://ACCOUNT/CONTAINER?account_key=KEY[&endpoint=URL][&prefix=P][&timeout=10s][&history_limit=N]
/// azblob://ACCOUNT/CONTAINER?sas=URL-ENCODED-SAS                 (or the SAS's own sv=..&sig=.. parameters)
/// azblob://ACCOUNT/CONTAINER?auth=managed-identity|workload-identity|developer-tools   (feature `identity`)
/// https://ACCOUNT.blob.core.windows.net/CONTAINER?sv=...&sig=... (a SAS URL as the portal gives it)
/// http://127.0.0.1:10000/ACCOUNT/CONTAINER?account_key=KEY       (path style, the emulator)
/// ```
///
/// - `account_key`: the storage account key (`%`-escape its `+`, `/` and `=`: `%2B`, `%2F`,
///   `%3D`). The store signs an account SAS (blob service, read, add, create, write, delete,
///   list) for every request itself, valid for an hour from the moment it is sent: nobody signs
///   a SAS by hand. For Azurite, the emulator's published development key.
/// - `sas`: a SAS query string, URL-encoded; or its parameters (`sv`, `sig`, ...) directly in the
///   URL. It needs read, add, create, write and list on the container.
/// - `endpoint`: the blob service endpoint of the account (the emulator, sovereign clouds).
/// - `prefix`: prepended to every blob name.
/// - `timeout`: how long one HTTP request may take, `30s` by default (a backstop: the engine gives
///   up at its own `request_timeout` first); units required: `500ms`, `10s`, `1m`.
/// - `max_requests`, `max_renewals`: operations in flight at once (1 to 4096, default 64 each):
///   `max_requests` of any kind, plus `max_renewals` slots kept for renewals and releases.
/// - `history_limit`: how many terms keep their history blob (default 1000; `0` keeps all).
/// - `ca`: a PEM file of the CA certificates to trust for an `https` endpoint *instead of* the
///   system's (a private CA, e.g. in front of the emulator); the spelling every leasehold
///   backend shares.
///
/// A repeated or unknown option is an error naming it. `Debug`, `Display` and every error leave
/// the key and the SAS out.
///
/// # Examples
///
/// ```
/// use leasehold_azure::{Auth, AzureConfig};
///
/// // Azurite's published development key, %-escaped.
/// let key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq%2FK1SZFPTOtr%2FKBHBeksoGMGw%3D%3D";
/// let config: AzureConfig = format!("http://127.0.0.1:10000/devstoreaccount1/leases?account_key={key}").parse()?;
/// assert_eq!((config.account.as_str(), config.container.as_str()), ("devstoreaccount1", "leases"));
/// assert!(matches!(config.auth, Auth::AccountKey(_)));
/// assert!(!format!("{config:?}").contains("Eby8"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AzureConfig {
    /// The storage account name.
    pub account: String,
    /// The container that holds one blob per lease (created if missing).
    pub container: String,
    /// Prepended to every blob name, e.g. `leases/`.
    pub prefix: String,
    /// The blob service endpoint of the account, e.g. `https://acct.blob.core.windows.net/` or,
    /// for Azurite, `http://127.0.0.1:10000/devstoreaccount1/`.
    pub endpoint: Url,
    /// How requests are authorised.
    pub auth: Auth,
    /// How long one HTTP request may take (connect's credential check included).
    pub timeout: Duration,
    /// How many operations of any kind run at once, at most (renewals and releases may use
    /// [`AzureConfig::max_renewals`] more slots).
    pub max_requests: usize,
    /// How many slots are kept for renewals and releases alone: they may run
    /// `max_requests + max_renewals` at once, everything else at most `max_requests`.
    pub max_renewals: usize,
    /// How many terms of each lease keep their history blob (the most recent ones); `0` keeps
    /// all. Default [`DEFAULT_HISTORY_LIMIT`].
    pub history_limit: u32,
    /// A PEM file of the CA certificates to trust instead of the system's (`https` only); read
    /// when the store connects.
    pub ca: Option<PathBuf>,
}

impl AzureConfig {
    /// A configuration for `container` in `account` on the public Azure cloud, with no
    /// credentials yet (set [`AzureConfig::auth`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when the account or container name is not valid.
    pub fn new(account: &str, container: &str) -> Result<Self> {
        let invalid = |field, value: &str, why: String| Error::InvalidConfig {
            field,
            value: format!("{value:?}"),
            allowed: why,
        };
        check_account(account).map_err(|why| invalid("account", account, why))?;
        check_container(container).map_err(|why| invalid("container", container, why))?;
        let endpoint = Url::parse(&format!("https://{account}.blob.core.windows.net/"))
            .map_err(|e| invalid("account", account, e.to_string()))?;
        Ok(AzureConfig {
            account: account.to_string(),
            container: container.to_string(),
            prefix: String::new(),
            endpoint,
            auth: Auth::Anonymous,
            timeout: DEFAULT_TIMEOUT,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_renewals: DEFAULT_MAX_RENEWALS,
            history_limit: DEFAULT_HISTORY_LIMIT,
            ca: None,
        })
    }

    /// Parses a store URL (see the [type docs](AzureConfig) for the forms and options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`], with every secret redacted, naming what is malformed or unknown.
    pub fn from_url(text: &str) -> Result<Self> {
        let url = StoreUrl::parse(text, STORE)?.known_options(OPTIONS);
        let scheme = url.require_scheme(&["azblob", "https", "http"])?.to_string();
        if url.username().is_some() || url.password().is_some() || url.hosts().len() != 1 {
            return Err(url.invalid("expected azblob://ACCOUNT/CONTAINER, without user, password or host list"));
        }
        let host = url.host().unwrap_or_default().to_string();
        let segments: Vec<&str> = url.path().split('/').filter(|s| !s.is_empty()).collect();
        let (account, container, mut endpoint) = if scheme == "azblob" {
            let [container] = segments.as_slice() else {
                return Err(url.invalid("expected azblob://ACCOUNT/CONTAINER"));
            };
            if url.port().is_some() {
                return Err(url.invalid("the host of an azblob URL is the account name, without a port"));
            }
            (
                host.clone(),
                container.to_string(),
                format!("https://{host}.blob.core.windows.net/"),
            )
        } else {
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            let path_style = host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') || host == "localhost";
            if path_style {
                let [account, container] = segments.as_slice() else {
                    return Err(url.invalid("expected http://HOST:PORT/ACCOUNT/CONTAINER"));
                };
                let endpoint = format!("{scheme}://{host}{port}/{account}/");
                (account.to_string(), container.to_string(), endpoint)
            } else {
                let [container] = segments.as_slice() else {
                    return Err(url.invalid("expected https://ACCOUNT.blob.core.windows.net/CONTAINER"));
                };
                let account = host.split('.').next().unwrap_or_default().to_string();
                (account, container.to_string(), format!("{scheme}://{host}{port}/"))
            }
        };
        check_account(&account).map_err(|why| url.invalid(why))?;
        check_container(&container).map_err(|why| url.invalid(why))?;
        let mut config = AzureConfig::new(&account, &container)?;

        let mut options = url.options();
        if let Some(prefix) = options.string("prefix") {
            check_prefix(&prefix).map_err(|why| options.invalid("prefix", why))?;
            config.prefix = prefix;
        }
        if let Some(given) = options.string("endpoint") {
            if scheme != "azblob" {
                return Err(options.invalid("endpoint", "only for azblob:// URLs (the URL itself is the endpoint)"));
            }
            endpoint = given;
        }
        config.endpoint = Url::parse(&endpoint)
            .ok()
            .filter(|e| matches!(e.scheme(), "http" | "https") && !e.cannot_be_a_base() && e.query().is_none())
            .ok_or_else(|| options.invalid("endpoint", "expected an http(s) URL without query"))?;
        if !config.endpoint.path().ends_with('/') {
            let path = format!("{}/", config.endpoint.path());
            config.endpoint.set_path(&path);
        }
        let timeouts = Duration::from_millis(1)..=Duration::from_secs(600);
        if let Some(timeout) = options.duration_in("timeout", timeouts, "expected 1ms to 10m")? {
            config.timeout = timeout;
        }
        config.max_requests = turns(&mut options, "max_requests")?.unwrap_or(DEFAULT_MAX_REQUESTS);
        config.max_renewals = turns(&mut options, "max_renewals")?.unwrap_or(DEFAULT_MAX_RENEWALS);
        if let Some(limit) = options.parse::<u32>("history_limit")? {
            config.history_limit = limit;
        }
        config.auth = auth(&mut options, &config.endpoint)?;
        if let Some(ca) = options.string("ca") {
            if config.endpoint.scheme() != "https" {
                return Err(options.invalid("ca", "a CA is for an https endpoint; this one is not"));
            }
            config.ca = Some(PathBuf::from(ca));
        }
        options.finish()?;
        Ok(config)
    }

    /// The container URL, with the SAS if there is one. It holds the secret: never log it.
    pub(crate) fn container_url(&self) -> Result<Url> {
        let mut url = self.endpoint.clone();
        url.path_segments_mut()
            .map_err(|()| Error::InvalidConfig {
                field: "endpoint",
                value: self.endpoint.to_string(),
                allowed: "an http(s) URL that can carry a path".into(),
            })?
            .pop_if_empty()
            .push(&self.container);
        if let Auth::Sas(sas) = &self.auth {
            url.set_query(Some(sas.expose().strip_prefix('?').unwrap_or(sas.expose())));
        }
        Ok(url)
    }
}

impl FromStr for AzureConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        AzureConfig::from_url(url)
    }
}

/// The certificates of the PEM file `ca=` names: the only roots the store trusts.
pub(crate) fn private_ca(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>> {
    let invalid = |why: String| Error::InvalidConfig {
        field: "ca",
        value: path.display().to_string(),
        allowed: format!("a PEM file of CA certificates ({why})"),
    };
    let pem = std::fs::read(path).map_err(|e| invalid(format!("cannot read it: {e}")))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => Err(invalid("it holds no certificate".into())),
        Err(e) => Err(invalid(e.to_string())),
    }
}

fn turns(options: &mut Options<'_>, name: &'static str) -> Result<Option<usize>> {
    match options.parse::<usize>(name)? {
        Some(n) if !(1..=4096).contains(&n) => Err(options.invalid(name, "expected 1 to 4096")),
        other => Ok(other),
    }
}

/// The credential: one of `account_key=`, `sas=`, the SAS's own parameters, or `auth=`.
fn auth(options: &mut Options<'_>, endpoint: &Url) -> Result<Auth> {
    let key = options.secret("account_key");
    let sas = options.secret("sas");
    let name = options.string("auth");
    // The SAS's own parameters are only looked for (and so only known) when a signature is.
    let inline = match options.secret("sig") {
        None => None,
        Some(_) => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            for key in SAS_KEYS {
                if let Some(value) = options.secret(key) {
                    query.append_pair(key, value.expose());
                }
            }
            Some(Secret::new(query.finish()))
        }
    };
    let given = [key.is_some(), sas.is_some(), inline.is_some(), name.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(options.invalid(
            "account_key",
            "give one credential: account_key=, sas=, the SAS's own parameters, or auth=",
        ));
    }
    if let Some(sas) = sas.or(inline) {
        if !sas.expose().split('&').any(|pair| pair.starts_with("sig=")) {
            return Err(options.invalid("sas", "the SAS has no sig= signature"));
        }
        return Ok(Auth::Sas(sas));
    }
    if let Some(key) = key {
        return Ok(Auth::AccountKey(key));
    }
    match name.as_deref() {
        None | Some("anonymous") => Ok(Auth::Anonymous),
        Some(_) if endpoint.scheme() != "https" => {
            Err(options.invalid("auth", "Entra ID tokens need an https endpoint"))
        }
        Some(name) => entra_credential(name)
            .map(Auth::Credential)
            .map_err(|why| options.invalid("auth", why)),
    }
}

#[cfg(feature = "identity")]
fn entra_credential(name: &str) -> std::result::Result<Arc<dyn TokenCredential>, String> {
    let failed = |e: azure_core::Error| format!("cannot create the {name} credential: {e}");
    match name {
        "managed-identity" => Ok(azure_identity::ManagedIdentityCredential::new(None).map_err(failed)?),
        "workload-identity" => Ok(azure_identity::WorkloadIdentityCredential::new(None).map_err(failed)?),
        "developer-tools" => Ok(azure_identity::DeveloperToolsCredential::new(None).map_err(failed)?),
        _ => Err("expected managed-identity, workload-identity, developer-tools or anonymous".into()),
    }
}

#[cfg(not(feature = "identity"))]
fn entra_credential(_name: &str) -> std::result::Result<Arc<dyn TokenCredential>, String> {
    Err("Entra ID needs the `identity` feature of leasehold-azure (or build the config with Auth::Credential)".into())
}

fn check_account(account: &str) -> std::result::Result<(), String> {
    let ok = (3..=24).contains(&account.len()) && account.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid account name {account:?}: 3 to 24 lowercase letters and digits"
        ))
    }
}

fn check_container(container: &str) -> std::result::Result<(), String> {
    let ok = (3..=63).contains(&container.len())
        && container
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !container.starts_with('-')
        && !container.ends_with('-')
        && !container.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid container name {container:?}: 3 to 63 lowercase letters, digits and single hyphens"
        ))
    }
}

fn check_prefix(prefix: &str) -> std::result::Result<(), String> {
    let ok = prefix.len() <= 512
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
        && !prefix.starts_with('/');
    if ok {
        Ok(())
    } else {
        Err("expected up to 512 ASCII letters, digits, '-', '_', '.', '/', not starting with '/'".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIG: &str = "c2VjcmV0LXNpZ25hdHVyZQ%3D%3D";

    #[test]
    fn options_from_the_url() {
        let config: AzureConfig =
            "azblob://acct/leases?max_requests=8&max_renewals=128&history_limit=0&timeout=2s&prefix=app/"
                .parse()
                .unwrap();
        assert_eq!((config.max_requests, config.max_renewals), (8, 128));
        assert_eq!((config.history_limit, config.timeout), (0, Duration::from_secs(2)));
        assert_eq!(config.prefix, "app/");
        let config: AzureConfig = "azblob://acct/leases".parse().unwrap();
        assert_eq!(
            (
                config.max_requests,
                config.max_renewals,
                config.history_limit,
                config.timeout
            ),
            (
                DEFAULT_MAX_REQUESTS,
                DEFAULT_MAX_RENEWALS,
                DEFAULT_HISTORY_LIMIT,
                DEFAULT_TIMEOUT
            )
        );
        assert!(matches!(config.auth, Auth::Anonymous));
        for (bad, name) in [
            ("max_renewals=0", "max_renewals"),
            ("max_renewals=many", "max_renewals"),
            ("max_requests=5000", "max_requests"),
            ("history_limit=-1", "history_limit"),
            ("timeout=10", "needs a unit"),
            ("timeout=1h", "timeout"),
            ("prefix=%2Fabs", "prefix"),
            ("prefix=a&prefix=b", "option prefix is given twice"),
            ("nope=1", "unknown option nope"),
        ] {
            let err = AzureConfig::from_url(&format!("azblob://acct/leases?{bad}")).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{bad}: {err:?}");
            assert!(err.to_string().contains(name), "{bad}: {err}");
        }
    }

    #[test]
    fn azblob_with_endpoint_and_sas() {
        let sas = format!("sv=2021-08-06&ss=b&srt=sco&sp=racwdl&se=2030-01-01T00%3A00%3A00Z&sig={SIG}");
        let url = format!(
            "azblob://devstoreaccount1/leases?prefix=app/&endpoint=http%3A%2F%2F127.0.0.1%3A21000%2Fdevstoreaccount1&sas={}",
            url::form_urlencoded::byte_serialize(sas.as_bytes()).collect::<String>()
        );
        let config = AzureConfig::from_url(&url).unwrap();
        assert_eq!(
            (config.account.as_str(), config.container.as_str()),
            ("devstoreaccount1", "leases")
        );
        assert_eq!(config.endpoint.as_str(), "http://127.0.0.1:21000/devstoreaccount1/");
        let Auth::Sas(got) = &config.auth else {
            panic!("{:?}", config.auth)
        };
        assert_eq!(got.expose(), sas);
        let container = config.container_url().unwrap();
        assert_eq!(container.path(), "/devstoreaccount1/leases");
        assert!(container.query().unwrap().contains(SIG));
        let debug = format!("{config:?}");
        assert!(!debug.contains(SIG) && !debug.contains("c2VjcmV0"), "{debug}");
    }

    #[test]
    fn a_private_ca_is_for_https_only() {
        let config =
            AzureConfig::from_url("https://127.0.0.1:1/devstoreaccount1/leases?ca=/pki/ca.pem&account_key=a2V5")
                .unwrap();
        assert_eq!(config.ca, Some(PathBuf::from("/pki/ca.pem")));
        assert_eq!(config.endpoint.as_str(), "https://127.0.0.1:1/devstoreaccount1/");
        let err = AzureConfig::from_url("http://127.0.0.1:1/devstoreaccount1/leases?ca=/pki/ca.pem&account_key=a2V5")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("option ca=\"/pki/ca.pem\": a CA is for an https endpoint"),
            "{err}"
        );
    }

    #[test]
    fn inline_sas_and_https_forms() {
        let config = AzureConfig::from_url(&format!("azblob://acct/leases?sv=2021-08-06&sp=rw&sig={SIG}")).unwrap();
        assert_eq!(config.endpoint.as_str(), "https://acct.blob.core.windows.net/");
        let Auth::Sas(sas) = &config.auth else { panic!() };
        assert!(sas.expose().starts_with("sv=2021-08-06&sp=rw&sig="), "{}", sas.expose());
        assert!(sas.expose().ends_with(SIG), "the signature is escaped as it came");

        let config = AzureConfig::from_url(&format!(
            "https://acct.blob.core.windows.net/leases?sv=2021-08-06&sig={SIG}&prefix=x/"
        ))
        .unwrap();
        assert_eq!(
            (
                config.account.as_str(),
                config.container.as_str(),
                config.prefix.as_str()
            ),
            ("acct", "leases", "x/")
        );
        assert_eq!(config.endpoint.as_str(), "https://acct.blob.core.windows.net/");

        let config = AzureConfig::from_url("http://127.0.0.1:10000/devstoreaccount1/leases?account_key=a2V5").unwrap();
        assert_eq!(config.endpoint.as_str(), "http://127.0.0.1:10000/devstoreaccount1/");
        assert_eq!(config.container, "leases");
        assert!(matches!(&config.auth, Auth::AccountKey(key) if key.expose() == "a2V5"));
    }

    #[test]
    fn bad_urls_are_typed_errors_without_secrets() {
        for (url, why) in [
            ("azblob://acct", "ACCOUNT/CONTAINER"),
            ("azblob://acct/a/b", "ACCOUNT/CONTAINER"),
            ("azblob://Acct/leases", "account"),
            ("azblob://acct/Leases", "container"),
            ("azblob://acct/leases?sv=1&sp=r", "unknown options sv, sp"),
            ("azblob://acct/leases?sas=sv%3D1", "no sig"),
            ("ftp://acct/leases", "scheme"),
            ("azblob://acct/leases?account_key=k&sas=sig%3Dx", "one credential"),
            ("azblob://acct/leases?auth=kerberos", "auth"),
        ] {
            let err = AzureConfig::from_url(url).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            assert!(err.to_string().contains(why), "{url}: {err}");
        }
        let err = AzureConfig::from_url(&format!("azblob://acct/leases?sig={SIG}&sas=sv%3D1%26sig%3Dx")).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(SIG) && shown.contains("sig=***"), "{shown}");
        let err = AzureConfig::from_url("azblob://acct/leases?account_key=S3CRETKEY&bogus=1").unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(
            !shown.contains("S3CRETKEY") && shown.contains("account_key=***"),
            "{shown}"
        );
    }

    #[test]
    fn entra_needs_the_feature_or_https() {
        let err =
            AzureConfig::from_url("azblob://acct/leases?auth=managed-identity&endpoint=http%3A%2F%2F127.0.0.1%3A1")
                .unwrap_err();
        assert!(err.to_string().contains("https"), "{err}");
        #[cfg(not(feature = "identity"))]
        {
            let err = AzureConfig::from_url("azblob://acct/leases?auth=managed-identity").unwrap_err();
            assert!(err.to_string().contains("identity"), "{err}");
        }
    }
}
