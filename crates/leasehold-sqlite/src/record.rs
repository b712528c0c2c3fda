//! Reading rows: every value is checked, and garbage becomes [`Error::CorruptRecord`] naming the
//! lease and the field (the holder fields by [`HolderInfo::from_record`], as on every backend).

use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use leasehold_core::{
    EndReason, Error, Grant, HolderFields, HolderInfo, LeaseName, Observation, Result, Term, Transition,
    TransitionFields, time,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, TypeInfo, ValueRef};

use crate::error::STORE;

/// The TTLs this store accepts.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(24 * 3600);

/// A lease row, validated.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) holder: Option<HolderInfo>,
    /// The row's term: the holder's, or the last one granted.
    pub(crate) term: Term,
    /// The highest term in the row or the history: the next grant is above it.
    pub(crate) last_term: Term,
    pub(crate) previous_end: Option<EndReason>,
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
    Ok(Record::decode(lease, &row, 0)?)
}

/// Reads and validates the rows of every lease whose name starts with `prefix`, in name order.
/// One statement, so one snapshot; leases without a row are not listed.
pub(crate) async fn list(conn: &mut SqliteConnection, prefix: &str) -> Result<Vec<(LeaseName, Record)>, Failure> {
    let rows = sqlx::query(
        "SELECT l.name, l.holder, l.term, l.ttl_ms, l.version, l.previous_end,
                (SELECT MAX(t.term) FROM leasehold_terms AS t WHERE t.name = l.name),
                1
         FROM leasehold_leases AS l
         WHERE l.name GLOB ?1",
    )
    .bind(glob_prefix(prefix))
    .fetch_all(conn)
    .await?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        let name = text(row, 0, "name")
            .map_err(|e| Error::corrupt(STORE, "(a row's name)", e))?
            .unwrap_or_default();
        let lease = LeaseName::new(name.as_str())
            .map_err(|e| Error::corrupt(STORE, &name, format!("the row's name is not a lease name: {e}")))?;
        let record = Record::decode(&lease, row, 1)?;
        leases.push((lease, record));
    }
    leases.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(leases)
}

/// `prefix` as a GLOB pattern (case-sensitive, unlike SQLite's `LIKE`): its `*`, `?` and `[`
/// each in a bracket of its own, then `*`.
fn glob_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        match c {
            '*' | '?' | '[' => {
                pattern.push('[');
                pattern.push(c);
                pattern.push(']');
            }
            c => pattern.push(c),
        }
    }
    pattern.push('*');
    pattern
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
    /// Decodes `(holder, term, ttl_ms, version, previous_end, max history term, row present)`,
    /// starting at column `at`.
    pub(crate) fn decode(lease: &LeaseName, row: &SqliteRow, at: usize) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let history_term = match integer(row, at + 5, "leasehold_terms.term").map_err(corrupt)? {
            None => Term(0),
            Some(t) => term_from(t).ok_or_else(|| corrupt(format!("leasehold_terms.term {t} is negative")))?,
        };
        if integer(row, at + 6, "name").map_err(corrupt)? != Some(1) {
            return Ok(Record {
                holder: None,
                term: history_term,
                last_term: history_term,
                previous_end: None,
            });
        }
        let term = integer(row, at + 1, "term")
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("term is NULL".into()))?;
        let previous_end = match text(row, at + 4, "previous_end").map_err(corrupt)? {
            None => None,
            Some(reason) => Some(
                reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("previous_end: {e}")))?,
            ),
        };
        let holder = match (
            text(row, at, "holder"),
            integer(row, at + 2, "ttl_ms"),
            text(row, at + 3, "version"),
        ) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(corrupt(e)),
            (Ok(None), Ok(None), Ok(None)) => None,
            (Ok(Some(id)), Ok(Some(ttl_ms)), Ok(Some(version))) => {
                let fields = HolderFields {
                    id: &id,
                    term: term.into(),
                    ttl_ms: ttl_ms.into(),
                    version: &version,
                    store_remaining: None,
                };
                let mut holder = HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?;
                // A row that names a holder and says its term was handed over is a reservation:
                // `term` ended, handed to `holder`, who has not taken it yet.
                holder.reserved = previous_end == Some(EndReason::HandedOver);
                Some(holder)
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
        let term = term_from(term).ok_or_else(|| corrupt(format!("term {term} is negative")))?;
        Ok(Record {
            holder,
            term,
            last_term: term.max(history_term),
            previous_end,
        })
    }

    /// Whether the row is a reservation for a named successor (see
    /// [`HolderInfo::reserved`]).
    pub(crate) fn reserved(&self) -> bool {
        self.holder.as_ref().is_some_and(|h| h.reserved)
    }

    /// Whether the row still records `grant`: its holder at its term, not handed over.
    pub(crate) fn records(&self, grant: &Grant) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.id == grant.holder && self.term == grant.term && !h.reserved)
    }

    /// What a candidate is told about the lease.
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: self.holder.clone(),
            last_term: self.last_term,
            previous_end: if self.holder.is_none() { self.previous_end } else { None },
        }
    }
}

/// Decodes `(term, holder, acquired_at, ended_at, end_reason)` of `leasehold_terms`.
pub(crate) fn decode_transition(lease: &LeaseName, row: &SqliteRow) -> Result<Transition> {
    let corrupt = |detail: String| Error::corrupt(STORE, lease, format!("history: {detail}"));
    let fields = TransitionFields {
        term: integer(row, 0, "term").map_err(corrupt)?,
        holder: text(row, 1, "holder").map_err(corrupt)?,
        acquired_at_ms: integer(row, 2, "acquired_at").map_err(corrupt)?,
        ended_at_ms: integer(row, 3, "ended_at").map_err(corrupt)?,
        end_reason: text(row, 4, "end_reason").map_err(corrupt)?,
    };
    Transition::from_record(STORE, lease, fields)
}

/// An INTEGER column, or a description of what is there instead.
fn integer(row: &SqliteRow, index: usize, field: &str) -> Result<Option<i64>, String> {
    row.try_get::<Option<i64>, _>(index)
        .map_err(|_| format!("{field} is {}, expected an integer", found(row, index)))
}

/// A TEXT column, or a description of what is there instead.
pub(crate) fn text(row: &SqliteRow, index: usize, field: &str) -> Result<Option<String>, String> {
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
