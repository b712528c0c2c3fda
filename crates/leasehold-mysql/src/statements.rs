//! The statements of the lock session: each operation as one batch, or as few round trips as
//! it can, on the one connection whose session holds the named locks. What the session holds is
//! kept here too ([`Session`]); the task that serialises the operations is in `session.rs`.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Error, Grant, LeaseName, RecordVersion, Renewed, Result, Term,
};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Executor, MySqlConnection, Row};
use tokio::time::Instant;

use crate::error::{self, STORE};
use crate::record::{Record, lock_of, millis, record_columns, term_value, unix_millis};

/// A grant whose named lock the session holds.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) holder: CandidateId,
    pub(crate) term: Term,
    pub(crate) ttl: Duration,
    /// When the last successful acquire or renewal of this grant was served: its holder stops
    /// believing in it less than `ttl` after that.
    pub(crate) confirmed: Instant,
}

/// The live lock connection and what its session holds.
pub(crate) struct Session {
    pub(crate) conn: MySqlConnection,
    pub(crate) held: HashMap<LeaseName, Held>,
    /// The session's `wait_timeout` in seconds as last set (0: the server's default).
    pub(crate) wait_timeout: u64,
    /// When the last statement's answer arrived.
    pub(crate) last_used: Instant,
}

impl Session {
    pub(crate) fn new(conn: MySqlConnection) -> Session {
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
pub(crate) enum Failure {
    Sql(sqlx::Error),
    NoAnswer(Duration),
    /// Not the session's fault (a corrupt row, no connection): the session stays.
    Other(Error),
}

impl Failure {
    pub(crate) fn ends_session(&self) -> bool {
        match self {
            Failure::Sql(e) => error::ends_session(e),
            Failure::NoAnswer(_) => true,
            Failure::Other(_) => false,
        }
    }

    pub(crate) fn into_error(self, operation: &'static str) -> Error {
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

/// What a lock session sets as it connects: no statement waits long for a row another
/// transaction holds (an operator's open transaction): one second; and READ COMMITTED, so that
/// the acquires of different leases take no gap locks on each other (at the default REPEATABLE
/// READ, two acquires of rows not yet written in one gap of the index deadlocked, error 1213).
/// Each lease's writes are ordered by its named lock, not by the isolation level.
pub(crate) async fn configure_lock_session(conn: &mut MySqlConnection, limit: Duration) -> Result<(), Failure> {
    timed(limit, conn.execute("SET SESSION innodb_lock_wait_timeout = 1")).await?;
    timed(
        limit,
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
    )
    .await?;
    Ok(())
}

/// Runs one statement future with a client-side bound.
pub(crate) async fn timed<T>(
    limit: Duration,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, statement).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Failure::Sql(e)),
        Err(_) => Err(Failure::NoAnswer(limit)),
    }
}

pub(crate) fn query(sql: String) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql))
}

/// Takes the lease's named lock if the session does not hold it: `Some(true)` taken now,
/// `Some(false)` already the session's, `None` another session holds it.
pub(crate) async fn lock(session: &mut Session, lease: &LeaseName, limit: Duration) -> Result<Option<bool>, Failure> {
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

pub(crate) async fn unlock(session: &mut Session, lease: &LeaseName, limit: Duration) -> Result<(), Failure> {
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
pub(crate) async fn acquire_many(
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
            confirmed: Instant::now(),
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
pub(crate) async fn renew(
    session: &mut Session,
    grants: &[Grant],
    limit: Duration,
) -> Result<Vec<Result<Renewed>>, Failure> {
    let versions: Vec<RecordVersion> = grants.iter().map(|_| RecordVersion::random()).collect();
    // Rare: a grant whose lock this session does not hold (a new session) takes it again if its
    // row still names it, writing the version the renewal below writes again.
    for (i, grant) in grants.iter().enumerate() {
        if session.held.contains_key(&grant.lease) {
            continue; // the session's lock is this grant's (renewed below) or another grant's
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
                confirmed: Instant::now(),
            };
            session.held.insert(grant.lease.clone(), held);
        } else {
            unlock(session, &grant.lease, limit).await?;
        }
    }
    // One packet: the renewal of every grant whose lock the session holds, then the read that
    // answers each grant. Values are hex literals (see `text_literal`).
    let mine: Vec<usize> = (0..grants.len()).filter(|&i| session.holds(&grants[i])).collect();
    let mut sql = String::new();
    if !mine.is_empty() {
        let cases: String = mine
            .iter()
            .map(|&i| {
                format!(
                    " WHEN {} THEN '{}'",
                    text_literal(grants[i].lease.as_str()),
                    versions[i]
                )
            })
            .collect();
        let keys: Vec<String> = mine
            .iter()
            .map(|&i| {
                let g = &grants[i];
                format!(
                    "({}, {}, {})",
                    text_literal(g.lease.as_str()),
                    text_literal(g.holder.as_str()),
                    term_value(g.term)
                )
            })
            .collect();
        let names: Vec<String> = mine.iter().map(|&i| text_literal(grants[i].lease.as_str())).collect();
        // `name IN (...)` as well: MariaDB does not use the key for a one-row `(a, b, c) IN`.
        sql.push_str(&format!(
            "UPDATE leasehold_leases SET version = CASE name{cases} END, renewed_at = NOW(3)
             WHERE name IN ({}) AND (name, holder, term) IN ({}) AND previous_end IS NULL
               AND IS_USED_LOCK({}) <=> CONNECTION_ID();\n",
            names.join(", "),
            keys.join(", "),
            lock_of("name")
        ));
    }
    let names: Vec<String> = grants.iter().map(|g| text_literal(g.lease.as_str())).collect();
    sql.push_str(&format!(
        "SELECT l.name, {} FROM leasehold_leases AS l WHERE l.name IN ({})",
        record_columns("l.name"),
        names.join(", ")
    ));
    let rows = timed(limit, sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(&mut session.conn)).await?;
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
            if let Some(held) = session.held.get_mut(&grant.lease) {
                held.confirmed = Instant::now();
            }
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
pub(crate) async fn release(session: &mut Session, grant: &Grant, limit: Duration) -> Result<(), Failure> {
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

/// One failure answers every renewal of a batch: each gets an error of the same kind.
pub(crate) fn clone_error(error: &Error) -> Error {
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
