//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): rows of
//! `leasehold_shards`, a table of their own, so that no lease operation ever reads one and no
//! listing of shard records ever shows a lease.
//!
//! A write is one conditional statement in the writer's `BEGIN IMMEDIATE` transaction (an
//! `INSERT ... ON CONFLICT DO NOTHING` where no record is expected, an `UPDATE ... WHERE version
//! = expected` otherwise); a refused one reads the record in the same transaction, so the
//! conflict answers exactly what the write was refused over. Each write gives the record a new
//! random [`RecordVersion`] (64 random bits), so a version never comes back, even after the row
//! is deleted and written again.

use leasehold_core::{LeaseName, RecordVersion, Result, ShardRecord, ShardWrite, prefix_end};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::error::STORE;
use crate::record::{Failure, text};

/// Writes `value` to the record `name` if its version is `expected` (`None`: if there is no
/// record); otherwise answers what the table holds. Run inside the writer's transaction, which
/// holds SQLite's write lock: the statement and the read of a refused write see the same row.
pub(crate) async fn write(
    conn: &mut SqliteConnection,
    name: &LeaseName,
    expected: Option<&str>,
    value: &str,
) -> Result<ShardWrite, Failure> {
    let version = String::from(RecordVersion::random());
    let written = match expected {
        None => {
            sqlx::query(
                "INSERT INTO leasehold_shards (name, version, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(name.as_str())
            .bind(&version)
            .bind(value)
            .execute(&mut *conn)
            .await?
        }
        Some(expected) => {
            sqlx::query("UPDATE leasehold_shards SET version = ?3, value = ?4 WHERE name = ?1 AND version = ?2")
                .bind(name.as_str())
                .bind(expected)
                .bind(&version)
                .bind(value)
                .execute(&mut *conn)
                .await?
        }
    };
    if written.rows_affected() == 1 {
        return Ok(ShardWrite::Written(ShardRecord {
            name: name.clone(),
            version,
            value: value.to_string(),
        }));
    }
    let row = sqlx::query("SELECT name, version, value FROM leasehold_shards WHERE name = ?1")
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(ShardWrite::Conflict(row.as_ref().map(decode).transpose()?))
}

/// The records whose name starts with `prefix`, in name order: one statement over a range of the
/// primary key (`name >= prefix AND name < ` the least string above every name with that
/// prefix), so one snapshot, however many records.
pub(crate) async fn list(conn: &mut SqliteConnection, prefix: &str) -> Result<Vec<ShardRecord>, Failure> {
    let rows = match prefix_end(prefix) {
        Some(end) => {
            sqlx::query(
                "SELECT name, version, value FROM leasehold_shards
                 WHERE name >= ?1 AND name < ?2 ORDER BY name",
            )
            .bind(prefix)
            .bind(end)
            .fetch_all(&mut *conn)
            .await?
        }
        // Nothing is above every name with this prefix (an empty prefix): no upper bound.
        None => {
            sqlx::query("SELECT name, version, value FROM leasehold_shards WHERE name >= ?1 ORDER BY name")
                .bind(prefix)
                .fetch_all(&mut *conn)
                .await?
        }
    };
    let mut records = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    // SQLite's order of TEXT is byte order, which is Rust's: this only guards the contract.
    records.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(records)
}

/// Decodes `(name, version, value)`, each checked ([`ShardRecord::from_columns`]).
fn decode(row: &SqliteRow) -> Result<ShardRecord> {
    ShardRecord::from_columns(
        STORE,
        text(row, 0, "name"),
        text(row, 1, "version"),
        text(row, 2, "value"),
    )
}
