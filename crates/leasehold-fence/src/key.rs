use std::fmt;

use leasehold_core::LeaseName;

use crate::FenceError;

/// The name a fence table keeps the highest term under: the store's identity and the lease.
///
/// Terms are only ordered within one lease of one store. Terms of different stores are
/// unrelated numbers: Redis hands out microsecond-based terms (around 1.7 × 10¹⁵), etcd its
/// revisions (small numbers), so a lease moved from Redis to etcd would have every write
/// rejected under a key that named the lease only. A key that names the store as well starts a
/// fresh sequence with the new store.
///
/// Its text is `<store identity>#<lease>`; the store identity never holds a password (see
/// [`FenceKey::from_url`]), since the key appears in the table and in errors.
///
/// # Moving a lease to another store
///
/// A fresh key also means the old store's leaders are not fenced against the new store's: stop
/// every instance that still campaigns on the old store before the first one campaigns on the
/// new store.
///
/// # Examples
///
/// ```
/// use leasehold_core::LeaseName;
/// use leasehold_fence::FenceKey;
///
/// let lease = LeaseName::new("orders-writer")?;
/// let key = FenceKey::from_url("postgres://app:s3cret@db.internal:5432/app?sslmode=require", &lease)?;
/// assert_eq!(key.as_str(), "postgres://db.internal:5432/app#orders-writer");
///
/// let key = FenceKey::new("redis-prod", &lease);
/// assert_eq!(key.as_str(), "redis-prod#orders-writer");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceKey(String);

impl FenceKey {
    /// The key of `lease` on the store you name `store`: any stable name that differs between
    /// stores, such as `"redis-prod"`. Do not put secrets in it.
    pub fn new(store: &str, lease: &LeaseName) -> Self {
        FenceKey(format!("{store}#{lease}"))
    }

    /// The key of `lease` on the store at `store_url` (the URL given to `leasehold::connect`):
    /// its scheme, hosts and path, lower-cased scheme and hosts; user, password, query and
    /// fragment are left out.
    ///
    /// Stores that differ only in the query (a DynamoDB region or endpoint given as an
    /// option, say) get the same identity here: name them yourself with [`FenceKey::new`].
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidStoreUrl`] when the URL has no `scheme:`.
    pub fn from_url(store_url: &str, lease: &LeaseName) -> Result<Self, FenceError> {
        Ok(Self::new(&store_identity(store_url)?, lease))
    }

    /// A key you built yourself, taken as it is.
    pub fn from_raw(key: impl Into<String>) -> Self {
        FenceKey(key.into())
    }

    /// The key's text, as stored in the fence table.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FenceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for FenceKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `scheme://hosts/path` of a store URL, without credentials, query or fragment.
///
/// Parsed by hand rather than with `url::Url`: leasehold's URLs name several hosts
/// (`etcd://h1:2379,h2:2379/prefix`), which `url` refuses for non-special schemes.
fn store_identity(url: &str) -> Result<String, FenceError> {
    let (scheme, rest) = url.split_once(':').ok_or(FenceError::InvalidStoreUrl {
        reason: "it has no scheme",
    })?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(FenceError::InvalidStoreUrl {
            reason: "it has no valid scheme",
        });
    }
    let scheme = scheme.to_ascii_lowercase();
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let Some(rest) = rest.strip_prefix("//") else {
        // `sqlite:leases.db`: a path only.
        return Ok(format!("{scheme}:{rest}"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // The password may hold '@' (escaped or not): the hosts follow the last one.
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, hosts)| hosts);
    Ok(format!("{scheme}://{}{path}", hosts.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(url: &str) -> String {
        FenceKey::from_url(url, &LeaseName::new("jobs").unwrap()).unwrap().0
    }

    #[test]
    fn a_key_from_a_url_names_scheme_hosts_and_path_and_no_secrets() {
        assert_eq!(
            key("postgres://u:pw@DB.example:5432/app?sslmode=require"),
            "postgres://db.example:5432/app#jobs"
        );
        assert_eq!(key("redis://:p@ss@127.0.0.1:6379/2"), "redis://127.0.0.1:6379/2#jobs");
        assert_eq!(
            key("etcd://root:pw@h1:2379,h2:2379/svc?password=x"),
            "etcd://h1:2379,h2:2379/svc#jobs"
        );
        assert_eq!(key("ETCD://h1:2379"), "etcd://h1:2379#jobs");
        assert_eq!(
            key("sqlite:///var/lib/app/leases.db?mode=rwc"),
            "sqlite:///var/lib/app/leases.db#jobs"
        );
        assert_eq!(key("sqlite:leases.db"), "sqlite:leases.db#jobs");
        assert_eq!(
            key("azblob://acct.blob.core.windows.net/leases?sv=2024&sig=SECRET"),
            "azblob://acct.blob.core.windows.net/leases#jobs"
        );
    }

    #[test]
    fn different_stores_give_different_keys_for_one_lease() {
        assert_ne!(key("redis://127.0.0.1:6379"), key("etcd://127.0.0.1:2379"));
        assert_ne!(key("postgres://db1/app"), key("postgres://db2/app"));
    }

    #[test]
    fn a_url_without_a_scheme_is_refused_without_quoting_it() {
        let lease = LeaseName::new("jobs").unwrap();
        for url in ["no scheme here", ":x", "1abc://h"] {
            let err = FenceKey::from_url(url, &lease).unwrap_err();
            assert!(matches!(err, FenceError::InvalidStoreUrl { .. }), "{url}: {err:?}");
            assert!(!err.to_string().contains(url), "{err}");
        }
    }
}
