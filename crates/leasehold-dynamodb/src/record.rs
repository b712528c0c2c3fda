//! The items in the lease table: every attribute is checked when read, and garbage becomes
//! [`Error::CorruptRecord`] naming the lease and the attribute.
//!
//! One table, key `lease` (S, partition) + `sk` (S, sort):
//!
//! | item | `lease` | `sk` | attributes |
//! |---|---|---|---|
//! | the lease | name | `lease` | `term` N, `last_holder` S, `acquired_at` N; while held `holder` S, `ttl_ms` N, `version` S; once ended `previous_end` S, `ended_at` N; while reserved for `holder` by a handover `reserved_term` N (= `term`), `handed_over_at` N; the term before: `prev_term` N, `prev_holder` S, `prev_acquired_at` N, `prev_ended_at` N, `prev_end` S |
//! | a finished term | name | `history#{term:020}` | `term` N, `holder` S, `acquired_at` N, `ended_at` N, `end_reason` S |
//! | a shard record (`shards`) | `#shards` | its name | `value` S, `version` S |

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_core::time::{from_unix_millis, unix_millis};
use leasehold_core::{
    CandidateId, EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, Result, Term, Transition,
};

use crate::error::STORE;

/// The TTLs this store accepts.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// The partition key attribute.
pub(crate) const KEY: &str = "lease";
/// The sort key attribute.
pub(crate) const SORT: &str = "sk";
/// The sort key of a lease item.
pub(crate) const LEASE_SK: &str = "lease";
/// The sort key prefix of history items.
pub(crate) const HISTORY_PREFIX: &str = "history#";
/// The attribute naming the term a reservation was handed over from: the item is reserved for
/// its `holder` only while this equals `term`, so a grant by code that does not know it (which
/// raises `term` and leaves it) ends the reservation.
pub(crate) const RESERVED_TERM: &str = "reserved_term";
/// When the reserved term was handed over (audit only).
pub(crate) const HANDED_OVER_AT: &str = "handed_over_at";

pub(crate) type Item = HashMap<String, AttributeValue>;

/// The sort key of the history item of `term`: zero-padded, so that the order of keys is the
/// order of terms, and below `lease`, so that one query descending from `lease` reads the lease
/// item and the newest history item.
pub(crate) fn term_sk(term: Term) -> String {
    format!("{HISTORY_PREFIX}{:020}", term.0)
}

/// The key of an item.
pub(crate) fn key(lease: &LeaseName, sk: &str) -> Item {
    HashMap::from([
        (KEY.to_string(), AttributeValue::S(lease.as_str().to_string())),
        (SORT.to_string(), AttributeValue::S(sk.to_string())),
    ])
}

pub(crate) fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

pub(crate) fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// A lease item, validated.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// Whether the item exists.
    pub(crate) present: bool,
    /// The item's term: the holder's, or the last one granted.
    pub(crate) term: Term,
    /// The highest term granted: the next grant is above it.
    pub(crate) last_term: Term,
    /// The holder of `term`, still holding or not (absent for term 0).
    pub(crate) last_holder: Option<CandidateId>,
    /// When `term` was granted (audit only).
    pub(crate) acquired_at: Option<SystemTime>,
    /// The holder, checked by core's [`HolderInfo::from_record`] (its term is `term`).
    pub(crate) holder: Option<HolderInfo>,
    /// When and how `term` ended, once it has.
    pub(crate) ended: Option<(SystemTime, EndReason)>,
    /// The term before `term`, finished, as the grant of `term` copied it into the item (absent
    /// on items created from nothing).
    pub(crate) previous: Option<Transition>,
    /// The highest term with a history item (0 without any).
    pub(crate) history_term: Term,
}

impl Record {
    /// A lease without an item: free, at the highest term its history records (so that a
    /// deleted item does not send the term back).
    pub(crate) fn absent(history_term: Term) -> Record {
        Record {
            present: false,
            term: history_term,
            last_term: history_term,
            last_holder: None,
            acquired_at: None,
            holder: None,
            ended: None,
            previous: None,
            history_term,
        }
    }

