//! Shard records ([`LeaseStore::write_shard`], [`LeaseStore::shard_records`]): one empty blob
//! per record, `{prefix}.leasehold-shards/{name}`, the value percent-encoded in its metadata
//! (`leasehold_shard_value`), the version its ETag (without the quotes). A write is one
//! conditional request (`Put Blob` on `If-None-Match: *` to create, `Set Blob Metadata` on
//! `If-Match` to replace); a listing is one `List Blobs` with metadata per 5,000 records.
//!
//! [`LeaseStore::write_shard`]: leasehold_core::LeaseStore::write_shard
//! [`LeaseStore::shard_records`]: leasehold_core::LeaseStore::shard_records

use std::collections::HashMap;

use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::models::{
    BlobClientSetMetadataOptions, BlobClientUploadOptions, BlobContainerClientListBlobsOptions, BlobItem,
    ListBlobsIncludeItem,
};
use futures::TryStreamExt;
use leasehold_core::{Error, LeaseName, Result, ShardRecord, ShardWrite, check_shard_value};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::error::{Refusal, STORE};
use crate::record::etag_of;
use crate::store::AzureBlobStore;

/// The virtual folder of the shard blobs, under the store's prefix. No lease can have a name
/// under it (a lease name never starts with `.` nor holds `/`), so `list` skips these blobs and
/// a lease blob is never a shard record.
pub(crate) const SHARD_FOLDER: &str = ".leasehold-shards/";

const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");

/// The metadata key of a shard record's value.
const VALUE: &str = "leasehold_shard_value";

/// Metadata values are ASCII header text (and Azure trims their spaces): everything but
/// letters, digits and `-_.~` is percent-encoded, so a value of 512 bytes takes at most 1,536
/// characters of the 8 KiB of metadata a blob may carry.
const VALUE_ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

impl AzureBlobStore {
    /// The name of the blob that holds the shard record `name`:
    /// `{prefix}.leasehold-shards/{name}`.
    pub fn shard_blob_name(&self, name: &LeaseName) -> String {
        format!("{}{SHARD_FOLDER}{name}", self.config().prefix)
    }

