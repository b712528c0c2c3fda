//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)): rows of
//! `<schema>.shards`, a table of their own, so that no lease operation ever reads one and no
//! listing of shard records ever shows a lease. They have no advisory lock and never touch the
//! lock session: every statement runs on the pool.
//!
//! A write is one conditional statement (an `INSERT ... ON CONFLICT (name) DO NOTHING` where no
//! record is expected, an `UPDATE ... WHERE name = $1 AND version = $2` otherwise). Postgres
//! applies it whole or not at all, and of racing writes at one version only one finds the row
//! still at it (the others wait for its row lock, then see the new version). A refused write is
//! followed by one read of the record, which the conflict answers. Each write gives the record a
//! new random [`RecordVersion`] (64 random bits), so a version never comes back, even after the
//! row is deleted and written again.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LeaseName, RecordVersion, Result, ShardRecord, ShardWrite, check_shard_value, prefix_end};
use sqlx::postgres::{PgPool, PgRow};

use crate::error::{self, STORE};
use crate::record::get;
use crate::schema::quoted;
use crate::sql::query;

/// The shard statements of one schema.
#[derive(Debug)]
pub(crate) struct ShardSql {
    /// `$1` name, `$2` new version, `$3` value: created if absent.
    create: Arc<str>,
    /// `$1` name, `$2` expected version, `$3` new version, `$4` value.
    replace: Arc<str>,
    /// `$1` name → its record, if any.
    read: Arc<str>,
    /// `$1` prefix, `$2` the least string above every name with it → the records between.
    range: Arc<str>,
    /// `$1` prefix → every record from it on (for a prefix with no string above it).
    from: Arc<str>,
}

impl ShardSql {
    pub(crate) fn new(schema: &str) -> ShardSql {
        let q = quoted(schema);
        let fill = |text: &str| -> Arc<str> { text.replace("{schema}", &q).into() };
        ShardSql {
            create: fill(
                "INSERT INTO {schema}.shards (name, version, value) VALUES ($1::text, $2::text, $3::text)
                 ON CONFLICT (name) DO NOTHING",
            ),
            replace: fill(
                "UPDATE {schema}.shards SET version = $3::text, value = $4::text
                 WHERE name = $1::text AND version = $2::text",
            ),
            read: fill("SELECT name, version, value FROM {schema}.shards WHERE name = $1::text"),
            // The column's collation is "C" (byte order, which is code point order in UTF-8):
            // said again here so that the range means byte order whatever the table says.
            range: fill(
                r#"SELECT name, version, value FROM {schema}.shards
                   WHERE name >= ($1::text COLLATE "C") AND name < ($2::text COLLATE "C")
                   ORDER BY name COLLATE "C""#,
            ),
            from: fill(
                r#"SELECT name, version, value FROM {schema}.shards
                   WHERE name >= ($1::text COLLATE "C")
                   ORDER BY name COLLATE "C""#,
            ),
        }
    }
}

/// Writes `value` to the record `name` if its version is `expected` (`None`: if there is no
/// record): one statement; a refused one is followed by one read, answered as the conflict.
pub(crate) async fn write(
    pool: &PgPool,
    sql: &ShardSql,
    name: &LeaseName,
    expected: Option<&str>,
    value: &str,
    timeout: Duration,
) -> Result<ShardWrite> {
    check_shard_value(value)?;
    let version = String::from(RecordVersion::random());
    let statement = match expected {
        None => query(&sql.create).bind(name.as_str()).bind(&version).bind(value),
        Some(expected) => query(&sql.replace)
            .bind(name.as_str())
            .bind(expected)
            .bind(&version)
            .bind(value),
    };
    let written = statement
        .execute(pool)
        .await
        .map_err(|e| error::map(&e, "write_shard", timeout))?;
    if written.rows_affected() == 1 {
        return Ok(ShardWrite::Written(ShardRecord {
            name: name.clone(),
            version,
            value: value.to_string(),
        }));
    }
    let row = query(&sql.read)
        .bind(name.as_str())
        .fetch_optional(pool)
        .await
        .map_err(|e| error::map(&e, "write_shard", timeout))?;
    Ok(ShardWrite::Conflict(row.as_ref().map(decode).transpose()?))
}

/// The records whose name starts with `prefix`, in name order: one statement over a range of
/// the primary key, one snapshot and one round trip however many records.
pub(crate) async fn list(pool: &PgPool, sql: &ShardSql, prefix: &str, timeout: Duration) -> Result<Vec<ShardRecord>> {
    let statement = match prefix_end(prefix) {
        Some(end) => query(&sql.range).bind(prefix).bind(end),
        None => query(&sql.from).bind(prefix),
    };
    let rows = statement
        .fetch_all(pool)
        .await
        .map_err(|e| error::map(&e, "shard_records", timeout))?;
    let mut records = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    // "C" order is byte order, which is Rust's: this only guards the contract.
    records.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(records)
}

/// Decodes `(name, version, value)`, each checked ([`ShardRecord::from_columns`]).
fn decode(row: &PgRow) -> Result<ShardRecord> {
    ShardRecord::from_columns(
        STORE,
        get::<String>(row, 0, "name"),
        get::<String>(row, 1, "version"),
        get::<String>(row, 2, "value"),
    )
}
