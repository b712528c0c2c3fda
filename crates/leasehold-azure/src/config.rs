//! `azblob://` URLs, the account endpoint and the credentials, with secrets kept out of
//! `Debug`, `Display` and errors.

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use leasehold_core::{Error, Result};
use url::Url;

/// The URL schemes this backend handles.
pub const URL_SCHEMES: &[&str] = &["azblob"];

/// The lease durations Azure Blob Storage accepts for a finite lease: 15 to 60 seconds.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(15)..=Duration::from_secs(60);

/// How long one HTTP request may take before it counts as [`Error::Timeout`], unless the URL
/// says `timeout=`. The engine's own `request_timeout` is usually shorter and wins.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How many operations one store runs at once (each with its own HTTP connection), unless the
/// URL says `max_requests=`; renewals and releases have turns of their own
/// ([`DEFAULT_MAX_RENEWALS`]). More wait for
/// a turn (within their timeout): a thousand leases campaigning at once must not open a thousand
/// connections, which overflows the server's accept queue and stalls requests for seconds.
pub const DEFAULT_MAX_REQUESTS: usize = 64;

/// How many renewals and releases one store runs at once, unless the URL says `max_renewals=`.
/// They come at the pace the leaders renew, so the bound is only reached when the service answers
/// slowly: then more of them in flight keep the renewals of many leases from falling behind.
pub const DEFAULT_MAX_RENEWALS: usize = 64;

/// How many terms of each lease keep their history blob, unless the URL says `history_limit=`
/// (`0` keeps all). Older ones are deleted as new terms are granted.
pub const DEFAULT_HISTORY_LIMIT: u32 = 1000;

/// The query parameters of a Shared Access Signature (they are gathered into the SAS when they
/// appear directly in the store URL).
const SAS_KEYS: &[&str] = &[
    "sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "sig", "sr", "si", "ses", "sdd", "skoid", "sktid", "skt", "ske",
    "sks", "skv", "saoid", "suoid", "scid", "rscc", "rscd", "rsce", "rscl", "rsct",
];

/// A Shared Access Signature: the query string that authorises requests (`sv=...&sig=...`).
///
/// Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct SasToken(String);

impl SasToken {
    /// Wraps a SAS query string (a leading `?` is dropped).
    pub fn new(query: impl Into<String>) -> Self {
        let query = query.into();
        SasToken(query.strip_prefix('?').unwrap_or(&query).to_string())
    }

    /// The SAS itself, for building request URLs. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SasToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SasToken(***)")
    }
}

impl fmt::Display for SasToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How requests are authorised.
#[derive(Clone)]
#[non_exhaustive]
pub enum Auth {
    /// A Shared Access Signature appended to every request URL (account or container SAS).
    Sas(SasToken),
    /// An Entra ID (Azure AD) token credential, e.g. from `azure_identity` (https only).
    Credential(Arc<dyn TokenCredential>),
    /// No authorisation (a public container, or a proxy that adds it).
    Anonymous,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Sas(sas) => write!(f, "Sas({sas:?})"),
            Auth::Credential(_) => f.write_str("Credential(TokenCredential)"),
            Auth::Anonymous => f.write_str("Anonymous"),
        }
    }
}

/// Where the leases live and how to reach them.
///
/// Parse one from a URL with [`AzureConfig::from_url`]; see the [crate docs](crate::docs) for
/// the URL forms. `Debug` leaves the SAS out.
#[derive(Clone, Debug)]
pub struct AzureConfig {
    /// The storage account name.
    pub account: String,
    /// The container that holds one blob per lease (created if missing).
    pub container: String,
    /// Prepended to every blob name, e.g. `leases/`.
    pub prefix: String,
    /// The blob service endpoint of the account, e.g. `https://acct.blob.core.windows.net/` or,
    /// for Azurite, `http://127.0.0.1:10000/devstoreaccount1`.
    pub endpoint: Url,
    /// How requests are authorised.
    pub auth: Auth,
    /// The longest one HTTP request may take (including its wait for a turn).
    pub request_timeout: Duration,
    /// How many operations run at once, at most (renewals and releases count separately, in
    /// [`AzureConfig::max_renewals`]).
    pub max_requests: usize,
    /// How many renewals and releases run at once, at most.
    pub max_renewals: usize,
    /// How many terms of each lease keep their history blob (the most recent ones); `0` keeps
    /// all. Default [`DEFAULT_HISTORY_LIMIT`].
    pub history_limit: u32,
}

