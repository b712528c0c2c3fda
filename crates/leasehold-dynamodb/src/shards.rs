//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): one item per
//! record in the lease table, all in one partition of their own, `lease = #shards` (no lease
//! name: `#` is not allowed in one), sort key the record's name. So no lease operation ever
//! reads one (`list` scans only items with sort key `lease` and lease names), and a listing is
//! one `Query` of that partition per 1 MB of records, in name order.
//!
//! Each item has `value` (S, as written) and `version` (S, 16 random hex digits, new on every
//! write). A write is one conditional `PutItem` (`attribute_not_exists(lease)`, or
//! `version = :expected`) that asks for the item it was refused on
//! (`ReturnValuesOnConditionCheckFailure = ALL_OLD`); where the server returns none (no item,
//! or an emulator that does not return it), one consistent `GetItem` after it.

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use leasehold_core::{Error, LeaseName, RecordVersion, Result, ShardRecord, ShardWrite, check_shard_value};

use crate::error::{self, STORE};
use crate::record::{Item, KEY, SORT, s};
use crate::table::Table;

/// The partition key of every shard record: no lease name can be it.
pub(crate) const SHARDS_KEY: &str = "#shards";
/// The attribute holding a shard record's value.
const VALUE: &str = "value";
/// The attribute holding a shard record's version.
const VERSION: &str = "version";

/// The key of a shard record's item.
fn shard_key(name: &LeaseName) -> Item {
    Item::from([(KEY.to_string(), s(SHARDS_KEY)), (SORT.to_string(), s(name.as_str()))])
}

/// A shard record's item, checked: `value` a valid value, `version` a record version.
fn decode(name: &LeaseName, item: &Item) -> Result<ShardRecord> {
    let corrupt = |detail: String| Error::corrupt(STORE, name, format!("shard record: {detail}"));
    let text = |attribute: &str| match item.get(attribute) {
        Some(AttributeValue::S(text)) => Ok(text.clone()),
        None => Err(corrupt(format!("{attribute} is missing"))),
        Some(_) => Err(corrupt(format!("{attribute} is not a string (S)"))),
    };
    let value = text(VALUE)?;
    check_shard_value(&value).map_err(|e| corrupt(format!("{VALUE}: {e}")))?;
    let version = text(VERSION)?;
    if RecordVersion::parse(&version).is_none() {
        return Err(corrupt(format!("{VERSION} {version:?} is not 16 hex digits")));
    }
    Ok(ShardRecord {
        name: name.clone(),
        version,
        value,
    })
}

impl Table {
    /// One conditional `PutItem` of a shard record (see the module docs).
    pub(crate) async fn put_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let version = RecordVersion::random().to_string();
        let mut item = shard_key(name);
        item.insert(VALUE.to_string(), s(value));
        item.insert(VERSION.to_string(), s(version.clone()));
        let put = self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(item))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let put = match expected {
            None => put
                .condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", KEY),
            Some(expected) => put
                .condition_expression("#v = :v")
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_values(":v", s(expected)),
        };
        match put.send().await {
            Ok(_) => Ok(ShardWrite::Written(ShardRecord {
                name: name.clone(),
                version,
                value: value.to_string(),
            })),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(refused)) => {
                    let held = match refused.item() {
                        Some(item) => Some(decode(name, item)?),
                        None => self.get_shard(name).await?,
                    };
                    Ok(ShardWrite::Conflict(held))
                }
                _ => Err(error::map(e, "write_shard", self.timeout)),
            },
        }
    }

    /// A shard record as one consistent `GetItem` reads it.
    async fn get_shard(&self, name: &LeaseName) -> Result<Option<ShardRecord>> {
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .set_key(Some(shard_key(name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| error::map(e, "write_shard", self.timeout))?;
        out.item().map(|item| decode(name, item)).transpose()
    }

    /// Every shard record whose name starts with `prefix`, in name order: a consistent `Query`
    /// of the `#shards` partition (`begins_with(sk, prefix)` for a non-empty prefix), every
    /// page. An item whose sort key is no lease name is no record.
    pub(crate) async fn list_shards(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(self.table.as_ref())
                .expression_attribute_names("#k", KEY)
                .expression_attribute_values(":k", s(SHARDS_KEY))
                .consistent_read(true)
                .set_exclusive_start_key(start.take());
            query = if prefix.is_empty() {
                query.key_condition_expression("#k = :k")
            } else {
                query
                    .key_condition_expression("#k = :k AND begins_with(#s, :p)")
                    .expression_attribute_names("#s", SORT)
                    .expression_attribute_values(":p", s(prefix))
            };
            let out = query
                .send()
                .await
                .map_err(|e| error::map(e, "shard_records", self.timeout))?;
            for item in out.items() {
                let Some(AttributeValue::S(sk)) = item.get(SORT) else {
                    continue;
                };
                let Ok(name) = LeaseName::new(sk.as_str()) else {
                    continue;
                };
                found.push(decode(&name, item)?);
            }
            match out.last_evaluated_key() {
                Some(next) if !next.is_empty() => start = Some(next.clone()),
                _ => break,
            }
        }
        found.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The partition of the shard records can never be a lease's.
    #[test]
    fn shard_records_have_a_partition_no_lease_has() {
        assert!(LeaseName::new(SHARDS_KEY).is_err());
        let name = LeaseName::new("g.s.01").unwrap();
        assert_eq!(shard_key(&name).get(KEY), Some(&s(SHARDS_KEY)));
        assert_eq!(shard_key(&name).get(SORT), Some(&s("g.s.01")));
    }

    #[test]
    fn garbage_is_corrupt() {
        let name = LeaseName::new("g.s.01").unwrap();
        let with = |value: Option<AttributeValue>, version: Option<AttributeValue>| {
            let mut item = shard_key(&name);
            item.extend(value.map(|v| (VALUE.to_string(), v)));
            item.extend(version.map(|v| (VERSION.to_string(), v)));
            item
        };
        let good = with(Some(s("leasehold1 1 1 a")), Some(s("0123456789abcdef")));
        assert_eq!(decode(&name, &good).unwrap().value, "leasehold1 1 1 a");
        for (item, why) in [
            (with(None, Some(s("0123456789abcdef"))), "value is missing"),
            (with(Some(s("")), Some(s("0123456789abcdef"))), "value"),
            (with(Some(s("a\nb")), Some(s("0123456789abcdef"))), "value"),
            (
                with(Some(AttributeValue::N("1".into())), Some(s("0123456789abcdef"))),
                "not a string",
            ),
            (with(Some(s("a")), None), "version is missing"),
            (with(Some(s("a")), Some(s("zz"))), "version \"zz\""),
        ] {
            match decode(&name, &item) {
                Err(Error::CorruptRecord { lease, detail, .. }) => {
                    assert_eq!(lease, "g.s.01");
                    assert!(detail.contains(why), "{why}: {detail}");
                }
                other => panic!("{why}: expected CorruptRecord, got {other:?}"),
            }
        }
    }
}
