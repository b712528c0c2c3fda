//! Reading what the scripts answer: every field is checked, and garbage becomes
//! [`Error::CorruptRecord`] naming the lease (the holder fields by [`HolderInfo::from_record`],
//! as on every backend); the history stream; and the keys [`list`](leasehold_core::LeaseStore::list)
//! finds.

use std::time::Duration;

use leasehold_core::{
    CandidateId, EndReason, Error, HolderFields, HolderInfo, LeaseName, Observation, Result, Term, Transition, time,
};
use redis::Value;

use crate::config::RedisConfig;
use crate::conn::Reply;
use crate::error::{self, RedisStoreError, STORE};

/// The TTLs the Redis store accepts: 10 ms to 24 h.
///
/// Redis keeps expiry times in milliseconds; a TTL that is not a whole number of milliseconds is
/// rounded up, so the server never lets go earlier than asked.
pub const TTL_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_millis(10)..=Duration::from_secs(24 * 3600);

/// What a script answered about a lease.
pub(crate) enum Answer {
    Granted(Term),
    Renewed,
    Done,
    Broken(Option<Term>),
    Seen(Observation),
    History {
        open: Option<(Term, u64)>,
        entries: Vec<Value>,
    },
}

/// Reads a reply, turning `corrupt` and `starting` into errors.
pub(crate) fn answer(lease: &LeaseName, reply: &Reply) -> Result<Answer> {
    let op = reply.operation;
    let term = |i| parse_term(lease, reply.text(i)?);
    match reply.status()? {
        "granted" => Ok(Answer::Granted(term(1)?)),
        "renewed" => Ok(Answer::Renewed),
        "ok" => Ok(Answer::Done),
        "broken" => Ok(Answer::Broken(Some(term(1)?))),
        "none" => Ok(Answer::Broken(None)),
        "free" => {
            let previous_end = match reply.text(2)? {
                "" => None,
                other => Some(
                    other
                        .parse::<EndReason>()
                        .map_err(|e| error::unexpected(op, format!("end reason: {e}")))?,
                ),
            };
            Ok(Answer::Seen(Observation::free(lease.clone(), term(1)?, previous_end)))
        }
        "held" => {
            let remaining = Duration::from_millis(parse_number(lease, "pttl", reply.text(5)?)?);
            let fields = HolderFields {
                id: reply.text(1)?,
                term: reply.text(2)?.into(),
                ttl_ms: reply.text(3)?.into(),
                version: reply.text(4)?,
                store_remaining: Some(remaining),
            };
            let mut info = HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?;
            info.reserved = reply.text(7)? == "1";
            let last_term = term(6)?.max(info.term);
            Ok(Answer::Seen(Observation {
                lease: lease.clone(),
                holder: Some(info),
                last_term,
                previous_end: None,
            }))
        }
        "history" => {
            let open = match reply.array(1)? {
                [] => None,
                [t, deadline] => Some((
                    parse_term(lease, bulk(op, t)?)?,
                    parse_number(lease, "deadline", bulk(op, deadline)?)?,
                )),
                other => return Err(error::unexpected(op, format!("open term {other:?}"))),
            };
            Ok(Answer::History {
                open,
                entries: reply.array(2)?.to_vec(),
            })
        }
        "corrupt" => Err(Error::corrupt(STORE, lease, reply.text(1)?)),
        "starting" => {
            let uptime = parse_number(lease, "uptime", reply.text(1)?)?;
            let needed = parse_number(lease, "needed", reply.text(2)?)?;
            Err(Error::store(
                STORE,
                RedisStoreError::RecentRestart {
                    uptime: Duration::from_secs(uptime),
                    needed: Duration::from_secs(needed),
                },
            ))
        }
        other => Err(error::unexpected(op, format!("status {other:?}"))),
    }
}

