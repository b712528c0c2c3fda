//! What leasehold writes into znodes: small line-based text records, each starting with a
//! format line, so that anything else is recognised as foreign and reported, never guessed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{CandidateId, EndReason, Term, Transition};

const CANDIDATE_FORMAT: &str = "leasehold-candidate/1";
const HISTORY_FORMAT: &str = "leasehold-term/1";

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
                    let reason = match reason {
                        "released" => EndReason::Released,
                        "expired" => EndReason::Expired,
                        "broken" => EndReason::Broken,
                        other => return Err(format!("unknown end reason {other:?}")),
                    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
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
    fn garbage_is_an_error() {
        for bad in [&b"garbage"[..], b"\xff\xfe", b"", b"leasehold-candidate/1\nttl_ms x\n"] {
            assert!(CandidateRecord::decode(bad).is_err());
            assert!(HistoryRecord::decode(bad).is_err());
        }
    }
}
