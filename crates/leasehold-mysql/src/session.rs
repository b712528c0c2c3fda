//! The lock session: one connection per store that never returns to a pool, owned by one task
//! that serves the store's acquires, renewals and releases from a queue. It holds the named lock
//! (`GET_LOCK`) of every lease the store holds; the server frees them all when the session ends.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Error, Grant, LeaseName, RecordVersion, Renewed, Result, Term,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::MysqlConfig;
use crate::error::{self, STORE};
use crate::record::{Record, lock_of, millis, record_columns, term_value, unix_millis};

/// Renewals per statement.
const MAX_RENEWALS: usize = 200;

/// Acquires sent in one packet (each for another lease) before the queue is looked at again, so
/// that renewals and releases that arrive while many acquires wait are not held up behind all
/// of them.
const ACQUIRES_PER_ROUND: usize = 32;

/// What the store's tasks share: the config and the driver's options.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) config: MysqlConfig,
}

impl Context {
    fn options(&self) -> MySqlConnectOptions {
        self.config.connect_options()
    }
}

type Reply<T> = oneshot::Sender<Result<T>>;

enum Command {
    Acquire(AcquireRequest, Reply<Acquired>),
    /// Renewals queued together, so that they share statements.
    Renew(Vec<(Grant, Reply<Renewed>)>),
    Release(Grant, Reply<()>),
}

/// The handle of the lock session's task; the task ends (and the session with it) when every
/// handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct LockSession {
    commands: mpsc::UnboundedSender<Command>,
}

fn gone() -> Error {
    Error::unreachable(STORE, "the lock session task has stopped (its tokio runtime shut down)")
}

impl LockSession {
    /// Starts the task on the current tokio runtime with `conn` as its first lock connection.
    pub(crate) fn spawn(cx: Arc<Context>, conn: MySqlConnection) -> LockSession {
        let (commands, queue) = mpsc::unbounded_channel();
        let actor = Actor {
            cx,
            session: Some(Session::new(conn)),
            acquires: VecDeque::new(),
            renewals: Vec::new(),
            releases: VecDeque::new(),
        };
        tokio::spawn(actor.run(queue));
        LockSession { commands }
    }

    pub(crate) async fn acquire(&self, request: AcquireRequest) -> Result<Acquired> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Acquire(request, reply))
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The answers in order.
    pub(crate) async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let (requests, answers): (Vec<_>, Vec<_>) = grants
            .iter()
            .map(|grant| {
                let (reply, answer) = oneshot::channel();
                ((grant.clone(), reply), answer)
            })
            .unzip();
        self.commands.send(Command::Renew(requests)).map_err(|_| gone())?;
        let mut renewals = Vec::with_capacity(answers.len());
        for answer in answers {
            renewals.push(answer.await.unwrap_or_else(|_| Err(gone())));
        }
        Ok(renewals)
    }

    pub(crate) async fn release(&self, grant: Grant) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Release(grant, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A grant whose named lock the session holds.
#[derive(Clone, Debug)]
struct Held {
    holder: CandidateId,
    term: Term,
    ttl: Duration,
}

/// The live lock connection and what its session holds.
struct Session {
    conn: MySqlConnection,
    held: HashMap<LeaseName, Held>,
    /// The session's `wait_timeout` in seconds as last set (0: the server's default).
    wait_timeout: u64,
    /// When the last statement's answer arrived.
    last_used: Instant,
}

impl Session {
    fn new(conn: MySqlConnection) -> Session {
        Session {
            conn,
            held: HashMap::new(),
            wait_timeout: 0,
            last_used: Instant::now(),
        }
    }

    fn holds(&self, grant: &Grant) -> bool {
        self.held
            .get(&grant.lease)
            .is_some_and(|h| h.holder == grant.holder && h.term == grant.term)
    }
}

/// Why a step failed.
#[derive(Debug)]
enum Failure {
    Sql(sqlx::Error),
    NoAnswer(Duration),
    /// Not the session's fault (a corrupt row, no connection): the session stays.
    Other(Error),
}

impl Failure {
    fn ends_session(&self) -> bool {
        match self {
            Failure::Sql(e) => error::ends_session(e),
            Failure::NoAnswer(_) => true,
            Failure::Other(_) => false,
        }
    }

    fn into_error(self, operation: &'static str) -> Error {
        match self {
            Failure::Sql(e) => error::map(&e, operation, Duration::ZERO),
            Failure::NoAnswer(after) => Error::Timeout {
                store: STORE,
                operation,
                after,
            },
            Failure::Other(e) => e,
        }
    }
}

/// Runs one statement future with a client-side bound.
async fn timed<T>(limit: Duration, statement: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, Failure> {
    match tokio::time::timeout(limit, statement).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Failure::Sql(e)),
        Err(_) => Err(Failure::NoAnswer(limit)),
    }
}

