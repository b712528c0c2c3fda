//! What leasehold keeps in blob metadata: the lease record, the history entries, the grant token
//! and the lease id of a candidate.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use azure_core::http::headers::{HeaderName, Headers};
use azure_core::time::OffsetDateTime;
use leasehold_core::time::{from_unix_millis, unix_millis};
use leasehold_core::{CandidateId, EndReason, Error, HolderInfo, LeaseName, Observation, Result, Term, Transition};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};

use crate::config::TTL_RANGE;
use crate::error::STORE;

/// Metadata keys (valid C# identifiers, as Azure requires; lower case, as Azure reports them).
pub(crate) const TERM: &str = "leasehold_term";
pub(crate) const HOLDER: &str = "leasehold_holder";
pub(crate) const TTL: &str = "leasehold_ttl_ms";
pub(crate) const ACQUIRED: &str = "leasehold_acquired_ms";
pub(crate) const STATE: &str = "leasehold_state";
pub(crate) const ENDED: &str = "leasehold_ended_ms";
pub(crate) const END: &str = "leasehold_end";
/// On a leased record: handed over to its holder at this term (which equals the record's term),
/// not taken yet. Code that does not know the key reads the record as leased by the successor.
pub(crate) const RESERVED_TERM: &str = "leasehold_reserved_term";

/// Candidate ids may hold any printable character; metadata values must be plain header text.
const HOLDER_ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Where a term stands in the lease blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Written by a candidate before it takes the blob lease: the claim counts as held for its
    /// TTL after the blob's Last-Modified, by the server's clock.
    Claimed,
    /// The candidate took the blob lease: held while the blob is leased.
    Leased,
    /// Broken by an operator.
    Broken,
    /// A claim withdrawn before it was leased.
    Released,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Claimed => "claimed",
            State::Leased => "leased",
            State::Broken => "broken",
            State::Released => "released",
        }
    }
}

/// The lease record in the metadata of the lease blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) holder: CandidateId,
    pub(crate) term: Term,
    pub(crate) ttl: Duration,
    pub(crate) acquired_ms: u64,
    pub(crate) state: State,
    /// Handed over to `holder` by the holder of `term` ([`LeaseStore::hand_over`]), whose blob
    /// lease now has the id [`reserved_lease_id`] of `holder`: `holder` has not taken it yet.
    /// Only on a [`State::Leased`] record.
    ///
    /// [`LeaseStore::hand_over`]: leasehold_core::LeaseStore::hand_over
    pub(crate) reserved: bool,
}

impl Record {
    pub(crate) fn encode(&self) -> HashMap<String, String> {
        let mut metadata = HashMap::from([
            (TERM.to_string(), self.term.0.to_string()),
            (HOLDER.to_string(), encode_holder(&self.holder)),
            (TTL.to_string(), self.ttl.as_millis().to_string()),
            (ACQUIRED.to_string(), self.acquired_ms.to_string()),
            (STATE.to_string(), self.state.as_str().to_string()),
        ]);
        if self.reserved {
            metadata.insert(RESERVED_TERM.to_string(), self.term.0.to_string());
        }
        metadata
    }

    /// Reads the record; `None` for a blob leasehold has not written a record to yet.
    pub(crate) fn decode(lease: &LeaseName, metadata: &HashMap<String, String>) -> Result<Option<Record>> {
        let ours = |k: &str| k.to_ascii_lowercase().starts_with("leasehold");
        if !metadata.keys().any(|k| ours(k)) {
            return Ok(None);
        }
        let fields = Fields {
            lease,
            metadata,
            what: "lease blob",
        };
        let term = Term(fields.number(TERM)?);
        let state = match fields.get(STATE)? {
            "claimed" => State::Claimed,
            "leased" => State::Leased,
            "broken" => State::Broken,
            "released" => State::Released,
            other => return Err(fields.bad(STATE, other, "not claimed, leased, broken or released")),
        };
        // Written by a grant, so within what Azure allows; anything else is foreign (and a huge
        // TTL would overflow the engine's deadlines).
        let ttl_ms = fields.number(TTL)?;
        let ttl = Duration::from_millis(ttl_ms);
        if !TTL_RANGE.contains(&ttl) {
            return Err(fields.bad(TTL, &ttl_ms.to_string(), "not a TTL Azure allows (15 to 60 s)"));
        }
        // Every write replaces all metadata, so a reservation key is always the latest write's.
        let reserved = match metadata.get(RESERVED_TERM) {
            None => false,
            Some(value) if state == State::Leased && value.parse() == Ok(term.0) => true,
            Some(value) => {
                return Err(fields.bad(
                    RESERVED_TERM,
                    value,
                    &format!("a reservation must be of the record's term {term}, on a leased record"),
                ));
            }
        };
        Ok(Some(Record {
            holder: fields.holder()?,
            term,
            ttl,
            acquired_ms: fields.number(ACQUIRED)?,
            state,
            reserved,
        }))
    }
}

