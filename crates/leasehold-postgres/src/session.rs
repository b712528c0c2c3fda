//! The lock session: one dedicated connection per store that holds the advisory lock of every
//! lease the store holds, driven by one task.
//!
//! The connection never returns to a pool: its session *is* the holding. Every lease of the store
//! shares it, so its statements are serialised: it is owned by a task that takes requests from a
//! queue and batches them (a statement on it is never cancelled half way, which keeps the
//! bookkeeping of what the session holds exact).
//! Requests that queue up are served releases (and handovers) first, then every renewal in one
//! statement, then
//! up to [`MAX_ACQUIRES`] acquires in one statement, so that a burst of campaigns never starves
//! the renewals of held leases.
//!
//! The session's `idle_session_timeout` is always the smallest TTL among the leases it holds
//! (off while it holds none), set by the very statement that takes or gives back a lock. A holder
//! that goes silent (crash without FIN, network partition, a frozen process) therefore loses
//! every lock it holds once the server has heard nothing from it for that long.
//!
//! A session that breaks or does not answer is dropped, with its locks. The rows still name their
//! grants, so the next renewal of each takes its lock again on a new session (nobody can have
//! been granted the lease in between, or the row would say so); grants that nobody renews are
//! given back after their TTL.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireRequest, Acquired, CandidateId, Error, Grant, LeaseName, Result, Term};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgRow};
use sqlx::query::Query;
use sqlx::{Connection, PgConnection, Postgres, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::PostgresConfig;
use crate::error::{self, STORE};
use crate::record::{lock_key, millis};
use crate::sql::{self, Sql};

mod requests;

use requests::Renewing;

/// Acquires sent in one statement at most (between two looks at the queue for releases and
/// renewals).
const MAX_ACQUIRES: usize = 256;

/// Renewals sent in one statement at most.
const MAX_RENEWALS: usize = 2048;

/// How often a running statement checks whether the client went away: it bounds how long a
/// vanished holder keeps its locks while a statement of its is still running.
const CLIENT_CHECK_INTERVAL_MS: u32 = 1000;

/// How long a statement on the lock session waits for a row lock (an operator's transaction,
/// a concurrent `break_lease`) before it fails as a transient timeout, instead of blocking every
/// lease of the session.
const LOCK_TIMEOUT_MS: u32 = 250;

/// What every part of a store shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) config: PostgresConfig,
    pub(crate) sql: Sql,
}

/// The `synchronous_commit` of every connection that writes lease records.
///
/// A grant is acknowledged when its statement commits. With `off` (or `local` while synchronous
/// standbys are configured), a commit can be acknowledged before it is durable, so a server
/// crash or a failover can bring the row back one term older and the same term is granted twice.
/// The database's, role's or server's default may say so, so it is set explicitly on each
/// connection, as a startup option: it comes after any `options` of the URL and overrides the
/// `ALTER DATABASE`/`ALTER ROLE ... SET` defaults.
///
/// `on` and not `remote_apply`: without synchronous standbys both wait for the local WAL flush
/// only; with them, `on` also waits until the standbys have flushed the commit, which is what
/// makes it survive a failover to one of them. `remote_apply` also waits until they have replayed
/// it, which matters only to reads on a standby (leasehold reads the primary), and a standby's
/// replay can stall for `max_standby_streaming_delay` (30 s by default) behind its own queries:
/// every renewal would wait for it and leaders would lose leases for no safety gained. Failover
/// to an *asynchronous* standby can lose acknowledged commits whatever this setting says (see
/// the docs).
pub(crate) const SYNCHRONOUS_COMMIT: &str = "on";

/// `options` with the settings every connection that writes lease records needs.
pub(crate) fn for_writes(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("synchronous_commit", SYNCHRONOUS_COMMIT)])
}

impl Context {
    pub(crate) fn new(config: PostgresConfig) -> Context {
        Context {
            sql: Sql::new(config.schema()),
            config,
        }
    }

