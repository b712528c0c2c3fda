//! What the Azure tests share: an account SAS signed for the Azurite emulator and raw access to
//! lease blobs for vandalism (the conformance suite's backend is in `tests/conformance.rs`).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use leasehold_azure::{Auth, AzureConfig};
use leasehold_core::config::Secret;
use leasehold_core::{Error, Result};
use url::Url;

/// The container the tests use (lease names are random per scenario).
pub const CONTAINER: &str = "leasehold-tests";

/// How many operations other than renewals and releases one test store runs at once.
///
/// Azurite is one Node.js process. On this shared 2-core machine it serves 100 to 400 simple
/// requests a second, depending on what else runs; once it has more requests in hand than it
/// can serve, every client waits: with 64 in flight a renewal takes 100-300 ms, and the first
/// request on a new connection up to 5 s (`tests/azurite_rate.rs`). The other scenarios' stores
/// open a new connection for nearly every renewal (idle connections are dropped after 2 s,
/// before Azurite's 5 s keep-alive closes them), so the 1,000 campaigns of `thousand_leases`
/// must not flood the emulator: 8 in flight keep it busy without a long queue. Renewals keep the
/// default of 64 ([`leasehold_azure::DEFAULT_MAX_RENEWALS`]): they come at the leaders' pace, and
/// when the emulator is slow a small bound would make 1,000 leases fall behind.
pub const AZURITE_MAX_REQUESTS: usize = 8;

/// The Azurite endpoint and its account key (from which the store signs its own SAS), from
/// `LEASEHOLD_AZURITE_*` (or the services env file), if the emulator answers.
pub fn azurite() -> Option<AzureConfig> {
    let url = leasehold_conformance::require_server("azurite", "LEASEHOLD_AZURITE_URL")?;
    let account = env("LEASEHOLD_AZURITE_ACCOUNT").unwrap_or_else(|| "devstoreaccount1".into());
    let key = env("LEASEHOLD_AZURITE_ACCOUNT_KEY").expect("LEASEHOLD_AZURITE_ACCOUNT_KEY is set with the URL");
    let mut config = AzureConfig::new(&account, CONTAINER).expect("valid names");
    config.endpoint = Url::parse(&format!("{}/", url.trim_end_matches('/'))).expect("LEASEHOLD_AZURITE_URL is a URL");
    config.auth = Auth::AccountKey(Secret::new(key));
    config.prefix = "t/".into();
    let number = |key: &str| std::env::var(key).ok().and_then(|n| n.parse().ok());
    config.max_requests = number("LEASEHOLD_AZURE_MAX_REQUESTS").unwrap_or(AZURITE_MAX_REQUESTS);
    config.max_renewals = number("LEASEHOLD_AZURE_MAX_RENEWALS").unwrap_or(config.max_renewals);
    Some(config)
}

fn env(key: &str) -> Option<String> {
    if let Ok(v) = std::env::var(key) {
        return Some(v);
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/services/env");
    let text = std::fs::read_to_string(root).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.trim().trim_start_matches("export ").split_once('=')?;
        (k == key).then(|| v.trim_matches(|c| c == '"' || c == '\'').to_string())
    })
}

/// An account SAS (blob service; service, container and object resources; read, add, create,
/// write, delete, list) valid for `valid_for`, signed with HMAC-SHA256 and the account key, by
/// hand (the store signs its own from `account_key`; tests use this one to sign with a wrong key
/// and to reach blobs behind the store's back).
pub fn account_sas(account: &str, key_base64: &str, valid_for: Duration) -> Secret {
    leasehold_azure::account_sas(account, &Secret::new(key_base64), valid_for).expect("the account key is base64")
}

/// Overwrites the metadata of a blob, bypassing the store: under `lease_id` if the blob is
/// leased.
pub async fn raw_set_metadata(
    config: &AzureConfig,
    blob: &str,
    pairs: &[(&str, &str)],
    lease_id: Option<&str>,
) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let metadata = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let options = azure_storage_blob::models::BlobClientSetMetadataOptions {
        lease_id: lease_id.map(str::to_string),
        ..Default::default()
    };
    container
        .blob_client(blob)
        .set_metadata(&metadata, Some(options))
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

fn container_url(config: &AzureConfig) -> Url {
    let mut url = config.endpoint.clone();
    url.path_segments_mut().unwrap().pop_if_empty().push(&config.container);
    match &config.auth {
        Auth::Sas(sas) => url.set_query(Some(sas.expose())),
        Auth::AccountKey(key) => {
            let sas = account_sas(&config.account, key.expose(), Duration::from_secs(3600));
            url.set_query(Some(sas.expose()));
        }
        _ => {}
    }
    url
}

/// The names of the blobs under `prefix`, bypassing the store.
pub async fn raw_list(config: &AzureConfig, prefix: &str) -> Result<Vec<String>> {
    use futures::TryStreamExt;
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let options = azure_storage_blob::models::BlobContainerClientListBlobsOptions {
        prefix: Some(prefix.to_string()),
        ..Default::default()
    };
    let mut pages = container
        .list_blobs(Some(options))
        .map_err(|e| Error::store("azure", e.to_string()))?
        .into_pages();
    let mut names = Vec::new();
    while let Some(page) = pages
        .try_next()
        .await
        .map_err(|e| Error::store("azure", e.to_string()))?
    {
        let page = page.into_model().map_err(|e| Error::store("azure", e.to_string()))?;
        names.extend(page.blob_items.into_iter().filter_map(|item| item.name));
    }
    Ok(names)
}

/// Writes an empty blob with `metadata`, bypassing the store.
pub async fn raw_upload(config: &AzureConfig, blob: &str, metadata: &[(&str, &str)]) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let options = azure_storage_blob::models::BlobClientUploadOptions {
        metadata: Some(metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    container
        .blob_client(blob)
        .upload(azure_core::http::RequestContent::from(Vec::new()), Some(options))
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

/// Deletes the container of `config` and every blob in it, bypassing the store.
pub async fn raw_delete_container(config: &AzureConfig) -> Result<()> {
    azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?
        .delete(None)
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}