/// One history blob: a term, who held it, and how it ended once known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) holder: CandidateId,
    pub(crate) acquired_ms: u64,
    pub(crate) end: Option<(u64, EndReason)>,
}

impl Entry {
    /// The entry of `record`'s term, not ended yet.
    pub(crate) fn of(record: &Record) -> Entry {
        Entry {
            holder: record.holder.clone(),
            acquired_ms: record.acquired_ms,
            end: None,
        }
    }

    pub(crate) fn encode(&self) -> HashMap<String, String> {
        let mut metadata = HashMap::from([
            (HOLDER.to_string(), encode_holder(&self.holder)),
            (ACQUIRED.to_string(), self.acquired_ms.to_string()),
        ]);
        if let Some((at, reason)) = self.end {
            metadata.insert(ENDED.to_string(), at.to_string());
            metadata.insert(END.to_string(), reason.to_string());
        }
        metadata
    }

    pub(crate) fn decode(lease: &LeaseName, metadata: &HashMap<String, String>) -> Result<Entry> {
        let fields = Fields {
            lease,
            metadata,
            what: "history blob",
        };
        let end = match metadata.get(END) {
            None => None,
            Some(reason) => {
                let reason = reason
                    .parse::<EndReason>()
                    .map_err(|e| fields.bad(END, reason, &e.to_string()))?;
                Some((fields.number(ENDED)?, reason))
            }
        };
        Ok(Entry {
            holder: fields.holder()?,
            acquired_ms: fields.number(ACQUIRED)?,
            end,
        })
    }

    pub(crate) fn transition(&self, term: Term) -> Transition {
        Transition {
            term,
            holder: self.holder.clone(),
            acquired_at: from_unix_millis(self.acquired_ms),
            ended: self.end.map(|(at, reason)| (from_unix_millis(at), reason)),
        }
    }
}

struct Fields<'a> {
    lease: &'a LeaseName,
    metadata: &'a HashMap<String, String>,
    what: &'static str,
}

impl Fields<'_> {
    fn get(&self, key: &'static str) -> Result<&str> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| Error::corrupt(STORE, self.lease, format!("{}: metadata {key} is missing", self.what)))
    }

    fn bad(&self, key: &'static str, value: &str, why: &str) -> Error {
        let shown: String = value.chars().take(64).collect();
        Error::corrupt(
            STORE,
            self.lease,
            format!("{}: metadata {key} = {shown:?}: {why}", self.what),
        )
    }

    fn number(&self, key: &'static str) -> Result<u64> {
        let value = self.get(key)?;
        value.parse().map_err(|_| self.bad(key, value, "not a number"))
    }

    fn holder(&self) -> Result<CandidateId> {
        let value = self.get(HOLDER)?;
        let decoded = percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| self.bad(HOLDER, value, "not UTF-8"))?;
        CandidateId::new(decoded.into_owned()).map_err(|_| self.bad(HOLDER, value, "not a candidate id"))
    }
}

fn encode_holder(holder: &CandidateId) -> String {
    utf8_percent_encode(holder.as_str(), HOLDER_ENCODE).to_string()
}

/// The blob lease id of `candidate` for `lease`: a UUID derived from both, so that a candidate
/// always proposes the same id and can recognise (and renew) a lease whose reply it lost.
pub(crate) fn lease_id(lease: &LeaseName, candidate: &CandidateId) -> String {
    uuid_of(b"leasehold-azure lease id\0", lease, candidate)
}

