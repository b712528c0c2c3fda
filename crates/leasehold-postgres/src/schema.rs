//! The schema and its tables, created when absent and checked when present. Nothing existing is
//! ever altered or dropped.

use std::time::Duration;

use leasehold_core::{Error, Result};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

use crate::error::{self, STORE};
use crate::record::lock_key;

/// The schema this build writes and reads, kept in `<schema>.meta`.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// One table: its name, how to create it, and the columns an existing one must have.
struct Table {
    name: &'static str,
    create: &'static str,
    /// `(name, type as format_type() spells it, not null)`, in order.
    columns: &'static [(&'static str, &'static str, bool)],
}

const TABLES: &[Table] = &[
    Table {
        name: "meta",
        create: "CREATE TABLE {schema}.meta (schema_version integer NOT NULL)",
        columns: &[("schema_version", "integer", true)],
    },
    // One row per lease, kept when the lease is released so that its term never goes back.
    // `holder`, `ttl_ms`, `version` and `lock_pid` are NULL while the lease is free; `term` is the
    // holder's term, or the last one granted; `previous_end` says how the last term ended.
    // `lock_key` is the advisory lock key (to join pg_locks), `lock_pid` the backend pid of the
    // holder's lock session, `renewed_at` the server time of the last grant or renewal (audit
    // only: no safety decision reads it).
    Table {
        name: "leases",
        create: "CREATE TABLE {schema}.leases (
            name         text PRIMARY KEY,
            holder       text,
            term         bigint NOT NULL,
            ttl_ms       bigint,
            version      text,
            previous_end text,
            lock_key     bigint,
            lock_pid     integer,
            renewed_at   timestamptz
        )",
        columns: &[
            ("name", "text", true),
            ("holder", "text", false),
            ("term", "bigint", true),
            ("ttl_ms", "bigint", false),
            ("version", "text", false),
            ("previous_end", "text", false),
            ("lock_key", "bigint", false),
            ("lock_pid", "integer", false),
            ("renewed_at", "timestamp with time zone", false),
        ],
    },
    // The audit trail: one row per term.
    Table {
        name: "history",
        create: "CREATE TABLE {schema}.history (
            name        text        NOT NULL,
            term        bigint      NOT NULL,
            holder      text        NOT NULL,
            acquired_at timestamptz NOT NULL,
            ended_at    timestamptz,
            end_reason  text,
            PRIMARY KEY (name, term)
        )",
        columns: &[
            ("name", "text", true),
            ("term", "bigint", true),
            ("holder", "text", true),
            ("acquired_at", "timestamp with time zone", true),
            ("ended_at", "timestamp with time zone", false),
            ("end_reason", "text", false),
        ],
    },
    // Shard records (`LeaseStore::write_shard`), apart from the leases: no lock, no history.
    // `name` sorts in byte order ("C"), so a prefix is a range of the primary key whatever the
    // database's collation. `version` is 16 random hex digits, new on every write. Added without
    // a schema version change (older builds ignore it).
    Table {
        name: "shards",
        create: r#"CREATE TABLE {schema}.shards (
            name    text COLLATE "C" PRIMARY KEY,
            version text NOT NULL,
            value   text NOT NULL
        )"#,
        columns: &[
            ("name", "text", true),
            ("version", "text", true),
            ("value", "text", true),
        ],
    },
];

/// `"schema"`, quoted for SQL (the name was validated: letters, digits, `_`).
pub(crate) fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Creates the missing schema and tables and checks the existing ones, in one transaction under a
/// transaction-level advisory lock, so that stores opening a new database at once agree.
pub(crate) async fn prepare(conn: &mut PgConnection, schema: &str, wait: Duration) -> Result<()> {
    let map = |e: sqlx::Error| error::map(&e, "open", wait);
    let q = quoted(schema);
    let mut tx = conn.begin().await.map_err(map)?;
    // The connection may carry the lock session's short lock_timeout; another store may be
    // preparing the same schema right now.
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(wait.as_millis().to_string())
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key(schema, "\u{0}setup"))
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
    if !exists {
        // Only when absent: CREATE SCHEMA IF NOT EXISTS needs the privilege even when it exists.
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {q}")))
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    for table in TABLES {
        let kind: Option<String> = sqlx::query_scalar(
            "SELECT c.relkind::text FROM pg_class AS c
             JOIN pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind(schema)
        .bind(table.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?;
        match kind.as_deref().and_then(|k| k.chars().next()) {
            None => {
                sqlx::query(AssertSqlSafe(table.create.replace("{schema}", &q)))
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
            }
            Some('r' | 'p') => check_columns(&mut tx, schema, table).await?,
            Some(other) => {
                let what = match other {
                    'v' => "a view",
                    'm' => "a materialized view",
                    'f' => "a foreign table",
                    'S' => "a sequence",
                    'i' | 'I' => "an index",
                    _ => "not a table",
                };
                return Err(foreign(
                    schema,
                    table.name,
                    format!("{schema}.{} is {what}, not a table", table.name),
                ));
            }
        }
    }
    let versions: Vec<i32> = sqlx::query(AssertSqlSafe(format!("SELECT schema_version FROM {q}.meta")))
        .fetch_all(&mut *tx)
        .await
        .map_err(map)?
        .iter()
        .map(|row| row.try_get::<i32, _>(0))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            foreign(
                schema,
                "meta",
                format!("{schema}.meta.schema_version is not an integer: {e}"),
            )
        })?;
    match versions[..] {
        [] => {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {q}.meta (schema_version) VALUES ($1)"
            )))
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        }
        [SCHEMA_VERSION] => {}
        [version] => {
            return Err(foreign(
                schema,
                "meta",
                format!(
                    "{schema}.meta.schema_version is {version}; this leasehold-postgres reads version {SCHEMA_VERSION}"
                ),
            ));
        }
        _ => {
            return Err(foreign(
                schema,
                "meta",
                format!("{schema}.meta has {} rows, expected one", versions.len()),
            ));
        }
    }
    tx.commit().await.map_err(map)
}

async fn check_columns(conn: &mut PgConnection, schema: &str, table: &Table) -> Result<()> {
    let rows = sqlx::query(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
         FROM pg_attribute AS a
         JOIN pg_class AS c ON c.oid = a.attrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum",
    )
    .bind(schema)
    .bind(table.name)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| error::map(&e, "open", Duration::ZERO))?;
    let found: Vec<(String, String, bool)> = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| foreign(schema, table.name, format!("cannot read its columns: {e}")))?;
    let expected: Vec<(String, String, bool)> = table
        .columns
        .iter()
        .map(|&(name, ty, not_null)| (name.to_string(), ty.to_string(), not_null))
        .collect();
    if found != expected {
        return Err(foreign(
            schema,
            table.name,
            format!(
                "table {schema}.{} has columns ({}), expected ({}); it was not written by leasehold and was left as it is",
                table.name,
                describe(&found),
                describe(&expected),
            ),
        ));
    }
    Ok(())
}

fn describe(columns: &[(String, String, bool)]) -> String {
    let column = |(name, ty, not_null): &(String, String, bool)| {
        if *not_null {
            format!("{name} {ty} NOT NULL")
        } else {
            format!("{name} {ty}")
        }
    };
    columns.iter().map(column).collect::<Vec<_>>().join(", ")
}

/// A table that leasehold did not write: reported as a corrupt record naming the table.
fn foreign(schema: &str, table: &str, detail: String) -> Error {
    Error::corrupt(STORE, format!("(table {schema}.{table})"), detail)
}
