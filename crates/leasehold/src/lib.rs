#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The repository's README (outside this package) is compiled as doctests in the workspace
// only: `cfg(doctest)` is never set when the published crate is built or documented.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;

use std::future::Future;
use std::pin::Pin;
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
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use leasehold_mysql as mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use leasehold_postgres as postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use leasehold_redis as redis;
#[cfg(feature = "s3")]
#[cfg_attr(docsrs, doc(cfg(feature = "s3")))]
pub use leasehold_s3 as s3;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use leasehold_zookeeper as zookeeper;

/// A boxed `connect` future of one backend.
type Connecting<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn LeaseStore>>> + Send + 'a>>;

/// A backend's constructor.
type Open = for<'a> fn(&'a str) -> Connecting<'a>;

/// A backend [`connect`] can open: its URL schemes, the Cargo feature of this crate that compiles
/// it in, and its constructor. [`BACKENDS`] lists every backend once, compiled in or not, so that
/// [`connect`] and its hints read one list (like sqlx's `AnyDriver`).
///
/// # Examples
///
/// ```
/// let sqlite = leasehold::backend_for("sqlite").unwrap();
/// assert_eq!((sqlite.name, sqlite.feature), ("sqlite", "sqlite"));
/// assert!(sqlite.is_enabled()); // the default feature
/// assert_eq!(leasehold::backend_for("postgresql").unwrap().name, "postgres");
/// assert!(leasehold::backend_for("ftp").is_none());
/// ```
#[derive(Clone, Copy)]
pub struct Backend {
    /// The backend's name, as its store reports it ([`LeaseStore::name`]).
    pub name: &'static str,
    /// The URL schemes it handles (lower case).
    pub schemes: &'static [&'static str],
    /// The Cargo feature of the `leasehold` crate that compiles it in.
    pub feature: &'static str,
    /// Its constructor, or `None` when the feature is off.
    open: Option<Open>,
}

