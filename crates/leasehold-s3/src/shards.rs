//! Shard records ([`LeaseStore::write_shard`], [`LeaseStore::shard_records`]): one JSON object
//! per record, `PREFIX/.leasehold-shards/NAME`, holding the value and a random nonce, so that
//! its ETag (the MD5 of the body, the record's version) is new with every write, even of the
//! same value. A write is one `PutObject` on `If-None-Match: *` or `If-Match`; a listing is one
//! `ListObjectsV2` per 1,000 records plus a `GetObject` of each record whose ETag this store has
//! not seen with its value.
//!
//! [`LeaseStore::write_shard`]: leasehold_core::LeaseStore::write_shard
//! [`LeaseStore::shard_records`]: leasehold_core::LeaseStore::shard_records

use std::collections::HashSet;

use futures::StreamExt;
use leasehold_core::{Error, LeaseName, Result, ShardRecord, ShardWrite, check_shard_value, random_u64};
use serde::{Deserialize, Serialize};

use crate::error::STORE;
use crate::objects::{If, Objects};

/// The folder of the shard record objects, under the prefix. No lease can have a key under it
/// (a lease name never starts with `.` nor holds `/`), and `list` does not descend into it.
pub(crate) const SHARD_FOLDER: &str = ".leasehold-shards/";

/// The `format` of a shard record object.
const FORMAT: &str = "leasehold-s3-shard/1";

/// How many records a listing reads at once (twice `list`'s 16: a group's listing may have
/// thousands to read, within the engine's timeout of three TTLs).
const READS: usize = 32;

/// A shard record object.
#[derive(Debug, Serialize, Deserialize)]
struct Body {
    format: String,
    /// The record's name, repeated: an object copied to another key is refused.
    name: String,
    /// 16 random hex digits, new with every write: what makes the ETag new.
    nonce: String,
    value: String,
}

impl Objects {
    /// The key of the shard record `name`: `PREFIX/.leasehold-shards/NAME`.
    pub(crate) fn shard_key(&self, name: &LeaseName) -> String {
        format!("{}{SHARD_FOLDER}{name}", self.key_prefix)
    }

    /// One `PutObject` of the record with a fresh nonce: `If-None-Match: *` when no record is
    /// expected, `If-Match: "<expected>"` otherwise. Refused (412, or 404 on `If-Match`), one
    /// `GetObject` of the record answers the conflict.
    pub(crate) async fn put_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let quoted = match expected {
            None => None,
            Some(version) if is_version(version) => Some(format!("\"{version}\"")),
            // Never a version of ours (nor a single ETag): no record has it.
            Some(_) => return Ok(ShardWrite::Conflict(self.get_shard(name, "write_shard").await?)),
        };
        let condition = quoted.as_deref().map_or(If::Absent, If::Matches);
        let body = Body {
            format: FORMAT.to_string(),
            name: name.to_string(),
            nonce: format!("{:016x}", random_u64()),
            value: value.to_string(),
        };
        let bytes = serde_json::to_vec(&body).map_err(|e| Error::store(STORE, e))?;
        let written = self
            .put_bytes(&self.shard_key(name), bytes, condition, "write_shard")
            .await?;
        let Some(etag) = written else {
            return Ok(ShardWrite::Conflict(self.get_shard(name, "write_shard").await?));
        };
        let version = unquoted(&etag);
        if version.is_empty() {
            // Written, but its version is unknown: the engine reads the record back.
            return Err(Error::unreachable(
                STORE,
                format!("write_shard: the write of shard record {name} was answered without an ETag; read it back"),
            ));
        }
        let record = ShardRecord {
            name: name.clone(),
            version,
            value: value.to_string(),
        };
        self.remember_shard(&record);
        Ok(ShardWrite::Written(record))
    }

    /// The record as the store holds it now (`GetObject`), `None` when there is none.
    async fn get_shard(&self, name: &LeaseName, operation: &'static str) -> Result<Option<ShardRecord>> {
        let Some((etag, bytes)) = self.get_bytes(name, &self.shard_key(name), operation).await? else {
            return Ok(None);
        };
        let record = decode(name, unquoted(&etag), &bytes)?;
        self.remember_shard(&record);
        Ok(Some(record))
    }

    /// Every shard record whose name starts with `prefix`, in name order: `ListObjectsV2` under
    /// `PREFIX/.leasehold-shards/{prefix}` (1,000 keys a page, with their ETags), then a
    /// `GetObject` of each record (32 at a time) unless this store already read or wrote it at
    /// the ETag listed. 10,000 records: 10 listings and 10,000 reads the first time, 10
    /// listings and one read per record changed since on the next.
    pub(crate) async fn list_shards(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let folder = format!("{}{SHARD_FOLDER}", self.key_prefix);
        let listed = self.list_objects(&folder, prefix, "shard_records").await?;
        let mut records = Vec::with_capacity(listed.len());
        let mut unread = Vec::new();
        {
            let known = self.shard_values.lock().expect("shard cache lock poisoned");
            for (name, etag) in &listed {
                let etag = unquoted(etag);
                match known.get(name) {
                    Some((version, value)) if *version == etag && !etag.is_empty() => records.push(ShardRecord {
                        name: name.clone(),
                        version: etag,
                        value: value.clone(),
                    }),
                    _ => unread.push(name.clone()),
                }
            }
        }
        let reads = futures::stream::iter(unread)
            .map(|name| async move { self.get_shard(&name, "shard_records").await })
            .buffered(READS)
            .collect::<Vec<_>>()
            .await;
        for read in reads {
            // A record deleted since the listing is no record.
            records.extend(read?);
        }
        let names: HashSet<&LeaseName> = listed.iter().map(|(name, _)| name).collect();
        self.shard_values
            .lock()
            .expect("shard cache lock poisoned")
            .retain(|name, _| !name.as_str().starts_with(prefix) || names.contains(name));
        records.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(records)
    }

    fn remember_shard(&self, record: &ShardRecord) {
        self.shard_values
            .lock()
            .expect("shard cache lock poisoned")
            .insert(record.name.clone(), (record.version.clone(), record.value.clone()));
    }
}