fn query(sql: String) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql))
}

struct Actor {
    cx: Arc<Context>,
    session: Option<Session>,
    acquires: VecDeque<(AcquireRequest, Reply<Acquired>)>,
    renewals: Vec<(Grant, Reply<Renewed>)>,
    releases: VecDeque<(Grant, Reply<()>)>,
}

impl Actor {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.acquires.is_empty() && self.renewals.is_empty() && self.releases.is_empty() {
                match commands.recv().await {
                    Some(command) => self.queue(command),
                    None => break,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.queue(command);
            }
            self.forget_silent_session();
            while let Some((grant, reply)) = self.releases.pop_front() {
                // Always carried out, even when the caller gave up: it only frees the lease.
                let result = self.release(&grant).await;
                let _ = reply.send(result);
            }
            while !self.renewals.is_empty() {
                let take = self.renewals.len().min(MAX_RENEWALS);
                let batch: Vec<_> = self.renewals.drain(..take).collect();
                let grants: Vec<Grant> = batch.iter().map(|(g, _)| g.clone()).collect();
                match self.renew(&grants).await {
                    Ok(answers) => {
                        for ((_, reply), answer) in batch.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(e) => {
                        for (_, reply) in batch {
                            let _ = reply.send(Err(clone_error(&e)));
                        }
                    }
                }
            }
            let mut batch: Vec<(AcquireRequest, Reply<Acquired>)> = Vec::new();
            let mut later = VecDeque::new();
            while batch.len() < ACQUIRES_PER_ROUND
                && let Some((request, reply)) = self.acquires.pop_front()
            {
                if reply.is_closed() {
                    continue; // nobody waits for it: not sent, nothing applied
                }
                if batch.iter().any(|(r, _)| r.lease == request.lease) {
                    later.push_back((request, reply)); // one acquire per lease and packet
                } else {
                    batch.push((request, reply));
                }
            }
            later.append(&mut self.acquires);
            self.acquires = later;
            if !batch.is_empty() {
                let requests: Vec<AcquireRequest> = batch.iter().map(|(r, _)| r.clone()).collect();
                match self.acquire_many(&requests).await {
                    Ok(answers) => {
                        for ((_, reply), answer) in batch.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(e) => {
                        for (_, reply) in batch {
                            let _ = reply.send(Err(clone_error(&e)));
                        }
                    }
                }
            }
        }
        // Every store handle is gone: closing the connection ends the session and its locks.
        if let Some(session) = self.session.take() {
            let _ = session.conn.close().await;
        }
    }

    fn queue(&mut self, command: Command) {
        match command {
            Command::Acquire(request, reply) => self.acquires.push_back((request, reply)),
            Command::Renew(renewals) => self.renewals.extend(renewals),
            Command::Release(grant, reply) => self.releases.push_back((grant, reply)),
        }
    }

    /// A session that said nothing for its whole `wait_timeout` has been ended by the server (or
    /// will be before the next statement arrives): forget it instead of failing a request on it.
    fn forget_silent_session(&mut self) {
        let Some(session) = &self.session else { return };
        let limit = Duration::from_secs(session.wait_timeout);
        if !limit.is_zero() && session.last_used.elapsed() + limit / 20 >= limit {
            warn!(
                held = session.held.len(),
                idle = ?session.last_used.elapsed(),
                "the lock session was silent for its wait_timeout; its locks are gone"
            );
            self.session = None;
        }
    }

