#![doc = include_str!("../../../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

use std::sync::Arc;

pub use leasehold_core::*;

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use leasehold_sqlite as sqlite;

#[cfg(feature = "azure")]
#[cfg_attr(docsrs, doc(cfg(feature = "azure")))]
pub use leasehold_azure as azure;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use leasehold_dynamodb as dynamodb;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use leasehold_etcd as etcd;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use leasehold_postgres as postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use leasehold_redis as redis;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use leasehold_zookeeper as zookeeper;

/// The URL schemes `connect` knows, with the Cargo feature that enables each.
pub const SCHEMES: &[(&str, &str)] = &[
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("zk", "zookeeper"),
    ("zookeeper", "zookeeper"),
    ("dynamodb", "dynamodb"),
    ("azblob", "azure"),
];

/// Connects to the lease store a URL names, picking the backend by the URL's scheme.
///
/// # Errors
///
/// [`Error::InvalidUrl`] for a URL that cannot be parsed (the error never shows its password);
/// [`Error::UnsupportedScheme`] naming the feature to enable for a compiled-out or unknown
/// scheme; the backend's own errors (e.g. [`Error::Unreachable`]) when it cannot connect.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let store = leasehold::connect(&format!("sqlite://{}/leases.db", dir.path().display())).await?;
/// assert_eq!(store.name(), "sqlite");
///
/// let err = leasehold::connect("nosuch://host").await.unwrap_err();
/// assert!(err.to_string().contains("unsupported store scheme"));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseStore>> {
    let scheme = scheme_of(url)?;
    let scheme = scheme.as_str();
    #[cfg(feature = "sqlite")]
    if leasehold_sqlite::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_sqlite::SqliteStore::connect(url).await?));
    }
    #[cfg(feature = "postgres")]
    if leasehold_postgres::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_postgres::PostgresStore::connect(url).await?));
    }
    #[cfg(feature = "redis")]
    if leasehold_redis::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_redis::RedisStore::connect(url).await?));
    }
    #[cfg(feature = "etcd")]
    if leasehold_etcd::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_etcd::EtcdStore::connect(url).await?));
    }
    #[cfg(feature = "zookeeper")]
    if leasehold_zookeeper::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_zookeeper::ZookeeperStore::connect(url).await?));
    }
    #[cfg(feature = "dynamodb")]
    if leasehold_dynamodb::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_dynamodb::DynamoDbStore::connect(url).await?));
    }
    #[cfg(feature = "azure")]
    if leasehold_azure::URL_SCHEMES.contains(&scheme) {
        return Ok(Arc::new(leasehold_azure::AzureBlobStore::connect(url).await?));
    }
    Err(unsupported(scheme))
}

fn scheme_of(url: &str) -> Result<String> {
    match url.split_once(':') {
        Some((scheme, _))
            if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            Ok(scheme.to_ascii_lowercase())
        }
        _ => Err(Error::InvalidUrl {
            url: redact(url),
            reason: "expected SCHEME://... (e.g. sqlite:///path/leases.db)".into(),
        }),
    }
}

fn unsupported(scheme: &str) -> Error {
    let hint = match SCHEMES.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => format!("enable the `{feature}` feature of the leasehold crate"),
        None => {
            let known: Vec<&str> = SCHEMES.iter().map(|(s, _)| *s).collect();
            format!("known schemes: {}", known.join(", "))
        }
    };
    Error::UnsupportedScheme {
        scheme: scheme.to_string(),
        hint,
    }
}

#[cfg(test)]
fn feature_enabled(feature: &str) -> bool {
    const COMPILED: &[(&str, bool)] = &[
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
        ("etcd", cfg!(feature = "etcd")),
        ("zookeeper", cfg!(feature = "zookeeper")),
        ("dynamodb", cfg!(feature = "dynamodb")),
        ("azure", cfg!(feature = "azure")),
    ];
    COMPILED.iter().any(|&(name, on)| name == feature && on)
}

/// Replaces the password of a URL (and any query value that looks secret) with `***`.
///
/// ```
/// assert_eq!(
///     leasehold::redact("postgres://app:hunter2@db:5432/x?mode=y&sig=abc"),
///     "postgres://app:***@db:5432/x?mode=y&sig=***"
/// );
/// ```
pub fn redact(url: &str) -> String {
    leasehold_core::config::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_and_compiled_out_schemes_name_the_fix() {
        // A backend compiled out of this build (if any) names its feature.
        if let Some((scheme, feature)) = SCHEMES.iter().find(|(_, feature)| !feature_enabled(feature)) {
            let err = connect(&format!("{scheme}://127.0.0.1:1/x")).await.unwrap_err();
            assert!(matches!(err, Error::UnsupportedScheme { .. }), "{err}");
            assert!(err.to_string().contains(&format!("`{feature}` feature")), "{err}");
        }
        let err = connect("ftp://x").await.unwrap_err();
        assert!(err.to_string().contains("known schemes"), "{err}");
        let err = connect("no scheme here").await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    }

    #[test]
    fn redaction_hides_passwords() {
        let r = redact("redis://:s3cret@host:6379/0");
        assert!(!r.contains("s3cret"), "{r}");
        let r = redact("not a url user:pw@host");
        assert!(!r.contains("pw@"), "{r}");
    }

    /// Finding 11 of issue 12: the CLI printed `cannot connect to postgres://app:pa/ss@db.internal/jobs`.
    #[tokio::test]
    async fn redaction_hides_passwords_holding_slash_or_question_mark() {
        for (url, shown) in [
            (
                "postgres://app:pa/ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            (
                "postgres://app:pa?ss@db.internal/jobs",
                "postgres://app:***@db.internal/jobs",
            ),
            ("redis://:pa/ss#x@cache:6379/0", "redis://:***@cache:6379/0"),
        ] {
            assert_eq!(redact(url), shown);
        }
        let err = connect("app:pa/ss@db.internal/jobs").await.unwrap_err();
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("pa/ss"), "{text}");
        }
    }
}
