//! The keys and values leasehold keeps in etcd, and how they are read back.
//!
//! For lease `L` under prefix `P`:
//!
//! - `P/L/c/{candidate}`: one key per candidate, bound to its process's etcd lease (session).
//!   Its `create_revision` is its place in the queue and, once it leads, its term.
//!   Value: `leasehold1 c {ttl_ms}`.
//! - `P/L/h/{term:020}`: written when the term is granted. Value: `leasehold1 h {unix_ms} {holder}`.
//! - `P/L/e/{term:020}`: written when the term ends. Value: `leasehold1 e {unix_ms} {reason}`.
//! - `P/L/granted`: rewritten by every grant, in the grant's transaction. Value:
//!   `leasehold1 g {term} {ttl_ms} {holder}`: who holds the lease now, as `inspect` shows it right
//!   after the grant, for the announcements (`announce.rs`). No other operation reads it
//!   (versions before it neither write nor read it, and ignore it when listing). A release of the
//!   key first in the queue, with no reservation there, rewrites it in the release's transaction
//!   to `leasehold1 released {term}`: the queued successor's store, watching this key, learns
//!   from it that its predecessor's key went by that release, so that its own key is now first
//!   (see `changes`: the successor's turn). Readers that know only grants skip it as unreadable.
//! - `P/L/reserved`: only while a handed-over lease waits for its successor, bound to an etcd
//!   lease of its own (granted with the handed-over grant's TTL, never kept alive: etcd deletes
//!   an untaken reservation after that TTL). Value: `leasehold1 r {ttl_ms} {term} {successor}`.
//!
//! A [`Snapshot`] is what one read of a lease shows; the transactions that end a term are
//! built here too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use leasehold_core::{CandidateId, EndReason, Error, HolderInfo, LeaseName, Observation, Result, Term, Transition};

use crate::error::STORE;

const MAGIC: &str = "leasehold1";

/// The TTLs the etcd store accepts: etcd counts lease TTLs in whole seconds and raises anything
/// below its minimum (1.5 x the election timeout, 2 s with the default 1 s election timeout).
pub const TTL_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(2)..=Duration::from_secs(3600);