    /// Takes the session (connecting one if needed) and the bound on its statements: half the
    /// shortest TTL the session holds or is asked for (a session that cannot answer within that
    /// cannot keep its shortest lease anyway).
    async fn begin(&mut self, ttl: Option<Duration>) -> Result<(Session, Duration)> {
        let shortest = self
            .session
            .as_ref()
            .and_then(|s| s.held.values().map(|h| h.ttl).min())
            .into_iter()
            .chain(ttl)
            .min();
        let limit = shortest.map_or(self.cx.config.connect_timeout(), |ttl| ttl / 2);
        let session = match self.session.take() {
            Some(session) => session,
            None => self.connect(limit).await?,
        };
        Ok((session, limit))
    }

    /// Puts the session back after `result`, unless it failed in a way that leaves the session
    /// untrustworthy: then it is dropped, and with it every lock it held. Sets `wait_timeout` to
    /// the shortest TTL held (rounded up to whole seconds, as the server counts).
    async fn finish<T>(
        &mut self,
        mut session: Session,
        limit: Duration,
        operation: &'static str,
        result: Result<T, Failure>,
    ) -> Result<T> {
        if let Err(failure) = &result
            && failure.ends_session()
        {
            warn!(error = ?failure, held = session.held.len(), "the lock session failed; its locks are gone");
            return result.map_err(|f| f.into_error(operation));
        }
        session.last_used = Instant::now();
        let wanted = session
            .held
            .values()
            .map(|h| u64::try_from(h.ttl.as_millis().div_ceil(1000)).unwrap_or(u64::MAX))
            .min()
            .unwrap_or(0);
        if wanted != session.wait_timeout {
            // 0: nothing held; the server's default (hours) is then harmless.
            let seconds = if wanted == 0 { 28_800 } else { wanted };
            let set = timed(
                limit,
                query(format!("SET SESSION wait_timeout = {seconds}")).execute(&mut session.conn),
            )
            .await;
            match set {
                Ok(_) => {
                    session.wait_timeout = wanted;
                    session.last_used = Instant::now();
                }
                Err(failure) => {
                    warn!(error = ?failure, "cannot set the lock session's wait_timeout; dropping the session");
                    return Err(failure.into_error(operation));
                }
            }
        }
        self.session = Some(session);
        result.map_err(|f| f.into_error(operation))
    }

    async fn release(&mut self, grant: &Grant) -> Result<()> {
        let (mut session, limit) = self.begin(Some(grant.ttl)).await?;
        let result = release(&mut session, grant, limit).await;
        self.finish(session, limit, "release", result).await
    }

    async fn renew(&mut self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let (mut session, limit) = self.begin(grants.iter().map(|g| g.ttl).min()).await?;
        let result = renew(&mut session, grants, limit).await;
        self.finish(session, limit, "renew", result).await
    }

    async fn acquire_many(&mut self, requests: &[AcquireRequest]) -> Result<Vec<Result<Acquired>>> {
        let (mut session, limit) = self.begin(requests.iter().map(|r| r.ttl).min()).await?;
        let history_limit = self.cx.config.history_limit();
        let result = acquire_many(&mut session, history_limit, requests, limit).await;
        self.finish(session, limit, "acquire", result).await
    }

