//! [`SqliteStore`]: the [`LeaseStore`] on one SQLite file.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
    check_shard_value,
};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use crate::changes::{Notifier, Signal};
use crate::config::{SqliteConfig, Synchronous};
use crate::error::{self, STORE};
use crate::record::{self, Failure, TTL_RANGE};
use crate::schema;
use crate::shards;
use crate::writer::{Op, Outcome, Writer};

/// A [`LeaseStore`] on one SQLite file, shared by every process on the machine that opens it.
///
/// Each lease is a row holding its holder, term, TTL and a random record version that changes
/// with every acquire and renew. Every write runs in a `BEGIN IMMEDIATE` transaction, so writers
/// from all processes take turns and each compare-and-set sees the latest row. SQLite has no
/// clock of its own: a contender takes over a silent holder only after it has seen the same
/// record version unchanged for the holder's full TTL ([`Expiry::ObservedByContenders`]; the
/// engine does the watching and passes [`AcquireRequest::takeover`]).
///
/// Writes that queue up while a transaction commits share the next one (group commit: one disk
/// sync for many renewals), so one process can hold thousands of leases. They are made by a task
/// on the tokio runtime that opened the store: use the store on that runtime (once it has shut
/// down, writes fail as [`Error::Unreachable`]).
///
/// Followers are woken when a lease changes hands, in every process on the file: each commit
/// that grants, renews, releases, hands over or breaks a lease rewrites `<file>-changes`, which
/// the followers' stores watch ([`Notifications::Release`]). A release wakes one follower, the
/// longest-waiting live one in any process. Grants and renewals wake nobody; they are announced
/// ([`announcements`](LeaseStore::announcements)), so idle followers make no requests while the
/// holder renews.
///
/// The file uses write-ahead logging, a busy timeout and a small connection pool; the tables are
/// `leasehold_leases`, `leasehold_terms` (history), `leasehold_waiters`, `leasehold_shards`
/// (shard records, apart from the leases) and `leasehold_meta` (schema version), created when
/// absent and never altered when present. See [`docs`](crate::docs) for the whole story.
///
/// # Cancel safety
///
/// Writes are handed to the writer task, which serialises them for SQLite's single writer and
/// commits them in shared transactions: a dropped acquire, renew, release or break is still
/// carried out (or skipped whole, if its transaction had not begun and its caller was gone) and
/// its outcome is unknown to the caller, as after a timeout. Reads hold no state between awaits.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_sqlite::SqliteStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("leases.db");
/// let store = SqliteStore::open(&path).await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(5)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// For reads, and for the writer's transactions; write-ahead logging lets readers go on
    /// while a transaction commits.
    pool: SqlitePool,
    writer: Writer,
    /// Shared by the clones of this store: one file watcher for all their followers.
    notifier: Arc<Notifier>,
    config: SqliteConfig,
}

