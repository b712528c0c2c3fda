//! What leasehold writes into znodes: small line-based text records, each starting with a
//! format line, so that anything else is recognised as foreign and reported, never guessed.

use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{CandidateId, EndReason, Error, HolderInfo, LeaseName, Observation, Result, Term, Transition};
use zookeeper_client as zk;

use crate::error::{STORE, map};
use crate::state::Inner;

const CANDIDATE_FORMAT: &str = "leasehold-candidate/1";
const HISTORY_FORMAT: &str = "leasehold-term/1";
const RESERVATION_FORMAT: &str = "leasehold-reserved/1";

/// The prefix of the version a reserved lease shows ([`HolderInfo::version`]): the reservation's
/// generation follows it. Candidate znode names, the versions of held leases, start with `c-`.
const RESERVATION_VERSION: &str = "reserved-";

/// How many terms of history are kept per lease; older `history/` znodes are deleted.
pub const HISTORY_LIMIT: usize = 1000;

/// The data of a candidate's ephemeral sequential znode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CandidateRecord {
    pub(crate) candidate: CandidateId,
    pub(crate) ttl: Duration,
    /// The candidate waits for change notifications: a release hands the lease straight to it.
    pub(crate) waiting: bool,
}

impl CandidateRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{CANDIDATE_FORMAT}\ncandidate {}\nttl_ms {}\nwaiting {}\n",
            self.candidate,
            self.ttl.as_millis(),
            u8::from(self.waiting)
        )
        .into_bytes()
    }

    pub(crate) fn decode(data: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(data).map_err(|_| "candidate znode data is not UTF-8".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(CANDIDATE_FORMAT) {
            return Err(format!(
                "candidate znode data is not a {CANDIDATE_FORMAT} record: {}",
                preview(data)
            ));
        }
        let (mut candidate, mut ttl, mut waiting) = (None, None, false);
        for line in lines {
            match line.split_once(' ') {
                Some(("waiting", flag)) => waiting = flag == "1",
                Some(("candidate", id)) => candidate = CandidateId::new(id).ok(),
                Some(("ttl_ms", ms)) => ttl = ms.parse::<u64>().ok().map(Duration::from_millis),
                _ => return Err(format!("unexpected line in candidate record: {line:?}")),
            }
        }
        match (candidate, ttl) {
            (Some(candidate), Some(ttl)) => Ok(CandidateRecord {
                candidate,
                ttl,
                waiting,
            }),
            _ => Err("candidate record lacks a valid candidate or ttl_ms".to_string()),
        }
    }
}

/// The data of a persistent `history/{term}` znode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HistoryRecord {
    pub(crate) holder: CandidateId,
    pub(crate) acquired_at: SystemTime,
    pub(crate) ended: Option<(SystemTime, EndReason)>,
}

impl HistoryRecord {
    pub(crate) fn new(holder: CandidateId) -> Self {
        HistoryRecord {
            holder,
            acquired_at: SystemTime::now(),
            ended: None,
        }
    }

    pub(crate) fn ended(mut self, reason: EndReason) -> Self {
        self.ended = Some((SystemTime::now(), reason));
        self
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{HISTORY_FORMAT}\nholder {}\nacquired_ms {}\n",
            self.holder,
            millis(self.acquired_at)
        );
        if let Some((at, reason)) = self.ended {
            text.push_str(&format!("ended_ms {} {reason}\n", millis(at)));
        }
        text.into_bytes()
    }

    pub(crate) fn decode(data: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(data).map_err(|_| "history znode data is not UTF-8".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(HISTORY_FORMAT) {
            return Err(format!(
                "history znode data is not a {HISTORY_FORMAT} record: {}",
                preview(data)
            ));
        }
        let (mut holder, mut acquired_at, mut ended) = (None, None, None);
        for line in lines {
            match line.split_once(' ') {
                Some(("holder", id)) => holder = CandidateId::new(id).ok(),
                Some(("acquired_ms", ms)) => acquired_at = ms.parse::<u64>().ok().map(from_millis),
                Some(("ended_ms", rest)) => {
                    let (ms, reason) = rest.split_once(' ').ok_or("ended_ms without a reason")?;
                    let reason = reason.parse::<EndReason>()?;
                    let at = ms.parse::<u64>().map_err(|_| "ended_ms is not a number")?;
                    ended = Some((from_millis(at), reason));
                }
                _ => return Err(format!("unexpected line in history record: {line:?}")),
            }
        }
        match (holder, acquired_at) {
            (Some(holder), Some(acquired_at)) => Ok(HistoryRecord {
                holder,
                acquired_at,
                ended,
            }),
            _ => Err("history record lacks a valid holder or acquired_ms".to_string()),
        }
    }

    pub(crate) fn transition(&self, term: Term) -> Transition {
        Transition {
            term,
            holder: self.holder.clone(),
            acquired_at: self.acquired_at,
            ended: self.ended,
        }
    }
}