    async fn connect(&mut self, limit: Duration) -> Result<Session> {
        let limit = limit.min(self.cx.config.connect_timeout());
        let endpoint = self.cx.config.endpoint();
        match tokio::time::timeout(limit, MySqlConnection::connect_with(&self.cx.options())).await {
            Ok(Ok(mut conn)) => {
                // A statement of the lock session never waits long for a row another
                // transaction holds (an operator's open transaction): one second.
                timed(limit, conn.execute("SET SESSION innodb_lock_wait_timeout = 1"))
                    .await
                    .map_err(|f| f.into_error("connect"))?;
                debug!("lock session connected");
                Ok(Session::new(conn))
            }
            Ok(Err(e)) => Err(error::map_connect(&e, &endpoint, limit)),
            Err(_) => Err(error::connect_timeout(&endpoint, limit)),
        }
    }
}

/// One failure answers every renewal of a batch: each gets an error of the same kind.
fn clone_error(error: &Error) -> Error {
    match error {
        Error::Timeout {
            store,
            operation,
            after,
        } => Error::Timeout {
            store,
            operation,
            after: *after,
        },
        Error::Unreachable { store, source } => Error::unreachable(store, source.to_string()),
        Error::Refused {
            store,
            operation,
            reason,
            ..
        } => Error::refused(store, operation, reason.clone()),
        other => Error::store(STORE, other.to_string()),
    }
}

/// Takes the lease's named lock if the session does not hold it: `Some(true)` taken now,
/// `Some(false)` already the session's, `None` another session holds it.
async fn lock(session: &mut Session, lease: &LeaseName, limit: Duration) -> Result<Option<bool>, Failure> {
    if session.held.contains_key(lease) {
        return Ok(Some(false));
    }
    let lk = lock_of("?");
    let sql = format!("SELECT CAST(IF(IS_USED_LOCK({lk}) <=> CONNECTION_ID(), 1, GET_LOCK({lk}, 0)) AS SIGNED)");
    let got: Option<i64> = timed(
        limit,
        query(sql)
            .bind(lease.as_str())
            .bind(lease.as_str())
            .fetch_one(&mut session.conn),
    )
    .await?
    .try_get(0)
    .map_err(Failure::Sql)?;
    // An untracked lock of ours (1 from IS_USED_LOCK) counts as taken now: given back if unused.
    Ok((got == Some(1)).then_some(true))
}

async fn unlock(session: &mut Session, lease: &LeaseName, limit: Duration) -> Result<(), Failure> {
    let sql = format!("SELECT RELEASE_LOCK({})", lock_of("?"));
    timed(limit, query(sql).bind(lease.as_str()).execute(&mut session.conn)).await?;
    session.held.remove(lease);
    Ok(())
}

/// `text` as an SQL literal that needs no escaping: a hex string converted to `utf8mb4` with a
/// binary collation, as leasehold's columns are.
fn text_literal(text: &str) -> String {
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4) COLLATE utf8mb4_bin")
}

/// The checks of [`Record::decode`] in SQL, over the `@lh_*` variables of the acquire batch: a
/// lease is granted only over a row that passes them.
const VALID_ROW_SQL: &str = "IFNULL(@lh_term >= 0
     AND (@lh_prev IS NULL OR @lh_prev IN ('released', 'expired', 'broken'))
     AND ((@lh_holder IS NULL AND @lh_ttl IS NULL AND @lh_version IS NULL)
          OR (@lh_holder IS NOT NULL AND @lh_ttl IS NOT NULL AND @lh_version IS NOT NULL AND @lh_prev IS NULL
              AND @lh_term > 0 AND @lh_ttl BETWEEN 1000 AND 3600000
              AND @lh_version REGEXP '^[0-9a-fA-F]{16}$'
              AND OCTET_LENGTH(@lh_holder) BETWEEN 1 AND 256
              AND @lh_holder NOT REGEXP '[[:cntrl:]]')), 0)";