/// The etcd lease TTL (whole seconds, rounded up) that backs a leasehold TTL.
pub(crate) fn session_ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The keys of one lease.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    pub(crate) lease: LeaseName,
    base: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, lease: &LeaseName) -> Self {
        Keys {
            lease: lease.clone(),
            base: format!("{prefix}/{lease}/"),
        }
    }

    pub(crate) fn candidates(&self) -> String {
        format!("{}c/", self.base)
    }

    pub(crate) fn candidate(&self, id: &CandidateId) -> String {
        format!("{}c/{id}", self.base)
    }

    pub(crate) fn history(&self) -> String {
        format!("{}h/", self.base)
    }

    pub(crate) fn started(&self, term: i64) -> String {
        format!("{}h/{term:020}", self.base)
    }

    pub(crate) fn ends(&self) -> String {
        format!("{}e/", self.base)
    }

    pub(crate) fn ended(&self, term: i64) -> String {
        format!("{}e/{term:020}", self.base)
    }

    /// The latest grant, as announced to followers.
    pub(crate) fn granted(&self) -> String {
        format!("{}granted", self.base)
    }

    /// Reads the latest grant's key: the holder it names, as `inspect` shows it right after
    /// the grant.
    pub(crate) fn parse_granted(&self, value: &[u8]) -> Result<Observation> {
        let text = std::str::from_utf8(value).unwrap_or("");
        let mut fields = text.splitn(5, ' ');
        let parsed = match (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) {
            (Some(MAGIC), Some("g"), Some(term), Some(ttl), Some(holder)) => {
                match (term.parse::<i64>(), ttl.parse::<u64>(), CandidateId::new(holder)) {
                    (Ok(term), Ok(ttl), Ok(holder)) if term > 0 && ttl > 0 => Some((term, ttl, holder)),
                    _ => None,
                }
            }
            _ => None,
        };
        let (term, ttl, id) =
            parsed.ok_or_else(|| self.corrupt(format!("granted: not a leasehold grant: {}", preview(value))))?;
        let holder = Candidate {
            id,
            rev: term,
            lease: 0,
            ttl: Duration::from_millis(ttl),
        };
        Ok(Observation {
            lease: self.lease.clone(),
            holder: Some(holder_info(&holder)),
            last_term: holder.term(),
            previous_end: None,
        })
    }

    /// The reservation of a handed-over lease for its successor.
    pub(crate) fn reserved(&self) -> String {
        format!("{}reserved", self.base)
    }

    /// Reads the reservation key.
    pub(crate) fn parse_reserved(&self, kv: &KeyValue) -> Result<Reservation> {
        let value = std::str::from_utf8(kv.value()).unwrap_or("");
        let mut fields = value.splitn(5, ' ');
        let parsed = match (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) {
            (Some(MAGIC), Some("r"), Some(ttl), Some(term), Some(to)) => {
                match (ttl.parse::<u64>(), term.parse::<i64>(), CandidateId::new(to)) {
                    (Ok(ttl), Ok(term), Ok(to)) if ttl > 0 && term > 0 => Some((ttl, term, to)),
                    _ => None,
                }
            }
            _ => None,
        };
        let (ttl, term, to) = parsed.ok_or_else(|| {
            self.corrupt(format!(
                "reserved: not a leasehold reservation: {}",
                preview(kv.value())
            ))
        })?;
        Ok(Reservation {
            to,
            term,
            ttl: Duration::from_millis(ttl),
            version: kv.mod_revision(),
        })
    }

    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::corrupt(STORE, &self.lease, detail)
    }

    /// Reads a candidate key.
    pub(crate) fn parse_candidate(&self, kv: &KeyValue) -> Result<Candidate> {
        let key = String::from_utf8_lossy(kv.key());
        let id = key
            .strip_prefix(&self.candidates())
            .ok_or_else(|| self.corrupt(format!("unexpected key {key:?}")))?;
        let id = CandidateId::new(id).map_err(|e| self.corrupt(format!("candidate key {key:?}: {e}")))?;
        let value = std::str::from_utf8(kv.value()).unwrap_or("");
        let mut fields = value.split(' ');
        let ttl = match (fields.next(), fields.next(), fields.next(), fields.next()) {
            (Some(MAGIC), Some("c"), Some(ttl), None) => ttl.parse::<u64>().ok().filter(|ms| *ms > 0),
            _ => None,
        };
        let ttl = ttl.ok_or_else(|| {
            self.corrupt(format!(
                "candidate {id}: not a leasehold candidate: {}",
                preview(kv.value())
            ))
        })?;
        Ok(Candidate {
            id,
            rev: kv.create_revision(),
            lease: kv.lease(),
            ttl: Duration::from_millis(ttl),
        })
    }

    /// Reads a history key (`h/`, the start of a term).
    pub(crate) fn parse_started(&self, kv: &KeyValue) -> Result<Started> {
        let term = self.term_of(kv, &self.history())?;
        let value = std::str::from_utf8(kv.value()).unwrap_or("");
        let mut fields = value.splitn(4, ' ');
        let parsed = match (fields.next(), fields.next(), fields.next(), fields.next()) {
            (Some(MAGIC), Some("h"), Some(at), Some(holder)) => {
                at.parse::<u64>().ok().zip(CandidateId::new(holder).ok())
            }
            _ => None,
        };
        let (at, holder) =
            parsed.ok_or_else(|| self.corrupt(format!("history of term {term}: {}", preview(kv.value()))))?;
        Ok(Started {
            term,
            holder,
            at: from_unix_ms(at),
        })
    }

    /// Reads an end key (`e/`, how a term ended).
    pub(crate) fn parse_ended(&self, kv: &KeyValue) -> Result<Ended> {
        let term = self.term_of(kv, &self.ends())?;
        let value = std::str::from_utf8(kv.value()).unwrap_or("");
        let mut fields = value.split(' ');
        let parsed = match (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) {
            (Some(MAGIC), Some("e"), Some(at), Some(reason), None) => at.parse::<u64>().ok().zip(match reason {
                "released" => Some(EndReason::Released),
                "expired" => Some(EndReason::Expired),
                "broken" => Some(EndReason::Broken),
                "handed_over" => Some(EndReason::HandedOver),
                _ => None,
            }),
            _ => None,
        };
        let (at, reason) =
            parsed.ok_or_else(|| self.corrupt(format!("end of term {term}: {}", preview(kv.value()))))?;
        Ok(Ended {
            term,
            at: from_unix_ms(at),
            reason,
        })
    }

    fn term_of(&self, kv: &KeyValue, prefix: &str) -> Result<i64> {
        let key = String::from_utf8_lossy(kv.key());
        key.strip_prefix(prefix)
            .filter(|t| t.len() == 20)
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|t| *t > 0)
            .ok_or_else(|| self.corrupt(format!("unexpected key {key:?}")))
    }
}