pub(crate) fn bulk<'v>(operation: &'static str, value: &'v Value) -> Result<&'v str> {
    match value {
        Value::BulkString(bytes) => {
            std::str::from_utf8(bytes).map_err(|_| error::unexpected(operation, "a field is not UTF-8"))
        }
        Value::SimpleString(s) => Ok(s),
        other => Err(error::unexpected(operation, format!("{other:?}, expected text"))),
    }
}

fn parse_term(lease: &LeaseName, text: &str) -> Result<Term> {
    parse_number(lease, "term", text).map(Term)
}

fn parse_number(lease: &LeaseName, what: &str, text: &str) -> Result<u64> {
    text.parse()
        .map_err(|_| Error::corrupt(STORE, lease, format!("{what} {text:?} is not a number")))
}

/// Builds the transitions of a lease from its history stream, newest entry first.
pub(crate) fn transitions(
    lease: &LeaseName,
    open: Option<(Term, u64)>,
    entries: &[Value],
    limit: usize,
) -> Result<Vec<Transition>> {
    let corrupt = |detail: String| Error::corrupt(STORE, lease, format!("history: {detail}"));
    let mut out: Vec<Transition> = Vec::new();
    for entry in entries.iter().rev() {
        let Value::Array(parts) = entry else {
            return Err(corrupt(format!("entry {entry:?}")));
        };
        let [id, Value::Array(fields)] = parts.as_slice() else {
            return Err(corrupt(format!("entry {entry:?}")));
        };
        let id = bulk("history", id)?;
        let fields = fields
            .iter()
            .map(|f| bulk("history", f))
            .collect::<Result<Vec<&str>>>()?;
        let at_ms = id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .ok_or_else(|| corrupt(format!("entry id {id:?}")))?;
        match fields.as_slice() {
            ["grant", term, "holder", holder, "ttl", _] => {
                let holder = CandidateId::new(*holder).map_err(|e| corrupt(format!("entry {id}: {e}")))?;
                out.push(Transition {
                    term: parse_term(lease, term)?,
                    holder,
                    acquired_at: time::from_unix_millis(at_ms),
                    ended: None,
                });
            }
            ["end", term, "reason", reason, "at", at] => {
                let reason = reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("entry {id}: end reason: {e}")))?;
                let term = parse_term(lease, term)?;
                let at = time::from_unix_millis(parse_number(lease, "end time", at)?);
                // An end whose grant was trimmed away is dropped with it.
                if let Some(t) = out.iter_mut().rev().find(|t| t.term == term) {
                    t.ended = Some((at, reason));
                }
            }
            _ => return Err(corrupt(format!("entry {id} has fields {fields:?}"))),
        }
    }
    if let Some((term, deadline)) = open
        && let Some(t) = out.iter_mut().rev().find(|t| t.term == term && t.ended.is_none())
    {
        t.ended = Some((time::from_unix_millis(deadline), EndReason::Expired));
    }
    let skip = out.len().saturating_sub(limit);
    out.drain(..skip);
    Ok(out)
}

/// Keys `SCAN` looks at per step of [`LeaseStore::list`].
pub(crate) const SCAN_COUNT: usize = 1000;

/// Leases inspected by one script of [`LeaseStore::list`].
pub(crate) const LIST_BATCH: usize = 250;

/// Inspection scripts of one [`LeaseStore::list`] sent at once.
pub(crate) const LIST_IN_FLIGHT: usize = 16;