/// The acquire of `request` as one batch of statements sent in one packet, so that the server
/// applies it whole even when its reply is lost (a grant decided in this process between two
/// round trips would not be): take the named lock unless the session holds it (`have`), read
/// the row `FOR UPDATE` in a transaction, grant if the row is absent, free, the candidate's own,
/// or has exactly the record version to take over (and passes [`VALID_ROW_SQL`]), write the row
/// and the history, commit, give back a lock taken but not used, and answer: whether the lock
/// was ours, whether granted, whether taken now, the new term, then the record as it is now.
fn acquire_batch(request: &AcquireRequest, have: bool, version: &RecordVersion, history_limit: u32) -> String {
    let takeover = request
        .takeover
        .as_deref()
        .map_or_else(|| "NULL".to_string(), text_literal);
    format!(
        "SET @lh_n = {name}, @lh_c = {candidate}, @lh_tk = {takeover}, @lh_lk = {lock},
             @lh_took = IF({have}, 0, IFNULL(IF(IS_USED_LOCK({lock}) <=> CONNECTION_ID(), 1, GET_LOCK({lock}, 0)), 0)),
             @lh_grant = 0, @lh_new = NULL, @lh_present = 0, @lh_holder = NULL, @lh_term = NULL,
             @lh_ttl = NULL, @lh_version = NULL, @lh_prev = NULL;
         START TRANSACTION;
         SELECT 1, holder, term, ttl_ms, version, previous_end
             INTO @lh_present, @lh_holder, @lh_term, @lh_ttl, @lh_version, @lh_prev
             FROM leasehold_leases WHERE name = @lh_n AND ({have} OR @lh_took = 1) FOR UPDATE;
         SET @lh_grant = ({have} OR @lh_took = 1) AND (@lh_present = 0 OR ({valid} AND (@lh_holder IS NULL
                 OR @lh_holder = @lh_c OR (@lh_tk IS NOT NULL AND @lh_version = @lh_tk)))),
             @lh_new = GREATEST(IFNULL(@lh_term, 0),
                 IFNULL((SELECT MAX(term) FROM leasehold_history WHERE name = @lh_n), 0)) + 1;
         INSERT INTO leasehold_leases (name, holder, term, ttl_ms, version, previous_end, renewed_at)
             SELECT @lh_n, @lh_c, @lh_new, {ttl_ms}, '{version}', NULL, NOW(3) FROM DUAL WHERE @lh_grant
             ON DUPLICATE KEY UPDATE holder = VALUES(holder), term = VALUES(term), ttl_ms = VALUES(ttl_ms),
                 version = VALUES(version), previous_end = NULL, renewed_at = VALUES(renewed_at);
         UPDATE leasehold_history SET ended_at = {now}, end_reason = IF(@lh_holder = @lh_c, 'released', 'expired')
             WHERE @lh_grant AND @lh_holder IS NOT NULL AND name = @lh_n AND term = @lh_term AND ended_at IS NULL;
         INSERT INTO leasehold_history (name, term, holder, acquired_at)
             SELECT @lh_n, @lh_new, @lh_c, {now} FROM DUAL WHERE @lh_grant;
         DELETE FROM leasehold_history
             WHERE @lh_grant AND {keep} > 0 AND name = @lh_n AND term <= @lh_new - {keep};
         COMMIT;
         DO IF(@lh_took = 1 AND NOT @lh_grant, RELEASE_LOCK(@lh_lk), 0);
         SELECT CAST({have} OR @lh_took = 1 AS SIGNED), CAST(@lh_grant AS SIGNED), CAST(@lh_took AS SIGNED),
                CAST(@lh_new AS SIGNED), {record}
             FROM (SELECT @lh_n AS n) AS w LEFT JOIN leasehold_leases AS l ON l.name = w.n",
        name = text_literal(request.lease.as_str()),
        candidate = text_literal(request.candidate.as_str()),
        lock = lock_of(&text_literal(request.lease.as_str())),
        have = u8::from(have),
        valid = VALID_ROW_SQL,
        ttl_ms = millis(request.ttl),
        version = version.as_str(),
        now = unix_millis(std::time::SystemTime::now()),
        keep = history_limit,
        record = record_columns("w.n"),
    )
}

