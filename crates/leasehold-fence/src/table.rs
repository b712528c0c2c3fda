//! What the Postgres and SQLite fences share: the table name, validated once and quoted for SQL,
//! the three statements, and the check itself (the same two statements in both databases).

use std::sync::Arc;

use leasehold_core::Term;
use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, IntoArguments, Type};

use crate::{FenceError, FenceKey, stale_or_conflict, stored_to_term, term_to_i64};

/// How a database spells the fence table's statements.
pub(crate) struct Dialect {
    /// The key column's type and constraints.
    pub(crate) key_column: &'static str,
    /// The term column's type.
    pub(crate) term_column: &'static str,
    /// The first and second bind parameters.
    pub(crate) params: [&'static str; 2],
}

/// The statements of one fence table.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    /// The table's name, quoted.
    table: Arc<str>,
    create: Arc<str>,
    upsert: Arc<str>,
    select: Arc<str>,
}

impl Statements {
    /// The statements of `table` (validated) in `dialect`.
    pub(crate) fn new(table: &str, dialect: &Dialect) -> Result<Self, FenceError> {
        let t = quoted_table_name(table)?;
        let Dialect {
            key_column,
            term_column,
            params: [p1, p2],
        } = dialect;
        Ok(Statements {
            table: t.as_str().into(),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (fence_key {key_column}, term {term_column} NOT NULL CHECK (term >= 0))"
            )
            .into(),
            upsert: format!(
                "INSERT INTO {t} AS fence (fence_key, term) VALUES ({p1}, {p2}) \
                 ON CONFLICT (fence_key) DO UPDATE SET term = excluded.term \
                 WHERE fence.term <= excluded.term RETURNING term"
            )
            .into(),
            select: format!("SELECT term FROM {t} WHERE fence_key = {p1}").into(),
        })
    }

    /// The table's name, quoted for SQL.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it does not exist.
    pub(crate) async fn ensure_table<DB>(&self, conn: &mut DB::Connection) -> Result<(), FenceError>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
    {
        sqlx::query::<DB>(AssertSqlSafe(self.create.clone()))
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Accepts `term` under `key` unless a higher term is stored (see the modules' docs).
    pub(crate) async fn check_and_advance<DB>(
        &self,
        conn: &mut DB::Connection,
        key: &FenceKey,
        term: Term,
    ) -> Result<(), FenceError>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
        (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    {
        let value = term_to_i64(key, term)?;
        let accepted: Option<i64> = sqlx::query_scalar::<DB, i64>(AssertSqlSafe(self.upsert.clone()))
            .bind(key.as_str())
            .bind(value)
            .fetch_optional(&mut *conn)
            .await?;
        if accepted.is_some() {
            return Ok(());
        }
        let stored = self.stored::<DB>(conn, key).await?;
        stale_or_conflict(key, term, stored)
    }

    /// The highest term accepted under `key`, or `None` if none has been.
    pub(crate) async fn highest<DB>(
        &self,
        conn: &mut DB::Connection,
        key: &FenceKey,
    ) -> Result<Option<Term>, FenceError>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> i64: Decode<'q, DB> + Type<DB>,
        (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    {
        let stored = self.stored::<DB>(conn, key).await?;
        stored.map(|s| stored_to_term(key, s)).transpose()
    }

    async fn stored<DB>(&self, conn: &mut DB::Connection, key: &FenceKey) -> Result<Option<i64>, FenceError>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> i64: Decode<'q, DB> + Type<DB>,
        (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    {
        Ok(sqlx::query_scalar::<DB, i64>(AssertSqlSafe(self.select.clone()))
            .bind(key.as_str())
            .fetch_optional(conn)
            .await?)
    }
}

/// `name` or `schema.name`, each part a plain identifier, as a quoted SQL name.
pub(crate) fn quoted_table_name(name: &str) -> Result<String, FenceError> {
    let invalid = |reason| FenceError::InvalidTableName {
        name: name.to_string(),
        reason,
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(invalid("at most one '.' (schema.table)"));
    }
    for part in &parts {
        if part.is_empty() {
            return Err(invalid("an empty identifier"));
        }
        if part.len() > 63 {
            return Err(invalid("an identifier longer than 63 bytes"));
        }
        if !part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            || !part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(invalid(
                "identifiers may only hold ASCII letters, digits and '_', and start with a letter or '_'",
            ));
        }
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_schema_qualified_names_are_quoted() {
        assert_eq!(quoted_table_name("leasehold_fence").unwrap(), "\"leasehold_fence\"");
        assert_eq!(quoted_table_name("app.Fence_2").unwrap(), "\"app\".\"Fence_2\"");
    }

    #[test]
    fn names_that_could_inject_sql_are_refused() {
        for name in [
            "",
            "a.b.c",
            ".a",
            "a.",
            "1a",
            "a b",
            "a\"; DROP TABLE x; --",
            "a-b",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(quoted_table_name(name), Err(FenceError::InvalidTableName { .. })),
                "{name:?} was accepted"
            );
        }
    }
}
