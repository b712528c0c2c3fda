//! Signing requests with the storage account key: every request gets a fresh account SAS
//! (HMAC-SHA256 of the string-to-sign with the key), so nobody signs a SAS by hand.
//!
//! An *account* SAS (blob service; service, container and object resources) rather than a
//! container-scoped service SAS: the store creates its container on first use, which a service
//! SAS cannot authorise. Each SAS is valid for [`VALID_FOR`] from the moment it is signed, so a
//! store that runs for months never meets an expired signature.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request};
use azure_core::time::{OffsetDateTime, to_rfc3339};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use leasehold_core::config::Secret;
use sha2::Sha256;

/// The SAS version signed (the account SAS string-to-sign with an encryption scope field, from
/// 2020-12-06 on).
pub(crate) const VERSION: &str = "2021-08-06";
/// read, add, create, write, delete, list.
const PERMISSIONS: &str = "racwdl";
/// The blob service.
const SERVICES: &str = "b";
/// Service, container and object.
const RESOURCE_TYPES: &str = "sco";
const PROTOCOLS: &str = "https,http";
/// How long each signature is valid (requests are signed as they are sent).
const VALID_FOR: Duration = Duration::from_secs(3600);

/// A storage account key, decoded: signs account SAS tokens.
#[derive(Clone)]
pub(crate) struct AccountKey {
    account: String,
    key: Arc<[u8]>,
}

impl fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccountKey")
            .field("account", &self.account)
            .field("key", &"***")
            .finish()
    }
}

impl AccountKey {
    /// Decodes the base64 key as the portal shows it.
    ///
    /// # Errors
    ///
    /// A message (without the key) when it is not base64.
    pub(crate) fn new(account: &str, key: &Secret) -> Result<Self, String> {
        let key = STANDARD
            .decode(key.expose().trim())
            .map_err(|_| "account_key is not base64 (copy it from the portal's access keys)".to_string())?;
        if key.is_empty() {
            return Err("account_key is empty".into());
        }
        Ok(AccountKey {
            account: account.to_string(),
            key: key.into(),
        })
    }

    /// The query of an account SAS valid until `expiry`.
    pub(crate) fn sign(&self, expiry: OffsetDateTime) -> String {
        let expiry = to_rfc3339(&expiry.replace_nanosecond(0).unwrap_or(expiry));
        // Account SAS string-to-sign, version 2020-12-06 and later: account, permissions,
        // services, resource types, start, expiry, IP, protocol, version, encryption scope, and
        // a final newline.
        let to_sign = [
            self.account.as_str(),
            PERMISSIONS,
            SERVICES,
            RESOURCE_TYPES,
            "",
            &expiry,
            "",
            PROTOCOLS,
            VERSION,
            "",
            "",
        ]
        .join("\n");
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(to_sign.as_bytes());
        let signature = STANDARD.encode(mac.finalize().into_bytes());
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("sv", VERSION)
            .append_pair("ss", SERVICES)
            .append_pair("srt", RESOURCE_TYPES)
            .append_pair("sp", PERMISSIONS)
            .append_pair("se", &expiry)
            .append_pair("spr", PROTOCOLS)
            .append_pair("sig", &signature)
            .finish()
    }
}

/// An account SAS query (blob service; service, container and object resources; read, add,
/// create, write, delete, list) valid for `valid_for`, signed with the account key: for a raw
/// Azure client beside the store, or a SAS-only tool, without signing by hand. The store itself
/// signs its requests when its URL carries `account_key=`.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::config::Secret;
///
/// // Azurite's well-known development key.
/// let key = Secret::new("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==");
/// let sas = leasehold_azure::account_sas("devstoreaccount1", &key, Duration::from_secs(3600)).unwrap();
/// assert!(sas.expose().starts_with("sv=2021-08-06&"));
/// assert!(sas.expose().contains("&sig="));
/// assert_eq!(format!("{sas}"), "***");
/// ```
///
/// # Errors
///
/// A message (without the key) when the key is not base64.
pub fn account_sas(account: &str, account_key: &Secret, valid_for: Duration) -> Result<Secret, String> {
    let expiry = OffsetDateTime::now_utc() + valid_for;
    Ok(Secret::new(AccountKey::new(account, account_key)?.sign(expiry)))
}

/// The pipeline policy that appends a freshly signed SAS to every request URL.
#[derive(Debug)]
pub(crate) struct SignWithKey(pub(crate) AccountKey);

#[async_trait]
impl Policy for SignWithKey {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        let expiry = OffsetDateTime::now_utc() + VALID_FOR;
        let sas = self.0.sign(expiry);
        let url = request.url_mut();
        let query = match url.query() {
            Some(query) if !query.is_empty() => format!("{query}&{sas}"),
            _ => sas,
        };
        url.set_query(Some(&query));
        match next.split_first() {
            Some((policy, rest)) => policy.send(ctx, request, rest).await,
            None => unreachable!("the SDK's pipeline ends with its transport policy"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Azure docs is for another version; this checks the shape and that the
    /// signature is the HMAC of exactly the string-to-sign (recomputed by hand here).
    #[test]
    fn signs_the_account_sas_string() {
        let key = AccountKey::new("devstoreaccount1", &Secret::new(STANDARD.encode(b"key"))).unwrap();
        let expiry = OffsetDateTime::from_unix_timestamp(1_893_456_000).unwrap();
        let query = key.sign(expiry);
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let get = |k: &str| pairs.iter().find(|(name, _)| name == k).map(|(_, v)| v.as_str());
        assert_eq!(get("se"), Some("2030-01-01T00:00:00Z"));
        assert_eq!(
            (get("sv"), get("ss"), get("srt"), get("sp")),
            (Some(VERSION), Some("b"), Some("sco"), Some("racwdl"))
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(b"key").unwrap();
        mac.update(b"devstoreaccount1\nracwdl\nb\nsco\n\n2030-01-01T00:00:00Z\n\nhttps,http\n2021-08-06\n\n");
        assert_eq!(get("sig"), Some(STANDARD.encode(mac.finalize().into_bytes()).as_str()));
        assert!(!format!("{key:?}").contains("a2V5"), "{key:?}");
    }

    #[test]
    fn a_key_that_is_not_base64_is_refused_without_showing_it() {
        let err = AccountKey::new("acct", &Secret::new("not base64 !!")).unwrap_err();
        assert!(err.contains("base64") && !err.contains("!!"), "{err}");
    }
}