/// Runs the [`acquire_batch`] of each request (each for another lease) in one packet, so that a
/// queue of acquires costs one round trip. Rows arrive as each acquire completes: a batch that
/// fails part way (a lock wait timeout) answers the acquires before the failure, rolls the failed
/// one back and gives back a lock it took, and answers it and the rest with the error.
async fn acquire_many(
    session: &mut Session,
    history_limit: u32,
    requests: &[AcquireRequest],
    limit: Duration,
) -> Result<Vec<Result<Acquired>>, Failure> {
    let versions: Vec<RecordVersion> = requests.iter().map(|_| RecordVersion::random()).collect();
    let sql: String = requests
        .iter()
        .zip(&versions)
        .map(|(request, version)| {
            let have = session.held.contains_key(&request.lease);
            acquire_batch(request, have, version, history_limit) + ";\n"
        })
        .collect();
    let collect = async {
        let mut rows = Vec::with_capacity(requests.len());
        let mut stream = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut session.conn);
        while let Some(item) = stream.next().await {
            match item {
                Ok(sqlx::Either::Right(row)) => rows.push(row),
                Ok(sqlx::Either::Left(_)) => {}
                Err(e) => return (rows, Some(e)),
            }
        }
        (rows, None)
    };
    let (rows, failed) = match tokio::time::timeout(limit, collect).await {
        Ok(outcome) => outcome,
        Err(_) => return Err(Failure::NoAnswer(limit)),
    };
    let mut answers = Vec::with_capacity(requests.len());
    for ((request, version), row) in requests.iter().zip(versions).zip(&rows) {
        answers.push(answer_acquire(session, request, version, row).map_err(|f| f.into_error("acquire")));
    }
    if let Some(e) = failed {
        let failure = Failure::Sql(e);
        if failure.ends_session() {
            return Err(failure);
        }
        let cleanup = "ROLLBACK; DO IF(@lh_took = 1, RELEASE_LOCK(@lh_lk), 0)";
        timed(limit, sqlx::raw_sql(cleanup).execute(&mut session.conn)).await?;
        let error = failure.into_error("acquire");
        while answers.len() < requests.len() {
            answers.push(Err(clone_error(&error)));
        }
    }
    if answers.len() < requests.len() {
        return Err(Failure::Other(Error::store(
            STORE,
            format!(
                "unexpected answer to acquire: {} rows for {} requests",
                rows.len(),
                requests.len()
            ),
        )));
    }
    Ok(answers)
}

/// What the last row of one [`acquire_batch`] says.
fn answer_acquire(
    session: &mut Session,
    request: &AcquireRequest,
    version: RecordVersion,
    row: &MySqlRow,
) -> Result<Acquired, Failure> {
    let lease = &request.lease;
    let flag = |index: usize| -> Result<i64, Failure> {
        row.try_get::<Option<i64>, _>(index)
            .map(Option::unwrap_or_default)
            .map_err(Failure::Sql)
    };
    let (got, granted, took, term) = (flag(0)?, flag(1)?, flag(2)?, flag(3)?);
    if granted == 1 {
        let term = Term(u64::try_from(term).unwrap_or_default());
        let held = Held {
            holder: request.candidate.clone(),
            term,
            ttl: request.ttl,
        };
        session.held.insert(lease.clone(), held);
        return Ok(Acquired::Granted(Grant {
            lease: lease.clone(),
            holder: request.candidate.clone(),
            term,
            ttl: request.ttl,
            token: version.into(),
        }));
    }
    let mut record = Record::decode(lease, row, 4).map_err(Failure::Other)?;
    if got == 1 && took == 0 {
        // The session holds the lock for another grant of this lease: not orphaned.
        record.lock_free = false;
    }
    Ok(Acquired::Held(record.observation(lease)))
}