/// A UUID (version 8) derived from `domain`, `lease` and `candidate`.
fn uuid_of(domain: &[u8], lease: &LeaseName, candidate: &CandidateId) -> String {
    let mut hash = Sha256::new();
    hash.update(domain);
    hash.update(lease.as_str().as_bytes());
    hash.update(b"\0");
    hash.update(candidate.as_str().as_bytes());
    let digest = hash.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80; // UUID version 8 (custom)
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The blob lease id of a reservation for `candidate` (see [`Record::reserved`]): derived like
/// [`lease_id`] but different from it, so that nothing holding the candidate's own id (a grant of
/// the handed-over term, say) can renew or release the reservation; only the candidate's acquire
/// changes it to its own id.
pub(crate) fn reserved_lease_id(lease: &LeaseName, candidate: &CandidateId) -> String {
    uuid_of(b"leasehold-azure reserved lease id\0", lease, candidate)
}

/// The grant token (and record version): the lease id, the blob's ETag after the holder's last
/// metadata write, and when the term began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) lease_id: String,
    pub(crate) etag: String,
    pub(crate) acquired_ms: u64,
}

impl Token {
    pub(crate) fn parse(lease: &LeaseName, token: &str) -> Result<Token> {
        let mut parts = token.splitn(3, ';');
        let (Some(lease_id), Some(acquired), Some(etag)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Error::store(
                STORE,
                format!("grant token for lease {lease} is not an azure token"),
            ));
        };
        let acquired_ms = acquired
            .parse()
            .map_err(|_| Error::store(STORE, format!("grant token for lease {lease} is not an azure token")))?;
        Ok(Token {
            lease_id: lease_id.to_string(),
            etag: etag.to_string(),
            acquired_ms,
        })
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{};{};{}", self.lease_id, self.acquired_ms, self.etag)
    }
}

/// Now, in Unix milliseconds (the audit trail's clock; no decision depends on it).
pub(crate) fn now_ms() -> u64 {
    unix_millis(SystemTime::now())
}

/// The lease blob as this client last saw it.
#[derive(Clone, Debug)]
pub(crate) struct View {
    /// `None`: no blob.
    pub(crate) etag: Option<String>,
    pub(crate) record: Option<Record>,
    /// Whether the blob lease is active (leased or breaking).
    pub(crate) leased: bool,
    /// The blob's lease state as reported (`available`, `expired`, `broken`, ...).
    pub(crate) lease_state: String,
    /// Seconds from the blob's Last-Modified to the server's Date of the reply that showed it.
    pub(crate) age_secs: Option<i64>,
}

impl View {
    pub(crate) fn absent() -> View {
        View {
            etag: None,
            record: None,
            leased: false,
            lease_state: String::new(),
            age_secs: None,
        }
    }

    pub(crate) fn last_term(&self) -> Term {
        self.record.as_ref().map(|r| r.term).unwrap_or_default()
    }

    /// A claim not yet turned into a blob lease still counts as held for its TTL (plus the two
    /// seconds the one-second resolution of the server's timestamps may hide), by the server's
    /// clock. A claim seen only from cache is treated as live.
    pub(crate) fn claim_live(&self) -> bool {
        match &self.record {
            Some(r) if r.state == State::Claimed && !self.leased => {
                self.age_secs.is_none_or(|age| age < claim_window_secs(r.ttl))
            }
            _ => false,
        }
    }

    /// The holder, if the blob is held.
    pub(crate) fn holder(&self) -> Option<&Record> {
        let record = self.record.as_ref()?;
        (self.leased || self.claim_live()).then_some(record)
    }

