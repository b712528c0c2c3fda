//! Writes: every acquire, renew, release, hand over, break and shard record write runs inside a
//! `BEGIN IMMEDIATE` transaction, and the requests that queue up while one transaction commits
//! share the next one (a renewal of many grants counts as one request per grant).
//!
//! `BEGIN IMMEDIATE` takes SQLite's write lock at once, so writers in all processes take turns
//! and the row a request reads is the row it replaces: that is the compare-and-set. Sharing a
//! transaction (group commit) costs one disk sync for many requests, which is what lets one
//! process hold thousands of leases with `synchronous=full`. Requests in one transaction run one
//! after the other and see each other's writes, exactly as if each had its own.

use std::time::SystemTime;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Grant, LeaseName, RecordVersion, Renewed, Result,
    ShardWrite, Term,
};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqlitePool;
use tokio::sync::{mpsc, oneshot};

use crate::changes::Signal;
use crate::config::SqliteConfig;
use crate::error::{self, STORE};
use crate::record::{self, Failure, Record, term_value, ttl_value, unix_millis};
use crate::shards;

/// At most this many requests (or grants of a renewal of many) share a transaction, so that
/// other processes' writes are not held up for long.
const MAX_BATCH: usize = 256;

/// A write request.
#[derive(Debug)]
pub(crate) enum Op {
    Acquire(AcquireRequest),
    Renew(Grant),
    /// Every grant renewed as [`Op::Renew`] would, in transactions of at most [`MAX_BATCH`]
    /// grants (one for a group's renewal round of up to 256 shards).
    RenewMany(Vec<Grant>),
    Release(Grant),
    HandOver(Grant, CandidateId),
    Break(LeaseName),
    /// A shard record's conditional write: name, expected version, value.
    WriteShard(LeaseName, Option<String>, String),
}

/// The answer to an [`Op`] of the same kind.
#[derive(Debug)]
pub(crate) enum Outcome {
    Acquired(Acquired),
    Renewed(Renewed),
    /// The answers of [`Op::RenewMany`], in order.
    RenewedEach(Vec<Result<Renewed>>),
    Released,
    HandedOver,
    Broken(Option<Term>),
    ShardWritten(ShardWrite),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Acquire(_) => "acquire",
            Op::Renew(_) => "renew",
            Op::RenewMany(_) => "renew_many",
            Op::Release(_) => "release",
            Op::HandOver(..) => "hand_over",
            Op::Break(_) => "break_lease",
            Op::WriteShard(..) => "write_shard",
        }
    }
}

#[derive(Debug)]
struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Outcome>>,
}

