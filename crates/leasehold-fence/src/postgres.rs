//! The fence table in a Postgres database.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fence (
//!     fence_key TEXT PRIMARY KEY,
//!     term BIGINT NOT NULL CHECK (term >= 0)
//! );
//! ```
//!
//! [`check_and_advance`] runs one statement in the caller's transaction:
//!
//! ```sql
//! INSERT INTO leasehold_fence AS fence (fence_key, term) VALUES ($1, $2)
//! ON CONFLICT (fence_key) DO UPDATE SET term = excluded.term
//! WHERE fence.term <= excluded.term
//! RETURNING term
//! ```
//!
//! A row back means the term is accepted and the fence row is now locked by the transaction
//! until it commits or rolls back; no row means the stored term is higher (the row is locked all
//! the same, and read back for the error). So fenced transactions of one key run one after
//! another from the check to their end: when a deposed leader's transaction (term 4) and its
//! successor's (term 5) race, whichever checks second waits for the other to end, then sees its
//! outcome: 4 after a committed 5 is rejected; 5 after a committed 4 is accepted, and 4's write
//! came before any write of 5. A rolled-back check leaves nothing behind.
//!
//! At `READ COMMITTED` (Postgres's default) the waiting statement re-reads the committed row.
//! At `REPEATABLE READ` or `SERIALIZABLE`, Postgres fails it with a serialization error instead
//! ([`FenceError::Database`], SQLSTATE 40001): retry the transaction.
//!
//! # Why `BIGINT`
//!
//! [`Term`] is a `u64`; Postgres has no unsigned integers. The column is a `BIGINT` and a term
//! above `i64::MAX` is refused with [`FenceError::TermOutOfRange`], rather than `NUMERIC(20)`:
//! no store of leasehold hands out such terms (the largest are Redis's microsecond-based ones,
//! around 2⁵⁰ today and 2⁶³ in about 290,000 years; etcd revisions and Postgres's own terms are
//! `BIGINT`s too), a `BIGINT` compares and indexes natively, reads back into every client
//! without a decimal type (sqlx would need `rust_decimal` or `bigdecimal`), and other programs
//! writing through the same table see plain integers. An order-preserving mapping of all of
//! `u64` onto `i64` was rejected for the same reason: the stored numbers would no longer be
//! the terms.

use std::sync::LazyLock;

use leasehold_core::Term;
use sqlx::PgConnection;

use crate::table::{Dialect, Statements};
use crate::{FenceError, FenceKey};

/// The table [`check_and_advance`] and [`ensure_table`] use.
pub const DEFAULT_TABLE: &str = "leasehold_fence";

static DEFAULT: LazyLock<Fence> = LazyLock::new(Fence::default);

/// A fence table with a name of your choice (`table` or `schema.table`).
///
/// # Examples
///
/// ```no_run
/// use leasehold_core::{LeaseName, Term};
/// use leasehold_fence::{FenceKey, postgres::Fence};
/// use sqlx::PgPool;
///
/// # async fn example(pool: PgPool, term: Term) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = Fence::new("billing.leader_fence")?;
/// fence.ensure_table(&mut *pool.acquire().await?).await?;
///
/// let key = FenceKey::new("etcd-prod", &LeaseName::new("invoicer")?);
/// let mut tx = pool.begin().await?;
/// fence.check_and_advance(&mut tx, &key, term).await?;
/// sqlx::query("UPDATE billing.runs SET last = now()").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Fence {
    statements: Statements,
}

const DIALECT: Dialect = Dialect {
    key_column: "TEXT PRIMARY KEY",
    term_column: "BIGINT",
    params: ["$1", "$2"],
};

impl Default for Fence {
    fn default() -> Self {
        Fence::new(DEFAULT_TABLE).expect("the default table name is valid")
    }
}

