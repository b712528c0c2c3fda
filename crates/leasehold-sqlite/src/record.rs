//! Reading rows: every value is checked, and garbage becomes [`Error::CorruptRecord`] naming the
//! lease and the field.

use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use leasehold_core::{
    CandidateId, EndReason, Error, HolderInfo, LeaseName, Observation, RecordVersion, Result, Term, Transition, time,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, TypeInfo, ValueRef};

use crate::error::STORE;

/// The TTLs this store accepts.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(24 * 3600);

/// A lease row, validated.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) holder: Option<Holding>,
    /// The row's term: the holder's, or the last one granted.
    pub(crate) term: Term,
    /// The highest term in the row or the history: the next grant is above it.
    pub(crate) last_term: Term,
    pub(crate) previous_end: Option<EndReason>,
}

/// The holder of a lease, as its row records it.
#[derive(Debug)]
pub(crate) struct Holding {
    pub(crate) id: CandidateId,
    pub(crate) ttl: Duration,
    pub(crate) version: String,
}

/// Reads and validates the row of `lease`. A lease without a row is free, at the highest term its
/// history records (so that a deleted row does not send the term back).
pub(crate) async fn read(conn: &mut SqliteConnection, lease: &LeaseName) -> Result<Record, Failure> {
    // One statement: the row and the highest recorded term come from one snapshot.
    let row = sqlx::query(
        "SELECT l.holder, l.term, l.ttl_ms, l.version, l.previous_end,
                (SELECT MAX(t.term) FROM leasehold_terms AS t WHERE t.name = ?1),
                l.name IS NOT NULL
         FROM (SELECT ?1 AS name) AS wanted
         LEFT JOIN leasehold_leases AS l ON l.name = wanted.name",
    )
    .bind(lease.as_str())
    .fetch_one(conn)
    .await?;
    Ok(Record::decode(lease, &row)?)
}

/// Why an operation failed: its own record (nothing was written; other requests in the same
/// transaction go on), or SQL itself (the whole transaction is abandoned).
#[derive(Debug)]
pub(crate) enum Failure {
    Record(Error),
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for Failure {
    fn from(error: sqlx::Error) -> Self {
        Failure::Sql(error)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Record(error)
    }
}

impl Record {
    /// Decodes `(holder, term, ttl_ms, version, previous_end, max history term, row present)`.
    fn decode(lease: &LeaseName, row: &SqliteRow) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let history_term = match integer(row, 5, "leasehold_terms.term").map_err(corrupt)? {
            None => Term(0),
            Some(t) => term_from(t).ok_or_else(|| corrupt(format!("leasehold_terms.term {t} is negative")))?,
        };
        if integer(row, 6, "name").map_err(corrupt)? != Some(1) {
            return Ok(Record {
                holder: None,
                term: history_term,
                last_term: history_term,
                previous_end: None,
            });
        }
        let term = integer(row, 1, "term")
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("term is NULL".into()))?;
        let term = term_from(term).ok_or_else(|| corrupt(format!("term {term} is negative")))?;
        let previous_end = match text(row, 4, "previous_end").map_err(corrupt)? {
            None => None,
            Some(reason) => Some(
                reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("previous_end: {e}")))?,
            ),
        };
        let holder = match (
            text(row, 0, "holder"),
            integer(row, 2, "ttl_ms"),
            text(row, 3, "version"),
        ) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(corrupt(e)),
            (Ok(None), Ok(None), Ok(None)) => None,
            (Ok(Some(id)), Ok(Some(ttl_ms)), Ok(Some(version))) => {
                let id = CandidateId::new(id).map_err(|e| corrupt(format!("holder: {e}")))?;
                if term == Term(0) {
                    return Err(corrupt("term 0 has a holder; terms start at 1".into()));
                }
                let ttl = u64::try_from(ttl_ms)
                    .ok()
                    .map(Duration::from_millis)
                    .filter(|ttl| TTL_RANGE.contains(ttl))
                    .ok_or_else(|| corrupt(format!("ttl_ms {ttl_ms} is outside {TTL_RANGE:?}")))?;
                if RecordVersion::parse(&version).is_none() {
                    return Err(corrupt(format!("version {version:?} is not 16 hex digits")));
                }
                Some(Holding { id, ttl, version })
            }
            (Ok(holder), Ok(ttl_ms), Ok(version)) => {
                let set = |is_set: bool| if is_set { "set" } else { "NULL" };
                return Err(corrupt(format!(
                    "holder, ttl_ms and version must be all set or all NULL, found holder {}, ttl_ms {}, version {}",
                    set(holder.is_some()),
                    set(ttl_ms.is_some()),
                    set(version.is_some()),
                )));
            }
        };
        Ok(Record {
            holder,
            term,
            last_term: term.max(history_term),
            previous_end,
        })
    }

    /// What a candidate is told about the lease.
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: self.holder.as_ref().map(|h| HolderInfo {
                id: h.id.clone(),
                term: self.term,
                ttl: h.ttl,
                version: h.version.clone(),
                orphaned: false,
                store_remaining: None,
            }),
            last_term: self.last_term,
            previous_end: if self.holder.is_none() { self.previous_end } else { None },
        }
    }
}

