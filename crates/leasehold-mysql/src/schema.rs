//! What `connect` checks before it answers: the tables (created when absent, checked when
//! present, never altered), the privileges leasehold needs, that the server is not a Galera
//! node, and that named locks stay with the session that took them.

use std::time::Duration;

use leasehold_core::{Error, Result, random_u64};
use sqlx::{Executor, MySqlConnection, Row};

use crate::error::{self, STORE};

/// The schema this build writes and reads, kept in `leasehold_meta`.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// One table: its name, how to create it, and its columns as `information_schema` shows them.
struct Table {
    name: &'static str,
    create: &'static str,
    /// `(name, data type)`, in order.
    columns: &'static [(&'static str, &'static str)],
}

const TABLES: &[Table] = &[
    Table {
        name: "leasehold_meta",
        create: "CREATE TABLE IF NOT EXISTS leasehold_meta (
            id             TINYINT NOT NULL PRIMARY KEY,
            schema_version INT     NOT NULL
        ) ENGINE = InnoDB",
        columns: &[("id", "tinyint"), ("schema_version", "int")],
    },
    // One row per lease, kept when the lease is released so that its term never goes back.
    Table {
        name: "leasehold_leases",
        create: "CREATE TABLE IF NOT EXISTS leasehold_leases (
            name         VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
            holder       VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
            term         BIGINT       NOT NULL,
            ttl_ms       BIGINT       NULL,
            version      VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
            previous_end VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
            renewed_at   TIMESTAMP(3) NULL
        ) ENGINE = InnoDB",
        columns: &[
            ("name", "varchar"),
            ("holder", "varchar"),
            ("term", "bigint"),
            ("ttl_ms", "bigint"),
            ("version", "varchar"),
            ("previous_end", "varchar"),
            ("renewed_at", "timestamp"),
        ],
    },
    // The audit trail: one row per term, times in Unix milliseconds by the writer's clock.
    Table {
        name: "leasehold_history",
        create: "CREATE TABLE IF NOT EXISTS leasehold_history (
            name        VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            term        BIGINT       NOT NULL,
            holder      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            acquired_at BIGINT       NOT NULL,
            ended_at    BIGINT       NULL,
            end_reason  VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
            PRIMARY KEY (name, term)
        ) ENGINE = InnoDB",
        columns: &[
            ("name", "varchar"),
            ("term", "bigint"),
            ("holder", "varchar"),
            ("acquired_at", "bigint"),
            ("ended_at", "bigint"),
            ("end_reason", "varchar"),
        ],
    },
    // Shard records (`LeaseStore::write_shard`), apart from the leases: no named lock, no
    // history. `version` is 16 random hex digits, new on every write; `value` the engine's, kept
    // as written (at most 512 bytes, so at most 512 characters). Added without a schema version
    // change (older builds ignore it).
    Table {
        name: "leasehold_shards",
        create: "CREATE TABLE IF NOT EXISTS leasehold_shards (
            name    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
            version VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
            value   VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        ) ENGINE = InnoDB",
        columns: &[("name", "varchar"), ("version", "varchar"), ("value", "varchar")],
    },
];

/// Refuses a Galera node: `wsrep_on` (as `SHOW VARIABLES` reports it, `None` when the server has
/// no such variable) must not be `ON`. Galera refuses `GET_LOCK` (MariaDB since 10.5.x/2023) or,
/// on older versions, takes it on the local node only, so two nodes could each grant a lease.
pub(crate) fn refuse_galera(wsrep_on: Option<&str>) -> Result<()> {
    match wsrep_on {
        Some(value) if value.eq_ignore_ascii_case("ON") || value == "1" => Err(Error::refused(
            STORE,
            "connect",
            "the server is a Galera cluster node (wsrep_on=ON), whose named locks (GET_LOCK) are not \
             cluster-wide: use a primary/replica server, or another backend",
        )),
        _ => Ok(()),
    }
}