impl Fence {
    /// A fence kept in `table` (`name` or `schema.name`: ASCII letters, digits and `_`; quoted,
    /// so case is kept).
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidTableName`].
    pub fn new(table: &str) -> Result<Self, FenceError> {
        Ok(Fence {
            statements: Statements::new(table, &DIALECT)?,
        })
    }

    /// Creates the table if it does not exist (the schema must). Safe to call from every
    /// replica at start-up, all at once: the `CREATE TABLE IF NOT EXISTS` runs in a
    /// transaction of its own (a savepoint if `conn` is in one already) under a transaction-level
    /// advisory lock on the table's name, so creators of one table go one after another and the
    /// later ones find it made. (Without the lock, Postgres fails all but one of concurrent
    /// creators of a new table with `duplicate key value violates unique constraint
    /// "pg_type_typname_nsp_index"`: `IF NOT EXISTS` does not cover a table being created by a
    /// transaction not yet committed.)
    ///
    /// # Errors
    ///
    /// [`FenceError::Database`].
    pub async fn ensure_table(&self, conn: &mut PgConnection) -> Result<(), FenceError> {
        let mut tx = sqlx::Connection::begin(conn).await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('leasehold_fence'), hashtext($1))")
            .bind(self.statements.table())
            .execute(&mut *tx)
            .await?;
        self.statements.ensure_table::<sqlx::Postgres>(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Accepts `term` under `key` if no higher term has been accepted there, records it as the
    /// highest, and holds the fence row locked until the transaction ends. Call it in the
    /// transaction that makes the fenced write, before committing; on an error, roll back.
    ///
    /// An equal term is accepted (one leader writes many times).
    ///
    /// # Errors
    ///
    /// - [`FenceError::Stale`]: a higher term has been accepted; the caller is deposed.
    /// - [`FenceError::TermOutOfRange`]: `term` is above `i64::MAX`.
    /// - [`FenceError::Conflict`]: the row changed under the transaction's snapshot; retry.
    /// - [`FenceError::Database`]: the table does not exist, the connection failed, a lock or
    ///   statement timeout, a serialization failure.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction in an unknown state: roll it back.
    pub async fn check_and_advance(
        &self,
        conn: &mut PgConnection,
        key: &FenceKey,
        term: Term,
    ) -> Result<(), FenceError> {
        self.statements
            .check_and_advance::<sqlx::Postgres>(conn, key, term)
            .await
    }

    /// The highest term accepted under `key`, or `None` if none has been.
    ///
    /// A negative number in the row (written by something else, into a table without the
    /// `CHECK`) is a [`FenceError::CorruptRecord`] here; [`check_and_advance`](Self::check_and_advance)
    /// replaces it, as it is below every term.
    ///
    /// # Errors
    ///
    /// [`FenceError::CorruptRecord`], [`FenceError::Database`].
    pub async fn highest(&self, conn: &mut PgConnection, key: &FenceKey) -> Result<Option<Term>, FenceError> {
        self.statements.highest::<sqlx::Postgres>(conn, key).await
    }
}

/// [`Fence::ensure_table`] on [`DEFAULT_TABLE`].
///
/// # Errors
///
/// [`FenceError::Database`].
pub async fn ensure_table(conn: &mut PgConnection) -> Result<(), FenceError> {
    DEFAULT.ensure_table(conn).await
}

/// [`Fence::check_and_advance`] on [`DEFAULT_TABLE`]: accepts `term` under `key` unless a higher
/// term was accepted there, inside the caller's transaction.
///
/// # Errors
///
/// See [`Fence::check_and_advance`]; [`FenceError::Stale`] means the caller is deposed.
///
/// # Examples
///
/// ```no_run
/// use leasehold_fence::{FenceKey, postgres};
///
/// # async fn example(pool: sqlx::PgPool, leader: leasehold_core::Leader, store_url: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let key = FenceKey::from_url(store_url, leader.lease())?;
/// let mut tx = pool.begin().await?;
/// postgres::check_and_advance(&mut tx, &key, leader.term()).await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn check_and_advance(conn: &mut PgConnection, key: &FenceKey, term: Term) -> Result<(), FenceError> {
    DEFAULT.check_and_advance(conn, key, term).await
}