    /// Decodes a lease item.
    pub(crate) fn decode(lease: &LeaseName, item: &Item) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let fields = Fields { item };
        let term = fields
            .number("term")
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("term is missing".into()))?;
        let term = Term(term);
        let last_holder = match fields.string("last_holder").map_err(corrupt)? {
            Some(id) => Some(CandidateId::new(id).map_err(|e| corrupt(format!("last_holder: {e}")))?),
            None if term.0 > 0 => return Err(corrupt(format!("term {term} has no last_holder"))),
            None => None,
        };
        let acquired_at = fields.number("acquired_at").map_err(corrupt)?.map(from_unix_millis);
        let reservation = match (fields.number(RESERVED_TERM), fields.number(HANDED_OVER_AT)) {
            (Err(e), _) | (_, Err(e)) => return Err(corrupt(e)),
            (Ok(None), Ok(None)) => None,
            (Ok(Some(reserved)), Ok(Some(_))) if reserved > term.0 => {
                return Err(corrupt(format!("{RESERVED_TERM} {reserved} is above term {term}")));
            }
            (Ok(Some(reserved)), Ok(Some(at))) => Some((Term(reserved), from_unix_millis(at))),
            _ => {
                return Err(corrupt(format!(
                    "{RESERVED_TERM} and {HANDED_OVER_AT} must be both set or both missing"
                )));
            }
        };
        let mut holder = match (
            fields.string("holder"),
            fields.number("ttl_ms"),
            fields.string("version"),
        ) {
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(corrupt(e)),
            (Ok(None), Ok(None), Ok(None)) => None,
            (Ok(Some(id)), Ok(Some(ttl_ms)), Ok(Some(version))) => {
                let fields = HolderFields {
                    id: &id,
                    term: term.0.into(),
                    ttl_ms: ttl_ms.into(),
                    version: &version,
                    store_remaining: None,
                };
                Some(HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?)
            }
            (Ok(holder), Ok(ttl_ms), Ok(version)) => {
                let set = |is_set: bool| if is_set { "set" } else { "missing" };
                return Err(corrupt(format!(
                    "holder, ttl_ms and version must be all set or all missing, found holder {}, ttl_ms {}, version {}",
                    set(holder.is_some()),
                    set(ttl_ms.is_some()),
                    set(version.is_some()),
                )));
            }
        };
        // Reserved: the holder is the successor, and the item's term (its last holder's) ended
        // handed over. A reservation left from an earlier term reserves nothing.
        let handed_over = reservation
            .filter(|(reserved, _)| *reserved == term && holder.is_some())
            .map(|(_, at)| at);
        if let (Some(holder), Some(_)) = (holder.as_mut(), handed_over) {
            holder.reserved = true;
        }
        let ended = match (fields.number("ended_at"), fields.string("previous_end")) {
            (Err(e), _) | (_, Err(e)) => return Err(corrupt(e)),
            (Ok(None), Ok(None)) => handed_over.map(|at| (at, EndReason::HandedOver)),
            (Ok(Some(at)), Ok(Some(reason))) if holder.is_none() => {
                let reason = reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("previous_end: {e}")))?;
                Some((from_unix_millis(at), reason))
            }
            _ => {
                return Err(corrupt(
                    "ended_at and previous_end must be both set, and only on a free lease, or both missing".into(),
                ));
            }
        };
        let previous = decode_previous(&fields, term).map_err(corrupt)?;
        Ok(Record {
            present: true,
            term,
            last_term: term,
            last_holder,
            acquired_at,
            holder,
            ended,
            previous,
            history_term: Term(0),
        })
    }

    /// What a candidate is told about the lease.
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: self.holder.clone(),
            last_term: self.last_term,
            previous_end: if self.holder.is_none() {
                self.ended.map(|(_, reason)| reason)
            } else {
                None
            },
        }
    }

    /// The item's own term as a history entry (its holder may still hold it).
    pub(crate) fn transition(&self) -> Option<Transition> {
        let holder = self.last_holder.clone()?;
        (self.term.0 > 0).then(|| Transition {
            term: self.term,
            holder,
            acquired_at: self.acquired_at.unwrap_or(SystemTime::UNIX_EPOCH),
            ended: self.ended,
        })
    }
}