/// Checks the server, and creates the missing tables and checks the existing ones, on the setup
/// connection `conn`.
pub(crate) async fn prepare(conn: &mut MySqlConnection, waited: Duration) -> Result<()> {
    let map = |e: sqlx::Error| refused_privilege(&e).unwrap_or_else(|| error::map(&e, "connect", waited));
    let wsrep: Option<String> = sqlx::query("SHOW VARIABLES LIKE 'wsrep_on'")
        .fetch_optional(&mut *conn)
        .await
        .map_err(map)?
        .map(|row| row.try_get::<String, _>(1))
        .transpose()
        .map_err(|e| Error::store(STORE, format!("unexpected answer to SHOW VARIABLES: {e}")))?;
    refuse_galera(wsrep.as_deref())?;
    for table in TABLES {
        let found: Vec<(String, String)> = sqlx::query(
            "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns
             WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
        )
        .bind(table.name)
        .fetch_all(&mut *conn)
        .await
        .map_err(map)?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get::<String, _>(1)?.to_ascii_lowercase())))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| foreign(table.name, format!("cannot read its columns: {e}")))?;
        if found.is_empty() {
            conn.execute(table.create).await.map_err(map)?;
            continue;
        }
        let expected: Vec<(String, String)> = table
            .columns
            .iter()
            .map(|&(name, ty)| (name.to_string(), ty.to_string()))
            .collect();
        if found != expected {
            let describe = |columns: &[(String, String)]| {
                columns
                    .iter()
                    .map(|(name, ty)| format!("{name} {ty}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(foreign(
                table.name,
                format!(
                    "table {} has columns ({}), expected ({}); it was not written by leasehold and was left as it is",
                    table.name,
                    describe(&found),
                    describe(&expected)
                ),
            ));
        }
    }
    let read_versions = async |conn: &mut MySqlConnection| -> Result<Vec<i64>> {
        sqlx::query_scalar("SELECT schema_version FROM leasehold_meta")
            .fetch_all(&mut *conn)
            .await
            .map_err(map)
    };
    let mut versions = read_versions(conn).await?;
    if versions.is_empty() {
        sqlx::query("INSERT IGNORE INTO leasehold_meta (id, schema_version) VALUES (1, ?)")
            .bind(SCHEMA_VERSION)
            .execute(&mut *conn)
            .await
            .map_err(map)?;
        versions = read_versions(conn).await?;
    }
    if versions != [SCHEMA_VERSION] {
        return Err(foreign(
            "leasehold_meta",
            format!(
                "leasehold_meta holds schema versions {versions:?}; this leasehold-mysql reads version {SCHEMA_VERSION}"
            ),
        ));
    }
    check_privileges(conn, waited).await
}

/// Writes, changes and deletes a row no lease can have (a name starting with a control
/// character, unique to this connection so that stores connecting together never wait for each
/// other) in each table inside a transaction that is rolled back: a missing `INSERT`, `UPDATE`
/// or `DELETE` privilege is a refusal naming it (`SELECT` was needed to get here).
async fn check_privileges(conn: &mut MySqlConnection, waited: Duration) -> Result<()> {
    let probe = "CONCAT(CHAR(1), 'leasehold-privilege-probe-', CONNECTION_ID())";
    let probes = [
        format!("INSERT INTO leasehold_leases (name, term) VALUES ({probe}, 0) ON DUPLICATE KEY UPDATE term = 0"),
        format!("UPDATE leasehold_leases SET term = 0 WHERE name = {probe}"),
        format!("DELETE FROM leasehold_leases WHERE name = {probe}"),
        format!(
            "INSERT INTO leasehold_history (name, term, holder, acquired_at) VALUES ({probe}, 0, '', 0)
             ON DUPLICATE KEY UPDATE acquired_at = 0"
        ),
        format!("UPDATE leasehold_history SET ended_at = 0 WHERE name = {probe}"),
        format!("DELETE FROM leasehold_history WHERE name = {probe}"),
        format!(
            "INSERT INTO leasehold_shards (name, version, value) VALUES ({probe}, '', '')
             ON DUPLICATE KEY UPDATE value = ''"
        ),
        format!("UPDATE leasehold_shards SET value = '' WHERE name = {probe}"),
    ];
    conn.execute("START TRANSACTION")
        .await
        .map_err(|e| error::map(&e, "connect", waited))?;
    let mut refused = None;
    for probe in probes {
        if let Err(e) = conn.execute(sqlx::AssertSqlSafe(probe)).await {
            refused = Some(e);
            break;
        }
    }
    let _ = conn.execute("ROLLBACK").await;
    match refused {
        None => Ok(()),
        Some(e) => Err(refused_privilege(&e).unwrap_or_else(|| error::map(&e, "connect", waited))),
    }
}

/// A missing table privilege (error 1142), naming what leasehold needs.
fn refused_privilege(error: &sqlx::Error) -> Option<Error> {
    (error::number(error) == Some(1142)).then(|| {
        Error::refused(
            STORE,
            "connect",
            format!(
                "{}: leasehold needs SELECT, INSERT, UPDATE and DELETE on the leasehold_* tables (and CREATE for the first connect)",
                error::describe(error)
            ),
        )
    })
}