/// Decodes `(term, holder, acquired_at, ended_at, end_reason)` of `leasehold_terms`.
pub(crate) fn decode_transition(lease: &LeaseName, row: &SqliteRow) -> Result<Transition> {
    let corrupt = |detail: String| Error::corrupt(STORE, lease, format!("history: {detail}"));
    let required = |index, field| integer(row, index, field)?.ok_or_else(|| format!("{field} is NULL"));
    let term = required(0, "term").map_err(corrupt)?;
    let term = term_from(term)
        .filter(|t| t.0 > 0)
        .ok_or_else(|| corrupt(format!("term {term} is not a term")))?;
    let holder = text(row, 1, "holder")
        .map_err(corrupt)?
        .ok_or_else(|| corrupt(format!("term {term}: holder is NULL")))?;
    let holder = CandidateId::new(holder).map_err(|e| corrupt(format!("term {term}: holder: {e}")))?;
    let acquired_at = system_time(required(2, "acquired_at").map_err(corrupt)?)
        .ok_or_else(|| corrupt(format!("term {term}: acquired_at is negative")))?;
    let ended_at = integer(row, 3, "ended_at").map_err(corrupt)?;
    let end_reason = text(row, 4, "end_reason").map_err(corrupt)?;
    let ended = match (ended_at, end_reason) {
        (None, None) => None,
        (Some(at), Some(reason)) => {
            let at = system_time(at).ok_or_else(|| corrupt(format!("term {term}: ended_at is negative")))?;
            let reason = reason
                .parse::<EndReason>()
                .map_err(|e| corrupt(format!("term {term}: end_reason: {e}")))?;
            Some((at, reason))
        }
        _ => {
            return Err(corrupt(format!(
                "term {term}: ended_at and end_reason must be both set or both NULL"
            )));
        }
    };
    Ok(Transition {
        term,
        holder,
        acquired_at,
        ended,
    })
}

/// An INTEGER column, or a description of what is there instead.
fn integer(row: &SqliteRow, index: usize, field: &str) -> Result<Option<i64>, String> {
    row.try_get::<Option<i64>, _>(index)
        .map_err(|_| format!("{field} is {}, expected an integer", found(row, index)))
}

/// A TEXT column, or a description of what is there instead.
fn text(row: &SqliteRow, index: usize, field: &str) -> Result<Option<String>, String> {
    row.try_get::<Option<String>, _>(index)
        .map_err(|_| format!("{field} is {}, expected text", found(row, index)))
}

/// Describes a value that failed to decode, e.g. `the text "garbage"` or `a REAL value`.
fn found(row: &SqliteRow, index: usize) -> String {
    let Ok(raw) = row.try_get_raw(index) else {
        return "unreadable".into();
    };
    let kind = raw.type_info().name().to_string();
    if kind == "TEXT"
        && let Ok(text) = row.try_get::<String, _>(index)
    {
        let shown: String = text.chars().take(40).collect();
        return format!("the text {shown:?}");
    }
    format!("a {kind} value")
}

fn term_from(value: i64) -> Option<Term> {
    u64::try_from(value).ok().map(Term)
}

/// A term as SQLite stores it. Terms come from the row (an `i64`) plus one, checked on grant.
pub(crate) fn term_value(term: Term) -> i64 {
    i64::try_from(term.0).unwrap_or(i64::MAX)
}

/// A TTL in milliseconds, within [`TTL_RANGE`] (checked on acquire).
pub(crate) fn ttl_value(ttl: Duration) -> i64 {
    i64::try_from(time::duration_millis(ttl)).unwrap_or(i64::MAX)
}

/// Unix milliseconds by this process's wall clock, for the audit trail only.
pub(crate) fn unix_millis(at: SystemTime) -> i64 {
    i64::try_from(time::unix_millis(at)).unwrap_or(i64::MAX)
}

/// An `INTEGER` of Unix milliseconds; `None` if negative.
fn system_time(millis: i64) -> Option<SystemTime> {
    u64::try_from(millis).ok().map(time::from_unix_millis)
}
