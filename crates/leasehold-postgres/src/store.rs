//! [`PostgresStore`]: the [`LeaseStore`] on a Postgres database.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::Instant;

use crate::changes::{Notifier, Outcome};
use crate::config::PostgresConfig;
use crate::error::{self, STORE};
use crate::record::{self, RECORD_WIDTH, Record, TTL_RANGE, term_value};
use crate::schema;
use crate::session::{self, Context, LockSession, Renewal};
use crate::shards::{self, ShardSql};
use crate::sql;

/// A [`LeaseStore`] on a Postgres database (14 or later), shared by every process that connects
/// to it.
///
/// Each lease is a session-level advisory lock, `pg_try_advisory_lock`, held on one dedicated
/// connection per store (never a pooled one): the lock session. Its `idle_session_timeout` is the
/// smallest TTL of the leases it holds, so the server ends the session, and frees every lock of
/// it, when the holder goes silent. A row per lease in `<schema>.leases` records the holder, the
/// fencing term (bumped by the statement that takes the lock) and a record version that changes
/// with every renewal; `<schema>.history` keeps every term.
///
/// A lock can end before its holder knows (a connection reset, a server restart). A contender
/// that then finds the lock free but a row that still names a holder is told the record is
/// [`orphaned`](leasehold_core::HolderInfo::orphaned); the engine replaces it (with
/// [`AcquireRequest::takeover`] of its version) only after it has seen that same record version
/// unchanged for the holder's whole TTL, on its own monotonic clock, so nobody is granted a lease
/// that its previous holder may still believe in.
/// Releases and takeovers are announced with `NOTIFY`. See [`docs`](crate::docs) for the whole
/// story.
///
/// The store's tasks run on the tokio runtime that created it: use it on that runtime.
///
/// # Cancel safety
///
/// Acquires, renewals and releases are handed to the lock session's task, which serialises
/// every statement on the one connection whose session holds the locks (and sends queued
/// renewals in one statement, releases first): a dropped call is still carried out (an acquire
/// whose caller is gone before it is sent is skipped), and its outcome is unknown to the
/// caller, as after a timeout. Reads run on the pool and hold no state between awaits.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_postgres::PostgresStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::connect("postgres://app@db.internal:5432/jobs").await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(10)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the redacted config: the driver's options hold the password.
        f.debug_struct("PostgresStore")
            .field("config", &self.inner.cx.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    cx: Arc<Context>,
    /// For reads and operator requests; never for locks.
    pool: PgPool,
    session: LockSession,
    notifier: Notifier,
    /// The statements of shard records (on the pool; they have no lock).
    shards: ShardSql,
}

