//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): one persistent
//! znode per record, `{chroot}/.shards/{name}`, apart from the leases (`.shards` is no lease
//! name, so `list` never reads it, and no lease path leads into it).
//!
//! A record's version is `{czxid}-{data version}`: the `czxid` is new whenever the znode is
//! created (zxids only grow, also across restarts), and the data version grows with every
//! `setData`, so a version never comes back for a name, also after an operator deleted the
//! znode. A write is one request: `create` when no record is expected, `setData` at the
//! expected data version otherwise; a refused one is answered with one `getData` after it.

use futures::future::join_all;
use leasehold_core::{Error, LeaseName, MAX_SHARD_VALUE_LEN, Result, ShardRecord, ShardWrite, check_shard_value};
use zookeeper_client as zk;

use crate::error::{Failed, STORE, map};
use crate::reads::{Got, READ_BYTES, Read, chunks, read_many};
use crate::state::Inner;

/// The first line of a shard record's znode data; the value follows it.
const SHARD_FORMAT: &str = "leasehold-shard/1";

/// The folder of the shard records under the chroot: not a lease name (it starts with `.`).
pub(crate) const SHARDS_DIR: &str = ".shards";

/// What one record's `getData` may add to a multi-read's answer, at most: its data (the format
/// line and the longest value), its stat (68 bytes) and the result's header.
const RECORD_READ_BYTES: usize = SHARD_FORMAT.len() + 1 + MAX_SHARD_VALUE_LEN + 68 + 32;

/// The data of a shard record's znode.
fn encode(value: &str) -> Vec<u8> {
    format!("{SHARD_FORMAT}\n{value}").into_bytes()
}

/// The record in a znode's data and stat, checked.
fn decode(name: &LeaseName, data: &[u8], stat: &zk::Stat) -> Result<ShardRecord> {
    let corrupt = |detail: String| Error::corrupt(STORE, name, format!("shard record: {detail}"));
    let text = std::str::from_utf8(data).map_err(|_| corrupt("the znode data is not UTF-8".into()))?;
    let value = text
        .strip_prefix(SHARD_FORMAT)
        .and_then(|rest| rest.strip_prefix('\n'))
        .ok_or_else(|| {
            let shown: String = text.chars().take(32).filter(|c| !c.is_control()).collect();
            corrupt(format!(
                "the znode data is not a {SHARD_FORMAT} record: {} bytes starting {shown:?}",
                data.len()
            ))
        })?;
    check_shard_value(value).map_err(|e| corrupt(format!("its value: {e}")))?;
    Ok(ShardRecord {
        name: name.clone(),
        version: version(stat),
        value: value.to_string(),
    })
}

/// The version a znode's stat gives its record.
fn version(stat: &zk::Stat) -> String {
    format!("{}-{}", stat.czxid, stat.version)
}

/// The record a write made.
fn written(name: &LeaseName, stat: &zk::Stat, value: &str) -> ShardRecord {
    ShardRecord {
        name: name.clone(),
        version: version(stat),
        value: value.to_string(),
    }
}

/// The `czxid` and data version of a version string, exactly as [`version`] writes them;
/// `None` for anything else (no record ever has that version).
fn parse_version(text: &str) -> Option<(i64, i32)> {
    let (czxid, data) = text.split_once('-')?;
    let parsed = (czxid.parse::<i64>().ok()?, data.parse::<i32>().ok()?);
    (parsed.0 > 0 && parsed.1 >= 0 && format!("{}-{}", parsed.0, parsed.1) == text).then_some(parsed)
}

impl Inner {
    /// The folder of the shard records.
    pub(crate) fn shards_dir(&self) -> String {
        format!("{}/{SHARDS_DIR}", self.config.chroot().trim_end_matches('/'))
    }

    fn shard_path(&self, name: &LeaseName) -> String {
        format!("{}/{name}", self.shards_dir())
    }

