//! Reading rows: every value is checked, and garbage becomes [`Error::CorruptRecord`] naming the
//! lease and the field (the holder fields by [`HolderInfo::from_record`], as on every backend).
//! Also the statements' shared pieces: the named lock of a lease and the record columns.

use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use leasehold_core::{
    CandidateId, EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, Result, Term, Transition,
    TransitionFields, time,
};
use sqlx::mysql::MySqlRow;
use sqlx::{Row, TypeInfo, ValueRef};

use crate::error::STORE;

/// The TTLs this store accepts: the server ends a silent lock session after `wait_timeout`, in
/// whole seconds (at least 1), so a TTL below a second cannot be enforced by the session; an hour
/// is already long for a lease nobody else may take after a silent holder.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// The named lock of the lease whose name is the SQL expression `name`: `leasehold/` and 40 hex
/// digits of the SHA-256 of `<database>/<lease>` (50 characters: MySQL allows 64; lock names are
/// server-wide, so the database is part of it).
pub(crate) fn lock_of(name: &str) -> String {
    format!("CONCAT('leasehold/', LEFT(SHA2(CONCAT(DATABASE(), '/', {name}), 256), 40))")
}

/// The columns every statement that reads a lease returns, over `l` (the row, maybe absent) and
/// `{name}` (the lease name expression): present, holder, term, ttl_ms, version, previous_end,
/// the highest history term, whether the lease's named lock is free.
pub(crate) fn record_columns(name: &str) -> String {
    format!(
        "l.name IS NOT NULL, l.holder, l.term, l.ttl_ms, l.version, l.previous_end,
         (SELECT MAX(h.term) FROM leasehold_history AS h WHERE h.name = {name}),
         IS_USED_LOCK({}) IS NULL",
        lock_of(name)
    )
}

/// A lease row, validated.
#[derive(Debug)]
pub(crate) struct Record {
    /// The holder the row names (never orphaned: that depends on the lock).
    pub(crate) holder: Option<HolderInfo>,
    /// The row's term: the holder's, or the last one granted.
    pub(crate) term: Term,
    /// The highest term in the row or the history: the next grant is above it.
    pub(crate) last_term: Term,
    pub(crate) previous_end: Option<EndReason>,
    /// Whether the lease's named lock was free when the row was read.
    pub(crate) lock_free: bool,
}

impl Record {
    /// Decodes the [`record_columns`] of `row` starting at column `at`.
    pub(crate) fn decode(lease: &LeaseName, row: &MySqlRow, at: usize) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let lock_free = get::<i64>(row, at + 7, "lock").map_err(corrupt)? == Some(1);
        let history_term = match get::<i64>(row, at + 6, "history.term").map_err(corrupt)? {
            None => Term(0),
            Some(t) => term_from(t).ok_or_else(|| corrupt(format!("history.term {t} is negative")))?,
        };
        if get::<i64>(row, at, "name").map_err(corrupt)? != Some(1) {
            return Ok(Record {
                holder: None,
                term: history_term,
                last_term: history_term,
                previous_end: None,
                lock_free,
            });
        }
        let term = get::<i64>(row, at + 2, "term")
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("term is NULL".into()))?;
        let previous_end = match get::<String>(row, at + 5, "previous_end").map_err(corrupt)? {
            None => None,
            Some(reason) => Some(
                reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("previous_end: {e}")))?,
            ),
        };
        let holder = match (
            get::<String>(row, at + 1, "holder"),
            get::<i64>(row, at + 3, "ttl_ms"),
            get::<String>(row, at + 4, "version"),
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
                Some(HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?)
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
        if previous_end.is_some() && holder.is_some() {
            // leasehold-postgres writes reservations this way; this store never does.
            return Err(corrupt("a row naming a holder must not say how a term ended".into()));
        }
        let term = term_from(term).ok_or_else(|| corrupt(format!("term {term} is negative")))?;
        Ok(Record {
            holder,
            term,
            last_term: term.max(history_term),
            previous_end,
            lock_free,
        })
    }

    /// Whether the row records `holder` at `term` (a live grant).
    pub(crate) fn names(&self, holder: &CandidateId, term: Term) -> bool {
        self.holder.as_ref().is_some_and(|h| &h.id == holder && h.term == term)
    }

    /// What a candidate is told about the lease. A holder whose lock is free has no session any
    /// more ([`HolderInfo::orphaned`]): the engine decides when it may be replaced.
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        let holder = self.holder.clone().map(|holder| HolderInfo {
            orphaned: self.lock_free,
            ..holder
        });
        Observation {
            lease: lease.clone(),
            holder,
            last_term: self.last_term,
            previous_end: if self.holder.is_none() { self.previous_end } else { None },
        }
    }
}

/// Decodes `(term, holder, acquired_at_ms, ended_at_ms, end_reason)` of the history table.
pub(crate) fn decode_transition(lease: &LeaseName, row: &MySqlRow) -> Result<Transition> {
    let corrupt = |detail: String| Error::corrupt(STORE, lease, format!("history: {detail}"));
    let fields = TransitionFields {
        term: get::<i64>(row, 0, "term").map_err(corrupt)?,
        holder: get::<String>(row, 1, "holder").map_err(corrupt)?,
        acquired_at_ms: get::<i64>(row, 2, "acquired_at").map_err(corrupt)?,
        ended_at_ms: get::<i64>(row, 3, "ended_at").map_err(corrupt)?,
        end_reason: get::<String>(row, 4, "end_reason").map_err(corrupt)?,
    };
    Transition::from_record(STORE, lease, fields)
}

/// A nullable column of type `T`, or a description of what is there instead.
pub(crate) fn get<'r, T>(row: &'r MySqlRow, index: usize, field: &str) -> Result<Option<T>, String>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get::<Option<T>, _>(index).map_err(|_| {
        let found = row
            .try_get_raw(index)
            .map(|raw| raw.type_info().name().to_string())
            .unwrap_or_else(|_| "unreadable".into());
        format!("{field} has type {found}, not the type leasehold wrote")
    })
}

fn term_from(value: i64) -> Option<Term> {
    u64::try_from(value).ok().map(Term)
}

/// A term as MySQL stores it (a `BIGINT`).
pub(crate) fn term_value(term: Term) -> i64 {
    i64::try_from(term.0).unwrap_or(i64::MAX)
}

/// A duration in milliseconds (a `BIGINT`).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(time::duration_millis(duration)).unwrap_or(i64::MAX)
}

/// Unix milliseconds by this process's wall clock, for the audit trail only.
pub(crate) fn unix_millis(at: SystemTime) -> i64 {
    i64::try_from(time::unix_millis(at)).unwrap_or(i64::MAX)
}
