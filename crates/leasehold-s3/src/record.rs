//! The lease object: one JSON document per lease, checked field by field when read (garbage
//! becomes [`Error::CorruptRecord`] naming the lease and the field), and the documents each
//! write replaces it with.
//!
//! ```json
//! {"format":"leasehold-s3/1","lease":"jobs","term":7,"version":"5f0c4a9e1b2d3c4f",
//!  "holder":{"id":"host-a-1234-9f2e1c","ttl_ms":10000},
//!  "terms":[{"term":6,"holder":"host-b-88-01ab2c","acquired_at":1764950400000,
//!            "ended_at":1764950460000,"end":"released"},
//!           {"term":7,"holder":"host-a-1234-9f2e1c","acquired_at":1764950461000}]}
//! ```
//!
//! - `term`: the last term granted; a free lease keeps it (a release writes a tombstone, the
//!   object is never deleted), so the next grant is above it.
//! - `version`: 16 random hex digits, new with every write: what contenders watch for a TTL, and
//!   what makes every write's ETag new (a write of the same bytes would keep the ETag).
//! - `holder`: while the lease is held, or reserved by a handover (`"reserved":true`, the term
//!   shown is then the one handed over, already ended `handed_over`).
//! - `terms`: the most recent [`MAX_TERMS`] terms, oldest first; the last is `term`.

use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use leasehold_core::time::{from_unix_millis, unix_millis};
use leasehold_core::{
    CandidateId, EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, RecordVersion, Result, Term,
    Transition,
};
use serde::{Deserialize, Serialize};

use crate::error::STORE;

/// The TTLs this store accepts.
pub const TTL_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// How many terms a lease object keeps: older ones are dropped from `history` (every write
/// rewrites the object, so its size is what each renewal sends).
pub const MAX_TERMS: usize = 256;

/// The `format` of the documents this version writes and reads.
const FORMAT: &str = "leasehold-s3/1";

/// A lease object, as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    format: String,
    lease: String,
    term: u64,
    version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<Holder>,
    terms: Vec<Entry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Holder {
    id: String,
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    reserved: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    term: u64,
    holder: String,
    acquired_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Option<String>,
}

impl Entry {
    fn is_open(&self) -> bool {
        self.ended_at.is_none()
    }

    fn close(&mut self, at: SystemTime, reason: EndReason) {
        if self.is_open() {
            self.ended_at = Some(unix_millis(at));
            self.end = Some(reason.to_string());
        }
    }
}

impl Record {
    /// The object of a lease granted for the first time.
    pub(crate) fn first(lease: &LeaseName, candidate: &CandidateId, ttl: Duration, now: SystemTime) -> Record {
        let empty = Record {
            format: FORMAT.into(),
            lease: lease.as_str().into(),
            term: 0,
            version: String::new(),
            holder: None,
            terms: Vec::new(),
        };
        empty.granted(candidate, ttl, now)
    }

    /// Reads and checks a lease object.
    pub(crate) fn decode(lease: &LeaseName, bytes: &[u8]) -> Result<Record> {
        let corrupt = |detail: String| Error::corrupt(STORE, lease, detail);
        let record: Record = serde_json::from_slice(bytes).map_err(|e| {
            corrupt(format!(
                "not a leasehold lease object ({} bytes): {}",
                bytes.len(),
                first_line(&e.to_string())
            ))
        })?;
        if record.format != FORMAT {
            return Err(corrupt(format!(
                "format {:?} is not {FORMAT:?} (written by another program or version)",
                shorten(&record.format)
            )));
        }
        if record.lease != lease.as_str() {
            return Err(corrupt(format!(
                "the object describes lease {:?}",
                shorten(&record.lease)
            )));
        }
        if record.term == 0 {
            return Err(corrupt("term 0 is not a term (1 or more)".into()));
        }
        RecordVersion::parse(&record.version)
            .ok_or_else(|| corrupt(format!("version {:?} is not 16 hex digits", shorten(&record.version))))?;
        let last = record.terms.last().ok_or_else(|| corrupt("terms is empty".into()))?;
        if last.term != record.term {
            return Err(corrupt(format!(
                "the last entry of terms is term {}, the object's term is {}",
                last.term, record.term
            )));
        }
        let mut previous = 0;
        for (i, entry) in record.terms.iter().enumerate() {
            if entry.term <= previous {
                return Err(corrupt(format!("terms: term {} follows term {previous}", entry.term)));
            }
            previous = entry.term;
            CandidateId::new(entry.holder.as_str())
                .map_err(|e| corrupt(format!("terms: term {}: holder: {e}", entry.term)))?;
            match (entry.ended_at, entry.end.as_deref()) {
                (None, None) if i + 1 == record.terms.len() => {}
                (None, None) => return Err(corrupt(format!("terms: term {} is open but not the last", entry.term))),
                (Some(_), Some(end)) => {
                    end.parse::<EndReason>()
                        .map_err(|e| corrupt(format!("terms: term {}: end: {e}", entry.term)))?;
                }
                _ => {
                    return Err(corrupt(format!(
                        "terms: term {}: ended_at and end must be both set or both missing",
                        entry.term
                    )));
                }
            }
        }
        match &record.holder {
            None if last.is_open() => {
                return Err(corrupt(format!(
                    "term {} is open but the lease has no holder",
                    last.term
                )));
            }
            None => {}
            Some(holder) => {
                record.holder_info(lease)?;
                if holder.reserved {
                    if last.end.as_deref() != Some("handed_over") {
                        return Err(corrupt(format!(
                            "reserved for {:?}, but term {} did not end handed_over",
                            shorten(&holder.id),
                            last.term
                        )));
                    }
                } else if !last.is_open() || last.holder != holder.id {
                    return Err(corrupt(format!(
                        "holder {:?} does not hold the open term {}",
                        shorten(&holder.id),
                        last.term
                    )));
                }
            }
        }
        Ok(record)
    }