/// The finished term before `term` that a grant keeps in the lease item: all five `prev_*`
/// attributes, or none.
fn decode_previous(fields: &Fields<'_>, term: Term) -> Result<Option<Transition>, String> {
    let (prev_term, holder, acquired_at, ended_at, end) = (
        fields.number("prev_term")?,
        fields.string("prev_holder")?,
        fields.number("prev_acquired_at")?,
        fields.number("prev_ended_at")?,
        fields.string("prev_end")?,
    );
    match (prev_term, holder, acquired_at, ended_at, end) {
        (None, None, None, None, None) => Ok(None),
        (Some(prev_term), Some(holder), Some(acquired_at), Some(ended_at), Some(end)) => {
            if prev_term == 0 || prev_term >= term.0 {
                return Err(format!("prev_term {prev_term} must be from 1 to below term {term}"));
            }
            let holder = CandidateId::new(holder).map_err(|e| format!("prev_holder: {e}"))?;
            let reason = end.parse::<EndReason>().map_err(|e| format!("prev_end: {e}"))?;
            Ok(Some(Transition {
                term: Term(prev_term),
                holder,
                acquired_at: from_unix_millis(acquired_at),
                ended: Some((from_unix_millis(ended_at), reason)),
            }))
        }
        _ => Err(
            "prev_term, prev_holder, prev_acquired_at, prev_ended_at and prev_end must be all set or all missing"
                .into(),
        ),
    }
}

/// The attributes of the lease item that keep the term before its own.
pub(crate) const PREVIOUS_ATTRIBUTES: [&str; 5] = [
    "prev_term",
    "prev_holder",
    "prev_acquired_at",
    "prev_ended_at",
    "prev_end",
];

/// The `prev_*` attributes for a finished term (one whose `ended` is set).
pub(crate) fn previous_attributes(finished: &Transition) -> [(&'static str, AttributeValue); 5] {
    let (ended_at, reason) = finished.ended.unwrap_or((finished.acquired_at, EndReason::Expired));
    [
        ("prev_term", n(finished.term.0)),
        ("prev_holder", s(finished.holder.as_str())),
        ("prev_acquired_at", n(unix_millis(finished.acquired_at))),
        ("prev_ended_at", n(unix_millis(ended_at))),
        ("prev_end", s(reason.to_string())),
    ]
}

/// A history item, checked.
pub(crate) fn decode_transition(lease: &LeaseName, item: &Item) -> Result<Transition> {
    let corrupt = |detail: String| Error::corrupt(STORE, lease, format!("history: {detail}"));
    let fields = Fields { item };
    let sk = fields.string(SORT).map_err(corrupt)?.unwrap_or_default();
    let term = fields
        .number("term")
        .map_err(corrupt)?
        .filter(|t| *t > 0)
        .map(Term)
        .ok_or_else(|| corrupt(format!("{sk}: term is missing or 0")))?;
    if sk != term_sk(term) {
        return Err(corrupt(format!("item {sk} holds term {term}")));
    }
    let holder = fields
        .string("holder")
        .map_err(corrupt)?
        .ok_or_else(|| corrupt(format!("term {term}: holder is missing")))?;
    let holder = CandidateId::new(holder).map_err(|e| corrupt(format!("term {term}: holder: {e}")))?;
    let acquired_at = fields
        .number("acquired_at")
        .map_err(corrupt)?
        .map_or(SystemTime::UNIX_EPOCH, from_unix_millis);
    let ended = match (fields.number("ended_at"), fields.string("end_reason")) {
        (Err(e), _) | (_, Err(e)) => return Err(corrupt(format!("term {term}: {e}"))),
        (Ok(None), Ok(None)) => None,
        (Ok(Some(at)), Ok(Some(reason))) => {
            let reason = reason
                .parse::<EndReason>()
                .map_err(|e| corrupt(format!("term {term}: end_reason: {e}")))?;
            Some((from_unix_millis(at), reason))
        }
        _ => {
            return Err(corrupt(format!(
                "term {term}: ended_at and end_reason must be both set or both missing"
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

/// The history item of a finished term.
pub(crate) fn transition_item(lease: &LeaseName, transition: &Transition) -> Item {
    let mut item = key(lease, &term_sk(transition.term));
    item.insert("term".into(), n(transition.term.0));
    item.insert("holder".into(), s(transition.holder.as_str()));
    item.insert("acquired_at".into(), n(unix_millis(transition.acquired_at)));
    if let Some((at, reason)) = transition.ended {
        item.insert("ended_at".into(), n(unix_millis(at)));
        item.insert("end_reason".into(), s(reason.to_string()));
    }
    item
}

/// Typed access to the attributes of an item, describing what is there instead.
struct Fields<'a> {
    item: &'a Item,
}

impl Fields<'_> {
    fn string(&self, name: &str) -> Result<Option<String>, String> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(true)) => Ok(None),
            Some(AttributeValue::S(text)) => Ok(Some(text.clone())),
            Some(other) => Err(format!("{name} is {}, expected a string (S)", describe(other))),
        }
    }

    fn number(&self, name: &str) -> Result<Option<u64>, String> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(true)) => Ok(None),
            Some(AttributeValue::N(text)) => text
                .parse()
                .map(Some)
                .map_err(|_| format!("{name} {text:?} is not a whole number from 0 to {}", u64::MAX)),
            Some(other) => Err(format!("{name} is {}, expected a number (N)", describe(other))),
        }
    }
}