impl SqliteStore {
    /// Opens (creating if needed) the lease file at `path` with the default options.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::from_config`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        SqliteStore::from_config(SqliteConfig::new(path.as_ref())).await
    }

    /// Opens the lease file named by a `sqlite:` URL, e.g.
    /// `sqlite:///var/lib/app/leases.db?busy_timeout=2s` (see [`SqliteConfig`] for the forms and
    /// options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed URL, an unknown option or an in-memory database;
    /// otherwise as [`SqliteStore::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        SqliteStore::from_config(SqliteConfig::from_str(url)?).await
    }

    /// Opens (creating if needed) the lease file that `config` describes: switches it to
    /// write-ahead logging, creates the missing tables and checks the shape of existing ones.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Store`] with an [`OpenError`](crate::OpenError) source naming the file when it
    ///   is not a SQLite database, or cannot be opened or created for writing;
    /// - [`Error::CorruptRecord`] naming the table when a table of the same name has another
    ///   shape, or the file was written by a newer schema; nothing is changed;
    /// - [`Error::Timeout`] when another process holds the write lock past the busy timeout.
    pub async fn from_config(config: SqliteConfig) -> Result<Self> {
        config.validate()?;
        let options = SqliteConnectOptions::new()
            .filename(&config.path)
            .create_if_missing(true)
            .busy_timeout(config.busy_timeout)
            .synchronous(match config.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            });
        let mut setup = options
            .connect()
            .await
            .map_err(|e| error::map_open(e, &config.path, config.busy_timeout))?;
        let prepared = schema::prepare(&mut setup, &config.path, config.busy_timeout).await;
        let _ = setup.close().await;
        prepared?;
        let pool = SqlitePoolOptions::new()
            .max_connections(config.pool_size)
            .min_connections(0)
            .acquire_timeout(config.busy_timeout.max(Duration::from_secs(1)))
            // A local file does not go stale; skip the ping before each request.
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        let signal = Signal::of(&config.path);
        signal.create(&config.path);
        let writer = Writer::spawn(pool.clone(), config.clone(), signal.clone());
        let notifier = Arc::new(Notifier::new(signal, options));
        Ok(SqliteStore {
            pool,
            writer,
            notifier,
            config,
        })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &SqliteConfig {
        &self.config
    }

    /// Closes every connection and ends every [`changes`](LeaseStore::changes) stream. Requests
    /// made afterwards fail as [`Error::Unreachable`].
    pub async fn close(&self) {
        self.pool.close().await;
        self.notifier.close().await;
    }

    fn map_read(&self, operation: &'static str) -> impl Fn(Failure) -> Error + use<> {
        let busy_timeout = self.config.busy_timeout;
        move |failure| match failure {
            Failure::Record(e) => e,
            Failure::Sql(e) => error::map(&e, operation, busy_timeout),
        }
    }
}

