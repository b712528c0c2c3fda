//! The tables, created when absent and checked when present. Nothing existing is ever altered.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_core::{Error, Result};
use sqlx::{Connection, Row, SqliteConnection};

use crate::error::{self, STORE};

/// The schema this build writes and reads, kept in `leasehold_meta`.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// One table: its name, how to create it, and the columns an existing one must have.
struct Table {
    name: &'static str,
    create: &'static str,
    /// `(name, declared type, not null, position in the primary key)`, in order.
    columns: &'static [(&'static str, &'static str, bool, i64)],
}

const TABLES: &[Table] = &[
    Table {
        name: "leasehold_meta",
        create: "CREATE TABLE leasehold_meta (schema_version INTEGER NOT NULL)",
        columns: &[("schema_version", "INTEGER", true, 0)],
    },
    // One row per lease, kept when the lease is released so that its term never goes back.
    // `holder`, `ttl_ms` and `version` are NULL while the lease is free; `term` is the holder's
    // term, or the last one granted; `previous_end` says how the last term ended.
    Table {
        name: "leasehold_leases",
        create: "CREATE TABLE leasehold_leases (
            name         TEXT    NOT NULL PRIMARY KEY,
            holder       TEXT,
            term         INTEGER NOT NULL,
            ttl_ms       INTEGER,
            version      TEXT,
            previous_end TEXT
        ) WITHOUT ROWID",
        columns: &[
            ("name", "TEXT", true, 1),
            ("holder", "TEXT", false, 0),
            ("term", "INTEGER", true, 0),
            ("ttl_ms", "INTEGER", false, 0),
            ("version", "TEXT", false, 0),
            ("previous_end", "TEXT", false, 0),
        ],
    },
    // The audit trail: one row per term. Times are Unix milliseconds by the writer's wall clock;
    // no safety decision reads them.
    Table {
        name: "leasehold_terms",
        create: "CREATE TABLE leasehold_terms (
            name        TEXT    NOT NULL,
            term        INTEGER NOT NULL,
            holder      TEXT    NOT NULL,
            acquired_at INTEGER NOT NULL,
            ended_at    INTEGER,
            end_reason  TEXT,
            PRIMARY KEY (name, term)
        ) WITHOUT ROWID",
        columns: &[
            ("name", "TEXT", true, 1),
            ("term", "INTEGER", true, 2),
            ("holder", "TEXT", true, 0),
            ("acquired_at", "INTEGER", true, 0),
            ("ended_at", "INTEGER", false, 0),
            ("end_reason", "TEXT", false, 0),
        ],
    },
    // The followers waiting for each lease, in the order they started waiting (`since`), with
    // the process they run in: a release wakes only the first live one. No safety decision
    // reads it; added without a schema version change (older builds ignore it).
    Table {
        name: "leasehold_waiters",
        create: "CREATE TABLE leasehold_waiters (
            name      TEXT    NOT NULL,
            candidate TEXT    NOT NULL,
            pid       INTEGER NOT NULL,
            since     INTEGER NOT NULL,
            PRIMARY KEY (name, candidate)
        ) WITHOUT ROWID",
        columns: &[
            ("name", "TEXT", true, 1),
            ("candidate", "TEXT", true, 2),
            ("pid", "INTEGER", true, 0),
            ("since", "INTEGER", true, 0),
        ],
    },
    // Shard records (`LeaseStore::write_shard`): kept apart from the leases, so that no lease
    // operation reads one. `version` is 16 random hex digits, new on every write. Added without
    // a schema version change (older builds ignore it).
    Table {
        name: "leasehold_shards",
        create: "CREATE TABLE leasehold_shards (
            name    TEXT NOT NULL PRIMARY KEY,
            version TEXT NOT NULL,
            value   TEXT NOT NULL
        ) WITHOUT ROWID",
        columns: &[
            ("name", "TEXT", true, 1),
            ("version", "TEXT", true, 0),
            ("value", "TEXT", true, 0),
        ],
    },
];