/// `text` with Redis's glob characters (`*`, `?`, `[`, `]`, `\`) escaped.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The lease whose lease or state key `key` is, if its name starts with `prefix`.
pub(crate) fn lease_of_key(config: &RedisConfig, key: &str, prefix: &str) -> Option<LeaseName> {
    let rest = key.strip_prefix(config.prefix.as_str())?;
    let name = rest
        .strip_prefix("lease:{")
        .or_else(|| rest.strip_prefix("state:{"))?
        .strip_suffix('}')?;
    let lease = LeaseName::new(name).ok().filter(|l| l.as_str().starts_with(prefix))?;
    let keys = config.keys(&lease);
    (key == keys.lease || key == keys.state).then_some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![text(id), Value::Array(fields.iter().map(|f| text(f)).collect())])
    }

    #[test]
    fn list_patterns_are_literal_and_only_lease_and_state_keys_name_leases() {
        assert_eq!(glob_escape(r"a*b?[c]\d-_%"), r"a\*b\?\[c\]\\d-_%");
        let config = RedisConfig::new("localhost", 6379);
        let prefix = &config.prefix;
        let lease = |key: &str, wanted: &str| lease_of_key(&config, key, wanted).map(|l| l.to_string());
        assert_eq!(lease(&format!("{prefix}lease:{{a-1}}"), "a-"), Some("a-1".into()));
        assert_eq!(lease(&format!("{prefix}state:{{a-1}}"), ""), Some("a-1".into()));
        assert_eq!(lease(&format!("{prefix}state:{{a-1}}"), "b"), None);
        for foreign in [
            format!("{prefix}history:{{a-1}}"),
            format!("{prefix}changes:{{a-1}}"),
            format!("{prefix}lease:{{a-1}}x"),
            format!("{prefix}lease:{{a/1}}"),
            format!("{prefix}ltase:{{a-1}}"),
            "other:lease:{a-1}".to_string(),
        ] {
            assert_eq!(lease(&foreign, ""), None, "{foreign}");
        }
    }

    #[test]
    fn history_pairs_grants_with_ends() {
        let lease = LeaseName::new("x").unwrap();
        // Newest first, as XREVRANGE answers; term 7's grant was trimmed away.
        let entries = vec![
            entry("1700000004000-0", &["grant", "10", "holder", "c", "ttl", "1000"]),
            entry(
                "1700000003500-0",
                &["end", "9", "reason", "expired", "at", "1700000003400"],
            ),
            entry("1700000003000-0", &["grant", "9", "holder", "b", "ttl", "1000"]),
            entry(
                "1700000002000-0",
                &["end", "8", "reason", "released", "at", "1700000002000"],
            ),
            entry("1700000001000-0", &["grant", "8", "holder", "a", "ttl", "1000"]),
            entry(
                "1700000000500-0",
                &["end", "7", "reason", "broken", "at", "1700000000500"],
            ),
        ];
        let all = transitions(&lease, Some((Term(10), 1700000005000)), &entries, 10).unwrap();
        let summary: Vec<_> = all
            .iter()
            .map(|t| (t.term.0, t.holder.as_str().to_string(), t.ended.map(|(_, r)| r)))
            .collect();
        assert_eq!(
            summary,
            vec![
                (8, "a".into(), Some(EndReason::Released)),
                (9, "b".into(), Some(EndReason::Expired)),
                (10, "c".into(), Some(EndReason::Expired)),
            ]
        );
        assert_eq!(all[0].acquired_at, time::from_unix_millis(1700000001000));
        assert_eq!(all[1].ended.unwrap().0, time::from_unix_millis(1700000003400));
        let last = transitions(&lease, None, &entries, 1).unwrap();
        assert_eq!((last.len(), last[0].term, last[0].ended), (1, Term(10), None));
    }

    #[test]
    fn foreign_history_entries_are_corrupt() {
        let lease = LeaseName::new("x").unwrap();
        for bad in [
            vec![entry("1-0", &["hello", "world"])],
            vec![entry("1-0", &["grant", "ten", "holder", "c", "ttl", "1"])],
            vec![entry("1-0", &["end", "1", "reason", "bored", "at", "1"])],
            vec![entry("x-0", &["grant", "1", "holder", "c", "ttl", "1"])],
            vec![text("not an entry")],
        ] {
            match transitions(&lease, None, &bad, 10) {
                Err(Error::CorruptRecord { lease: named, .. }) => assert_eq!(named, "x"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
