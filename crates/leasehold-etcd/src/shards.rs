//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): one key per
//! record, `{prefix}/.shards/{name}`, in a folder of its own beside the leases (`.shards` is no
//! lease name, so no lease key is ever under it, and `list` never reads it). The record's
//! version is the key's `mod_revision`: etcd's revision is store-global and only grows, so a
//! version never comes back for a name, also after the key was deleted and written again.
//!
//! - A write is one transaction: compare the key's `mod_revision` with the expected version
//!   (`create_revision == 0`: no key, when none is expected), then put the value and read the
//!   key back (its new `mod_revision`); else read the key, which answers the conflict.
//! - A listing is one range read per [`PAGE`](crate::list::PAGE) records, every page at the revision of the first
//!   (one snapshot): 10,000 records take 4 requests.

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};
use leasehold_core::{Error, LeaseName, Result, ShardRecord, ShardWrite, check_shard_value};

use crate::error::STORE;
use crate::list::range_end;
use crate::state::Inner;

/// The folder of the shard records under the store's prefix. Lease names never start with `.`,
/// so no lease's keys (`{prefix}/{lease}/...`) are under it.
const FOLDER: &str = ".shards";

impl Inner {
    /// The key of shard record `name`.
    fn shard_key(&self, name: &str) -> String {
        format!("{}/{FOLDER}/{name}", self.config.prefix)
    }

    /// One transaction: the value put if the key's `mod_revision` is `expected` (no key if
    /// `None`), else the key as it is.
    pub(crate) async fn write_shard(
        &self,
        name: &LeaseName,
        expected: Option<&str>,
        value: &str,
    ) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let key = self.shard_key(name.as_str());
        let compare = match expected {
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Some(version) => match parse_version(version) {
                Some(revision) => Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
                // Not a version this store gives: no record has it (no key's mod_revision is
                // below 0, an absent one's is 0), and the transaction answers what is there.
                None => Compare::mod_revision(key.clone(), CompareOp::Less, 0),
            },
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.clone(), value, None), TxnOp::get(key.clone(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.txn("write_shard", txn).await?;
        let ops = resp.op_responses();
        let read = ops.iter().rev().find_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first()),
            _ => None,
        });
        let Some(read) = read else {
            return Err(Error::store(STORE, "write_shard: the transaction answered no read"));
        };
        let held = read.map(|kv| self.parse_shard(kv)).transpose()?;
        if resp.succeeded() {
            match held {
                Some(record) => Ok(ShardWrite::Written(record)),
                None => Err(Error::store(STORE, "write_shard: the key written was not read back")),
            }
        } else {
            Ok(ShardWrite::Conflict(held))
        }
    }

    /// The records whose name starts with `prefix`, in name order (etcd ranges are in key
    /// order, and the keys differ only by the name).
    pub(crate) async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let start = self.shard_key(prefix).into_bytes();
        let end = range_end(&start);
        let mut records = Vec::new();
        self.read_range("shard_records", start, end, |kv| {
            records.push(self.parse_shard(kv)?);
            Ok(())
        })
        .await?;
        Ok(records)
    }

    /// Reads a shard record's key: a name and a value leasehold writes, else
    /// [`Error::CorruptRecord`].
    fn parse_shard(&self, kv: &KeyValue) -> Result<ShardRecord> {
        let folder = self.shard_key("");
        let key = String::from_utf8_lossy(kv.key());
        let name = key
            .strip_prefix(&folder)
            .ok_or_else(|| Error::corrupt(STORE, &key, "a key outside the shard records' folder"))?;
        let name =
            LeaseName::new(name).map_err(|e| Error::corrupt(STORE, &key, format!("not a shard record's key: {e}")))?;
        let value = std::str::from_utf8(kv.value())
            .map_err(|_| Error::corrupt(STORE, &name, "shard record: the value is not UTF-8"))?;
        check_shard_value(value)
            .map_err(|e| Error::corrupt(STORE, &name, format!("shard record: not a leasehold value: {e}")))?;
        Ok(ShardRecord {
            name,
            version: kv.mod_revision().to_string(),
            value: value.to_string(),
        })
    }
}

/// The revision a version names: a positive decimal number, written as this store writes it
/// (versions are compared as text, so `007` is not `7`).
fn parse_version(version: &str) -> Option<i64> {
    version
        .parse::<i64>()
        .ok()
        .filter(|revision| *revision > 0 && revision.to_string() == version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_revisions_as_written() {
        assert_eq!(parse_version("42"), Some(42));
        assert_eq!(parse_version("042"), None);
        assert_eq!(parse_version("+42"), None);
        assert_eq!(parse_version("0"), None);
        assert_eq!(parse_version("-3"), None);
        assert_eq!(parse_version("42x"), None);
        assert_eq!(parse_version(""), None);
    }
}