/// A version this store could have given: an ETag's text (hex digits, `-N` for a multipart
/// upload). Anything else (quotes, commas, `*`) would make `If-Match` mean something else.
fn is_version(version: &str) -> bool {
    !version.is_empty() && version.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// An ETag without its quotes.
fn unquoted(etag: &str) -> String {
    etag.trim_start_matches("W/").trim_matches('"').to_string()
}

/// Reads a shard record object, every field checked.
fn decode(name: &LeaseName, version: String, bytes: &[u8]) -> Result<ShardRecord> {
    let corrupt = |detail: String| Error::corrupt(STORE, name, format!("shard record: {detail}"));
    let body: Body = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a shard record object: {e}")))?;
    if body.format != FORMAT {
        return Err(corrupt(format!("format {:?}, expected {FORMAT:?}", body.format)));
    }
    if body.name != name.as_str() {
        return Err(corrupt(format!(
            "the object names record {:?}: copied from another key",
            body.name
        )));
    }
    if body.nonce.len() != 16 || !body.nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(corrupt(format!("nonce {:?} is not 16 hex digits", body.nonce)));
    }
    check_shard_value(&body.value).map_err(|e| corrupt(format!("value: {e}")))?;
    Ok(ShardRecord {
        name: name.clone(),
        version,
        value: body.value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> LeaseName {
        LeaseName::new("g.s.01").unwrap()
    }

    #[test]
    fn objects_round_trip_and_foreign_ones_are_corrupt() {
        let body =
            br#"{"format":"leasehold-s3-shard/1","name":"g.s.01","nonce":"0123456789abcdef","value":"a \"b\" \u6771"}"#;
        let record = decode(&name(), "v".into(), body).unwrap();
        assert_eq!(record.value, "a \"b\" 東");
        for foreign in [
            &br#"{"holder":"vandal"}"#[..],
            br#"{"format":"leasehold-s3/1","name":"g.s.01","nonce":"0123456789abcdef","value":"x"}"#,
            br#"{"format":"leasehold-s3-shard/1","name":"g.s.02","nonce":"0123456789abcdef","value":"x"}"#,
            br#"{"format":"leasehold-s3-shard/1","name":"g.s.01","nonce":"12","value":"x"}"#,
            br#"{"format":"leasehold-s3-shard/1","name":"g.s.01","nonce":"0123456789abcdef","value":"a\nb"}"#,
            b"",
        ] {
            let err = decode(&name(), "v".into(), foreign).unwrap_err();
            assert!(
                matches!(&err, Error::CorruptRecord { lease, .. } if lease == "g.s.01"),
                "{}: {err:?}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    #[test]
    fn versions_are_bare_etags() {
        assert_eq!(
            unquoted("\"9b2cf535f27731c974343645a3985328\""),
            "9b2cf535f27731c974343645a3985328"
        );
        assert!(is_version("9b2cf535f27731c974343645a3985328"));
        assert!(is_version("9b2cf535f27731c974343645a3985328-2"));
        for odd in ["", "*", "\"a\"", "a,b", "a b"] {
            assert!(!is_version(odd), "{odd:?}");
        }
    }
}