impl PostgresStore {
    /// Connects to the database named by a `postgres://` or `postgresql://` URL (see
    /// [`PostgresConfig`] for the options), creating leasehold's schema and tables if absent.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (redacted) for a malformed URL or a bad option; otherwise as
    /// [`PostgresStore::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        PostgresStore::from_config(PostgresConfig::from_str(url)?).await
    }

    /// Connects with `config`: checks that the server answers, creates the schema and tables if
    /// absent and checks their shape if present. The lock session and the listener connect on
    /// first use.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Unreachable`] or [`Error::Timeout`] when the server cannot be reached;
    /// - [`Error::Store`] for a definite refusal (authentication, a missing privilege);
    /// - [`Error::CorruptRecord`] naming the table when a table of the same name has another
    ///   shape, or the schema was written by a newer version; nothing is changed.
    pub async fn from_config(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let options = config.connect_options().clone();
        let timeout = config.connect_timeout();
        let cx = Arc::new(Context::new(config));
        // The first connection prepares the schema, then becomes the lock session: a store that
        // answers `connect` can take a lease with one statement.
        let mut conn = match tokio::time::timeout(timeout, cx.lock_options().connect()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(error::map_connect(&e, &cx.config.endpoint(), timeout)),
            Err(_) => return Err(error::connect_timeout(&cx.config.endpoint(), timeout)),
        };
        if let Err(e) = schema::prepare(&mut conn, cx.config.schema(), timeout).await {
            let _ = conn.close().await;
            return Err(e);
        }
        let pool = PgPoolOptions::new()
            .max_connections(cx.config.pool_size())
            .min_connections(0)
            .acquire_timeout(timeout)
            .connect_lazy_with(session::for_writes(match options.get_application_name() {
                Some(_) => options.clone(),
                None => options.clone().application_name("leasehold"),
            }));
        let notifier = Notifier::new(options, timeout, cx.config.schema(), pool.clone());
        let session = LockSession::spawn(cx.clone(), conn);
        let shards = ShardSql::new(cx.config.schema());
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                cx,
                pool,
                session,
                notifier,
                shards,
            }),
        })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.cx.config
    }

    /// The advisory lock key of `lease` in this store's schema (see [`lock_key`](crate::lock_key)).
    pub fn lock_key(&self, lease: &LeaseName) -> i64 {
        self.inner.cx.key(lease)
    }

    /// The value of the server setting `name` (as `SHOW` reports it) on the connections that
    /// write lease records: the lock session, and a pooled connection (it writes for
    /// [`break_lease`](LeaseStore::break_lease)). For operators and tests checking what the
    /// store runs with whatever the server's, database's or role's defaults, for example that
    /// `synchronous_commit` is `on`.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`] or [`Error::Timeout`] when the server cannot be reached;
    /// [`Error::Store`] for a setting the server does not know.
    pub async fn write_session_setting(&self, name: &str) -> Result<WriteSessionSetting> {
        let lock_session = self.inner.session.show(name).await?;
        let timeout = self.inner.cx.config.connect_timeout();
        let pool = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, "show", timeout))?;
        Ok(WriteSessionSetting { lock_session, pool })
    }

    /// The row of `lease`, and whether its advisory lock was free when it was read.
    async fn read(&self, lease: &LeaseName, operation: &'static str) -> Result<(Record, bool)> {
        let timeout = self.inner.cx.config.connect_timeout();
        let row = sql::query(&self.inner.cx.sql.read)
            .bind(lease.as_str())
            .bind(self.inner.cx.key(lease))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, operation, timeout))?;
        let record = Record::decode(lease, &row, 0)?;
        let lock_free = row
            .try_get::<bool, _>(RECORD_WIDTH)
            .map_err(|e| Error::store(STORE, format!("unexpected answer to {operation}: {e}")))?;
        Ok((record, lock_free))
    }
}

impl PostgresStore {
    /// What the store holds for each of `lost` (grants the session no longer holds), in one
    /// statement on the pool, as renew answers it: a row that still names the grant outlived its
    /// lock (the session ended), so the lease is not the grant's any more, whatever the row says.
    async fn observe_lost(&self, lost: &[&Grant]) -> Vec<Result<Observation>> {
        if lost.is_empty() {
            return Vec::new();
        }
        let timeout = self.inner.cx.config.connect_timeout();
        let names: Vec<&str> = lost.iter().map(|g| g.lease.as_str()).collect();
        let keys: Vec<i64> = lost.iter().map(|g| self.inner.cx.key(&g.lease)).collect();
        let rows = sql::query(&self.inner.cx.sql.read_many)
            .bind(names)
            .bind(keys)
            .fetch_all(&self.inner.pool)
            .await;
        let rows = match rows {
            Ok(rows) if rows.len() == lost.len() => rows,
            Ok(rows) => {
                let wrong = format!(
                    "unexpected answer to renew: {} rows for {} leases",
                    rows.len(),
                    lost.len()
                );
                return lost.iter().map(|_| Err(Error::store(STORE, wrong.clone()))).collect();
            }
            Err(e) => return lost.iter().map(|_| Err(error::map(&e, "renew", timeout))).collect(),
        };
        lost.iter()
            .zip(&rows)
            .map(|(grant, row)| {
                let record = Record::decode(&grant.lease, row, 0)?;
                let lock_free = row
                    .try_get::<bool, _>(RECORD_WIDTH)
                    .map_err(|e| Error::store(STORE, format!("unexpected answer to renew: {e}")))?;
                let mut observation = record.observation(&grant.lease, lock_free);
                if observation
                    .holder
                    .as_ref()
                    .is_some_and(|h| h.id == grant.holder && h.term == grant.term && !h.reserved)
                {
                    observation.holder = None;
                }
                Ok(observation)
            })
            .collect()
    }
}