/// Describes a value of the wrong type, e.g. `the string "garbage"` or `a list`.
fn describe(value: &AttributeValue) -> String {
    match value {
        AttributeValue::S(text) => format!("the string {:?}", text.chars().take(40).collect::<String>()),
        AttributeValue::N(text) => format!("the number {text}"),
        AttributeValue::B(_) => "binary (B)".into(),
        AttributeValue::Bool(b) => format!("the boolean {b}"),
        AttributeValue::L(_) => "a list (L)".into(),
        AttributeValue::M(_) => "a map (M)".into(),
        AttributeValue::Ss(_) | AttributeValue::Ns(_) | AttributeValue::Bs(_) => "a set".into(),
        AttributeValue::Null(_) => "NULL".into(),
        _ => "a value of an unknown type".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> LeaseName {
        LeaseName::new("jobs").unwrap()
    }

    fn held() -> Item {
        let mut item = key(&lease(), LEASE_SK);
        for (k, v) in [
            ("term", n(7)),
            ("last_holder", s("a")),
            ("holder", s("a")),
            ("acquired_at", n(1_700_000_000_000u64)),
            ("ttl_ms", n(5000)),
            ("version", s("0123456789abcdef")),
        ] {
            item.insert(k.into(), v);
        }
        item
    }

    #[test]
    fn decodes_a_held_lease() {
        let record = Record::decode(&lease(), &held()).unwrap();
        let observation = record.observation(&lease());
        let holder = observation.holder.unwrap();
        assert_eq!(
            (holder.id.as_str(), holder.term, holder.ttl),
            ("a", Term(7), Duration::from_secs(5))
        );
        assert_eq!(observation.last_term, Term(7));
        assert_eq!(record.transition().unwrap().ended, None);
    }

    #[test]
    fn decodes_a_reservation() {
        let mut item = held();
        item.insert(RESERVED_TERM.into(), n(7));
        item.insert(HANDED_OVER_AT.into(), n(1_700_000_005_000u64));
        let record = Record::decode(&lease(), &item).unwrap();
        let holder = record.observation(&lease()).holder.unwrap();
        assert!(holder.reserved && holder.term == Term(7), "{holder:?}");
        assert_eq!(
            record.transition().unwrap().ended,
            Some((from_unix_millis(1_700_000_005_000), EndReason::HandedOver)),
            "the reserved term ended handed over"
        );
        // Left from an earlier term, or on a free lease: no reservation.
        item.insert(RESERVED_TERM.into(), n(6));
        let record = Record::decode(&lease(), &item).unwrap();
        assert!(!record.holder.unwrap().reserved);
        assert_eq!(record.ended, None);
        let mut free = held();
        for k in ["holder", "ttl_ms", "version"] {
            free.remove(k);
        }
        free.insert(RESERVED_TERM.into(), n(7));
        free.insert(HANDED_OVER_AT.into(), n(1));
        let record = Record::decode(&lease(), &free).unwrap();
        assert!(record.holder.is_none() && record.ended.is_none());
    }

    #[test]
    fn garbage_names_the_lease_and_the_attribute() {
        let mut cases: Vec<(Item, &str)> = Vec::new();
        let with = |k: &str, v: Option<AttributeValue>| {
            let mut item = held();
            match v {
                Some(v) => item.insert(k.into(), v),
                None => item.remove(k),
            };
            item
        };
        cases.push((with("term", Some(s("garbage"))), "term is the string \"garbage\""));
        cases.push((with("term", Some(n("-1"))), "term \"-1\""));
        cases.push((with("term", Some(n("1.5"))), "term \"1.5\""));
        cases.push((with("term", None), "term is missing"));
        cases.push((with("version", None), "version must be all set"));
        cases.push((with("version", Some(s("zz"))), "version \"zz\""));
        cases.push((with("ttl_ms", Some(n(0))), "ttl_ms 0"));
        cases.push((
            with("holder", Some(AttributeValue::Bool(true))),
            "holder is the boolean true",
        ));
        cases.push((with("holder", Some(s(""))), "holder \"\": must not be empty"));
        cases.push((
            with("holder", Some(s("a\u{7}b"))),
            "holder \"a\\u{7}b\": must not contain control characters",
        ));
        let mut free_with_holder = held();
        free_with_holder.insert("term".into(), n(0));
        free_with_holder.remove("last_holder");
        cases.push((free_with_holder, "term 0 is not a term (1 or more)"));
        cases.push((with("last_holder", None), "no last_holder"));
        cases.push((with("previous_end", Some(s("released"))), "ended_at and previous_end"));
        cases.push((
            with("reserved_term", Some(s("7"))),
            "reserved_term is the string \"7\", expected a number (N)",
        ));
        cases.push((
            with("reserved_term", Some(n(7))),
            "reserved_term and handed_over_at must be both set",
        ));
        let mut above = with("reserved_term", Some(n(8)));
        above.insert(HANDED_OVER_AT.into(), n(1));
        cases.push((above, "reserved_term 8 is above term 7"));
        cases.push((with("prev_term", Some(n(6))), "prev_term, prev_holder"));
        let mut slot = held();
        for (k, v) in [
            ("prev_term", n(7)),
            ("prev_holder", s("z")),
            ("prev_acquired_at", n(1)),
            ("prev_ended_at", n(2)),
            ("prev_end", s("released")),
        ] {
            slot.insert(k.into(), v);
        }
        cases.push((slot.clone(), "prev_term 7 must be from 1 to below term 7"));
        slot.insert("prev_term".into(), n(6));
        slot.insert("prev_end".into(), s("vanished"));
        cases.push((slot, "prev_end"));
        for (item, why) in cases {
            match Record::decode(&lease(), &item) {
                Err(Error::CorruptRecord { lease, detail, .. }) => {
                    assert_eq!(lease, "jobs");
                    assert!(detail.contains(why), "{why}: {detail}");
                }
                other => panic!("{why}: expected CorruptRecord, got {other:?}"),
            }
        }
    }

    #[test]
    fn history_items_round_trip() {
        let t = Transition {
            term: Term(3),
            holder: CandidateId::new("b").unwrap(),
            acquired_at: from_unix_millis(1_000),
            ended: Some((from_unix_millis(2_000), EndReason::Expired)),
        };
        let item = transition_item(&lease(), &t);
        assert_eq!(decode_transition(&lease(), &item).unwrap(), t);
        assert_eq!(term_sk(Term(3)), "history#00000000000000000003");
        let mut wrong = item.clone();
        wrong.insert("term".into(), n(4));
        assert!(matches!(
            decode_transition(&lease(), &wrong),
            Err(Error::CorruptRecord { .. })
        ));
    }
}