    /// One conditional write of a shard record (see the module docs).
    pub(crate) async fn write_shard(
        &self,
        name: &LeaseName,
        expected: Option<&str>,
        value: &str,
    ) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let client = self.reader().await?;
        let path = self.shard_path(name);
        let data = encode(value);
        let Some(expected) = expected else {
            return self.create_shard(&client, name, &data, value).await;
        };
        // A version no record has: nothing to write over.
        let Some((czxid, at)) = parse_version(expected) else {
            return self.conflict(&client, name).await;
        };
        match client.set_data(&path, &data, Some(at)).await {
            // `czxid` differs only if an operator deleted the znode and it was made again and
            // written up to the same data version: ZooKeeper's condition is the data version
            // alone (see the crate docs, "Shard records").
            Ok(stat) => {
                if stat.czxid != czxid {
                    tracing::warn!(
                        record = %name,
                        expected,
                        "a shard record was written over a znode made again since the version expected was read"
                    );
                }
                Ok(ShardWrite::Written(written(name, &stat, value)))
            }
            Err(zk::Error::NoNode) => Ok(ShardWrite::Conflict(None)),
            Err(zk::Error::BadVersion) => self.conflict(&client, name).await,
            Err(e) => Err(map(e)),
        }
    }

    /// A record where none is: one `create` (the folder is made first if it is missing: then
    /// the create is refused as a whole, and sent once more).
    async fn create_shard(
        &self,
        client: &zk::Client,
        name: &LeaseName,
        data: &[u8],
        value: &str,
    ) -> Result<ShardWrite> {
        let path = self.shard_path(name);
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let created = match client.create(&path, data, &options).await {
            Err(zk::Error::NoNode) => {
                client.mkdir(&self.shards_dir(), &options).await.map_err(map)?;
                client.create(&path, data, &options).await
            }
            other => other,
        };
        match created {
            Ok((stat, _)) if stat.is_invalid() => {
                // A server before 3.5 answers a create without its stat: read it back (a new
                // znode has data version 0 until someone writes it again).
                match client.get_data(&path).await {
                    Ok((_, stat)) if stat.version == 0 => Ok(ShardWrite::Written(written(name, &stat, value))),
                    Ok(_) | Err(zk::Error::NoNode) => Err(Error::unreachable(
                        STORE,
                        Failed::new("the shard record was created and changed again before its version was read"),
                    )),
                    Err(e) => Err(map(e)),
                }
            }
            Ok((stat, _)) => Ok(ShardWrite::Written(written(name, &stat, value))),
            Err(zk::Error::NodeExists) => self.conflict(client, name).await,
            Err(zk::Error::NoNode) => Err(Error::store(
                STORE,
                Failed::new(format!(
                    "the folder {} was deleted as soon as it was made; is something deleting it?",
                    self.shards_dir()
                )),
            )),
            Err(e) => Err(map(e)),
        }
    }

    /// The answer to a refused write: the record as one read after it finds it.
    async fn conflict(&self, client: &zk::Client, name: &LeaseName) -> Result<ShardWrite> {
        match client.get_data(&self.shard_path(name)).await {
            Ok((data, stat)) => Ok(ShardWrite::Conflict(Some(decode(name, &data, &stat)?))),
            Err(zk::Error::NoNode) => Ok(ShardWrite::Conflict(None)),
            Err(e) => Err(map(e)),
        }
    }

    /// Every shard record whose name starts with `prefix`, in name order: `getChildren` of the
    /// folder, then `getData` of each record in multi-reads sent together, each small enough
    /// that also its answer stays under half of `jute.maxbuffer` (about 750 records each). A
    /// record deleted between the two is not listed; a znode with no lease name is no record.
    pub(crate) async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let client = self.reader().await?;
        let children = match client.list_children(&self.shards_dir()).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(map(e)),
        };
        let mut names: Vec<LeaseName> = children
            .into_iter()
            .filter(|child| child.starts_with(prefix))
            .filter_map(|child| LeaseName::new(child).ok())
            .collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let reads: Vec<Read> = names.iter().map(|name| Read::Data(self.shard_path(name))).collect();
        let costs = reads.iter().map(|read| match read {
            Read::Data(path) | Read::Children(path) => path.len() + 32 + RECORD_READ_BYTES,
        });
        let client = &client;
        let answers = join_all(
            chunks(costs, READ_BYTES)
                .into_iter()
                .map(|chunk| read_many(client, &reads[chunk], READ_BYTES)),
        )
        .await;
        let mut records = Vec::with_capacity(names.len());
        for (name, answer) in names.iter().zip(answers.into_iter().flatten()) {
            match answer.map_err(map)? {
                Got::Data(data, stat) => records.push(decode(name, &data, &stat)?),
                Got::NoNode => {}
                Got::Children(_) => {
                    return Err(Error::store(
                        STORE,
                        Failed::new("ZooKeeper answered a getData in a multi-read with children"),
                    ));
                }
            }
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(czxid: i64, version: i32) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 0,
            mtime: 0,
            version,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children: 0,
        }
    }

    /// The folder can never be a lease's znode, and versions name the znode's creation and its
    /// data version exactly (anything else is no version a record has).
    #[test]
    fn the_layout_keeps_shards_apart_and_versions_exact() {
        assert!(LeaseName::new(SHARDS_DIR).is_err());
        assert_eq!(version(&stat(17_179_869_193, 3)), "17179869193-3");
        assert_eq!(parse_version("17179869193-3"), Some((17_179_869_193, 3)));
        for garbage in [
            "", "1", "1-", "-1", "1-x", "01-3", "1-03", "+1-3", "0-1", "1--1", "1-3x", "1-3-4",
        ] {
            assert_eq!(parse_version(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn records_keep_their_value_and_garbage_is_corrupt() {
        let name = LeaseName::new("g.s.01").unwrap();
        let value = "leasehold1 3 3 \"'%\\ éß東";
        let record = decode(&name, &encode(value), &stat(5, 2)).unwrap();
        assert_eq!((record.value.as_str(), record.version.as_str()), (value, "5-2"));
        for bad in [
            &b"garbage"[..],
            b"\xff",
            b"leasehold-shard/1",
            b"leasehold-shard/1\n",
            b"leasehold-shard/1\na\nb",
        ] {
            assert!(
                matches!(decode(&name, bad, &stat(5, 2)), Err(Error::CorruptRecord { .. })),
                "{bad:?}"
            );
        }
    }
}