    /// The options of a lock connection: the user's, plus the session settings it relies on.
    /// (Made on demand rather than kept: their `Debug` shows the password.)
    pub(crate) fn lock_options(&self) -> PgConnectOptions {
        let options = for_writes(self.config.connect_options()).options([
            ("idle_session_timeout", "0".to_string()),
            ("client_connection_check_interval", CLIENT_CHECK_INTERVAL_MS.to_string()),
            ("lock_timeout", LOCK_TIMEOUT_MS.to_string()),
        ]);
        match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("leasehold-lock"),
        }
    }

    /// The advisory lock key of `lease`.
    pub(crate) fn key(&self, lease: &LeaseName) -> i64 {
        lock_key(self.config.schema(), lease.as_str())
    }

    /// The payload of a notification about a change of `lease` made by candidate `by` (empty:
    /// an operator): `<schema>/<lease>/<by>`. The candidate that made a change is not woken by
    /// it (see [`Notifier`](crate::changes::Notifier)).
    pub(crate) fn payload(&self, lease: &LeaseName, by: &str) -> String {
        format!("{}/{}/{}", self.config.schema(), lease, by)
    }

    /// The payload of a release that gave back the lease's lock: [`Context::payload`] and
    /// [`QUEUED`](crate::sql::QUEUED) on a line of its own (candidate ids have no control
    /// characters). A store of this version with a queue watcher on the lease does not wake its
    /// candidates for it: the head of the queue wakes when the lock is given back. Older versions
    /// read the whole rest as the candidate and wake everyone, as before.
    pub(crate) fn queued_payload(&self, lease: &LeaseName, by: &str) -> String {
        format!("{}\n{}", self.payload(lease, by), crate::sql::QUEUED)
    }

    /// The payload of a handover by `by` to `to`: [`Context::payload`] and
    /// [`HANDOVER`](crate::sql::HANDOVER) followed by the successor on a line of its own. A
    /// store of this version wakes only the successor for it (the others would only find the
    /// reservation); older versions wake everyone, as before.
    pub(crate) fn handover_payload(&self, lease: &LeaseName, by: &str, to: &str) -> String {
        format!("{}\n{}{to}", self.payload(lease, by), crate::sql::HANDOVER)
    }
}

/// What a renewal found.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// Renewed: the grant with its new record version.
    Renewed(Grant),
    /// This store no longer holds the grant's lock (its session ended, or the row no longer
    /// names the grant); the lock, if it still had it, is given back.
    NotHeld,
}

#[derive(Debug)]
enum Command {
    Acquire {
        request: AcquireRequest,
        at: Instant,
        reply: oneshot::Sender<Result<Acquired>>,
    },
    /// Renewals queued together, so that they share one statement.
    RenewMany(Vec<Renewing>),
    Release {
        grant: Grant,
        reply: oneshot::Sender<Result<()>>,
    },
    HandOver {
        grant: Grant,
        to: CandidateId,
        reply: oneshot::Sender<Result<()>>,
    },
    Show {
        setting: String,
        reply: oneshot::Sender<Result<String>>,
    },
}

/// The handle of the lock session's task; the task ends (and the session with it) when every
/// handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct LockSession {
    commands: mpsc::UnboundedSender<Command>,
}

impl LockSession {
    /// Starts the task on the current tokio runtime, with `conn` (opened with
    /// [`Context::lock_options`]) as its first lock connection.
    pub(crate) fn spawn(cx: Arc<Context>, conn: PgConnection) -> LockSession {
        let (commands, queue) = mpsc::unbounded_channel();
        let actor = Actor {
            cx,
            session: Some(Session {
                conn,
                held: HashMap::new(),
                idle_timeout: Duration::ZERO,
                last_used: Instant::now(),
            }),
            releases: VecDeque::new(),
            handovers: VecDeque::new(),
            shows: VecDeque::new(),
            renewals: Vec::new(),
            acquires: VecDeque::new(),
        };
        tokio::spawn(actor.run(queue));
        LockSession { commands }
    }

