//! The fence table in a SQLite database.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fence (
//!     fence_key TEXT PRIMARY KEY NOT NULL,
//!     term INTEGER NOT NULL CHECK (term >= 0)
//! );
//! ```
//!
//! [`check_and_advance`] runs one statement in the caller's transaction:
//!
//! ```sql
//! INSERT INTO leasehold_fence AS fence (fence_key, term) VALUES (?1, ?2)
//! ON CONFLICT (fence_key) DO UPDATE SET term = excluded.term
//! WHERE fence.term <= excluded.term
//! RETURNING term
//! ```
//!
//! # Start the transaction with `BEGIN IMMEDIATE`
//!
//! SQLite has one writer per database: the transaction holds the write lock from its first
//! write to its end, so fenced transactions run one after another and a deposed leader's check
//! after its successor's commit sees the higher term. Begin fenced transactions with
//! `conn.begin_with("BEGIN IMMEDIATE")` (or `pool.begin_with(...)`): the write lock is then
//! taken at `BEGIN`, waiting up to the busy timeout for another writer (sqlx's default is 5 s).
//! A plain `BEGIN` (sqlx's `begin()`) that reads before it writes has to upgrade its lock
//! mid-transaction, and in WAL mode fails at once with `SQLITE_BUSY` if another writer
//! committed since its read; that is safe (nothing is written) but needs a retry.
//!
//! # Terms above `i64::MAX`
//!
//! SQLite integers are signed 64-bit: such a term is refused with
//! [`FenceError::TermOutOfRange`]. No store of leasehold hands out such terms; the
//! `postgres` module docs say why the tables keep a signed 64-bit integer.

use std::sync::LazyLock;

use leasehold_core::Term;
use sqlx::SqliteConnection;

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
/// use leasehold_fence::{FenceKey, sqlite::Fence};
/// use sqlx::SqlitePool;
///
/// # async fn example(pool: SqlitePool, term: Term) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = Fence::new("leader_fence")?;
/// fence.ensure_table(&mut *pool.acquire().await?).await?;
///
/// let key = FenceKey::new("etcd-prod", &LeaseName::new("invoicer")?);
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// fence.check_and_advance(&mut tx, &key, term).await?;
/// sqlx::query("UPDATE runs SET last = unixepoch()").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Fence {
    statements: Statements,
}

const DIALECT: Dialect = Dialect {
    key_column: "TEXT PRIMARY KEY NOT NULL",
    term_column: "INTEGER",
    params: ["?1", "?2"],
};

impl Default for Fence {
    fn default() -> Self {
        Fence::new(DEFAULT_TABLE).expect("the default table name is valid")
    }
}

impl Fence {
    /// A fence kept in `table` (`name` or `schema.name` of an attached database: ASCII letters,
    /// digits and `_`).
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidTableName`].
    pub fn new(table: &str) -> Result<Self, FenceError> {
        Ok(Fence {
            statements: Statements::new(table, &DIALECT)?,
        })
    }

    /// Creates the table if it does not exist (in the attached database `schema`, if the name has
    /// one).
    ///
    /// # Errors
    ///
    /// [`FenceError::Database`].
    pub async fn ensure_table(&self, conn: &mut SqliteConnection) -> Result<(), FenceError> {
        self.statements.ensure_table::<sqlx::Sqlite>(conn).await
    }

    /// Accepts `term` under `key` if no higher term has been accepted there and records it as
    /// the highest; the transaction holds the database's write lock until it ends. Call it in
    /// the transaction that makes the fenced write (begun with `BEGIN IMMEDIATE`), before
    /// committing; on an error, roll back.
    ///
    /// An equal term is accepted (one leader writes many times).
    ///
    /// # Errors
    ///
    /// - [`FenceError::Stale`]: a higher term has been accepted; the caller is deposed.
    /// - [`FenceError::TermOutOfRange`]: `term` is above `i64::MAX`.
    /// - [`FenceError::Database`]: the table does not exist, the database is busy beyond the busy
    ///   timeout, the file cannot be written.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction in an unknown state: roll it back.
    pub async fn check_and_advance(
        &self,
        conn: &mut SqliteConnection,
        key: &FenceKey,
        term: Term,
    ) -> Result<(), FenceError> {
        self.statements.check_and_advance::<sqlx::Sqlite>(conn, key, term).await
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
    pub async fn highest(&self, conn: &mut SqliteConnection, key: &FenceKey) -> Result<Option<Term>, FenceError> {
        self.statements.highest::<sqlx::Sqlite>(conn, key).await
    }
}

/// [`Fence::ensure_table`] on [`DEFAULT_TABLE`].
///
/// # Errors
///
/// [`FenceError::Database`].
pub async fn ensure_table(conn: &mut SqliteConnection) -> Result<(), FenceError> {
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
/// use leasehold_fence::{FenceKey, sqlite};
///
/// # async fn example(pool: sqlx::SqlitePool, leader: leasehold_core::Leader, store_url: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let key = FenceKey::from_url(store_url, leader.lease())?;
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// sqlite::check_and_advance(&mut tx, &key, leader.term()).await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn check_and_advance(conn: &mut SqliteConnection, key: &FenceKey, term: Term) -> Result<(), FenceError> {
    DEFAULT.check_and_advance(conn, key, term).await
}