/// A server setting on the connections of a [`PostgresStore`] that write lease records (see
/// [`PostgresStore::write_session_setting`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteSessionSetting {
    /// Its value on the lock session (acquires, renewals, releases).
    pub lock_session: String,
    /// Its value on a pooled connection (operator writes: `break_lease`).
    pub pool: String,
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ServerSession,
            notifications: Notifications::Release,
            announces: leasehold_core::Announces::GrantsAndRenewals,
            fifo: false,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let answer = self.inner.session.acquire(request.clone(), Instant::now()).await;
        self.inner
            .notifier
            .acquired(&request.lease, &request.candidate, Outcome::of(&answer));
        answer
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let mut answers = self.renew_many(std::slice::from_ref(grant)).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(Error::store(STORE, "internal error: no answer to renew")))
    }

    /// The grants go to the lock session together: one statement renews every grant it holds
    /// (up to 2,048 per statement), one statement gives back the locks of those whose rows no
    /// longer name them, and one read on the pool finds what the store holds for every grant
    /// that was lost (its answer is [`Renewed::Lost`] with that observation, as from
    /// [`renew`](LeaseStore::renew), which is this with one grant). A grant whose lock this
    /// session lost (a broken connection) takes it again with a statement of its own.
    ///
    /// # Errors
    ///
    /// The outer error when every grant failed (the session is unreachable); per grant, the
    /// error of a statement that failed for it, or [`Error::CorruptRecord`] for a lost grant's
    /// unreadable row.
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        if grants.is_empty() {
            return Ok(Vec::new());
        }
        let renewals = self.inner.session.renew_many(grants.to_vec(), Instant::now()).await?;
        if renewals.iter().all(Result::is_err) {
            if let Some(Err(error)) = renewals.into_iter().next() {
                return Err(error);
            }
            return Err(Error::store(STORE, "internal error: no answer to renew_many"));
        }
        let lost: Vec<&Grant> = grants
            .iter()
            .zip(&renewals)
            .filter(|(_, renewal)| matches!(renewal, Ok(Renewal::NotHeld)))
            .map(|(grant, _)| grant)
            .collect();
        let mut seen = self.observe_lost(&lost).await.into_iter();
        Ok(grants
            .iter()
            .zip(renewals)
            .map(|(grant, renewal)| match renewal? {
                Renewal::Renewed(grant) => Ok(Renewed::Renewed(grant)),
                Renewal::NotHeld => seen
                    .next()
                    .unwrap_or_else(|| {
                        Err(Error::store(
                            STORE,
                            format!("internal error: no record of {}", grant.lease),
                        ))
                    })
                    .map(Renewed::Lost),
            })
            .collect())
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.session.release(grant.clone()).await
    }

    /// One statement on the lock session: if the row still names the grant, its term ends
    /// `handed_over` and the row names `to` at the same term with `previous_end` `handed_over`
    /// and a new version (a reservation), the lock is given back and a notification wakes `to`.
    /// The reservation has no lock, so others see it orphaned and reserved: only `to`'s acquire
    /// is granted (a new term) until they have watched its version for a TTL.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.inner.session.hand_over(grant.clone(), to.clone()).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let (record, lock_free) = self.read(lease, "inspect").await?;
        Ok(record.observation(lease, lock_free))
    }

    /// One statement: the rows whose name starts with `prefix` (`LIKE`, with `%`, `_` and the
    /// escape character escaped), each with the state of its advisory lock.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let timeout = self.inner.cx.config.connect_timeout();
        let rows = sql::query(&self.inner.cx.sql.list)
            .bind(leasehold_core::like_prefix(prefix))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, "list", timeout))?;
        let unexpected = |e: sqlx::Error| Error::store(STORE, format!("unexpected answer to list: {e}"));
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row.try_get(0).map_err(unexpected)?;
            let lease = LeaseName::new(name.as_str())
                .map_err(|e| Error::corrupt(STORE, &name, format!("the row's name is not a lease name: {e}")))?;
            let record = Record::decode(&lease, row, 1)?;
            let lock_key: Option<i64> = row.try_get(1 + RECORD_WIDTH).map_err(unexpected)?;
            let lock_free: bool = row.try_get(2 + RECORD_WIDTH).map_err(unexpected)?;
            // A row that records another key than its lease's (written by someone else) says
            // nothing about the lease's lock: not orphaned, as far as anyone can tell.
            let lock_free = lock_free && lock_key == Some(self.inner.cx.key(&lease));
            leases.push(record.observation(&lease, lock_free));
        }
        leases.sort_by(|a, b| a.lease.cmp(&b.lease));
        Ok(leases)
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        // Like every operation, refuse to report on a lease whose record cannot be read.
        self.read(lease, "history").await?;
        let timeout = self.inner.cx.config.connect_timeout();
        let rows = sql::query(&self.inner.cx.sql.history)
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

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(Some(self.inner.notifier.changes(lease, candidate)))
    }

    /// Every grant announces itself on the `leasehold_granted` channel in its own statement,
    /// every renewal on `leasehold_renewed` in its statement; the store's listener passes those
    /// of `lease` on (see [`docs`](crate::docs)).
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        Ok(Some(self.inner.notifier.announcements(lease)))
    }

    /// One statement on the pool over a range of `<schema>.shards`' primary key (the names from
    /// `prefix` up to the least string above every name with it, in byte order): one snapshot
    /// and one round trip for 10,000 records as for 10. Leases are in another table and never
    /// listed.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let timeout = self.inner.cx.config.connect_timeout();
        shards::list(&self.inner.pool, &self.inner.shards, prefix, timeout).await
    }

    /// One conditional statement on the pool: `INSERT ... ON CONFLICT (name) DO NOTHING` when
    /// no record is expected, `UPDATE ... WHERE name = $1 AND version = $2` otherwise, with a
    /// new random version. A refused write is followed by one read of the record, which the
    /// [`Conflict`](ShardWrite::Conflict) answers. No lock, no notification, no history.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a value [`check_shard_value`](leasehold_core::check_shard_value)
    /// refuses (nothing is sent); otherwise as the trait says.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let timeout = self.inner.cx.config.connect_timeout();
        shards::write(&self.inner.pool, &self.inner.shards, name, expected, value, timeout).await
    }

    /// `true`: [`break_lease`](LeaseStore::break_lease) works.
    fn can_break(&self) -> bool {
        true
    }

    /// Ends the current term as `broken` in the row and the history, and notifies. The holder's
    /// lock session is not terminated (it holds the store's other leases too): the holder learns
    /// at its next renewal, which answers `Lost` and gives the lock back, or, if it is silent,
    /// the server frees the lock within the TTL. Candidates take the lease as soon as the lock
    /// is free.
    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let (record, _) = self.read(lease, "break_lease").await?;
        let Some(holder) = &record.holder else {
            return Ok(None);
        };
        let timeout = self.inner.cx.config.connect_timeout();
        let row = sql::query(&self.inner.cx.sql.break_lease)
            .bind(lease.as_str())
            .bind(term_value(record.term))
            .bind(holder.id.as_str())
            .bind(self.inner.cx.payload(lease, ""))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| error::map(&e, "break_lease", timeout))?;
        let broken: i64 = row
            .try_get(0)
            .map_err(|e| Error::store(STORE, format!("unexpected answer to break_lease: {e}")))?;
        // Zero: the term ended on its own in the meantime; nothing was broken.
        Ok((broken > 0).then_some(record.term))
    }
}
