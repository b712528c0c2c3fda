//! [`MysqlStore`]: the [`LeaseStore`] on a MySQL or MariaDB database.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    AcquireRequest, Acquired, Announces, Capabilities, Error, Expiry, Grant, LeaseName, LeaseStore, Notifications,
    Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, MySqlConnection, Row};

use crate::config::MysqlConfig;
use crate::error::{self, STORE};
use crate::record::{self, Record, TTL_RANGE, record_columns, term_value, unix_millis};
use crate::schema;
use crate::session::{Context, LockSession};
use crate::shards;
use crate::statements::configure_lock_session;

/// A [`LeaseStore`] on a MySQL (5.7 or later) or MariaDB (10.0.2 or later) database, shared by
/// every process that connects to it.
///
/// Each lease is a named lock (`GET_LOCK`) held on one dedicated connection per store, never a
/// pooled one: the lock session. Its `wait_timeout` is the smallest TTL of the leases it holds
/// (in whole seconds, rounded up), so the server ends the session, and frees every lock of it,
/// when the holder goes silent. A row per lease in `leasehold_leases` records the holder, the
/// fencing term and a record version that changes with every renewal; `leasehold_history`
/// keeps every term.
///
/// A lock can end before its holder knows (a connection reset, a server restart). A contender
/// that then finds the lock free but a row that still names a holder is told the record is
/// [`orphaned`](leasehold_core::HolderInfo::orphaned); the engine replaces it (with
/// [`AcquireRequest::takeover`] of its version) only after it has seen that same record version
/// unchanged for the holder's whole TTL, on its own monotonic clock.
///
/// MySQL has no notifications: followers poll ([`Notifications::None`]). `connect` refuses a
/// Galera node, a server or proxy that does not keep named locks per session, and missing
/// privileges. See [`docs`](crate::docs) for the whole story.
///
/// The store's task runs on the tokio runtime that created it: use it on that runtime.
///
/// # Cancel safety
///
/// Acquires, renewals and releases are handed to the lock session's task, which serialises
/// every statement on the one connection whose session holds the locks: a dropped call is
/// still carried out (an acquire whose caller is gone before it is sent is skipped), and its
/// outcome is unknown to the caller, as after a timeout. Reads run on the pool and hold no state
/// between awaits.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_mysql::MysqlStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MysqlStore::connect("mysql://app:secret@db.internal:3306/jobs").await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(10)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MysqlStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the redacted config: the driver's options hold the password.
        f.debug_struct("MysqlStore")
            .field("config", &self.inner.cx.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    cx: Arc<Context>,
    /// For reads and operator requests; never for locks.
    pool: MySqlPool,
    session: LockSession,
}

impl MysqlStore {
    /// Connects to the database named by a `mysql://` or `mariadb://` URL (see [`MysqlConfig`]
    /// for the options), creating leasehold's tables if absent.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (redacted) for a malformed URL or a bad option; otherwise as
    /// [`MysqlStore::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        MysqlStore::from_config(MysqlConfig::from_str(url)?).await
    }

    /// Connects with `config`: checks the server (not a Galera node, named locks kept per
    /// session), creates the tables if absent and checks their shape if present, checks the
    /// privileges, and opens the lock session.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Unreachable`] or [`Error::Timeout`] when the server cannot be reached;
    /// - [`Error::Refused`] for wrong credentials, an unknown database, a missing privilege, a
    ///   Galera node, a server or proxy that does not keep named locks per session, or a port
    ///   that serves another protocol;
    /// - [`Error::CorruptRecord`] naming the table when a table of the same name has another
    ///   shape, or the schema was written by a newer version; nothing is changed.
    pub async fn from_config(config: MysqlConfig) -> Result<Self> {
        config.validate()?;
        let timeout = config.connect_timeout();
        let endpoint = config.endpoint();
        let options = config.connect_options();
        let open = || async {
            match tokio::time::timeout(timeout, options.connect()).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(error::map_connect(&e, &endpoint, timeout)),
                Err(_) => Err(error::connect_timeout(&endpoint, timeout)),
            }
        };
        let mut setup: MySqlConnection = open().await?;
        let checked = async {
            schema::prepare(&mut setup, timeout).await?;
            let mut lock_conn = open().await?;
            configure_lock_session(&mut lock_conn, timeout)
                .await
                .map_err(|f| f.into_error("connect"))?;
            match schema::check_named_locks(&mut lock_conn, &mut setup, timeout).await {
                Ok(()) => Ok(lock_conn),
                Err(e) => {
                    let _ = lock_conn.close().await;
                    Err(e)
                }
            }
        }
        .await;
        let _ = setup.close().await;
        let lock_conn = checked?;
        let pool = MySqlPoolOptions::new()
            .max_connections(config.pool_size())
            .min_connections(0)
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        let cx = Arc::new(Context { config });
        let session = LockSession::spawn(cx.clone(), lock_conn);
        Ok(MysqlStore {
            inner: Arc::new(Inner { cx, pool, session }),
        })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &MysqlConfig {
        &self.inner.cx.config
    }

    /// The row of `lease` and whether its named lock was free, read on the pool.
    async fn read(&self, lease: &LeaseName, operation: &'static str) -> Result<Record> {
        let timeout = self.inner.cx.config.connect_timeout();
        let sql = format!(
            "SELECT {} FROM (SELECT CAST(? AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin AS n) AS w
             LEFT JOIN leasehold_leases AS l ON l.name = w.n",
            record_columns("w.n")
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(lease.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, operation, timeout))?;
        Record::decode(lease, &row, 0)
    }
}