/// The value of a candidate key.
pub(crate) fn candidate_value(ttl: Duration) -> String {
    format!("{MAGIC} c {}", ttl.as_millis().max(1))
}

/// The value of a history key.
pub(crate) fn started_value(holder: &CandidateId) -> String {
    format!("{MAGIC} h {} {holder}", unix_ms())
}

/// The value of the latest grant's key: term `term` granted to `holder` for `ttl`.
pub(crate) fn granted_value(term: i64, ttl: Duration, holder: &CandidateId) -> String {
    format!("{MAGIC} g {term} {} {holder}", ttl.as_millis().max(1))
}

/// The value a release puts in the latest grant's key when the released key was first in the
/// queue and no reservation was there (see `EtcdStore::release`): `leasehold1 released {term}`.
/// Readers of `granted` before it skip it as unreadable (it has three fields, a grant five).
pub(crate) fn released_value(term: i64) -> String {
    format!("{MAGIC} released {term}")
}

/// The term a release marker (see [`released_value`]) names, if `value` is one.
pub(crate) fn parse_released(value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    let mut fields = text.split(' ');
    match (fields.next(), fields.next(), fields.next(), fields.next()) {
        (Some(MAGIC), Some("released"), Some(term), None) => term.parse::<i64>().ok().filter(|t| *t > 0),
        _ => None,
    }
}

/// The value of the reservation key.
pub(crate) fn reserved_value(to: &CandidateId, term: i64, ttl: Duration) -> String {
    format!("{MAGIC} r {} {term} {to}", ttl.as_millis().max(1))
}

/// The value of an end key.
pub(crate) fn ended_value(reason: EndReason) -> String {
    format!("{MAGIC} e {} {reason}", unix_ms())
}

/// A candidate's key.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub(crate) id: CandidateId,
    /// Its create_revision: place in the queue, and term once granted.
    pub(crate) rev: i64,
    /// The etcd lease (session) it is bound to.
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
}

impl Candidate {
    pub(crate) fn term(&self) -> Term {
        Term(u64::try_from(self.rev).unwrap_or(0))
    }
}

/// A history entry: the start of a term.
#[derive(Clone, Debug)]
pub(crate) struct Started {
    pub(crate) term: i64,
    pub(crate) holder: CandidateId,
    pub(crate) at: SystemTime,
}

/// A handed-over lease waiting for its successor.
#[derive(Clone, Debug)]
pub(crate) struct Reservation {
    pub(crate) to: CandidateId,
    /// The handed-over term.
    pub(crate) term: i64,
    /// The handed-over grant's TTL.
    pub(crate) ttl: Duration,
    /// The key's mod_revision: what the successor's take compares.
    pub(crate) version: i64,
}

/// An end entry.
#[derive(Clone, Debug)]
pub(crate) struct Ended {
    pub(crate) term: i64,
    pub(crate) at: SystemTime,
    pub(crate) reason: EndReason,
}

fn preview(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(&value[..value.len().min(40)]).into_owned();
    format!("{text:?}{}", if value.len() > 40 { "..." } else { "" })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

pub(crate) fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, etcd_client::ResponseHeader::revision)
}

/// The key-values of the `i`-th operation of a transaction (empty if it was not a range).
pub(crate) fn kvs_of(ops: &[TxnOpResponse], i: usize) -> &[KeyValue] {
    match ops.get(i) {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    }
}

pub(crate) fn first_of(prefix: String) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
}

pub(crate) fn last_of(prefix: String, limit: i64) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(limit),
        ),
    )
}

/// What one read of a lease shows: the first candidate, the latest term and the latest end.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) first: Option<Candidate>,
    pub(crate) started: Option<Started>,
    pub(crate) ended: Option<Ended>,
    pub(crate) reserved: Option<Reservation>,
}

impl Snapshot {
    /// The reads of a snapshot, as transaction operations.
    pub(crate) fn reads(keys: &Keys) -> [TxnOp; 4] {
        [
            first_of(keys.candidates()),
            last_of(keys.history(), 1),
            last_of(keys.ends(), 1),
            TxnOp::get(keys.reserved(), None),
        ]
    }

    /// Parses the four reads starting at `ops[at]`.
    pub(crate) fn parse(keys: &Keys, ops: &[TxnOpResponse], at: usize) -> Result<Snapshot> {
        Ok(Snapshot {
            first: kvs_of(ops, at).first().map(|kv| keys.parse_candidate(kv)).transpose()?,
            started: kvs_of(ops, at + 1)
                .first()
                .map(|kv| keys.parse_started(kv))
                .transpose()?,
            ended: kvs_of(ops, at + 2).first().map(|kv| keys.parse_ended(kv)).transpose()?,
            reserved: kvs_of(ops, at + 3)
                .first()
                .map(|kv| keys.parse_reserved(kv))
                .transpose()?,
        })
    }