/// The data of the persistent `reserved` znode of a lease: the holder of term `term` handed the
/// lease over to `to` ([`LeaseStore::hand_over`](leasehold_core::LeaseStore::hand_over)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReservationRecord {
    pub(crate) to: CandidateId,
    /// The handed-over term.
    pub(crate) term: Term,
    /// The handed-over grant's TTL: how long contenders watch the reservation before taking over.
    pub(crate) ttl: Duration,
    /// The data version of the lease's znode that the handover set. Taking or ending the
    /// reservation is conditional on it, so a later reservation at the same path is never taken
    /// for this one; it is also the version the lease shows while reserved.
    pub(crate) generation: i32,
}

impl ReservationRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{RESERVATION_FORMAT}\nto {}\nterm {}\nttl_ms {}\ngeneration {}\n",
            self.to,
            self.term,
            self.ttl.as_millis(),
            self.generation
        )
        .into_bytes()
    }

    pub(crate) fn decode(data: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(data).map_err(|_| "reserved znode data is not UTF-8".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(RESERVATION_FORMAT) {
            return Err(format!(
                "reserved znode data is not a {RESERVATION_FORMAT} record: {}",
                preview(data)
            ));
        }
        let (mut to, mut term, mut ttl, mut generation) = (None, None, None, None);
        for line in lines {
            match line.split_once(' ') {
                Some(("to", id)) => to = Some(CandidateId::new(id).map_err(|e| format!("reserved znode: to: {e}"))?),
                Some(("term", n)) => {
                    term = Some(
                        n.parse::<u64>()
                            .map(Term)
                            .map_err(|_| format!("reserved znode: term {n:?} is not a number"))?,
                    )
                }
                Some(("ttl_ms", ms)) => {
                    ttl = Some(
                        ms.parse::<u64>()
                            .map(Duration::from_millis)
                            .map_err(|_| format!("reserved znode: ttl_ms {ms:?} is not a number"))?,
                    )
                }
                Some(("generation", n)) => {
                    generation = Some(
                        n.parse::<i32>()
                            .map_err(|_| format!("reserved znode: generation {n:?} is not a number"))?,
                    )
                }
                _ => return Err(format!("unexpected line in reserved znode: {line:?}")),
            }
        }
        match (to, term, ttl, generation) {
            (Some(to), Some(term), Some(ttl), Some(generation)) => Ok(ReservationRecord {
                to,
                term,
                ttl,
                generation,
            }),
            _ => Err("reserved znode lacks one of to, term, ttl_ms, generation".to_string()),
        }
    }

    /// The version the reserved lease shows, which a takeover names.
    pub(crate) fn version(&self) -> String {
        format!("{RESERVATION_VERSION}{}", self.generation)
    }

    /// The lease as everyone sees it while reserved: held by `to` at the handed-over term, and
    /// orphaned: nothing on the server ends a reservation by itself, so contenders take it over
    /// once they have seen it unchanged for its TTL.
    pub(crate) fn observation(&self, lease: &LeaseName) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: Some(HolderInfo {
                id: self.to.clone(),
                term: self.term,
                ttl: self.ttl,
                version: self.version(),
                orphaned: true,
                reserved: true,
                store_remaining: None,
            }),
            last_term: self.term,
            previous_end: None,
        }
    }
}

/// A stable 64-bit FNV-1a hash (the same in every process and Rust version): names the znode
/// whose creation wakes a handover's successor.
pub(crate) fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The znode name of a term's history entry: zero-padded so names sort like terms.
pub(crate) fn history_name(term: Term) -> String {
    format!("t-{:020}", term.0)
}

pub(crate) fn parse_history_name(name: &str) -> Option<Term> {
    name.strip_prefix("t-")
        .filter(|d| d.len() == 20)
        .and_then(|d| d.parse().ok())
        .map(Term)
}

