//! Reading rows: every value is checked, and garbage becomes [`Error::CorruptRecord`] naming the
//! lease and the field (the holder fields by [`HolderInfo::from_record`], as on every backend).
//! Also the lock key of a lease.

use std::ops::RangeInclusive;
use std::time::Duration;

use leasehold_core::{
    EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, Result, Term, Transition, TransitionFields,
    time,
};
use sqlx::postgres::PgRow;
use sqlx::{Row, TypeInfo, ValueRef};

use crate::error::STORE;

/// The TTLs this store accepts: `idle_session_timeout` counts in milliseconds, but a lock session
/// that must speak at least once a TTL is fragile below a second, and an hour is already long for
/// a lease nobody else may take after a silent holder.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// A lease row, validated.
#[derive(Debug)]
pub(crate) struct Record {
    /// The holder the row names (never [`orphaned`](HolderInfo::orphaned): only whoever knows
    /// the state of its lock can say that).
    pub(crate) holder: Option<HolderInfo>,
    /// The row's term: the holder's, or the last one granted.
    pub(crate) term: Term,
    /// The highest term in the row or the history: the next grant is above it.
    pub(crate) last_term: Term,
    pub(crate) previous_end: Option<EndReason>,
}

/// The columns every statement that reads a lease returns, in this order, starting at some
/// index: `present, holder, term, ttl_ms, version, previous_end, history_term`.
pub(crate) const RECORD_COLUMNS: &str = "l.name IS NOT NULL, l.holder, l.term, l.ttl_ms, l.version, l.previous_end,
     (SELECT max(h.term) FROM {schema}.history AS h WHERE h.name = w.name)";

/// How many columns [`RECORD_COLUMNS`] are.
pub(crate) const RECORD_WIDTH: usize = 7;

/// The same checks as [`Record::decode`], in SQL, over `l` (the row) and `history_term`: the
/// acquire statement grants only on a row that passes them.
pub(crate) const VALID_ROW_SQL: &str = "(l.term >= 0
     AND (l.previous_end IS NULL OR l.previous_end IN ('released', 'expired', 'broken', 'handed_over'))
     AND ((l.holder IS NULL AND l.ttl_ms IS NULL AND l.version IS NULL)
          OR (l.holder IS NOT NULL AND l.ttl_ms IS NOT NULL AND l.version IS NOT NULL AND l.term > 0
              AND l.ttl_ms BETWEEN {min_ttl_ms} AND {max_ttl_ms}
              AND l.version ~ '^[0-9a-fA-F]{16}$'
              AND octet_length(l.holder) BETWEEN 1 AND 256
              AND l.holder !~ E'[\\\\u0001-\\\\u001f\\\\u007f-\\\\u009f]')))";

impl Record {
    /// Decodes the [`RECORD_COLUMNS`] of `row` starting at column `at`.
    pub(crate) fn decode(lease: &LeaseName, row: &PgRow, at: usize) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let history_term = match get::<i64>(row, at + 6, "history.term").map_err(corrupt)? {
            None => Term(0),
            Some(t) => term_from(t).ok_or_else(|| corrupt(format!("history.term {t} is negative")))?,
        };
        if get::<bool>(row, at, "name").map_err(corrupt)? != Some(true) {
            return Ok(Record {
                holder: None,
                term: history_term,
                last_term: history_term,
                previous_end: None,
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

    /// What a candidate is told about the lease. `lock_free`: the lease's advisory lock was
    /// free when the row was read, so a holder it names has no session any more
    /// ([`HolderInfo::orphaned`]: the engine decides when it may be replaced). A reservation
    /// ([`HolderInfo::reserved`]) has no lock either: it is orphaned and reserved.
    pub(crate) fn observation(&self, lease: &LeaseName, lock_free: bool) -> Observation {
        let holder = self.holder.clone().map(|holder| HolderInfo {
            orphaned: lock_free,
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
pub(crate) fn decode_transition(lease: &LeaseName, row: &PgRow) -> Result<Transition> {
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
pub(crate) fn get<'r, T>(row: &'r PgRow, index: usize, field: &str) -> Result<Option<T>, String>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
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

/// A term as Postgres stores it (a `bigint`).
pub(crate) fn term_value(term: Term) -> i64 {
    i64::try_from(term.0).unwrap_or(i64::MAX)
}

/// A duration in milliseconds as Postgres stores it (a `bigint`).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(time::duration_millis(duration)).unwrap_or(i64::MAX)
}

/// The advisory lock key of `lease` in `schema`: the 64-bit FNV-1a hash of
/// `leasehold/<schema>/<lease>`, as a signed `bigint`.
///
/// Stable across versions and platforms (it is written into each row's `lock_key` column, so
/// operators can join `pg_locks` without computing it). Two stores with different schemas in one
/// database never contend for each other's locks.
///
/// # Examples
///
/// ```
/// use leasehold_postgres::lock_key;
///
/// assert_eq!(lock_key("leasehold", "a"), lock_key("leasehold", "a"));
/// assert_ne!(lock_key("leasehold", "a"), lock_key("other", "a"));
/// ```
pub fn lock_key(schema: &str, lease: &str) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in "leasehold/"
        .bytes()
        .chain(schema.bytes())
        .chain(std::iter::once(b'/'))
        .chain(lease.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable() {
        // FNV-1a 64 of "leasehold/leasehold/invoice-scheduler", computed independently.
        let expected = {
            let mut h: u64 = 0xcbf29ce484222325;
            for b in b"leasehold/leasehold/invoice-scheduler" {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x100000001b3);
            }
            h as i64
        };
        assert_eq!(lock_key("leasehold", "invoice-scheduler"), expected);
        assert_ne!(lock_key("leasehold", "a"), lock_key("leasehold", "b"));
        assert_ne!(lock_key("x", "ab"), lock_key("xa", "b"));
    }
}