/// Switches the file to write-ahead logging, then creates the missing tables and checks the
/// existing ones, all in one transaction so that processes opening a new file together agree.
pub(crate) async fn prepare(conn: &mut SqliteConnection, path: &Path, busy_timeout: Duration) -> Result<()> {
    let map = |e| error::map_open(e, path, busy_timeout);
    enable_wal(conn, path, busy_timeout).await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
    for table in TABLES {
        let kind: Option<String> = sqlx::query_scalar("SELECT type FROM sqlite_master WHERE name = ?1")
            .bind(table.name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        match kind.as_deref() {
            None => {
                sqlx::query(table.create).execute(&mut *tx).await.map_err(map)?;
            }
            Some("table") => check_columns(&mut tx, table, path).await?,
            Some(other) => {
                return Err(foreign(
                    table.name,
                    format!("{} in {} is a {other}, not a table", table.name, path.display()),
                ));
            }
        }
    }
    let versions: Vec<i64> = sqlx::query("SELECT schema_version FROM leasehold_meta")
        .fetch_all(&mut *tx)
        .await
        .map_err(map)?
        .iter()
        .map(|row| row.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            foreign(
                "leasehold_meta",
                format!("leasehold_meta.schema_version is not an integer: {e}"),
            )
        })?;
    match versions[..] {
        [] => {
            sqlx::query("INSERT INTO leasehold_meta (schema_version) VALUES (?1)")
                .bind(SCHEMA_VERSION)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
        }
        [SCHEMA_VERSION] => {}
        [version] => {
            return Err(foreign(
                "leasehold_meta",
                format!(
                    "leasehold_meta.schema_version is {version}; this leasehold-sqlite reads version {SCHEMA_VERSION}"
                ),
            ));
        }
        _ => {
            return Err(foreign(
                "leasehold_meta",
                format!("leasehold_meta has {} rows, expected one", versions.len()),
            ));
        }
    }
    tx.commit().await.map_err(map)
}

/// `PRAGMA journal_mode = WAL` takes an exclusive lock that SQLite's busy handler does not wait
/// for, so when several processes open a new file at once, the losers wait here (once, at
/// open; lease operations never loop).
async fn enable_wal(conn: &mut SqliteConnection, path: &Path, busy_timeout: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let mode: Result<String, sqlx::Error> = async {
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut *conn).await?;
            if mode.eq_ignore_ascii_case("wal") {
                return Ok(mode);
            }
            sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&mut *conn)
                .await
        }
        .await;
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::store(
                    STORE,
                    format!(
                        "{} cannot use write-ahead logging (journal mode stays {mode:?})",
                        path.display()
                    ),
                ));
            }
            Err(e) if error::is_busy(&e) && started.elapsed() < busy_timeout => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(error::map_open(e, path, busy_timeout)),
        }
    }
}

async fn check_columns(conn: &mut SqliteConnection, table: &Table, path: &Path) -> Result<()> {
    let rows = sqlx::query(r#"SELECT name, type, "notnull", pk FROM pragma_table_info(?1) ORDER BY cid"#)
        .bind(table.name)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| error::map_open(e, path, Duration::ZERO))?;
    let found: Vec<(String, String, bool, i64)> = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get(0)?,
                row.try_get::<String, _>(1)?.to_ascii_uppercase(),
                row.try_get(2)?,
                row.try_get(3)?,
            ))
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| foreign(table.name, format!("cannot read its columns: {e}")))?;
    let expected: Vec<(String, String, bool, i64)> = table
        .columns
        .iter()
        .map(|&(name, ty, not_null, pk)| (name.to_string(), ty.to_string(), not_null, pk))
        .collect();
    if found != expected {
        return Err(foreign(
            table.name,
            format!(
                "table {} in {} has columns ({}), expected ({}); it was not written by leasehold and was left as it is",
                table.name,
                path.display(),
                describe(&found),
                describe(&expected),
            ),
        ));
    }
    Ok(())
}

fn describe(columns: &[(String, String, bool, i64)]) -> String {
    let column = |(name, ty, not_null, pk): &(String, String, bool, i64)| {
        let mut text = format!("{name} {ty}");
        if *not_null {
            text.push_str(" NOT NULL");
        }
        if *pk > 0 {
            text.push_str(" PRIMARY KEY");
        }
        text
    };
    columns.iter().map(column).collect::<Vec<_>>().join(", ")
}

/// A table that leasehold did not write: reported as a corrupt record naming the table.
fn foreign(table: &str, detail: String) -> Error {
    Error::corrupt(STORE, format!("(table {table})"), detail)
}