    pub(crate) fn previous_end(&self) -> Option<EndReason> {
        let record = self.record.as_ref()?;
        // A reservation nobody took: its term ended handed over.
        if record.reserved {
            return Some(EndReason::HandedOver);
        }
        Some(match record.state {
            State::Broken => EndReason::Broken,
            State::Released => EndReason::Released,
            State::Claimed => EndReason::Expired,
            State::Leased => match self.lease_state.as_str() {
                "expired" => EndReason::Expired,
                "broken" => EndReason::Broken,
                _ => EndReason::Released,
            },
        })
    }

    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        match self.holder() {
            Some(r) => Observation {
                lease: lease.clone(),
                holder: Some(HolderInfo {
                    id: r.holder.clone(),
                    term: r.term,
                    ttl: r.ttl,
                    version: Token {
                        lease_id: lease_id(lease, &r.holder),
                        etag: self.etag.clone().unwrap_or_default(),
                        acquired_ms: r.acquired_ms,
                    }
                    .to_string(),
                    orphaned: false,
                    reserved: r.reserved,
                    store_remaining: None,
                }),
                last_term: r.term,
                previous_end: None,
            },
            None => Observation::free(lease.clone(), self.last_term(), self.previous_end()),
        }
    }
}

fn claim_window_secs(ttl: Duration) -> i64 {
    i64::from(lease_seconds(ttl)) + 2
}

/// Azure takes whole seconds; rounding up keeps the promise that nobody else gets the lease
/// before `ttl` has passed.
pub(crate) fn lease_seconds(ttl: Duration) -> i32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

pub(crate) const ETAG: HeaderName = HeaderName::from_static("etag");
const DATE: HeaderName = HeaderName::from_static("date");
const LAST_MODIFIED: HeaderName = HeaderName::from_static("last-modified");
const LEASE_STATE: HeaderName = HeaderName::from_static("x-ms-lease-state");
const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");

fn header<'h>(headers: &'h Headers, name: &HeaderName) -> Option<&'h str> {
    headers.get_optional_str(name)
}

pub(crate) fn etag_of(lease: &LeaseName, headers: &Headers) -> Result<String> {
    header(headers, &ETAG)
        .map(str::to_string)
        .ok_or_else(|| Error::store(STORE, format!("the reply for lease {lease} has no ETag")))
}

pub(crate) fn view_of(lease: &LeaseName, headers: &Headers) -> Result<View> {
    let etag = etag_of(lease, headers)?;
    let length: u64 = header(headers, &CONTENT_LENGTH)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let metadata: HashMap<String, String> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().to_ascii_lowercase();
            key.strip_prefix("x-ms-meta-")
                .map(|k| (k.to_string(), value.as_str().to_string()))
        })
        .collect();
    let parse = |name: &HeaderName| header(headers, name).and_then(|v| azure_core::time::parse_rfc7231(v).ok());
    BlobState {
        etag,
        length,
        metadata,
        lease_state: header(headers, &LEASE_STATE).unwrap_or("available"),
        date: parse(&DATE),
        modified: parse(&LAST_MODIFIED),
    }
    .view(lease)
}

/// What a reply says about a lease blob: the headers of its properties, or an item of a blob
/// listing (see `list.rs`).
pub(crate) struct BlobState<'a> {
    pub(crate) etag: String,
    /// Content length: a lease blob has none.
    pub(crate) length: u64,
    /// Metadata, keys without `x-ms-meta-`.
    pub(crate) metadata: HashMap<String, String>,
    /// `available`, `leased`, `expired`, `breaking` or `broken`, any case.
    pub(crate) lease_state: &'a str,
    /// The server's time of the reply.
    pub(crate) date: Option<OffsetDateTime>,
    /// The blob's Last-Modified.
    pub(crate) modified: Option<OffsetDateTime>,
}