impl Backend {
    /// Whether this build has the backend (its feature is on).
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.open.is_some()
    }

    /// Opens the store `url` names with this backend.
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedScheme`] naming the feature to enable when it is off; the backend's
    /// own errors otherwise.
    pub async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        match self.open {
            Some(open) => open(url).await,
            None => Err(Error::UnsupportedScheme {
                scheme: self.schemes[0].to_string(),
                hint: format!("enable the `{}` feature of the leasehold crate", self.feature),
            }),
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .field("enabled", &self.is_enabled())
            .finish()
    }
}

/// One entry of [`BACKENDS`]: the constructor exists only when the feature is on.
macro_rules! backend {
    ($name:literal, $feature:literal, [$($scheme:literal),+], $store:path) => {{
        #[cfg(feature = $feature)]
        const OPEN: Option<Open> = {
            fn open(url: &str) -> Connecting<'_> {
                Box::pin(async move { Ok(Arc::new(<$store>::connect(url).await?) as Arc<dyn LeaseStore>) })
            }
            Some(open)
        };
        #[cfg(not(feature = $feature))]
        const OPEN: Option<Open> = None;
        Backend {
            name: $name,
            schemes: &[$($scheme),+],
            feature: $feature,
            open: OPEN,
        }
    }};
}

/// Every backend, compiled in or not.
pub const BACKENDS: &[Backend] = &[
    backend!("sqlite", "sqlite", ["sqlite"], leasehold_sqlite::SqliteStore),
    backend!(
        "postgres",
        "postgres",
        ["postgres", "postgresql"],
        leasehold_postgres::PostgresStore
    ),
    backend!("mysql", "mysql", ["mysql", "mariadb"], leasehold_mysql::MysqlStore),
    backend!("redis", "redis", ["redis", "rediss"], leasehold_redis::RedisStore),
    backend!("etcd", "etcd", ["etcd", "etcds"], leasehold_etcd::EtcdStore),
    backend!(
        "zookeeper",
        "zookeeper",
        ["zk", "zookeeper"],
        leasehold_zookeeper::ZookeeperStore
    ),
    backend!("dynamodb", "dynamodb", ["dynamodb"], leasehold_dynamodb::DynamoDbStore),
    backend!("azure", "azure", ["azblob"], leasehold_azure::AzureBlobStore),
    backend!("s3", "s3", ["s3"], leasehold_s3::S3Store),
];

/// The backend that handles `scheme` (in any case), compiled in or not.
#[must_use]
pub fn backend_for(scheme: &str) -> Option<&'static Backend> {
    let scheme = scheme.to_ascii_lowercase();
    BACKENDS
        .iter()
        .find(|backend| backend.schemes.contains(&scheme.as_str()))
}

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
    match backend_for(&scheme) {
        Some(backend) => backend.connect(url).await,
        None => {
            let known: Vec<&str> = BACKENDS
                .iter()
                .flat_map(|backend| backend.schemes.iter().copied())
                .collect();
            Err(Error::UnsupportedScheme {
                scheme,
                hint: format!("known schemes: {}", known.join(", ")),
            })
        }
    }
}

fn scheme_of(url: &str) -> Result<String> {
    match url.split_once(':') {
        Some((scheme, _))
            if scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            Ok(scheme.to_ascii_lowercase())
        }
        _ => Err(Error::InvalidUrl {
            url: redact(url),
            reason: "expected SCHEME://... (e.g. sqlite:///path/leases.db)".into(),
        }),
    }
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
        // A backend compiled out of this build (if any) names its feature, for each scheme.
        for backend in BACKENDS.iter().filter(|backend| !backend.is_enabled()) {
            for scheme in backend.schemes {
                let err = connect(&format!("{scheme}://127.0.0.1:1/x")).await.unwrap_err();
                assert!(matches!(err, Error::UnsupportedScheme { .. }), "{err}");
                assert!(
                    err.to_string().contains(&format!("`{}` feature", backend.feature)),
                    "{err}"
                );
            }
        }
        let err = connect("ftp://x").await.unwrap_err();
        assert!(
            err.to_string().contains("known schemes: sqlite, postgres, postgresql"),
            "{err}"
        );
        let err = connect("no scheme here").await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    }

    /// The list is the one place a backend is named: its feature switch, its schemes and the
    /// crate's own `URL_SCHEMES` agree.
    #[test]
    fn the_backend_list_matches_the_features_and_the_crates() {
        let enabled: Vec<&str> = BACKENDS
            .iter()
            .filter(|backend| backend.is_enabled())
            .map(|backend| backend.feature)
            .collect();
        let compiled = [
            ("sqlite", cfg!(feature = "sqlite")),
            ("postgres", cfg!(feature = "postgres")),
            ("mysql", cfg!(feature = "mysql")),
            ("redis", cfg!(feature = "redis")),
            ("etcd", cfg!(feature = "etcd")),
            ("zookeeper", cfg!(feature = "zookeeper")),
            ("dynamodb", cfg!(feature = "dynamodb")),
            ("azure", cfg!(feature = "azure")),
            ("s3", cfg!(feature = "s3")),
        ];
        let expected: Vec<&str> = compiled.iter().filter(|(_, on)| *on).map(|(f, _)| *f).collect();
        assert_eq!(enabled, expected);
        let mut schemes: Vec<&str> = BACKENDS.iter().flat_map(|b| b.schemes.iter().copied()).collect();
        let count = schemes.len();
        schemes.sort_unstable();
        schemes.dedup();
        assert_eq!(schemes.len(), count, "a scheme is listed twice");
        #[cfg(feature = "sqlite")]
        assert_eq!(backend_for("SQLite").unwrap().schemes, leasehold_sqlite::URL_SCHEMES);
        #[cfg(feature = "postgres")]
        assert_eq!(
            backend_for("postgres").unwrap().schemes,
            leasehold_postgres::URL_SCHEMES
        );
        #[cfg(feature = "mysql")]
        assert_eq!(backend_for("mariadb").unwrap().schemes, leasehold_mysql::URL_SCHEMES);
        #[cfg(feature = "redis")]
        assert_eq!(backend_for("redis").unwrap().schemes, leasehold_redis::URL_SCHEMES);
        #[cfg(feature = "etcd")]
        assert_eq!(backend_for("etcd").unwrap().schemes, leasehold_etcd::URL_SCHEMES);
        #[cfg(feature = "zookeeper")]
        assert_eq!(backend_for("zk").unwrap().schemes, leasehold_zookeeper::URL_SCHEMES);
        #[cfg(feature = "dynamodb")]
        assert_eq!(
            backend_for("dynamodb").unwrap().schemes,
            leasehold_dynamodb::URL_SCHEMES
        );
        #[cfg(feature = "azure")]
        assert_eq!(backend_for("azblob").unwrap().schemes, leasehold_azure::URL_SCHEMES);
        #[cfg(feature = "s3")]
        assert_eq!(backend_for("s3").unwrap().schemes, leasehold_s3::URL_SCHEMES);
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