/// Takes two named locks on the lock session (`lock_conn`) and checks, from the setup
/// connection, that the lock session holds both: a server that keeps one named lock per session
/// (MySQL before 5.7 lets a second `GET_LOCK` release the first), or a proxy that sends the
/// statements of one client to several server sessions, is refused.
pub(crate) async fn check_named_locks(
    lock_conn: &mut MySqlConnection,
    setup: &mut MySqlConnection,
    waited: Duration,
) -> Result<()> {
    let map = |e: sqlx::Error| error::map(&e, "connect", waited);
    let (a, b) = (
        format!("leasehold/probe/{:016x}", random_u64()),
        format!("leasehold/probe/{:016x}", random_u64()),
    );
    let (got_a, id): (Option<i64>, i64) =
        sqlx::query_as("SELECT CAST(GET_LOCK(?, 0) AS SIGNED), CAST(CONNECTION_ID() AS SIGNED)")
            .bind(&a)
            .fetch_one(&mut *lock_conn)
            .await
            .map_err(map)?;
    let (got_b, id_b): (Option<i64>, i64) =
        sqlx::query_as("SELECT CAST(GET_LOCK(?, 0) AS SIGNED), CAST(CONNECTION_ID() AS SIGNED)")
            .bind(&b)
            .fetch_one(&mut *lock_conn)
            .await
            .map_err(map)?;
    let (holder_a, holder_b): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(&a)
            .bind(&b)
            .fetch_one(&mut *setup)
            .await
            .map_err(map)?;
    let _ = sqlx::query("SELECT RELEASE_LOCK(?), RELEASE_LOCK(?)")
        .bind(&a)
        .bind(&b)
        .execute(&mut *lock_conn)
        .await;
    check_lock_probe(got_a, got_b, id, id_b, holder_a, holder_b)
}

/// The verdict of [`check_named_locks`] on what it saw.
pub(crate) fn check_lock_probe(
    got_a: Option<i64>,
    got_b: Option<i64>,
    id: i64,
    id_b: i64,
    holder_a: Option<i64>,
    holder_b: Option<i64>,
) -> Result<()> {
    let refuse = |why: String| Err(Error::refused(STORE, "connect", why));
    if got_a != Some(1) || got_b != Some(1) {
        return refuse(format!(
            "GET_LOCK did not grant a free named lock (answered {got_a:?}, {got_b:?})"
        ));
    }
    if id != id_b {
        return refuse(format!(
            "two statements on one connection ran in different server sessions ({id}, then {id_b}): \
             a proxy or pooler in statement or transaction mode is in the way; connect directly"
        ));
    }
    if holder_a != Some(id) || holder_b != Some(id) {
        return refuse(format!(
            "the server does not keep several named locks per session (session {id} took two, another session \
             sees them held by {holder_a:?} and {holder_b:?}): MySQL 5.7 or MariaDB 10.0.2 or later is needed, connected directly"
        ));
    }
    Ok(())
}

/// A table that leasehold did not write: reported as a corrupt record naming the table.
fn foreign(table: &str, detail: String) -> Error {
    Error::corrupt(STORE, format!("(table {table})"), detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn galera_nodes_are_refused() {
        for on in ["ON", "on", "1"] {
            let err = refuse_galera(Some(on)).unwrap_err();
            assert!(err.is_permanent(), "{err:?}");
            assert_eq!(
                err.to_string(),
                "mysql store refused connect: the server is a Galera cluster node (wsrep_on=ON), whose named locks \
                 (GET_LOCK) are not cluster-wide: use a primary/replica server, or another backend"
            );
        }
        for off in [None, Some("OFF"), Some("0")] {
            refuse_galera(off).unwrap();
        }
    }

    #[test]
    fn a_lock_probe_that_lost_a_lock_is_refused() {
        check_lock_probe(Some(1), Some(1), 7, 7, Some(7), Some(7)).unwrap();
        // Old servers: the second GET_LOCK released the first.
        let err = check_lock_probe(Some(1), Some(1), 7, 7, None, Some(7)).unwrap_err();
        assert!(
            err.to_string()
                .contains("does not keep several named locks per session"),
            "{err}"
        );
        // A statement-mode proxy: another backend session answered.
        let err = check_lock_probe(Some(1), Some(1), 7, 9, Some(7), Some(9)).unwrap_err();
        assert!(err.to_string().contains("different server sessions"), "{err}");
        let err = check_lock_probe(Some(0), Some(1), 7, 7, Some(3), Some(7)).unwrap_err();
        assert!(err.to_string().contains("did not grant"), "{err}");
    }
}