    /// The snapshot of a lease from every key of it (as a range over its keys returns them):
    /// what [`Snapshot::reads`] would pick (the candidate key created first, the last history
    /// key, the last end key), parsed as [`Snapshot::parse`] does. `None` when the lease has no
    /// history key: it was never granted, and the store keeps no record of it.
    pub(crate) fn of_keys(keys: &Keys, kvs: &[KeyValue]) -> Result<Option<Snapshot>> {
        let under = |prefix: String| kvs.iter().filter(move |kv| kv.key().starts_with(prefix.as_bytes()));
        let Some(started) = under(keys.history()).max_by(|x, y| x.key().cmp(y.key())) else {
            return Ok(None);
        };
        let first = under(keys.candidates()).min_by_key(|kv| kv.create_revision());
        let ended = under(keys.ends()).max_by(|x, y| x.key().cmp(y.key()));
        let reserved = kvs.iter().find(|kv| kv.key() == keys.reserved().as_bytes());
        Ok(Some(Snapshot {
            first: first.map(|kv| keys.parse_candidate(kv)).transpose()?,
            started: Some(keys.parse_started(started)?),
            ended: ended.map(|kv| keys.parse_ended(kv)).transpose()?,
            reserved: reserved.map(|kv| keys.parse_reserved(kv)).transpose()?,
        }))
    }

    pub(crate) fn last_term(&self) -> Term {
        Term(self.started.as_ref().map_or(0, |s| u64::try_from(s.term).unwrap_or(0)))
    }

    /// Whether the latest term has an end record.
    pub(crate) fn latest_ended(&self) -> bool {
        matches!((&self.started, &self.ended), (Some(s), Some(e)) if s.term == e.term)
    }

    /// The holder: the first candidate, once it has been granted (its term has a history entry
    /// and no end). A candidate that is first but not yet granted is not a holder.
    pub(crate) fn holder(&self) -> Option<&Candidate> {
        let first = self.first.as_ref()?;
        let started = self.started.as_ref()?;
        (started.term == first.rev && !self.latest_ended()).then_some(first)
    }

    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        if let Some(reservation) = &self.reserved {
            return reservation_observation(lease, reservation, self.last_term());
        }
        match self.holder() {
            Some(holder) => Observation {
                lease: lease.clone(),
                holder: Some(holder_info(holder)),
                last_term: self.last_term(),
                previous_end: None,
            },
            None => {
                let previous_end = match (&self.started, self.latest_ended()) {
                    (None, _) => None,
                    (Some(_), true) => self.ended.as_ref().map(|e| e.reason),
                    // The holder's key went away without an end record: its session expired.
                    (Some(_), false) => Some(EndReason::Expired),
                };
                Observation::free(lease.clone(), self.last_term(), previous_end)
            }
        }
    }

    /// For a candidate queued behind `first`: the first candidate counts as the holder (it is
    /// granted, or will be as soon as it asks).
    pub(crate) fn queued_observation(&self, lease: &LeaseName) -> Observation {
        if self.reserved.is_some() {
            return self.observation(lease);
        }
        match &self.first {
            Some(first) => Observation {
                lease: lease.clone(),
                holder: Some(holder_info(first)),
                last_term: self.last_term().max(first.term()),
                previous_end: None,
            },
            None => self.observation(lease),
        }
    }
}

/// A reserved lease shows its successor as holder, at the handed-over term.
fn reservation_observation(lease: &LeaseName, reservation: &Reservation, last_term: Term) -> Observation {
    let term = Term(u64::try_from(reservation.term).unwrap_or(0));
    Observation {
        lease: lease.clone(),
        holder: Some(HolderInfo {
            id: reservation.to.clone(),
            term,
            ttl: reservation.ttl,
            version: format!("reserved-{}", reservation.version),
            orphaned: false,
            reserved: true,
            store_remaining: None,
        }),
        last_term: last_term.max(term),
        previous_end: None,
    }
}

fn holder_info(candidate: &Candidate) -> HolderInfo {
    HolderInfo {
        id: candidate.id.clone(),
        term: candidate.term(),
        ttl: candidate.ttl,
        version: candidate.rev.to_string(),
        orphaned: false,
        reserved: false,
        store_remaining: None,
    }
}