impl AzureConfig {
    /// A configuration for `container` in `account` on the public Azure cloud, with no
    /// credentials yet (set [`AzureConfig::auth`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when the account or container name is not valid.
    pub fn new(account: &str, container: &str) -> Result<Self> {
        let endpoint = format!("https://{account}.blob.core.windows.net/");
        let bad = |reason: String| Error::InvalidUrl {
            url: endpoint.clone(),
            reason,
        };
        check_account(account).map_err(bad)?;
        check_container(container).map_err(bad)?;
        Ok(AzureConfig {
            account: account.to_string(),
            container: container.to_string(),
            prefix: String::new(),
            endpoint: Url::parse(&endpoint).map_err(|e| bad(e.to_string()))?,
            auth: Auth::Anonymous,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_renewals: DEFAULT_MAX_RENEWALS,
            history_limit: DEFAULT_HISTORY_LIMIT,
        })
    }

    /// Parses a store URL:
    ///
    /// - `azblob://ACCOUNT/CONTAINER?prefix=P&endpoint=URL&sas=ENCODED_SAS&timeout=SECS&max_requests=N&max_renewals=N&history_limit=N`, where
    ///   the SAS may also be given as its own parameters (`...&sv=...&sig=...`), or
    ///   `auth=managed-identity|workload-identity|developer-tools` (feature `identity`);
    /// - `https://ACCOUNT.blob.core.windows.net/CONTAINER?sv=...&sig=...` (the SAS URL the Azure
    ///   portal hands out; `prefix=` and `timeout=` are accepted there too), or the path-style
    ///   `http://127.0.0.1:10000/ACCOUNT/CONTAINER?...` of the emulator.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`], with the SAS signature redacted, for anything malformed or unknown.
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: leasehold_core::url_options::redact_url(url),
            reason: reason.to_string(),
        };
        let parsed = Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
        let scheme = parsed.scheme().to_ascii_lowercase();
        let segments: Vec<String> = parsed
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        let host = parsed.host_str().unwrap_or_default().to_string();
        let (account, container, mut endpoint) = if URL_SCHEMES.contains(&scheme.as_str()) {
            let [container] = segments.as_slice() else {
                return Err(invalid("expected azblob://ACCOUNT/CONTAINER"));
            };
            if parsed.port().is_some() || !parsed.username().is_empty() || parsed.password().is_some() {
                return Err(invalid(
                    "the host of an azblob URL is the account name, without port or user",
                ));
            }
            let endpoint = format!("https://{host}.blob.core.windows.net/");
            (
                host.clone(),
                container.clone(),
                Url::parse(&endpoint).map_err(|e| invalid(&e.to_string()))?,
            )
        } else if scheme == "https" || scheme == "http" {
            let path_style = parsed.host().is_some_and(|h| !matches!(h, url::Host::Domain(_))) || host == "localhost";
            let mut endpoint = parsed.clone();
            endpoint.set_query(None);
            endpoint.set_fragment(None);
            if path_style {
                let [account, container] = segments.as_slice() else {
                    return Err(invalid("expected http://HOST:PORT/ACCOUNT/CONTAINER"));
                };
                endpoint.set_path(&format!("/{account}"));
                (account.clone(), container.clone(), endpoint)
            } else {
                let [container] = segments.as_slice() else {
                    return Err(invalid("expected https://ACCOUNT.blob.core.windows.net/CONTAINER"));
                };
                endpoint.set_path("/");
                let account = host.split('.').next().unwrap_or_default().to_string();
                (account, container.clone(), endpoint)
            }
        } else {
            return Err(invalid("the scheme must be azblob, https or http"));
        };
        check_account(&account).map_err(|r| invalid(&r))?;
        check_container(&container).map_err(|r| invalid(&r))?;

        let mut prefix = String::new();
        let mut sas_param: Option<String> = None;
        let mut sas_inline = url::form_urlencoded::Serializer::new(String::new());
        let mut has_inline = false;
        let mut auth_name: Option<String> = None;
        let mut request_timeout = DEFAULT_REQUEST_TIMEOUT;
        let mut max_requests = DEFAULT_MAX_REQUESTS;
        let mut max_renewals = DEFAULT_MAX_RENEWALS;
        let mut history_limit = DEFAULT_HISTORY_LIMIT;
        for (key, value) in parsed.query_pairs() {
            match key.as_ref() {
                "prefix" => {
                    check_prefix(&value).map_err(|r| invalid(&r))?;
                    prefix = value.into_owned();
                }
                "endpoint" if scheme == "azblob" => {
                    let e = Url::parse(&value).map_err(|_| invalid("endpoint= must be an http(s) URL"))?;
                    if !matches!(e.scheme(), "http" | "https") || e.cannot_be_a_base() || e.query().is_some() {
                        return Err(invalid("endpoint= must be an http(s) URL without query"));
                    }
                    endpoint = e;
                }
                "sas" => sas_param = Some(value.into_owned()),
                "auth" => auth_name = Some(value.into_owned()),
                "timeout" => {
                    let secs: f64 = value
                        .parse()
                        .map_err(|_| invalid("timeout= must be a number of seconds"))?;
                    if !(secs > 0.0 && secs <= 3600.0) {
                        return Err(invalid("timeout= must be between 0 and 3600 seconds"));
                    }
                    request_timeout = Duration::from_secs_f64(secs);
                }
                "max_requests" => {
                    max_requests = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=4096).contains(n))
                        .ok_or_else(|| invalid("max_requests= must be a number from 1 to 4096"))?;
                }
                "max_renewals" => {
                    max_renewals = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=4096).contains(n))
                        .ok_or_else(|| invalid("max_renewals= must be a number from 1 to 4096"))?;
                }
                "history_limit" => {
                    history_limit = value
                        .parse()
                        .map_err(|_| invalid("history_limit= must be a number of terms (0 keeps all)"))?;
                }
                k if SAS_KEYS.contains(&k) => {
                    sas_inline.append_pair(k, &value);
                    has_inline = true;
                }
                _ => return Err(invalid(&format!("unknown option {key:?}"))),
            }
        }
        if !endpoint.path().ends_with('/') {
            let path = format!("{}/", endpoint.path());
            endpoint.set_path(&path);
        }
        let sas = match (sas_param, has_inline) {
            (Some(_), true) => {
                return Err(invalid(
                    "give the SAS either as sas= or as its own parameters, not both",
                ));
            }
            (Some(sas), false) => Some(SasToken::new(sas)),
            (None, true) => Some(SasToken::new(sas_inline.finish())),
            (None, false) => None,
        };
        if let Some(sas) = &sas
            && !sas.expose().split('&').any(|pair| pair.starts_with("sig="))
        {
            return Err(invalid("the SAS has no sig= signature"));
        }
        let auth = match (auth_name.as_deref(), sas) {
            (Some(_), Some(_)) => return Err(invalid("give either a SAS or auth=, not both")),
            (None, Some(sas)) => Auth::Sas(sas),
            (None, None) => Auth::Anonymous,
            (Some("anonymous"), None) => Auth::Anonymous,
            (Some(name), None) => {
                if endpoint.scheme() != "https" {
                    return Err(invalid("Entra ID tokens need an https endpoint"));
                }
                Auth::Credential(entra_credential(name).map_err(|r| invalid(&r))?)
            }
        };
        Ok(AzureConfig {
            account,
            container,
            prefix,
            endpoint,
            auth,
            request_timeout,
            max_requests,
            max_renewals,
            history_limit,
        })
    }

    /// The container URL, with the SAS if there is one. It holds the secret: never log it.
    pub(crate) fn container_url(&self) -> Result<Url> {
        let mut url = self.endpoint.clone();
        url.path_segments_mut()
            .map_err(|()| Error::InvalidUrl {
                url: self.endpoint.to_string(),
                reason: "not a base URL".into(),
            })?
            .pop_if_empty()
            .push(&self.container);
        if let Auth::Sas(sas) = &self.auth {
            url.set_query(Some(sas.expose()));
        }
        Ok(url)
    }

    /// The secret parts of requests, to scrub from error messages.
    pub(crate) fn secrets(&self) -> Vec<String> {
        match &self.auth {
            Auth::Sas(sas) => {
                let mut secrets = vec![sas.expose().to_string()];
                for pair in sas.expose().split('&') {
                    if let Some(sig) = pair.strip_prefix("sig=") {
                        secrets.push(sig.to_string());
                        if let Ok(decoded) = percent_encoding::percent_decode_str(sig).decode_utf8() {
                            secrets.push(decoded.into_owned());
                        }
                    }
                }
                secrets.retain(|s| !s.is_empty());
                secrets
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(feature = "identity")]
fn entra_credential(name: &str) -> std::result::Result<Arc<dyn TokenCredential>, String> {
    let failed = |e: azure_core::Error| format!("cannot create the {name} credential: {e}");
    match name {
        "managed-identity" => Ok(azure_identity::ManagedIdentityCredential::new(None).map_err(failed)?),
        "workload-identity" => Ok(azure_identity::WorkloadIdentityCredential::new(None).map_err(failed)?),
        "developer-tools" => Ok(azure_identity::DeveloperToolsCredential::new(None).map_err(failed)?),
        other => Err(format!(
            "unknown auth={other:?}: use managed-identity, workload-identity, developer-tools or anonymous"
        )),
    }
}

#[cfg(not(feature = "identity"))]
fn entra_credential(name: &str) -> std::result::Result<Arc<dyn TokenCredential>, String> {
    Err(format!(
        "auth={name} needs Entra ID support: enable the `identity` feature of leasehold-azure \
         (or build the config with Auth::Credential)"
    ))
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
        Err(format!(
            "invalid prefix {prefix:?}: up to 512 ASCII letters, digits, '-', '_', '.', '/'"
        ))
    }
}

/// `message` with every secret replaced by `***`.
pub(crate) fn scrub(message: &str, secrets: &[String]) -> String {
    let mut message = message.to_string();
    for secret in secrets {
        message = message.replace(secret.as_str(), "***");
    }
    // Belt and braces: any signature that slipped through in another encoding.
    let mut out = String::with_capacity(message.len());
    let mut rest = message.as_str();
    while let Some(at) = rest.find("sig=") {
        out.push_str(&rest[..at + 4]);
        out.push_str("***");
        let tail = &rest[at + 4..];
        let end = tail.find(['&', ' ', ')', '"', '\'']).unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_from_the_url() {
        let config = AzureConfig::from_url("azblob://acct/leases?max_requests=8&max_renewals=128").unwrap();
        assert_eq!((config.max_requests, config.max_renewals), (8, 128));
        let config = AzureConfig::from_url("azblob://acct/leases").unwrap();
        assert_eq!(
            (config.max_requests, config.max_renewals),
            (DEFAULT_MAX_REQUESTS, DEFAULT_MAX_RENEWALS)
        );
        for bad in ["max_renewals=0", "max_renewals=many", "max_requests=5000"] {
            let err = AzureConfig::from_url(&format!("azblob://acct/leases?{bad}")).unwrap_err();
            let name = bad.split('=').next().unwrap();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn history_limit_from_the_url() {
        let config = AzureConfig::from_url("azblob://acct/leases").unwrap();
        assert_eq!(config.history_limit, DEFAULT_HISTORY_LIMIT);
        let config = AzureConfig::from_url("azblob://acct/leases?history_limit=0").unwrap();
        assert_eq!(config.history_limit, 0);
        for bad in ["history_limit=-1", "history_limit=lots"] {
            let err = AzureConfig::from_url(&format!("azblob://acct/leases?{bad}")).unwrap_err();
            assert!(err.to_string().contains("history_limit"), "{err}");
        }
    }

    const SIG: &str = "c2VjcmV0LXNpZ25hdHVyZQ%3D%3D";

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
        assert_eq!(config.prefix, "app/");
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
    fn inline_sas_and_https_forms() {
        let config = AzureConfig::from_url(&format!("azblob://acct/leases?sv=2021-08-06&sp=rw&sig={SIG}")).unwrap();
        assert_eq!(config.endpoint.as_str(), "https://acct.blob.core.windows.net/");
        let Auth::Sas(sas) = &config.auth else { panic!() };
        assert!(sas.expose().starts_with("sv=2021-08-06&sp=rw&sig="));

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

        let config = AzureConfig::from_url(&format!(
            "http://127.0.0.1:10000/devstoreaccount1/leases?sv=1&sig={SIG}"
        ))
        .unwrap();
        assert_eq!(config.endpoint.as_str(), "http://127.0.0.1:10000/devstoreaccount1/");
        assert_eq!(config.container, "leases");
    }

    #[test]
    fn bad_urls_are_typed_errors_without_secrets() {
        for (url, why) in [
            ("azblob://acct", "ACCOUNT/CONTAINER"),
            ("azblob://acct/a/b", "ACCOUNT/CONTAINER"),
            ("azblob://Acct/leases", "account"),
            ("azblob://acct/Leases", "container"),
            ("azblob://acct/leases?nope=1", "unknown option"),
            ("azblob://acct/leases?sv=1&sp=r", "no sig"),
            ("azblob://acct/leases?prefix=%2Fabs", "prefix"),
            ("ftp://acct/leases", "scheme"),
        ] {
            let err = AzureConfig::from_url(url).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            assert!(err.to_string().contains(why), "{url}: {err}");
        }
        let err = AzureConfig::from_url(&format!("azblob://acct/leases?sig={SIG}&sas=sv%3D1%26sig%3Dx")).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(SIG) && shown.contains("sig=***"), "{shown}");
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

    #[test]
    fn scrubbing() {
        let secrets = vec!["sv=1&sig=abc".to_string(), "abc".to_string()];
        assert_eq!(
            scrub("GET http://h/c?sv=1&sig=abc failed", &secrets),
            "GET http://h/c?*** failed"
        );
        assert_eq!(
            scrub("url (http://h/c?sig=zzz&x=1)", &[]),
            "url (http://h/c?sig=***&x=1)"
        );
        assert_eq!(
            leasehold_core::url_options::redact_url("azblob://a/b?prefix=x&sig=abc"),
            "azblob://a/b?prefix=x&sig=***"
        );
        assert_eq!(
            format!("{:?} {}", SasToken::new("?sig=abc"), SasToken::new("sig=abc")),
            "SasToken(***) ***"
        );
    }
}