/// The handle of the writer task; the task ends when every handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    /// After each transaction that granted, renewed, released, handed over or broke a lease, it
    /// sends `signal` (once per transaction).
    pub(crate) fn spawn(pool: SqlitePool, config: SqliteConfig, signal: Signal) -> Writer {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, config, signal, queue));
        Writer { jobs }
    }

    /// Queues `op` and waits for its transaction to commit.
    ///
    /// Cancel safe in the way the engine needs: a request dropped before its transaction starts
    /// is skipped; one dropped later may or may not be applied, like any request whose reply
    /// is lost.
    pub(crate) async fn write(&self, op: Op) -> Result<Outcome> {
        let (reply, answer) = oneshot::channel();
        let stopped = || {
            Error::unreachable(
                STORE,
                "the SQLite writer task has stopped (its tokio runtime shut down)",
            )
        };
        self.jobs.send(Job { op, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(pool: SqlitePool, config: SqliteConfig, signal: Signal, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // A caller that gave up before its transaction started is not applied at all.
        batch.retain(|job: &Job| !job.reply.is_closed());
        let steps: Vec<Step<'_>> = batch.iter().flat_map(|job| Step::of(&job.op)).collect();
        let mut done = Vec::with_capacity(steps.len());
        for steps in steps.chunks(MAX_BATCH) {
            match transaction(&pool, &config, steps).await {
                Ok((answers, changed)) => {
                    // Committed and visible: tell the watchers (one file write per transaction,
                    // however many leases it renewed or handed on).
                    if changed {
                        signal.send();
                    }
                    done.extend(answers.into_iter().map(Done::Answered));
                }
                // Nothing of this transaction was committed: each of its steps gets the error.
                Err(e) => done.extend(
                    steps
                        .iter()
                        .map(|step| Done::Abandoned(error::map(&e, step.name(), config.busy_timeout))),
                ),
            }
        }
        let mut done = done.into_iter();
        for job in batch.drain(..) {
            let answer = match &job.op {
                Op::RenewMany(grants) => renewed_each(done.by_ref().take(grants.len()).collect()),
                _ => done.next().map_or_else(|| Err(lost_step()), Done::into_result),
            };
            let _ = job.reply.send(answer);
        }
    }
}

/// One request of a transaction: a whole [`Op`], or one grant of an [`Op::RenewMany`].
#[derive(Clone, Copy, Debug)]
enum Step<'a> {
    Whole(&'a Op),
    RenewOne(&'a Grant),
}

impl<'a> Step<'a> {
    fn of(op: &'a Op) -> Vec<Step<'a>> {
        match op {
            Op::RenewMany(grants) => grants.iter().map(Step::RenewOne).collect(),
            op => vec![Step::Whole(op)],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Step::Whole(op) => op.name(),
            Step::RenewOne(_) => "renew_many",
        }
    }
}

/// What became of a step: its answer, or the error of its whole transaction.
#[derive(Debug)]
enum Done {
    Answered(Result<Outcome>),
    Abandoned(Error),
}

impl Done {
    fn into_result(self) -> Result<Outcome> {
        match self {
            Done::Answered(answer) => answer,
            Done::Abandoned(e) => Err(e),
        }
    }
}

fn lost_step() -> Error {
    Error::store(STORE, "internal error: a request got no answer from its transaction")
}

/// The answer to an [`Op::RenewMany`] from its grants' steps: the error of the first transaction
/// when every one of them was abandoned (no grant's outcome is known), else one answer per grant.
fn renewed_each(done: Vec<Done>) -> Result<Outcome> {
    if !done.is_empty() && done.iter().all(|d| matches!(d, Done::Abandoned(_))) {
        return done
            .into_iter()
            .next()
            .map_or_else(|| Err(lost_step()), Done::into_result);
    }
    let answers = done
        .into_iter()
        .map(|d| match d.into_result()? {
            Outcome::Renewed(renewed) => Ok(renewed),
            other => Err(Error::store(
                STORE,
                format!("internal error: unexpected answer {other:?}"),
            )),
        })
        .collect();
    Ok(Outcome::RenewedEach(answers))
}

/// Runs `steps` in one transaction, answering each, and whether a lease changed (was granted,
/// renewed, released, handed over or broken: anything watchers announce or wake on). A step whose record is corrupt gets its own error
/// (it wrote nothing); an SQL error abandons the whole transaction.
async fn transaction(
    pool: &SqlitePool,
    config: &SqliteConfig,
    steps: &[Step<'_>],
) -> Result<(Vec<Result<Outcome>>, bool), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut answers = Vec::with_capacity(steps.len());
    let mut changed_hands = false;
    for step in steps {
        let answer = match *step {
            Step::Whole(Op::Acquire(request)) => acquire(&mut tx, config, request).await.map(Outcome::Acquired),
            Step::Whole(Op::Renew(grant)) | Step::RenewOne(grant) => renew(&mut tx, grant).await.map(Outcome::Renewed),
            Step::Whole(Op::Release(grant)) => release(&mut tx, grant).await.map(|ended| {
                changed_hands |= ended;
                Outcome::Released
            }),
            Step::Whole(Op::HandOver(grant, to)) => hand_over(&mut tx, grant, to).await.map(|ended| {
                changed_hands |= ended;
                Outcome::HandedOver
            }),
            Step::Whole(Op::Break(lease)) => break_lease(&mut tx, lease).await.map(Outcome::Broken),
            Step::Whole(Op::WriteShard(name, expected, value)) => {
                shards::write(&mut tx, name, expected.as_deref(), value)
                    .await
                    .map(Outcome::ShardWritten)
            }
            // `Step::of` splits a renewal of many into its grants.
            Step::Whole(Op::RenewMany(_)) => Err(Failure::Record(lost_step())),
        };
        changed_hands |= matches!(
            answer,
            Ok(Outcome::Acquired(Acquired::Granted(_))
                | Outcome::Renewed(Renewed::Renewed(_))
                | Outcome::Broken(Some(_)))
        );
        answers.push(match answer {
            Ok(outcome) => Ok(outcome),
            Err(Failure::Record(e)) => Err(e),
            Err(Failure::Sql(e)) => return Err(e),
        });
    }
    tx.commit().await?;
    Ok((answers, changed_hands))
}

async fn acquire(
    conn: &mut SqliteConnection,
    config: &SqliteConfig,
    request: &AcquireRequest,
) -> Result<Acquired, Failure> {
    let lease = &request.lease;
    let record = record::read(conn, lease).await?;
    let term = next_term(lease, &record)?;
    match &record.holder {
        None => {}
        // The successor taking its reservation, or a reservation nobody took for its whole TTL:
        // the handed-over term already ended in the history; the grant below replaces the row.
        Some(h) if h.reserved && (h.id == request.candidate || request.takeover.as_ref() == Some(&h.version)) => {}
        // The candidate itself: its earlier leadership has ended, since it campaigns again. Or
        // the caller saw this very version unchanged for the holder's whole TTL.
        Some(h) if h.id == request.candidate || request.takeover.as_ref() == Some(&h.version) => {
            end(conn, lease, record.term, EndReason::Expired).await?;
        }
        Some(_) => return Ok(Acquired::Held(record.observation(lease))),
    }
    let version = String::from(RecordVersion::random());
    sqlx::query(
        "INSERT INTO leasehold_leases (name, holder, term, ttl_ms, version, previous_end)
         VALUES (?1, ?2, ?3, ?4, ?5, NULL)
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, term = excluded.term,
             ttl_ms = excluded.ttl_ms, version = excluded.version, previous_end = NULL",
    )
    .bind(lease.as_str())
    .bind(request.candidate.as_str())
    .bind(term_value(term))
    .bind(ttl_value(request.ttl))
    .bind(&version)
    .execute(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO leasehold_terms (name, term, holder, acquired_at) VALUES (?1, ?2, ?3, ?4)")
        .bind(lease.as_str())
        .bind(term_value(term))
        .bind(request.candidate.as_str())
        .bind(unix_millis(SystemTime::now()))
        .execute(&mut *conn)
        .await?;
    let keep = u64::from(config.history_limit);
    if keep > 0 && term.0 > keep {
        sqlx::query("DELETE FROM leasehold_terms WHERE name = ?1 AND term <= ?2")
            .bind(lease.as_str())
            .bind(term_value(Term(term.0 - keep)))
            .execute(&mut *conn)
            .await?;
    }
    let (holder, ttl) = (request.candidate.clone(), request.ttl);
    Ok(Acquired::Granted(Grant {
        lease: lease.clone(),
        holder,
        term,
        ttl,
        token: version,
    }))
}

/// The term of the next grant, checked before anything is written.
fn next_term(lease: &LeaseName, record: &Record) -> Result<Term, Failure> {
    let next = record.last_term.0.checked_add(1).filter(|t| i64::try_from(*t).is_ok());
    let grow = || {
        Error::corrupt(
            STORE,
            lease,
            format!("term {} cannot grow any further", record.last_term),
        )
    };
    Ok(next.map(Term).ok_or_else(grow)?)
}

async fn renew(conn: &mut SqliteConnection, grant: &Grant) -> Result<Renewed, Failure> {
    let lease = &grant.lease;
    let record = record::read(conn, lease).await?;
    match &record.holder {
        Some(h) if record.records(grant) => {
            let version = String::from(RecordVersion::random());
            sqlx::query("UPDATE leasehold_leases SET version = ?2 WHERE name = ?1")
                .bind(lease.as_str())
                .bind(&version)
                .execute(&mut *conn)
                .await?;
            Ok(Renewed::Renewed(Grant {
                ttl: h.ttl,
                token: version,
                ..grant.clone()
            }))
        }
        _ => Ok(Renewed::Lost(record.observation(lease))),
    }
}

/// Ends the grant's term if the row still records it; whether it did.
async fn release(conn: &mut SqliteConnection, grant: &Grant) -> Result<bool, Failure> {
    let record = record::read(conn, &grant.lease).await?;
    if !record.records(grant) {
        return Ok(false);
    }
    end(conn, &grant.lease, record.term, EndReason::Released).await?;
    Ok(true)
}

/// Ends the grant's term as handed over and leaves the row naming `to` as a reservation: the
/// same term, `previous_end` `handed_over`, a new version (so contenders watch a full TTL from
/// now before taking it over) and the grant's TTL. Whether the row still recorded the grant.
async fn hand_over(conn: &mut SqliteConnection, grant: &Grant, to: &CandidateId) -> Result<bool, Failure> {
    let lease = &grant.lease;
    let record = record::read(conn, lease).await?;
    if !record.records(grant) {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE leasehold_leases SET holder = ?2, ttl_ms = ?3, version = ?4, previous_end = ?5 WHERE name = ?1",
    )
    .bind(lease.as_str())
    .bind(to.as_str())
    .bind(ttl_value(grant.ttl))
    .bind(String::from(RecordVersion::random()))
    .bind(EndReason::HandedOver.to_string())
    .execute(&mut *conn)
    .await?;
    end_term(conn, lease, record.term, EndReason::HandedOver).await?;
    Ok(true)
}

async fn break_lease(conn: &mut SqliteConnection, lease: &LeaseName) -> Result<Option<Term>, Failure> {
    let record = record::read(conn, lease).await?;
    if record.holder.is_none() {
        return Ok(None);
    }
    if record.reserved() {
        // The term already ended, handed over: free the row, keep the history.
        free(conn, lease, EndReason::Broken).await?;
    } else {
        end(conn, lease, record.term, EndReason::Broken).await?;
    }
    Ok(Some(record.term))
}

/// Ends the current term in the history and frees the lease; the row and its term stay, so the
/// term never goes back.
async fn end(conn: &mut SqliteConnection, lease: &LeaseName, term: Term, reason: EndReason) -> Result<(), sqlx::Error> {
    free(conn, lease, reason).await?;
    end_term(conn, lease, term, reason).await
}

/// Frees the lease's row, saying how its last term ended.
async fn free(conn: &mut SqliteConnection, lease: &LeaseName, reason: EndReason) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE leasehold_leases SET holder = NULL, ttl_ms = NULL, version = NULL, previous_end = ?2
         WHERE name = ?1",
    )
    .bind(lease.as_str())
    .bind(reason.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Records in the history that `term` ended for `reason`.
async fn end_term(
    conn: &mut SqliteConnection,
    lease: &LeaseName,
    term: Term,
    reason: EndReason,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE leasehold_terms SET ended_at = ?3, end_reason = ?4 WHERE name = ?1 AND term = ?2")
        .bind(lease.as_str())
        .bind(term_value(term))
        .bind(unix_millis(SystemTime::now()))
        .bind(reason.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}