    /// The document to write.
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }

    /// The record version (16 hex digits), also the holder's grant token.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// The last term granted.
    pub(crate) fn term(&self) -> Term {
        Term(self.term)
    }

    /// The holder, checked as every backend checks it (the term is the object's).
    pub(crate) fn holder_info(&self, lease: &LeaseName) -> Result<Option<HolderInfo>> {
        let Some(holder) = &self.holder else { return Ok(None) };
        let fields = HolderFields {
            id: &holder.id,
            term: self.term.into(),
            ttl_ms: holder.ttl_ms.into(),
            version: &self.version,
            store_remaining: None,
        };
        let mut info = HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?;
        info.reserved = holder.reserved;
        Ok(Some(info))
    }

    /// Whether `candidate` holds the lease at `term`, not merely reserved for it.
    pub(crate) fn is_held_by(&self, candidate: &CandidateId, term: Term) -> bool {
        self.term == term.0
            && self
                .holder
                .as_ref()
                .is_some_and(|h| h.id == candidate.as_str() && !h.reserved)
    }

    /// The candidate the object names as holder (held or reserved).
    pub(crate) fn holder_id(&self) -> Option<&str> {
        self.holder.as_ref().map(|h| h.id.as_str())
    }

    /// What a candidate is told about the lease (a decoded record's holder is valid).
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        let previous_end = match &self.holder {
            Some(_) => None,
            None => self.terms.last().and_then(|e| e.end.as_deref()?.parse().ok()),
        };
        Observation {
            lease: lease.clone(),
            holder: self.holder_info(lease).ok().flatten(),
            last_term: Term(self.term),
            previous_end,
        }
    }

    /// The recorded terms, oldest first.
    pub(crate) fn transitions(&self) -> Vec<Transition> {
        self.terms
            .iter()
            .map(|e| Transition {
                term: Term(e.term),
                holder: CandidateId::new(e.holder.as_str()).expect("checked by decode"),
                acquired_at: from_unix_millis(e.acquired_at),
                ended: e
                    .ended_at
                    .zip(e.end.as_deref().and_then(|end| end.parse().ok()))
                    .map(|(at, reason)| (from_unix_millis(at), reason)),
            })
            .collect()
    }

    /// The next term for `candidate`: an open term before it ends expired (its holder stopped
    /// renewing, or is `candidate` itself campaigning anew); a reserved or free lease's last
    /// term has ended already.
    pub(crate) fn granted(mut self, candidate: &CandidateId, ttl: Duration, now: SystemTime) -> Record {
        if let Some(last) = self.terms.last_mut() {
            last.close(now, EndReason::Expired);
        }
        self.term += 1;
        self.terms.push(Entry {
            term: self.term,
            holder: candidate.as_str().into(),
            acquired_at: unix_millis(now),
            ended_at: None,
            end: None,
        });
        let excess = self.terms.len().saturating_sub(MAX_TERMS);
        self.terms.drain(..excess);
        self.holder = Some(Holder {
            id: candidate.as_str().into(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            reserved: false,
        });
        self.with_new_version()
    }

    /// The same holder and term, with a new version.
    pub(crate) fn renewed(self) -> Record {
        self.with_new_version()
    }

    /// Free, keeping the term: the open term ends for `reason` (a reservation's term ended
    /// handed over already).
    pub(crate) fn ended(mut self, reason: EndReason, now: SystemTime) -> Record {
        if let Some(last) = self.terms.last_mut() {
            last.close(now, reason);
        }
        self.holder = None;
        self.with_new_version()
    }

    /// Reserved for `to` at the same term, which ends handed over.
    pub(crate) fn handed_over(mut self, to: &CandidateId, ttl: Duration, now: SystemTime) -> Record {
        if let Some(last) = self.terms.last_mut() {
            last.close(now, EndReason::HandedOver);
        }
        self.holder = Some(Holder {
            id: to.as_str().into(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            reserved: true,
        });
        self.with_new_version()
    }

    fn with_new_version(mut self) -> Record {
        self.version = RecordVersion::random().into();
        self
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().chars().take(200).collect()
}

/// At most 40 characters of something read from the store.
fn shorten(text: &str) -> String {
    let shown: String = text.chars().take(40).collect();
    if shown.len() < text.len() {
        format!("{shown}...")
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> LeaseName {
        LeaseName::new("jobs").unwrap()
    }

    fn id(name: &str) -> CandidateId {
        CandidateId::new(name).unwrap()
    }

    fn round_trip(record: &Record) -> Record {
        Record::decode(&lease(), &record.encode()).unwrap()
    }

    #[test]
    fn a_lease_lives_its_terms() {
        let now = SystemTime::now();
        let ttl = Duration::from_secs(10);
        let first = round_trip(&Record::first(&lease(), &id("a"), ttl, now));
        assert_eq!(first.term(), Term(1));
        assert!(first.is_held_by(&id("a"), Term(1)));
        let renewed = round_trip(&first.clone().renewed());
        assert_ne!(renewed.version(), first.version(), "every write has a new version");
        let free = round_trip(&renewed.ended(EndReason::Released, now));
        let seen = free.observation(&lease());
        assert_eq!((seen.holder, seen.last_term), (None, Term(1)));
        assert_eq!(seen.previous_end, Some(EndReason::Released));
        let second = round_trip(&free.granted(&id("b"), ttl, now));
        assert_eq!(second.term(), Term(2));
        let reserved = round_trip(&second.handed_over(&id("c"), ttl, now));
        let holder = reserved.observation(&lease()).holder.unwrap();
        assert!(holder.reserved && holder.id == id("c") && holder.term == Term(2));
        assert!(!reserved.is_held_by(&id("c"), Term(2)));
        let third = round_trip(&reserved.granted(&id("c"), ttl, now));
        let taken = round_trip(&third.granted(&id("d"), ttl, now));
        let ends: Vec<_> = taken
            .transitions()
            .iter()
            .map(|t| (t.term.0, t.holder.to_string(), t.ended.map(|(_, why)| why)))
            .collect();
        assert_eq!(
            ends,
            [
                (1, "a".into(), Some(EndReason::Released)),
                (2, "b".into(), Some(EndReason::HandedOver)),
                (3, "c".into(), Some(EndReason::Expired)),
                (4, "d".into(), None),
            ]
        );
    }

    #[test]
    fn history_keeps_the_last_terms() {
        let now = SystemTime::now();
        let mut record = Record::first(&lease(), &id("a"), Duration::from_secs(1), now);
        for _ in 0..MAX_TERMS + 10 {
            record = record.granted(&id("a"), Duration::from_secs(1), now);
        }
        let record = round_trip(&record);
        assert_eq!(record.transitions().len(), MAX_TERMS);
        assert_eq!(record.transitions().last().unwrap().term, record.term());
    }

    #[test]
    fn garbage_names_the_problem() {
        let now = SystemTime::now();
        let good = Record::first(&lease(), &id("a"), Duration::from_secs(5), now);
        let json = String::from_utf8(good.encode()).unwrap();
        let version = good.version().to_string();
        for (bad, why) in [
            ("hello".to_string(), "not a leasehold lease object"),
            ("{}".to_string(), "not a leasehold lease object"),
            (json.replace(FORMAT, "other/9"), "format \"other/9\""),
            (json.replace("\"jobs\"", "\"other\""), "describes lease \"other\""),
            (json.replace(&version, "xyz"), "version \"xyz\""),
            (json.replace("\"ttl_ms\":5000", "\"ttl_ms\":0"), "ttl_ms 0"),
            (
                json.replacen("\"term\":1,", "\"term\":2,", 1),
                "the last entry of terms is term 1",
            ),
            (
                json.replace(",\"holder\":{\"id\":\"a\",\"ttl_ms\":5000}", ""),
                "term 1 is open but the lease has no holder",
            ),
            (
                json.replace("{\"id\":\"a\"", "{\"id\":\"b\""),
                "does not hold the open term",
            ),
            (
                json.replace("\"acquired_at\"", "\"end\":\"released\",\"acquired_at\""),
                "ended_at and end must be both set",
            ),
        ] {
            let err = Record::decode(&lease(), bad.as_bytes()).unwrap_err();
            assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
            assert!(err.to_string().contains(why), "{bad}: {err}");
            assert!(err.to_string().lines().count() == 1, "{err}");
        }
    }
}