/// The name of the znode a grant creates and deletes again under `{lease}/leader/`: it says who
/// now holds the lease, as `inspect` would show it, to every session that keeps a persistent
/// recursive watch there (the watch event carries the path, so nobody needs to read anything).
/// `t-{term}-{holder's znode}-{ttl_ms}-{candidate id in hex}`.
pub(crate) fn announcement_name(term: Term, node: &str, ttl: Duration, candidate: &CandidateId) -> String {
    let hex: String = candidate.as_str().bytes().map(|b| format!("{b:02x}")).collect();
    format!("{}-{node}-{}-{hex}", history_name(term), ttl.as_millis())
}

/// The holder an announcement names, as [`holder_observation`] shows it; `None` for a name
/// that is not an announcement.
pub(crate) fn parse_announcement(lease: &LeaseName, name: &str) -> Option<Observation> {
    let term = parse_history_name(name.get(..22)?)?;
    let rest = name.get(22..)?.strip_prefix('-')?;
    let (rest, hex) = rest.rsplit_once('-')?;
    let (node, ttl_ms) = rest.rsplit_once('-')?;
    let ttl = Duration::from_millis(ttl_ms.parse().ok()?);
    if hex.len() % 2 != 0 || !node.starts_with("c-") {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let candidate = CandidateId::new(String::from_utf8(bytes).ok()?).ok()?;
    Some(Observation {
        lease: lease.clone(),
        holder: Some(HolderInfo {
            id: candidate,
            term,
            ttl,
            version: node.to_string(),
            orphaned: false,
            reserved: false,
            store_remaining: None,
        }),
        last_term: term,
        previous_end: None,
    })
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn preview(data: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(&data[..data.len().min(32)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    format!("{} bytes starting {shown:?}", data.len())
}

/// One child of `candidates/`.
#[derive(Clone, Debug)]
pub(crate) struct Child {
    pub(crate) name: String,
    pub(crate) seq: i64,
}

/// The children of `candidates/` in sequence order: the queue.
pub(crate) fn parse_queue(lease: &LeaseName, children: Vec<String>) -> Result<Vec<Child>> {
    let mut queue = Vec::with_capacity(children.len());
    for name in children {
        let seq = name
            .strip_prefix("c-")
            .and_then(|rest| rest.rsplit_once('-'))
            .filter(|(tag, seq)| tag.len() == 16 && seq.len() >= 10)
            .and_then(|(_, seq)| seq.parse::<i64>().ok())
            .ok_or_else(|| Error::corrupt(STORE, lease, format!("foreign znode {name:?} among the candidates")))?;
        queue.push(Child { name, seq });
    }
    queue.sort_by_key(|c| c.seq);
    Ok(queue)
}

pub(crate) fn holder_observation(
    lease: &LeaseName,
    name: &str,
    record: &CandidateRecord,
    stat: &zk::Stat,
) -> Observation {
    let term = Term(stat.czxid as u64);
    Observation {
        lease: lease.clone(),
        holder: Some(HolderInfo {
            id: record.candidate.clone(),
            term,
            ttl: record.ttl,
            version: name.to_string(),
            orphaned: false,
            reserved: false,
            store_remaining: None,
        }),
        last_term: term,
        previous_end: None,
    }
}

impl Inner {
    pub(crate) fn lease_dir(&self, lease: &LeaseName) -> String {
        format!("{}/{}", self.config.chroot().trim_end_matches('/'), lease)
    }

    pub(crate) fn candidates_dir(&self, lease: &LeaseName) -> String {
        format!("{}/candidates", self.lease_dir(lease))
    }

    pub(crate) fn history_dir(&self, lease: &LeaseName) -> String {
        format!("{}/history", self.lease_dir(lease))
    }

    /// Where grants announce the new holder (see [`announcement_name`]).
    pub(crate) fn leader_dir(&self, lease: &LeaseName) -> String {
        format!("{}/leader", self.lease_dir(lease))
    }

    /// The announcement of a grant: see [`announcement_name`].
    pub(crate) fn announcement_path(
        &self,
        lease: &LeaseName,
        term: Term,
        node: &str,
        ttl: Duration,
        candidate: &CandidateId,
    ) -> String {
        format!(
            "{}/{}",
            self.leader_dir(lease),
            announcement_name(term, node, ttl, candidate)
        )
    }

    /// The persistent znode that reserves the lease for a handover's successor (absent otherwise).
    pub(crate) fn reserved_path(&self, lease: &LeaseName) -> String {
        format!("{}/reserved", self.lease_dir(lease))
    }

    /// The znode a handover creates and deletes again at once, to wake its successor's change
    /// stream (which watches for its creation): only the successor is woken.
    pub(crate) fn doorbell_path(&self, lease: &LeaseName, to: &CandidateId) -> String {
        format!("{}/wake-{:016x}", self.lease_dir(lease), stable_hash(to.as_str()))
    }

    pub(crate) fn candidate_path(&self, lease: &LeaseName, name: &str) -> String {
        format!("{}/{name}", self.candidates_dir(lease))
    }

    /// The name prefix of this store's znodes for `candidate` (the server appends a sequence).
    pub(crate) fn prefix(&self, candidate: &CandidateId) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.nonce.hash(&mut hasher);
        candidate.hash(&mut hasher);
        format!("c-{:016x}-", hasher.finish())
    }

    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.config.auth().is_empty() {
            zk::Acls::anyone_all()
        } else {
            zk::Acls::creator_all()
        }
    }

    /// The candidates queue in sequence order; `None` when the lease has no znodes yet.
    pub(crate) async fn queue(&self, client: &zk::Client, lease: &LeaseName) -> Result<Option<Vec<Child>>> {
        Ok(self.queue_at(client, lease).await?.map(|(queue, _)| queue))
    }

    /// As [`Inner::queue`], with the zxid of the listing's last change (`pzxid`): a znode whose
    /// `czxid` is larger was queued after the listing.
    pub(crate) async fn queue_at(&self, client: &zk::Client, lease: &LeaseName) -> Result<Option<(Vec<Child>, i64)>> {
        let (children, stat) = match client.get_children(&self.candidates_dir(lease)).await {
            Ok(listed) => listed,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e)),
        };
        Ok(Some((parse_queue(lease, children)?, stat.pzxid)))
    }

    /// Reads a candidate znode: its record and stat; `None` if it is gone.
    pub(crate) async fn read_candidate(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        name: &str,
    ) -> Result<Option<(CandidateRecord, zk::Stat)>> {
        match client.get_data(&self.candidate_path(lease, name)).await {
            Ok((data, stat)) => {
                let record = CandidateRecord::decode(&data)
                    .map_err(|detail| Error::corrupt(STORE, lease, format!("candidate znode {name}: {detail}")))?;
                Ok(Some((record, stat)))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e)),
        }
    }

    /// The lease's reservation, if it has one.
    pub(crate) async fn read_reservation(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
    ) -> Result<Option<ReservationRecord>> {
        match client.get_data(&self.reserved_path(lease)).await {
            Ok((data, _)) => ReservationRecord::decode(&data)
                .map(Some)
                .map_err(|detail| Error::corrupt(STORE, lease, detail)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e)),
        }
    }

    /// The newest history entry: its term and how it ended.
    pub(crate) async fn last_history(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
    ) -> Result<Option<(Term, HistoryRecord)>> {
        let terms = self.history_terms(client, lease).await?;
        let Some(&term) = terms.last() else { return Ok(None) };
        Ok(self
            .read_history(client, lease, term)
            .await?
            .map(|record| (term, record)))
    }

    pub(crate) async fn history_terms(&self, client: &zk::Client, lease: &LeaseName) -> Result<Vec<Term>> {
        let names = match client.list_children(&self.history_dir(lease)).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(map(e)),
        };
        let mut terms = names
            .iter()
            .map(|name| {
                parse_history_name(name)
                    .ok_or_else(|| Error::corrupt(STORE, lease, format!("foreign znode {name:?} in the history")))
            })
            .collect::<Result<Vec<_>>>()?;
        terms.sort();
        Ok(terms)
    }

    pub(crate) async fn read_history(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        term: Term,
    ) -> Result<Option<HistoryRecord>> {
        let path = format!("{}/{}", self.history_dir(lease), history_name(term));
        match client.get_data(&path).await {
            Ok((data, _)) => HistoryRecord::decode(&data)
                .map(Some)
                .map_err(|detail| Error::corrupt(STORE, lease, format!("history of term {term}: {detail}"))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn records_round_trip() {
        let c = CandidateRecord {
            candidate: CandidateId::new("host-1 (eu)").unwrap(),
            ttl: Duration::from_millis(1500),
            waiting: true,
        };
        assert_eq!(CandidateRecord::decode(&c.encode()).unwrap(), c);
        let h = HistoryRecord::new(c.candidate.clone()).ended(EndReason::Released);
        let back = HistoryRecord::decode(&h.encode()).unwrap();
        assert_eq!(back.holder, h.holder);
        assert_eq!(back.ended.map(|e| e.1), Some(EndReason::Released));
        assert_eq!(parse_history_name(&history_name(Term(42))), Some(Term(42)));
    }

    #[test]
    fn announcements_name_the_holder_as_inspect_shows_it() {
        let lease = LeaseName::new("jobs").unwrap();
        let id = CandidateId::new("host-1 (eu)/ü-2").unwrap();
        let node = "c-0123456789abcdef-0000000042";
        let name = announcement_name(Term(77), node, Duration::from_millis(1500), &id);
        assert!(!name.contains('/'), "{name}");
        let record = CandidateRecord {
            candidate: id.clone(),
            ttl: Duration::from_millis(1500),
            waiting: false,
        };
        let stat = zk::Stat {
            czxid: 77,
            mzxid: 77,
            pzxid: 77,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 1,
            data_length: 0,
            num_children: 0,
        };
        assert_eq!(
            parse_announcement(&lease, &name),
            Some(holder_observation(&lease, node, &record, &stat))
        );
        for garbage in [
            "",
            "t-00000000000000000077",
            "x-00000000000000000077-c-a-1-61",
            "t-00000000000000000077-c-a-1-6",
        ] {
            assert_eq!(parse_announcement(&lease, garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn handed_over_terms_and_reservations_round_trip() {
        let h = HistoryRecord::new(CandidateId::new("a").unwrap()).ended(EndReason::HandedOver);
        let back = HistoryRecord::decode(&h.encode()).unwrap();
        assert_eq!(back.ended.map(|e| e.1), Some(EndReason::HandedOver));
        let r = ReservationRecord {
            to: CandidateId::new("host-2 (eu)").unwrap(),
            term: Term(17_179_869_193),
            ttl: Duration::from_millis(2500),
            generation: 7,
        };
        assert_eq!(ReservationRecord::decode(&r.encode()).unwrap(), r);
        let seen = r.observation(&LeaseName::new("jobs").unwrap());
        let holder = seen.holder.unwrap();
        assert!(holder.reserved && holder.orphaned);
        assert_eq!(
            (holder.id, holder.term, holder.version.as_str()),
            (r.to.clone(), r.term, "reserved-7")
        );
        assert_eq!(seen.last_term, r.term);
    }

    /// Each broken field of a reservation is named.
    #[test]
    fn a_garbled_reservation_names_what_is_wrong() {
        let cases: [(&[u8], &str); 6] = [
            (b"garbage", "not a leasehold-reserved/1 record"),
            (
                b"leasehold-reserved/1\nto c\nterm x\nttl_ms 1\ngeneration 1\n",
                "term \"x\"",
            ),
            (
                b"leasehold-reserved/1\nto c\nterm 1\nttl_ms -1\ngeneration 1\n",
                "ttl_ms \"-1\"",
            ),
            (
                b"leasehold-reserved/1\nto c\nterm 1\nttl_ms 1\ngeneration z\n",
                "generation \"z\"",
            ),
            (b"leasehold-reserved/1\nto c\nterm 1\nttl_ms 1\n", "lacks one of"),
            (b"leasehold-reserved/1\nto c\nwho 1\n", "unexpected line"),
        ];
        for (data, named) in cases {
            let error = ReservationRecord::decode(data).unwrap_err();
            assert!(error.contains(named), "{error:?} should say {named:?}");
        }
    }

    #[test]
    fn the_doorbell_hash_is_stable() {
        // FNV-1a 64 test vectors: the same in every process, so a handover rings the right bell.
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    pub(crate) fn garbage_is_an_error() {
        for bad in [&b"garbage"[..], b"\xff\xfe", b"", b"leasehold-candidate/1\nttl_ms x\n"] {
            assert!(CandidateRecord::decode(bad).is_err());
            assert!(HistoryRecord::decode(bad).is_err());
        }
    }
}