/// Renews `grants` (each for another lease or term): one statement renews those whose locks the
/// session holds; a grant whose lock the session lost (a broken connection) takes it again if
/// the row still names it; one read then tells each grant what the store holds.
async fn renew(session: &mut Session, grants: &[Grant], limit: Duration) -> Result<Vec<Result<Renewed>>, Failure> {
    let versions: Vec<RecordVersion> = grants.iter().map(|_| RecordVersion::random()).collect();
    let mine: Vec<usize> = (0..grants.len()).filter(|&i| session.holds(&grants[i])).collect();
    if !mine.is_empty() {
        let cases = vec!["WHEN ? THEN ?"; mine.len()].join(" ");
        let keys = vec!["(?, ?, ?)"; mine.len()].join(", ");
        let sql = format!(
            "UPDATE leasehold_leases SET version = CASE name {cases} END, renewed_at = NOW(3)
             WHERE (name, holder, term) IN ({keys}) AND previous_end IS NULL
               AND IS_USED_LOCK({}) <=> CONNECTION_ID()",
            lock_of("name")
        );
        let mut statement = query(sql);
        for &i in &mine {
            statement = statement.bind(grants[i].lease.as_str()).bind(versions[i].as_str());
        }
        for &i in &mine {
            let g = &grants[i];
            statement = statement
                .bind(g.lease.as_str())
                .bind(g.holder.as_str())
                .bind(term_value(g.term));
        }
        timed(limit, statement.execute(&mut session.conn)).await?;
    }
    for (i, grant) in grants.iter().enumerate() {
        if session.held.contains_key(&grant.lease) {
            continue; // the session's lock is another grant's (or renewed above)
        }
        if lock(session, &grant.lease, limit).await? != Some(true) {
            continue;
        }
        let renewed = timed(
            limit,
            sqlx::query(
                "UPDATE leasehold_leases SET version = ?, renewed_at = NOW(3)
                 WHERE name = ? AND holder = ? AND term = ? AND previous_end IS NULL",
            )
            .bind(versions[i].as_str())
            .bind(grant.lease.as_str())
            .bind(grant.holder.as_str())
            .bind(term_value(grant.term))
            .execute(&mut session.conn),
        )
        .await?
        .rows_affected();
        if renewed == 1 {
            let held = Held {
                holder: grant.holder.clone(),
                term: grant.term,
                ttl: grant.ttl,
            };
            session.held.insert(grant.lease.clone(), held);
        } else {
            unlock(session, &grant.lease, limit).await?;
        }
    }
    let names = vec!["?"; grants.len()].join(", ");
    let sql = format!(
        "SELECT l.name, {} FROM leasehold_leases AS l WHERE l.name IN ({names})",
        record_columns("l.name")
    );
    let mut statement = query(sql);
    for grant in grants {
        statement = statement.bind(grant.lease.as_str());
    }
    let rows = timed(limit, statement.fetch_all(&mut session.conn)).await?;
    let mut found: HashMap<String, &MySqlRow> = HashMap::new();
    for row in &rows {
        let name: String = row.try_get(0).map_err(Failure::Sql)?;
        found.insert(name, row);
    }
    let mut answers = Vec::with_capacity(grants.len());
    for (i, grant) in grants.iter().enumerate() {
        let record = match found.get(grant.lease.as_str()) {
            Some(row) => Record::decode(&grant.lease, row, 1),
            None => Ok(Record {
                holder: None,
                term: grant.term,
                last_term: grant.term,
                previous_end: None,
                lock_free: true,
            }),
        };
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                answers.push(Err(e));
                continue;
            }
        };
        let names_grant = record.names(&grant.holder, grant.term) && record.previous_end.is_none();
        let version = record.holder.as_ref().map(|h| h.version.as_str());
        if names_grant && version == Some(versions[i].as_str()) && session.holds(grant) {
            answers.push(Ok(Renewed::Renewed(Grant {
                token: versions[i].to_string(),
                ..grant.clone()
            })));
        } else if names_grant {
            // The row still names the grant, but another session holds its lock (a contender's
            // instant check, or this store's previous session the server has not ended yet).
            answers.push(Err(Error::unreachable(
                STORE,
                format!(
                    "the named lock of {} is held by another session while its row still names this grant",
                    grant.lease
                ),
            )));
        } else {
            if session.holds(grant) {
                unlock(session, &grant.lease, limit).await?;
            }
            answers.push(Ok(Renewed::Lost(record.observation(&grant.lease))));
        }
    }
    Ok(answers)
}

/// Frees the lease if the row still names the grant (ending its term in the history in the same
/// statement), then gives back the lock if the session holds it for this grant. Releasing a
/// grant that is no longer held changes nothing.
async fn release(session: &mut Session, grant: &Grant, limit: Duration) -> Result<(), Failure> {
    timed(
        limit,
        sqlx::query(
            "UPDATE leasehold_leases AS l
             LEFT JOIN leasehold_history AS h ON h.name = l.name AND h.term = l.term AND h.ended_at IS NULL
             SET h.ended_at = ?, h.end_reason = 'released',
                 l.holder = NULL, l.ttl_ms = NULL, l.version = NULL, l.previous_end = 'released'
             WHERE l.name = ? AND l.holder = ? AND l.term = ? AND l.previous_end IS NULL",
        )
        .bind(unix_millis(std::time::SystemTime::now()))
        .bind(grant.lease.as_str())
        .bind(grant.holder.as_str())
        .bind(term_value(grant.term))
        .execute(&mut session.conn),
    )
    .await?;
    if session.holds(grant) {
        unlock(session, &grant.lease, limit).await?;
    }
    Ok(())
}