    /// One conditional write of the record (an empty blob, the value in its metadata): `Put
    /// Blob` on `If-None-Match: *` when no record is expected, `Set Blob Metadata` on `If-Match:
    /// "<expected>"` otherwise. A refusal (409 or 412) is answered with one `Get Blob
    /// Properties` of the record; a 404 on `If-Match` (no blob or no container) is a conflict
    /// with no record. A missing container is created before a first record is written into
    /// it, as for a lease.
    pub(crate) async fn put_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let condition = match expected {
            None => Condition::Absent,
            Some(version) if is_version(version) => Condition::Matches(version),
            // Never a version of ours (nor a single ETag): no record has it.
            Some(_) => return Ok(ShardWrite::Conflict(self.read_shard(name).await?)),
        };
        let written = match self.send_shard(name, condition, value).await {
            Err(Refusal::NotFound(_)) if expected.is_none() => {
                self.create_container().await?;
                self.send_shard(name, condition, value).await
            }
            other => other,
        };
        match written {
            Ok(version) => Ok(ShardWrite::Written(ShardRecord {
                name: name.clone(),
                version,
                value: value.to_string(),
            })),
            Err(Refusal::Conflict(_)) => Ok(ShardWrite::Conflict(self.read_shard(name).await?)),
            Err(Refusal::NotFound(_)) if expected.is_some() => Ok(ShardWrite::Conflict(None)),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// The record's one conditional write: the new version. A new record is a `Put Blob` of an
    /// empty blob with its metadata on `If-None-Match: *`; a replacement only sets the metadata
    /// (`Set Blob Metadata` on `If-Match`: a `PUT` that rewrites no content, which on Azurite
    /// also writes no extent).
    async fn send_shard(
        &self,
        name: &LeaseName,
        condition: Condition<'_>,
        value: &str,
    ) -> std::result::Result<String, Refusal> {
        let metadata = HashMap::from([(VALUE.to_string(), utf8_percent_encode(value, VALUE_ENCODE).to_string())]);
        let blob = self.container().blob_client(&self.shard_blob_name(name));
        let etag = match condition {
            Condition::Absent => {
                let options = BlobClientUploadOptions {
                    metadata: Some(metadata),
                    ..Default::default()
                }
                .if_not_exists();
                let reply = self
                    .call(
                        "upload shard",
                        blob.upload(RequestContent::from(Vec::new()), Some(options)),
                    )
                    .await?;
                reply.etag.map(|etag| etag.as_ref().to_string())
            }
            Condition::Matches(version) => {
                let options = BlobClientSetMetadataOptions {
                    if_match: Some(Etag::from(format!("\"{version}\""))),
                    ..Default::default()
                };
                let reply = self
                    .call("set_metadata shard", blob.set_metadata(&metadata, Some(options)))
                    .await?;
                etag_of(name, reply.headers()).ok()
            }
        };
        // The write was applied: without its version the engine must read the record back.
        let etag = etag.ok_or_else(|| {
            Refusal::Failed(Error::unreachable(
                STORE,
                format!("the write of shard record {name} was answered without an ETag"),
            ))
        })?;
        Ok(unquoted(&etag))
    }

    /// The record as the store holds it now (`Get Blob Properties`), `None` when there is none.
    pub(crate) async fn read_shard(&self, name: &LeaseName) -> Result<Option<ShardRecord>> {
        let blob = self.container().blob_client(&self.shard_blob_name(name));
        match self.call("get_properties shard", blob.get_properties(None)).await {
            Ok(reply) => shard_of_headers(name, reply.headers()).map(Some),
            Err(Refusal::NotFound(_)) => Ok(None),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Every shard record whose name starts with `prefix`, in name order: `List Blobs` with
    /// metadata under `{prefix}.leasehold-shards/{prefix}`, every page (5,000 blobs each), so
    /// 10,000 records are 2 requests. A blob there whose name is no lease name is not a record
    /// and is skipped (as `list` skips such blobs); one that is, but that leasehold cannot read,
    /// is [`Error::CorruptRecord`].
    pub(crate) async fn list_shards(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let folder = format!("{}{SHARD_FOLDER}", self.config().prefix);
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(format!("{folder}{prefix}")),
            include: Some(vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        };
        let mut pages = match self.container().list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => return Err(self.refusal("list_blobs shards", &e).into_error()),
        };
        let mut found = Vec::new();
        loop {
            let page = match self.call("list_blobs shards", pages.try_next()).await {
                Ok(Some(page)) => page,
                // No container: no records.
                Ok(None) | Err(Refusal::NotFound(_)) => break,
                Err(refusal) => return Err(refusal.into_error()),
            };
            let page = page
                .into_model()
                .map_err(|e| self.refusal("list_blobs shards", &e).into_error())?;
            for item in page.blob_items {
                if let Some(record) = listed(&folder, item)? {
                    found.push(record);
                }
            }
        }
        found.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(found)
    }
}

/// The condition of a record's write.
#[derive(Clone, Copy, Debug)]
enum Condition<'a> {
    /// `If-None-Match: *`.
    Absent,
    /// `If-Match: "<version>"`.
    Matches(&'a str),
}

/// A version this store could have given: an ETag's text (Azure's are `0x` and hex digits).
/// Anything else (quotes, commas, `*`) would make `If-Match` mean something else.
fn is_version(version: &str) -> bool {
    !version.is_empty() && version.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// An ETag without its quotes (headers carry them, listings do not).
fn unquoted(etag: &str) -> String {
    etag.trim_start_matches("W/").trim_matches('"').to_string()
}

/// The record a listed blob holds; `None` for a name that is no lease name.
fn listed(folder: &str, item: BlobItem) -> Result<Option<ShardRecord>> {
    let Some(name) = item
        .name
        .as_deref()
        .and_then(|blob| blob.strip_prefix(folder))
        .and_then(|name| LeaseName::new(name).ok())
    else {
        return Ok(None);
    };
    let properties = item.properties.unwrap_or_default();
    let etag = properties
        .etag
        .map(|etag| unquoted(etag.as_ref()))
        .ok_or_else(|| Error::store(STORE, format!("the listing of shard record {name} has no ETag")))?;
    let metadata = item.metadata.and_then(|m| m.values).unwrap_or_default();
    shard_record(name, etag, properties.content_length.unwrap_or(0), &metadata).map(Some)
}

/// The record in the headers of `Get Blob Properties`.
fn shard_of_headers(name: &LeaseName, headers: &Headers) -> Result<ShardRecord> {
    let etag = unquoted(&etag_of(name, headers)?);
    let length = headers
        .get_optional_str(&CONTENT_LENGTH)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let metadata: HashMap<String, String> = headers
        .iter()
        .filter_map(|(key, value)| {
            let key = key.as_str().to_ascii_lowercase();
            key.strip_prefix("x-ms-meta-")
                .map(|k| (k.to_string(), value.as_str().to_string()))
        })
        .collect();
    shard_record(name.clone(), etag, length, &metadata)
}

/// Decodes a shard blob: no content, its value in [`VALUE`] (any case of the key).
fn shard_record(
    name: LeaseName,
    version: String,
    length: u64,
    metadata: &HashMap<String, String>,
) -> Result<ShardRecord> {
    let corrupt = |detail: String| Error::corrupt(STORE, &name, format!("shard record: {detail}"));
    if length > 0 {
        return Err(corrupt(format!(
            "the blob has {length} bytes of content: not a leasehold shard blob"
        )));
    }
    let Some(encoded) = metadata
        .iter()
        .find_map(|(k, v)| k.eq_ignore_ascii_case(VALUE).then_some(v))
    else {
        return Err(corrupt(format!("metadata {VALUE} is missing")));
    };
    let shown: String = encoded.chars().take(64).collect();
    let value = percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|_| corrupt(format!("metadata {VALUE} = {shown:?}: not UTF-8")))?
        .into_owned();
    check_shard_value(&value).map_err(|e| corrupt(format!("metadata {VALUE} = {shown:?}: {e}")))?;
    Ok(ShardRecord { name, version, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> LeaseName {
        LeaseName::new("g.s.01").unwrap()
    }

    #[test]
    fn values_round_trip_as_ascii_metadata() {
        let value = "leasehold1 3 3  \"'%\\*?/:{}[]<>|&;$#@!=+,.~`^éß東 ";
        let encoded = utf8_percent_encode(value, VALUE_ENCODE).to_string();
        assert!(encoded.bytes().all(|b| b.is_ascii_graphic()), "{encoded}");
        let metadata = HashMap::from([(VALUE.to_string(), encoded)]);
        let record = shard_record(name(), "0x8D1".into(), 0, &metadata).unwrap();
        assert_eq!(record.value, value);
    }

    #[test]
    fn foreign_blobs_are_corrupt_records() {
        let good = HashMap::from([(VALUE.to_string(), "x".to_string())]);
        for (length, metadata) in [
            (3, good.clone()),
            (0, HashMap::new()),
            (0, HashMap::from([(VALUE.to_string(), "%FF".to_string())])),
            (0, HashMap::from([(VALUE.to_string(), "a%0Ab".to_string())])),
            (0, HashMap::from([(VALUE.to_string(), String::new())])),
        ] {
            let err = shard_record(name(), "0x1".into(), length, &metadata).unwrap_err();
            assert!(
                matches!(&err, Error::CorruptRecord { lease, .. } if lease == "g.s.01"),
                "{length} {metadata:?}: {err:?}"
            );
        }
    }

    #[test]
    fn versions_are_bare_etags() {
        assert_eq!(unquoted("\"0x8DC1\""), "0x8DC1");
        assert_eq!(unquoted("0x8DC1"), "0x8DC1");
        assert!(is_version("0x8DC1"));
        for odd in ["", "*", "\"0x1\"", "0x1,0x2", "0x1 "] {
            assert!(!is_version(odd), "{odd:?}");
        }
    }
}