/// The answer of the writer to a request it cannot have given.
fn mismatch(outcome: Outcome) -> Error {
    Error::store(STORE, format!("internal error: unexpected answer {outcome:?}"))
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ObservedByContenders,
            notifications: Notifications::Release,
            announces: leasehold_core::Announces::GrantsAndRenewals,
            fifo: false,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        match self.writer.write(Op::Acquire(request.clone())).await? {
            Outcome::Acquired(acquired) => Ok(acquired),
            other => Err(mismatch(other)),
        }
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        match self.writer.write(Op::Renew(grant.clone())).await? {
            Outcome::Renewed(renewed) => Ok(renewed),
            other => Err(mismatch(other)),
        }
    }

    /// The grants go to the writer as one request and are renewed in one `BEGIN IMMEDIATE`
    /// transaction per 256 grants (shared with other writes queued meanwhile): one disk sync
    /// for a group's renewal round. Each grant is renewed exactly as
    /// [`renew`](LeaseStore::renew) would, with a corrupt row failing only its own grant.
    ///
    /// # Errors
    ///
    /// The outer error when every transaction failed (e.g. another process held the write lock
    /// past the busy timeout); a grant of a failed transaction gets its error when others were
    /// renewed.
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        if grants.is_empty() {
            return Ok(Vec::new());
        }
        match self.writer.write(Op::RenewMany(grants.to_vec())).await? {
            Outcome::RenewedEach(answers) => Ok(answers),
            other => Err(mismatch(other)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        match self.writer.write(Op::Release(grant.clone())).await? {
            Outcome::Released => Ok(()),
            other => Err(mismatch(other)),
        }
    }

    /// One transaction: if the row still names the grant's holder at its term, the term ends
    /// `handed_over` in the history and the row names `to` at the same term with `previous_end`
    /// `handed_over` (a reservation: only `to`'s acquire is granted, with a new term) and a new
    /// version, which contenders watch for a TTL before they take it over. No schema change: an
    /// older leasehold-sqlite reading a reservation reports a corrupt record for that lease.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.capabilities().check_ttl(STORE, grant.ttl)?;
        match self.writer.write(Op::HandOver(grant.clone(), to.clone())).await? {
            Outcome::HandedOver => Ok(()),
            other => Err(mismatch(other)),
        }
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let map = self.map_read("inspect");
        let mut conn = self.pool.acquire().await.map_err(|e| map(e.into()))?;
        let record = record::read(&mut conn, lease).await.map_err(map)?;
        Ok(record.observation(lease))
    }

    /// One statement (`GLOB`, case-sensitive, with the prefix's `*`, `?` and `[` escaped).
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let map = self.map_read("list");
        let mut conn = self.pool.acquire().await.map_err(|e| map(e.into()))?;
        let leases = record::list(&mut conn, prefix).await.map_err(map)?;
        Ok(leases.iter().map(|(lease, record)| record.observation(lease)).collect())
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let map = self.map_read("history");
        // One read transaction: the row and the history come from one snapshot.
        let mut tx = self.pool.begin().await.map_err(|e| map(e.into()))?;
        // Like every operation, refuse to report on a lease whose record cannot be read.
        record::read(&mut tx, lease).await.map_err(&map)?;
        let rows = sqlx::query(
            "SELECT term, holder, acquired_at, ended_at, end_reason FROM leasehold_terms
             WHERE name = ?1 ORDER BY term DESC LIMIT ?2",
        )
        .bind(lease.as_str())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| map(e.into()))?;
        let mut transitions = rows
            .iter()
            .map(|row| record::decode_transition(lease, row))
            .collect::<Result<Vec<_>>>()?;
        transitions.reverse();
        Ok(transitions)
    }

    /// A stream that yields when the lease changes hands in a way that concerns `candidate`, by
    /// a write of any process or store on this file: when the lease becomes free (released,
    /// broken) and `candidate` is the longest-waiting live follower (one follower per release,
    /// across processes), or when it is handed over to `candidate`. Grants and renewals do not
    /// wake it (they are [announced](LeaseStore::announcements)), nor changes `candidate` made
    /// itself. All subscriptions of a store share one file watcher
    /// (inotify on Linux) and one connection; see [`docs`](crate::docs#change-notifications).
    ///
    /// `Ok(None)` (the engine polls) when the directory cannot be watched: no inotify watch left,
    /// a file system without notifications, another platform's limits.
    ///
    /// # Errors
    ///
    /// A transient error when the lease's row cannot be read.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future or the stream ends the subscription; nothing else changes.
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.notifier
            .changes(lease, candidate)
            .await
            .map_err(|e| error::map(&e, "changes", self.config.busy_timeout))
    }

    /// Every grant and renewal of the lease by any process or store on this file, as
    /// [`inspect`](LeaseStore::inspect) would show it after the commit
    /// ([`Announces::GrantsAndRenewals`](leasehold_core::Announces::GrantsAndRenewals)): each
    /// transaction that renews or grants anything rewrites `<file>-changes` once, and the
    /// store's watcher reads the followed rows in one statement per signal, shared by all the
    /// store's followers (no request of theirs). An idle follower so makes no requests while the
    /// holder renews. `Ok(None)` when the directory cannot be watched (the engine polls).
    ///
    /// # Errors
    ///
    /// A transient error when the lease's row cannot be read.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future or the stream ends the subscription; nothing else changes.
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.notifier
            .announcements(lease)
            .await
            .map_err(|e| error::map(&e, "announcements", self.config.busy_timeout))
    }

    /// One statement on a pooled connection, a range of `leasehold_shards`' primary key (the
    /// names from `prefix` up to the least string above every name with it): one snapshot, one
    /// statement for 10,000 records as for 10. Leases are in another table and never listed.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let map = self.map_read("shard_records");
        let mut conn = self.pool.acquire().await.map_err(|e| map(e.into()))?;
        shards::list(&mut conn, prefix).await.map_err(map)
    }

    /// One conditional statement in the writer's `BEGIN IMMEDIATE` transaction (shared with
    /// other writes queued meanwhile, like every write): `INSERT ... ON CONFLICT (name) DO
    /// NOTHING` when no record is expected, `UPDATE ... WHERE name = ? AND version = ?`
    /// otherwise, with a new random version. A refused write reads the row in the same
    /// transaction and answers it. Nothing wakes followers: shard records are not leases.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a value [`check_shard_value`] refuses (nothing is written);
    /// otherwise as the trait says.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        check_shard_value(value)?;
        let op = Op::WriteShard(name.clone(), expected.map(str::to_string), value.to_string());
        match self.writer.write(op).await? {
            Outcome::ShardWritten(written) => Ok(written),
            other => Err(mismatch(other)),
        }
    }

    /// `true`: [`break_lease`](LeaseStore::break_lease) works.
    fn can_break(&self) -> bool {
        true
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        match self.writer.write(Op::Break(lease.clone())).await? {
            Outcome::Broken(term) => Ok(term),
            other => Err(mismatch(other)),
        }
    }
}