impl BlobState<'_> {
    /// The lease blob as this reply shows it, its record checked.
    pub(crate) fn view(self, lease: &LeaseName) -> Result<View> {
        if self.length > 0 {
            return Err(Error::corrupt(
                STORE,
                lease,
                format!(
                    "the lease blob has {} bytes of content: not a leasehold lease blob",
                    self.length
                ),
            ));
        }
        let metadata: HashMap<String, String> = self
            .metadata
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let record = Record::decode(lease, &metadata)?;
        let lease_state = self.lease_state.to_ascii_lowercase();
        let age_secs = match (self.date, self.modified) {
            (Some(date), Some(modified)) => Some((date - modified).whole_seconds()),
            _ => None,
        };
        Ok(View {
            etag: Some(self.etag),
            record,
            leased: matches!(lease_state.as_str(), "leased" | "breaking"),
            lease_state,
            age_secs: age_secs.or(Some(0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> LeaseName {
        LeaseName::new("jobs").unwrap()
    }

    #[test]
    fn records_round_trip() {
        let record = Record {
            holder: CandidateId::new("host-1 (eu) ünïcode/;=").unwrap(),
            term: Term(42),
            ttl: Duration::from_secs(15),
            acquired_ms: 1_700_000_000_000,
            state: State::Leased,
            reserved: false,
        };
        let metadata = record.encode();
        assert!(
            metadata.values().all(|v| v.bytes().all(|b| b.is_ascii_graphic())),
            "{metadata:?}"
        );
        assert_eq!(Record::decode(&lease(), &metadata).unwrap(), Some(record.clone()));
        let reserved = Record {
            reserved: true,
            ..record
        };
        let metadata = reserved.encode();
        assert_eq!(metadata.get(RESERVED_TERM).map(String::as_str), Some("42"));
        assert_eq!(Record::decode(&lease(), &metadata).unwrap(), Some(reserved));
        assert_eq!(
            Record::decode(&lease(), &HashMap::from([("other".into(), "x".into())])).unwrap(),
            None
        );
    }

    #[test]
    fn garbage_names_the_lease_and_field() {
        let mut metadata = Record {
            holder: CandidateId::new("a").unwrap(),
            term: Term(1),
            ttl: Duration::from_secs(15),
            acquired_ms: 1,
            state: State::Claimed,
            reserved: false,
        }
        .encode();
        metadata.insert(TERM.into(), "garbage".into());
        let err = Record::decode(&lease(), &metadata).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptRecord { lease, .. } if lease == "jobs"),
            "{err:?}"
        );
        assert!(err.to_string().contains(TERM), "{err}");
        for ttl in ["0", "14999", "60001", &u64::MAX.to_string()] {
            let mut metadata = metadata.clone();
            metadata.insert(TERM.into(), "1".into());
            metadata.insert(TTL.into(), ttl.to_string());
            let err = Record::decode(&lease(), &metadata).unwrap_err();
            assert!(err.to_string().contains(TTL), "{ttl}: {err}");
        }
        metadata.insert(TERM.into(), "1".into());
        for (state, reserved) in [("leased", "yes"), ("leased", "2"), ("claimed", "1")] {
            let mut metadata = metadata.clone();
            metadata.insert(STATE.into(), state.into());
            metadata.insert(RESERVED_TERM.into(), reserved.into());
            let err = Record::decode(&lease(), &metadata).unwrap_err();
            assert!(
                matches!(&err, Error::CorruptRecord { lease, .. } if lease == "jobs")
                    && err.to_string().contains(RESERVED_TERM),
                "{state} {reserved}: {err}"
            );
        }
        metadata.remove(STATE);
        assert!(
            Record::decode(&lease(), &metadata)
                .unwrap_err()
                .to_string()
                .contains(STATE)
        );
    }

    #[test]
    fn lease_ids_are_stable_uuids() {
        let (a, b) = (CandidateId::new("a").unwrap(), CandidateId::new("b").unwrap());
        let id = lease_id(&lease(), &a);
        assert_eq!(id, lease_id(&lease(), &a));
        assert_ne!(id, lease_id(&lease(), &b));
        assert_ne!(id, lease_id(&LeaseName::new("other").unwrap(), &a));
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "8");
        let reserved = reserved_lease_id(&lease(), &a);
        assert_eq!(reserved, reserved_lease_id(&lease(), &a));
        assert_ne!(reserved, id, "a reservation is never held under the candidate's own id");
        assert_ne!(reserved, reserved_lease_id(&lease(), &b));
    }

    #[test]
    fn tokens_round_trip() {
        let token = Token {
            lease_id: "id".into(),
            etag: "\"0x1;2\"".into(),
            acquired_ms: 7,
        };
        assert_eq!(Token::parse(&lease(), &token.to_string()).unwrap(), token);
        assert!(Token::parse(&lease(), "nope").is_err());
    }
}
