//! Listing leases by prefix: one Scan of the lease items, every page.

use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_core::{LeaseName, Observation, Result};

use crate::error;
use crate::record::{Item, KEY, LEASE_SK, Record, SORT, s};
use crate::table::Table;

impl Table {
    /// Every lease item whose name begins with `prefix`, sorted by name, decoded as `read`
    /// decodes it. The partition key is the lease name, so this is a Scan (DynamoDB can only
    /// range over sort keys): filtered to lease items (`sk = lease`) and, for a non-empty prefix,
    /// `begins_with(lease, prefix)`; one request per 1 MB of the table, every page read.
    pub(crate) async fn list_leases(&self, prefix: &str) -> Result<Vec<Observation>> {
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let mut scan = self
                .client
                .scan()
                .table_name(self.table.as_ref())
                .expression_attribute_names("#s", SORT)
                .expression_attribute_values(":lease", s(LEASE_SK))
                .consistent_read(true)
                .set_exclusive_start_key(start.take());
            scan = if prefix.is_empty() {
                scan.filter_expression("#s = :lease")
            } else {
                scan.filter_expression("#s = :lease AND begins_with(#k, :p)")
                    .expression_attribute_names("#k", KEY)
                    .expression_attribute_values(":p", s(prefix))
            };
            let out = scan.send().await.map_err(|e| error::map(e, "list", self.timeout))?;
            for item in out.items() {
                // An item whose key is no lease name was not written by leasehold: not a lease.
                let Some(AttributeValue::S(name)) = item.get(KEY) else {
                    continue;
                };
                let Ok(lease) = LeaseName::new(name.as_str()) else {
                    continue;
                };
                found.push(Record::decode(&lease, item)?.observation(&lease));
            }
            match out.last_evaluated_key() {
                Some(next) if !next.is_empty() => start = Some(next.clone()),
                _ => break,
            }
        }
        found.sort_by(|a, b| a.lease.as_str().cmp(b.lease.as_str()));
        Ok(found)
    }
}