#[async_trait]
impl LeaseStore for MysqlStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ServerSession,
            notifications: Notifications::None,
            announces: Announces::None,
            fifo: false,
        }
    }

    /// On the lock session: takes the lease's named lock (`GET_LOCK(name, 0)`, unless the
    /// session holds it), then in one transaction reads the row `FOR UPDATE` and grants if it is
    /// absent, free, the candidate's own, or has exactly the record version to take over; a lock
    /// taken but not used is given back.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        self.inner.session.acquire(request.clone()).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let mut answers = self.renew_many(std::slice::from_ref(grant)).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(Error::store(STORE, "internal error: no answer to renew")))
    }

    /// The grants join the lock session's queue together: one `UPDATE` renews those whose locks
    /// the session holds (up to 200 per statement), one read answers each. A grant whose lock
    /// the session lost (a broken connection) takes it again if its row still names it.
    ///
    /// # Errors
    ///
    /// The outer error when every grant failed (the session is unreachable); per grant, the
    /// error of a statement that failed for it, or [`Error::CorruptRecord`] for an unreadable
    /// row.
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        if grants.is_empty() {
            return Ok(Vec::new());
        }
        let mut renewals = self.inner.session.renew_many(grants).await?;
        if renewals.iter().all(Result::is_err) {
            return renewals.swap_remove(0).map(|_| Vec::new());
        }
        Ok(renewals)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.session.release(grant.clone()).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        Ok(self.read(lease, "inspect").await?.observation(lease))
    }

    /// One statement: the rows whose name starts with `prefix` (`LIKE`, with `%`, `_` and the
    /// escape character escaped; the names' collation is binary), each with its lock's state.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let timeout = self.inner.cx.config.connect_timeout();
        let sql = format!(
            "SELECT l.name, {} FROM leasehold_leases AS l WHERE l.name LIKE ? ESCAPE '!'",
            record_columns("l.name")
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(leasehold_core::like_prefix(prefix))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, "list", timeout))?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row
                .try_get(0)
                .map_err(|e| Error::store(STORE, format!("unexpected answer to list: {e}")))?;
            let lease = LeaseName::new(name.as_str())
                .map_err(|e| Error::corrupt(STORE, &name, format!("the row's name is not a lease name: {e}")))?;
            leases.push(Record::decode(&lease, row, 1)?.observation(&lease));
        }
        leases.sort_by(|a, b| a.lease.cmp(&b.lease));
        Ok(leases)
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        // Like every operation, refuse to report on a lease whose record cannot be read.
        self.read(lease, "history").await?;
        let timeout = self.inner.cx.config.connect_timeout();
        let rows = sqlx::query(
            "SELECT term, holder, acquired_at, ended_at, end_reason FROM leasehold_history
             WHERE name = ? ORDER BY term DESC LIMIT ?",
        )
        .bind(lease.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| error::map(&e, "history", timeout))?;
        let mut transitions = rows
            .iter()
            .map(|row| record::decode_transition(lease, row))
            .collect::<Result<Vec<_>>>()?;
        transitions.reverse();
        Ok(transitions)
    }

    /// One statement on the pool over a range of `leasehold_shards`' primary key (the names from
    /// `prefix` up to the least string above every name with it), the prefix also matched by an
    /// escaped `LIKE`: one snapshot and one statement for 10,000 records as for 10. Leases are in
    /// another table and never listed.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        shards::list(&self.inner.pool, prefix, self.inner.cx.config.connect_timeout()).await
    }

    /// One conditional statement on the pool: `INSERT` when no record is expected (a duplicate
    /// key is the refusal), `UPDATE ... WHERE name = ? AND version = ?` otherwise, with a new
    /// random version. A refused write is followed by one read of the record, which the
    /// [`Conflict`](ShardWrite::Conflict) answers. No named lock, no history.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a value [`check_shard_value`](leasehold_core::check_shard_value)
    /// refuses (nothing is sent); otherwise as the trait says.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let timeout = self.inner.cx.config.connect_timeout();
        shards::write(&self.inner.pool, name, expected, value, timeout).await
    }

    /// `true`: [`break_lease`](LeaseStore::break_lease) works.
    fn can_break(&self) -> bool {
        true
    }

    /// Ends the current term as `broken` in the row and the history (one statement, on the
    /// pool). The holder's lock session is not killed (it holds the store's other leases too):
    /// the holder learns at its next renewal, which answers `Lost` and gives the lock back; a
    /// silent holder's session ends within its TTL. Candidates take the lease once the lock is
    /// free.
    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let record = self.read(lease, "break_lease").await?;
        let Some(holder) = &record.holder else {
            return Ok(None);
        };
        let timeout = self.inner.cx.config.connect_timeout();
        let broken = sqlx::query(
            "UPDATE leasehold_leases AS l
             LEFT JOIN leasehold_history AS h ON h.name = l.name AND h.term = l.term AND h.ended_at IS NULL
             SET h.ended_at = ?, h.end_reason = 'broken',
                 l.holder = NULL, l.ttl_ms = NULL, l.version = NULL, l.previous_end = 'broken'
             WHERE l.name = ? AND l.holder = ? AND l.term = ? AND l.previous_end IS NULL",
        )
        .bind(unix_millis(std::time::SystemTime::now()))
        .bind(lease.as_str())
        .bind(holder.id.as_str())
        .bind(term_value(record.term))
        .execute(&self.inner.pool)
        .await
        .map_err(|e| error::map(&e, "break_lease", timeout))?
        .rows_affected();
        // Zero: the term ended on its own in the meantime; nothing was broken.
        Ok((broken > 0).then_some(record.term))
    }
}