    /// Takes the lease if the store lets this candidate have it. `at` is when the caller asked,
    /// no earlier than when the engine sent the request.
    pub(crate) async fn acquire(&self, request: AcquireRequest, at: Instant) -> Result<Acquired> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Acquire { request, at, reply }, answer).await
    }

    /// Renews grants this store holds (one or many), queued together so that they go in one
    /// statement (up to [`MAX_RENEWALS`]); the answers in order.
    pub(crate) async fn renew_many(&self, grants: Vec<Grant>, at: Instant) -> Result<Vec<Result<Renewal>>> {
        let gone = || Error::unreachable(STORE, "the lock session task has stopped (its tokio runtime shut down)");
        let (requests, answers): (Vec<_>, Vec<_>) = grants
            .into_iter()
            .map(|grant| {
                let (reply, answer) = oneshot::channel();
                ((grant, at, reply), answer)
            })
            .unzip();
        self.commands.send(Command::RenewMany(requests)).map_err(|_| gone())?;
        let mut renewals = Vec::with_capacity(answers.len());
        for answer in answers {
            renewals.push(answer.await.unwrap_or_else(|_| Err(gone())));
        }
        Ok(renewals)
    }

    /// Ends a grant (if the row still names it) and gives its lock back.
    pub(crate) async fn release(&self, grant: Grant) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Release { grant, reply }, answer).await
    }

    /// Ends a grant (if the row still names it) by reserving the lease for `to`, and gives its
    /// lock back.
    pub(crate) async fn hand_over(&self, grant: Grant, to: CandidateId) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::HandOver { grant, to, reply }, answer).await
    }

    /// The value of a server setting on the lock session (connecting it if needed).
    pub(crate) async fn show(&self, setting: &str) -> Result<String> {
        let (reply, answer) = oneshot::channel();
        let setting = setting.to_string();
        self.send(Command::Show { setting, reply }, answer).await
    }

    async fn send<T>(&self, command: Command, answer: oneshot::Receiver<Result<T>>) -> Result<T> {
        let gone = || Error::unreachable(STORE, "the lock session task has stopped (its tokio runtime shut down)");
        self.commands.send(command).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// One advisory lock the session holds.
#[derive(Clone, Debug)]
struct Held {
    key: i64,
    holder: CandidateId,
    term: Term,
    ttl: Duration,
    /// When the last successful acquire or renewal of this grant was asked for: the holder
    /// believes its grant for less than `ttl` after that.
    confirmed: Instant,
}

/// The live lock connection and what its session holds.
struct Session {
    conn: PgConnection,
    held: HashMap<LeaseName, Held>,
    /// The session's `idle_session_timeout` as last set (zero: off).
    idle_timeout: Duration,
    /// When the last statement's answer arrived.
    last_used: Instant,
}

/// Why a statement failed, kept so that one failure can answer many requests.
#[derive(Debug)]
enum Failure {
    Sql(sqlx::Error),
    NoAnswer(Duration),
    NotConnected(Error),
}

impl Failure {
    fn to_error(&self, operation: &'static str) -> Error {
        match self {
            Failure::Sql(e) => error::map(e, operation, Duration::ZERO),
            Failure::NoAnswer(after) => Error::Timeout {
                store: STORE,
                operation,
                after: *after,
            },
            Failure::NotConnected(e) => match e {
                Error::Unreachable { source, .. } => Error::unreachable(STORE, source.to_string()),
                Error::Timeout { after, .. } => Error::Timeout {
                    store: STORE,
                    operation,
                    after: *after,
                },
                Error::Refused {
                    operation: refused,
                    reason,
                    ..
                } => Error::refused(STORE, refused, reason.clone()),
                other => Error::store(STORE, other.to_string()),
            },
        }
    }
}

struct Actor {
    cx: Arc<Context>,
    session: Option<Session>,
    releases: VecDeque<(Grant, oneshot::Sender<Result<()>>)>,
    handovers: VecDeque<(Grant, CandidateId, oneshot::Sender<Result<()>>)>,
    shows: VecDeque<(String, oneshot::Sender<Result<String>>)>,
    renewals: Vec<Renewing>,
    acquires: VecDeque<(AcquireRequest, Instant, oneshot::Sender<Result<Acquired>>)>,
}

/// The smallest TTL among `held` (leaving out `except`) and `plus`; zero (no timeout) if none.
fn idle_timeout(held: &HashMap<LeaseName, Held>, except: Option<&LeaseName>, plus: Option<Duration>) -> Duration {
    held.iter()
        .filter(|(lease, _)| Some(*lease) != except)
        .map(|(_, h)| h.ttl)
        .chain(plus)
        .min()
        .unwrap_or(Duration::ZERO)
}

/// A Postgres setting in milliseconds.
fn setting(duration: Duration) -> String {
    millis(duration).to_string()
}

impl Actor {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.releases.is_empty()
                && self.handovers.is_empty()
                && self.shows.is_empty()
                && self.renewals.is_empty()
                && self.acquires.is_empty()
            {
                match commands.recv().await {
                    Some(command) => self.queue(command),
                    None => break,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.queue(command);
            }
            self.forget_silent_session();
            self.expire_abandoned().await;
            while let Some((grant, reply)) = self.releases.pop_front() {
                // Always carried out, even when the caller gave up: it only frees the lease.
                let result = self.release(&grant).await;
                let _ = reply.send(result);
            }
            while let Some((grant, to, reply)) = self.handovers.pop_front() {
                // Carried out like a release: it only ends the grant.
                let result = self.hand_over(&grant, &to).await;
                let _ = reply.send(result);
            }
            while let Some((setting, reply)) = self.shows.pop_front() {
                let result = self.show(&setting).await;
                let _ = reply.send(result);
            }
            while !self.renewals.is_empty() {
                let take = self.renewals.len().min(MAX_RENEWALS);
                let batch: Vec<_> = self.renewals.drain(..take).collect();
                self.renew_all(batch).await;
            }
            self.acquire_some().await;
        }
        // Every store handle is gone: closing the connection ends the session and its locks.
        if let Some(session) = self.session.take() {
            let _ = session.conn.close().await;
        }
    }

    fn queue(&mut self, command: Command) {
        match command {
            Command::Acquire { request, at, reply } => self.acquires.push_back((request, at, reply)),
            Command::RenewMany(renewals) => self.renewals.extend(renewals),
            Command::Release { grant, reply } => self.releases.push_back((grant, reply)),
            Command::HandOver { grant, to, reply } => self.handovers.push_back((grant, to, reply)),
            Command::Show { setting, reply } => self.shows.push_back((setting, reply)),
        }
    }

    /// A session that said nothing for its whole idle timeout has been ended by the server (or
    /// will be before the next statement arrives): forget it instead of failing a request on it.
    fn forget_silent_session(&mut self) {
        let Some(session) = &self.session else { return };
        let limit = session.idle_timeout;
        if !limit.is_zero() && session.last_used.elapsed() + limit / 20 >= limit {
            warn!(
                held = session.held.len(),
                idle = ?session.last_used.elapsed(),
                "the lock session was silent for its idle timeout; its locks are gone"
            );
            self.session = None;
        }
    }

    /// The bound on one statement: half the shortest TTL the session holds (or is asked for).
    ///
    /// A statement whose reply was lost leaves the connection useless (the protocol cannot
    /// resynchronise), and nothing tells a lost reply from a slow one; a session that cannot
    /// answer within half a TTL cannot keep its shortest lease anyway. Dropping it costs little:
    /// the next renewal of each grant takes its lock again on a new session if the row still
    /// names it.
    fn statement_limit(&self, plus: Option<Duration>) -> Duration {
        let shortest = self
            .session
            .as_ref()
            .map(|s| idle_timeout(&s.held, None, plus))
            .or(plus)
            .unwrap_or_default();
        if shortest.is_zero() {
            self.cx.config.connect_timeout()
        } else {
            shortest / 2
        }
    }

    /// Opens the lock connection if there is none.
    async fn connect(&mut self, limit: Duration) -> Result<(), Failure> {
        if self.session.is_some() {
            return Ok(());
        }
        let limit = limit.min(self.cx.config.connect_timeout());
        match tokio::time::timeout(limit, PgConnection::connect_with(&self.cx.lock_options())).await {
            Ok(Ok(conn)) => {
                debug!("lock session connected");
                self.session = Some(Session {
                    conn,
                    held: HashMap::new(),
                    idle_timeout: Duration::ZERO,
                    last_used: Instant::now(),
                });
                Ok(())
            }
            Ok(Err(e)) => Err(Failure::NotConnected(error::map_connect(
                &e,
                &self.cx.config.endpoint(),
                limit,
            ))),
            Err(_) => Err(Failure::NotConnected(error::connect_timeout(
                &self.cx.config.endpoint(),
                limit,
            ))),
        }
    }

    /// Runs one statement with a client-side bound. A statement that does not answer in time,
    /// or fails in a way that ends the session, drops the connection: its locks are gone.
    async fn fetch_all(
        &mut self,
        query: Query<'_, Postgres, PgArguments>,
        limit: Duration,
    ) -> Result<Vec<PgRow>, Failure> {
        let Some(session) = self.session.as_mut() else {
            return Err(Failure::NotConnected(Error::unreachable(
                STORE,
                "the lock session is not connected",
            )));
        };
        let outcome = tokio::time::timeout(limit, query.fetch_all(&mut session.conn)).await;
        match outcome {
            Ok(Ok(rows)) => {
                session.last_used = Instant::now();
                Ok(rows)
            }
            Ok(Err(e)) => {
                if error::ends_session(&e) {
                    warn!(error = %e, held = session.held.len(), "the lock session broke; its locks are gone");
                    self.session = None;
                } else {
                    session.last_used = Instant::now();
                }
                Err(Failure::Sql(e))
            }
            Err(_) => {
                warn!(
                    ?limit,
                    held = session.held.len(),
                    "the lock session did not answer; dropping it and its locks"
                );
                self.session = None;
                Err(Failure::NoAnswer(limit))
            }
        }
    }

    async fn fetch_one(&mut self, query: Query<'_, Postgres, PgArguments>, limit: Duration) -> Result<PgRow, Failure> {
        self.fetch_all(query, limit)
            .await?
            .into_iter()
            .next()
            .ok_or(Failure::Sql(sqlx::Error::RowNotFound))
    }

    /// `SHOW setting` on the lock session.
    async fn show(&mut self, setting: &str) -> Result<String> {
        let limit = self.statement_limit(None);
        self.connect(limit).await.map_err(|f| f.to_error("show"))?;
        let query = sqlx::query("SELECT current_setting($1)").bind(setting.to_string());
        let row = self.fetch_one(query, limit).await.map_err(|f| f.to_error("show"))?;
        row.try_get(0)
            .map_err(|e| Error::store(STORE, format!("unexpected answer to show: {e}")))
    }

    /// Gives back `keys` after a statement that may have taken one failed (a session-level
    /// advisory lock survives the rollback of the statement that took it); drops the session
    /// if even that fails, which also frees them.
    async fn give_back(&mut self, keys: Vec<i64>, limit: Duration) {
        let Some(session) = &self.session else { return };
        let after = idle_timeout(&session.held, None, None);
        let query = sql::query(&self.cx.sql.unlock).bind(keys).bind(setting(after));
        match self.fetch_one(query, limit).await {
            Ok(_) => {
                if let Some(session) = &mut self.session {
                    session.idle_timeout = after;
                }
            }
            Err(_) => self.session = None,
        }
    }
}