/// Deletes the candidate key `key` if it still has `rev`, recording the end of its term if it
/// was granted and has no end yet.
pub(crate) fn end_term(keys: &Keys, key: &str, rev: i64, snapshot: &Snapshot, reason: EndReason) -> Txn {
    let mut ops = vec![TxnOp::delete(key.to_string(), None)];
    let granted = snapshot.started.as_ref().is_some_and(|s| s.term == rev);
    if granted && !snapshot.latest_ended() {
        ops.push(TxnOp::put(keys.ended(rev), ended_value(reason), None));
    }
    Txn::new()
        .when([Compare::create_revision(key.to_string(), CompareOp::Equal, rev)])
        .and_then(ops)
}

/// The transitions of a lease from a read of its latest `h/` keys (op 0, newest first), its
/// latest `e/` keys (op 1) and its first candidate (op 2), oldest first.
pub(crate) fn transitions(keys: &Keys, ops: &[TxnOpResponse]) -> Result<Vec<Transition>> {
    let ends = kvs_of(ops, 1)
        .iter()
        .map(|kv| keys.parse_ended(kv))
        .collect::<Result<Vec<_>>>()?;
    let first = kvs_of(ops, 2).first().map(|kv| keys.parse_candidate(kv)).transpose()?;
    let mut started = kvs_of(ops, 0)
        .iter()
        .map(|kv| keys.parse_started(kv))
        .collect::<Result<Vec<_>>>()?;
    started.reverse();
    let now = std::time::SystemTime::now();
    let history = started
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let recorded = ends.iter().find(|e| e.term == s.term).map(|e| (e.at, e.reason));
            // No end record, yet a later term exists or the key is gone: the holder's session
            // expired (the next leader records that, unless there was none yet).
            let holds = first.as_ref().is_some_and(|f| f.rev == s.term);
            let inferred = match started.get(i + 1) {
                Some(next) => Some((next.at, EndReason::Expired)),
                None if !holds => Some((now, EndReason::Expired)),
                None => None,
            };
            Transition {
                term: Term(u64::try_from(s.term).unwrap_or(0)),
                holder: s.holder.clone(),
                acquired_at: s.at,
                ended: recorded.or(inferred),
            }
        })
        .collect();
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ttls_round_up_to_seconds() {
        assert_eq!(session_ttl_secs(Duration::from_secs(2)), 2);
        assert_eq!(session_ttl_secs(Duration::from_millis(2001)), 3);
        assert_eq!(session_ttl_secs(Duration::from_millis(10)), 1);
    }

    #[test]
    fn keys_of_a_lease() {
        let keys = Keys::new("app", &LeaseName::new("jobs").unwrap());
        assert_eq!(keys.candidate(&CandidateId::new("a b").unwrap()), "app/jobs/c/a b");
        assert_eq!(keys.started(42), "app/jobs/h/00000000000000000042");
        assert_eq!(keys.ended(42), "app/jobs/e/00000000000000000042");
        assert!(keys.started(i64::MAX) > keys.started(99));
        assert_eq!(keys.granted(), "app/jobs/granted");
    }

    #[test]
    fn a_grant_reads_back_as_inspect_shows_its_holder() {
        let keys = Keys::new("app", &LeaseName::new("jobs").unwrap());
        let holder = CandidateId::new("host 7 x").unwrap();
        let value = granted_value(42, Duration::from_millis(2500), &holder);
        assert_eq!(value, "leasehold1 g 42 2500 host 7 x");
        let seen = keys.parse_granted(value.as_bytes()).unwrap();
        // As `Snapshot::observation` shows a holder whose candidate key has create_revision 42.
        let candidate = Candidate {
            id: holder,
            rev: 42,
            lease: 7,
            ttl: Duration::from_millis(2500),
        };
        let inspected = Observation {
            lease: keys.lease.clone(),
            holder: Some(holder_info(&candidate)),
            last_term: Term(42),
            previous_end: None,
        };
        assert_eq!(seen, inspected);
        for bad in [
            "leasehold1 g 0 2500 a",
            "leasehold1 g 42 0 a",
            "leasehold1 g 42 2500",
            "leasehold1 h 42 2500 a",
            "leasehold1 g x 2500 a",
            "leasehold1 g 42 2500 a\u{1}",
        ] {
            let err = keys.parse_granted(bad.as_bytes()).unwrap_err();
            assert!(matches!(err, Error::CorruptRecord { .. }), "{bad}: {err}");
        }
    }
}
