//! The shared conformance suite against Azurite, every scenario at once: Azure's 15 s minimum
//! lease makes each take minutes.
//!
//! The backend: Azure Blob Storage on the Azurite emulator (`scripts/services up azurite`): every client is its
//! own `AzureBlobStore`; the suite writes into a container of its own, deleted at the end (the
//! in-memory emulator scans every blob of the account on each request).
//!
//! Azure's minimum lease is 15 s, so the scenarios that wait for expiries take minutes each: run
//! them with `suite!(azure, concurrent)`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_azure::AzureBlobStore;
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use url::Url;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, configured_url, host_port, require_server};

/// Blob names of the suite start with this.
const PREFIX: &str = "t/";

/// How many operations other than renewals and releases one store runs at once.
///
/// Azurite is one Node.js process. On this shared 2-core machine it serves 100 to 400 simple
/// requests a second, depending on what else runs; once it has more requests in hand than it
/// can serve, every client waits: with 64 in flight a renewal takes 100-300 ms, and the first
/// request on a new connection up to 5 s (`leasehold-azure/tests/azurite_rate.rs`). So the
/// 1,000 campaigns of `thousand_leases` must not flood the emulator: 8 in flight keep it busy
/// without a long queue.
const MAX_REQUESTS: usize = 8;

/// Azurite, in a new container `leasehold-conformance-<random>`.
fn azure() -> Option<Arc<dyn Backend>> {
    let endpoint = require_server("azurite", "LEASEHOLD_AZURITE_URL")?;
    let endpoint = endpoint.trim_end_matches('/').to_string();
    let upstream = host_port(&endpoint)?;
    let account = configured_url("LEASEHOLD_AZURITE_ACCOUNT").unwrap_or_else(|| "devstoreaccount1".into());
    let key =
        configured_url("LEASEHOLD_AZURITE_ACCOUNT_KEY").expect("LEASEHOLD_AZURITE_ACCOUNT_KEY is set with the URL");
    let sas = leasehold_azure::account_sas(
        &account,
        &leasehold_core::config::Secret::new(key.as_str()),
        Duration::from_secs(24 * 3600),
    )
    .expect("LEASEHOLD_AZURITE_ACCOUNT_KEY is base64");
    let sas = sas.expose().to_string();
    let container = format!("leasehold-conformance-{:x}", leasehold_core::random_u64());
    let container_url = Arc::new(format!("{endpoint}/{container}?{sas}"));
    // The store signs its requests with the account key; the raw client of `corrupt` and the
    // clean-up uses an account SAS.
    let encoded_key: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
    let url = format!("{endpoint}/{container}?prefix={PREFIX}&max_requests={MAX_REQUESTS}&account_key={encoded_key}");
    let (for_corrupt, for_remove, for_finish) = (container_url.clone(), container_url.clone(), container_url);
    let store_url = url.clone();
    let backend = ServerBackend::new(
        "azure",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(AzureBlobStore::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        move |lease| Box::pin(corrupt(store_url.clone(), for_corrupt.clone(), lease)),
    )
    .remove_with(move |lease| Box::pin(remove(for_remove.clone(), lease)))
    // 1,000 leases renewed every TTL/3 are 3,000/TTL renewals a second, 50 at 60 s, a small share
    // of what Azurite serves next to everything else the suite runs at the same time.
    .many_leases_ttl(Duration::from_secs(60))
    // No `restart_with`: Azurite runs in memory here (`--inMemoryPersistence`), and a restart would
    // lose the container, which no real service does: the restart scenario does not run.
    .secret_urls(move |secret| {
        // A well-formed SAS whose signature is wrong: the emulator refuses every request.
        let forged: String = sas
            .split('&')
            .map(|pair| {
                if pair.starts_with("sig=") {
                    format!("sig={secret}")
                } else {
                    pair.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("&");
        let refused = format!("{endpoint}/{container}?prefix={PREFIX}&{forged}");
        let closed = refused.replacen(&host_port(&endpoint).unwrap_or_default(), "127.0.0.1:1", 1);
        SecretUrls {
            accepted: None,
            malformed: vec![with_option(&refused, "nonsense=1")],
            refused: Some(refused),
            closed: Some(closed),
        }
    })
    .on_finish(move || {
        let container = for_finish.clone();
        Box::pin(async move {
            // Bounded: an emulator that stopped answering must not hold up the results.
            // A container left behind slows every later run down: the emulator scans every blob
            // of the account on each request. Deleting 2,500 blobs right after `thousand_leases`
            // released its 1,000 leases can take Azurite a while.
            match tokio::time::timeout(Duration::from_secs(120), delete_container(&container)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("cannot delete the suite's container: {e}"),
                Err(_) => eprintln!("cannot delete the suite's container: no answer in 120 s"),
            }
        })
    });
    Some(Arc::new(backend))
}

/// Writes garbage where the term belongs, as a foreign program using the same blob would, then
/// breaks the blob lease. The garbage is written *under the holder's lease* (its id is in the
/// record version), so that no candidate can take the lease between the break and the write; a
/// holder that changed in between makes Azure refuse the write, and it is tried again.
async fn corrupt(store_url: String, container_url: Arc<String>, lease: LeaseName) -> Result<()> {
    let store = AzureBlobStore::connect(&store_url).await?;
    let container = container_client(&container_url)?;
    let blob = container.blob_client(&format!("{PREFIX}{lease}"));
    let mut attempts = 0;
    loop {
        let seen = store.inspect(&lease).await?;
        let lease_id = seen
            .holder
            .as_ref()
            .and_then(|h| h.version.split(';').next().map(str::to_string));
        let garbage = [("leasehold_term", "garbage"), ("vandal", "yes")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let options = azure_storage_blob::models::BlobClientSetMetadataOptions {
            lease_id,
            ..Default::default()
        };
        attempts += 1;
        match blob.set_metadata(&garbage, Some(options)).await {
            Ok(_) => break,
            Err(_) if attempts < 10 => eprintln!("azure: corrupting {lease} was refused (the holder changed); again"),
            Err(e) => return Err(Error::store("azure", e.to_string())),
        }
    }
    let options = azure_storage_blob::models::BlobClientBreakLeaseOptions {
        break_period: Some(0),
        ..Default::default()
    };
    match blob.break_lease(Some(options)).await {
        Ok(_) => Ok(()),
        // 409: no lease to break.
        Err(e) if e.http_status().is_some_and(|s| u16::from(s) == 409) => Ok(()),
        Err(e) => Err(Error::store("azure", e.to_string())),
    }
}

/// Deletes the blob of `lease` (`corrupt` broke its lease).
async fn remove(container_url: Arc<String>, lease: LeaseName) -> Result<()> {
    container_client(&container_url)?
        .blob_client(&format!("{PREFIX}{lease}"))
        .delete(None)
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

fn container_client(container_url: &str) -> Result<azure_storage_blob::BlobContainerClient> {
    let url = Url::parse(container_url).map_err(|e| Error::store("azure", e))?;
    azure_storage_blob::BlobContainerClient::new(url, None, None).map_err(|e| Error::store("azure", e.to_string()))
}

/// Deletes the suite's container and every blob in it.
async fn delete_container(container_url: &str) -> Result<()> {
    container_client(container_url)?
        .delete(None)
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

leasehold_conformance::suite!(azure, azure(), concurrent);
