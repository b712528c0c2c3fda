//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): rows of
//! `leasehold_shards`, a table of their own, so that no lease operation ever reads one and no
//! listing of shard records ever shows a lease. They have no named lock and never touch the lock
//! session: every statement runs on the pool, in autocommit.
//!
//! A write is one conditional statement: an `INSERT` where no record is expected (a duplicate
//! key, error 1062, is the refusal), an `UPDATE ... WHERE name = ? AND version = ?` otherwise
//! (InnoDB's `UPDATE` reads the latest committed row under its row lock, whatever the isolation
//! level, so of racing writes at one version only one matches). MySQL has no `RETURNING` on
//! `UPDATE`: a refused write is followed by one read of the record, which the conflict answers.
//! Each write gives the record a new random [`RecordVersion`] (64 random bits), so a version
//! never comes back, even after the row is deleted and written again.

use std::time::Duration;

use leasehold_core::{LeaseName, RecordVersion, Result, ShardRecord, ShardWrite, check_shard_value, prefix_end};
use sqlx::mysql::{MySqlPool, MySqlRow};

use crate::error::{self, STORE};
use crate::record::get;

/// ER_DUP_ENTRY: the `INSERT` of a record that exists.
const DUPLICATE_KEY: u16 = 1062;

/// Writes `value` to the record `name` if its version is `expected` (`None`: if there is no
/// record): one statement; a refused one is followed by one read, answered as the conflict.
pub(crate) async fn write(
    pool: &MySqlPool,
    name: &LeaseName,
    expected: Option<&str>,
    value: &str,
    timeout: Duration,
) -> Result<ShardWrite> {
    check_shard_value(value)?;
    let map = |e: sqlx::Error| error::map(&e, "write_shard", timeout);
    let version = String::from(RecordVersion::random());
    let written = match expected {
        None => {
            match sqlx::query("INSERT INTO leasehold_shards (name, version, value) VALUES (?, ?, ?)")
                .bind(name.as_str())
                .bind(&version)
                .bind(value)
                .execute(pool)
                .await
            {
                Ok(done) => done.rows_affected() == 1,
                Err(e) if error::number(&e) == Some(DUPLICATE_KEY) => false,
                Err(e) => return Err(map(e)),
            }
        }
        // Every version this store writes is 16 hex digits: another one matches no record (and
        // is not compared in SQL, where `ascii_bin` ignores trailing spaces).
        Some(expected) if RecordVersion::parse(expected).is_none() => false,
        Some(expected) => {
            sqlx::query("UPDATE leasehold_shards SET version = ?, value = ? WHERE name = ? AND version = ?")
                .bind(&version)
                .bind(value)
                .bind(name.as_str())
                .bind(expected)
                .execute(pool)
                .await
                .map_err(map)?
                .rows_affected()
                == 1
        }
    };
    if written {
        return Ok(ShardWrite::Written(ShardRecord {
            name: name.clone(),
            version,
            value: value.to_string(),
        }));
    }
    let row = sqlx::query("SELECT name, version, value FROM leasehold_shards WHERE name = ?")
        .bind(name.as_str())
        .fetch_optional(pool)
        .await
        .map_err(map)?;
    Ok(ShardWrite::Conflict(row.as_ref().map(decode).transpose()?))
}

/// The records whose name starts with `prefix`, in name order: one statement over a range of
/// the primary key (`utf8mb4_bin` orders by code point), with the prefix also matched by `LIKE`
/// (escaped), which does not pad with spaces as the range's comparisons do.
pub(crate) async fn list(pool: &MySqlPool, prefix: &str, timeout: Duration) -> Result<Vec<ShardRecord>> {
    let statement = match prefix_end(prefix) {
        Some(end) => sqlx::query(
            "SELECT name, version, value FROM leasehold_shards
             WHERE name >= ? AND name < ? AND name LIKE ? ESCAPE '!' ORDER BY name",
        )
        .bind(prefix)
        .bind(end),
        None => sqlx::query(
            "SELECT name, version, value FROM leasehold_shards
             WHERE name >= ? AND name LIKE ? ESCAPE '!' ORDER BY name",
        )
        .bind(prefix),
    };
    let rows = statement
        .bind(leasehold_core::like_prefix(prefix))
        .fetch_all(pool)
        .await
        .map_err(|e| error::map(&e, "shard_records", timeout))?;
    let mut records = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    // `utf8mb4_bin` orders by code point, which is Rust's order: this only guards the contract.
    records.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(records)
}

/// Decodes `(name, version, value)`, each checked ([`ShardRecord::from_columns`]).
fn decode(row: &MySqlRow) -> Result<ShardRecord> {
    ShardRecord::from_columns(
        STORE,
        get::<String>(row, 0, "name"),
        get::<String>(row, 1, "version"),
        get::<String>(row, 2, "value"),
    )
}
