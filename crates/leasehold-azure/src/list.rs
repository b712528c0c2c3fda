//! Listing the leases of a container by prefix: List Blobs with the metadata of each blob, every
//! page, decoded as `inspect` decodes one lease blob.

use azure_storage_blob::models::{BlobContainerClientListBlobsOptions, BlobItem, ListBlobsIncludeItem};
use leasehold_core::{LeaseName, Observation, Result};

use crate::error::Refusal;
use crate::record::BlobState;
use crate::store::AzureBlobStore;

const DATE: azure_core::http::headers::HeaderName = azure_core::http::headers::HeaderName::from_static("date");

impl AzureBlobStore {
    /// Every lease whose name starts with `prefix`, sorted by name, as [`inspect`] would show
    /// it. One List Blobs request per 5,000 blobs under `{store prefix}{prefix}`; the history
    /// blobs of those leases (`{lease}.history/...`, at most `history_limit` per lease) come in
    /// the same listing and are skipped, as is every blob whose name is not a lease name.
    ///
    /// [`inspect`]: leasehold_core::LeaseStore::inspect
    pub(crate) async fn list_leases(&self, prefix: &str) -> Result<Vec<Observation>> {
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(format!("{}{prefix}", self.config().prefix)),
            include: Some(vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        };
        let mut pages = match self.container().list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => return Err(self.refusal("list_blobs", &e).into_error()),
        };
        let mut found = Vec::new();
        loop {
            let page = match self
                .call("list_blobs", futures::TryStreamExt::try_next(&mut pages))
                .await
            {
                Ok(Some(page)) => page,
                // No container: no leases.
                Ok(None) | Err(Refusal::NotFound(_)) => break,
                Err(refusal) => return Err(refusal.into_error()),
            };
            let date = page
                .headers()
                .get_optional_str(&DATE)
                .and_then(|v| azure_core::time::parse_rfc7231(v).ok());
            let page = page
                .into_model()
                .map_err(|e| self.refusal("list_blobs", &e).into_error())?;
            for item in page.blob_items {
                if let Some(observation) = self.listed(item, date)? {
                    found.push(observation);
                }
            }
        }
        found.sort_by(|a, b| a.lease.as_str().cmp(b.lease.as_str()));
        Ok(found)
    }

    /// The lease a listed blob holds; `None` for a blob that is not a lease blob (a history
    /// blob, a name that is no lease name) or that leasehold has not written a record to.
    fn listed(&self, item: BlobItem, date: Option<azure_core::time::OffsetDateTime>) -> Result<Option<Observation>> {
        let Some(lease) = item
            .name
            .as_deref()
            .and_then(|name| name.strip_prefix(self.config().prefix.as_str()))
            .and_then(|name| LeaseName::new(name).ok())
        else {
            return Ok(None);
        };
        let properties = item.properties.unwrap_or_default();
        let Some(etag) = properties.etag.map(|etag| quoted(etag.to_string())) else {
            return Ok(None);
        };
        let lease_state = properties.lease_state.map(|state| state.to_string());
        let state = BlobState {
            etag,
            length: properties.content_length.unwrap_or(0),
            metadata: item.metadata.and_then(|m| m.values).unwrap_or_default(),
            lease_state: lease_state.as_deref().unwrap_or("available"),
            date,
            modified: properties.last_modified,
        };
        let view = state.view(&lease)?;
        if view.record.is_none() {
            return Ok(None);
        }
        Ok(Some(view.observation(&lease)))
    }
}

/// An ETag as the `ETag` header carries it (in quotes; listings leave them out), so that a
/// listed lease has the version `inspect` reports.
fn quoted(etag: String) -> String {
    if etag.starts_with('"') || etag.starts_with("W/") {
        etag
    } else {
        format!("\"{etag}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_etags_are_quoted_like_the_header() {
        assert_eq!(quoted("0x8D1".into()), "\"0x8D1\"");
        assert_eq!(quoted("\"0x8D1\"".into()), "\"0x8D1\"");
    }
}
