//! `list(prefix)`: every lease whose name starts with a prefix, read with range requests over
//! the lease keys (one per [`PAGE`] keys, all at the revision of the first) and decoded as
//! `inspect` decodes one lease. The shard records' folder (`shards.rs`) is not read.

use std::collections::BTreeMap;

use etcd_client::{GetOptions, KeyValue};
use leasehold_core::{LeaseName, Observation, Result};

use crate::record::{Keys, Snapshot};
use crate::state::Inner;

/// Keys read per range request. A key is at most some 900 bytes on the wire (a shard record's:
/// a 128-byte name, a 512-byte value, the prefix and the key's metadata), so a page stays well
/// under the 4 MiB a gRPC client accepts in one message.
pub(crate) const PAGE: i64 = 2500;

impl Inner {
    /// Every lease under `prefix` that was ever granted (it has a history key), in name order,
    /// as [`inspect`](leasehold_core::LeaseStore::inspect) shows it.
    pub(crate) async fn list_leases(&self, prefix: &str) -> Result<Vec<Observation>> {
        let root = format!("{}/", self.config.prefix);
        let start = format!("{root}{prefix}").into_bytes();
        let end = range_end(&start);
        // Every lease name starts with a letter, a digit or `_`: with no prefix, the range
        // begins at `0`, after the shard records' folder (`.shards`, see `shards.rs`).
        let start = if prefix.is_empty() {
            format!("{root}0").into_bytes()
        } else {
            start
        };
        let mut leases: BTreeMap<LeaseName, Vec<KeyValue>> = BTreeMap::new();
        self.read_range("list", start, end, |kv| {
            if let Some(lease) = lease_of(&root, kv.key()).filter(|l| l.as_str().starts_with(prefix)) {
                leases.entry(lease).or_default().push(kv.clone());
            }
            Ok(())
        })
        .await?;
        let mut listed = Vec::with_capacity(leases.len());
        for (lease, kvs) in leases {
            let keys = Keys::new(&self.config.prefix, &lease);
            // A lease never granted (only queued candidates) keeps no record: not listed.
            let Some(snapshot) = Snapshot::of_keys(&keys, &kvs)? else {
                continue;
            };
            listed.push(self.unretired(&keys, &lease, snapshot)?.observation(&lease));
        }
        Ok(listed)
    }

    /// Reads the keys from `start` up to `end` in pages of [`PAGE`], every page at the revision
    /// of the first (one snapshot), and hands each to `each` in key order.
    pub(crate) async fn read_range(
        &self,
        operation: &'static str,
        start: Vec<u8>,
        end: Vec<u8>,
        mut each: impl FnMut(&KeyValue) -> Result<()>,
    ) -> Result<()> {
        let mut from = start;
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut client = self.kv();
            let key = from.clone();
            let page = self
                .call(operation, async move { client.get(key, Some(options)).await })
                .await?;
            if revision == 0 {
                revision = page.header().map_or(0, etcd_client::ResponseHeader::revision);
            }
            for kv in page.kvs() {
                each(kv)?;
            }
            match page.kvs().last() {
                Some(last) if page.more() => from = [last.key(), &[0]].concat(),
                _ => return Ok(()),
            }
        }
    }
}

/// The lease a key of the store belongs to: `{root}{lease}/{c|h|e}/...` with a valid lease
/// name; `None` for any other key under the root (not leasehold's, or not a lease's).
fn lease_of(root: &str, key: &[u8]) -> Option<LeaseName> {
    let rest = key.strip_prefix(root.as_bytes())?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    let (name, kind) = rest.split_at(slash);
    if !(kind.starts_with(b"/c/") || kind.starts_with(b"/h/") || kind.starts_with(b"/e/") || kind == b"/reserved") {
        return None;
    }
    LeaseName::new(std::str::from_utf8(name).ok()?).ok()
}

/// The end of the range of keys starting with `start` (etcd's prefix range end: the prefix with
/// its last byte below 0xff incremented; `\0` for all keys).
pub(crate) fn range_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_belong_to_their_lease() {
        let lease = |key: &str| lease_of("app/", key.as_bytes()).map(|l| l.as_str().to_string());
        assert_eq!(lease("app/jobs/c/a").as_deref(), Some("jobs"));
        assert_eq!(lease("app/jobs.v2/h/00000000000000000042").as_deref(), Some("jobs.v2"));
        assert_eq!(lease("app/jobs/e/00000000000000000042").as_deref(), Some("jobs"));
        assert_eq!(lease("app/jobs/reserved").as_deref(), Some("jobs"));
        assert_eq!(lease("app/jobs/x/1"), None, "not a key of leasehold's layout");
        // The latest grant's key (announcements) is not read by `list`, in this version and
        // the ones before it: they list a lease as they always did.
        assert_eq!(lease("app/jobs/granted"), None);
        assert_eq!(lease("app/jobs"), None);
        assert_eq!(lease("app/-bad/c/a"), None, "not a lease name");
        assert_eq!(lease("other/jobs/c/a"), None);
        assert!(lease_of("app/", b"app/\xff/c/a").is_none());
    }

    #[test]
    fn range_ends_after_every_key_with_the_prefix() {
        assert_eq!(range_end(b"app/a-"), b"app/a.".to_vec());
        assert_eq!(range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(range_end(b""), vec![0]);
    }
}
