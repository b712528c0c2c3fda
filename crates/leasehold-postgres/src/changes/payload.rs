//! The payloads of the notification channels: a change `<schema>/<lease>/<by>[\n<flag>]` and a
//! grant announcement `<schema>/<lease>\n<term>\n<ttl_ms>\n<version>\n<holder>`.

use std::time::Duration;

use leasehold_core::{HolderFields, HolderInfo, LeaseName, Observation};

use crate::error::STORE;
use crate::record::TTL_RANGE;
use crate::sql::{HANDOVER, QUEUED};

/// A grant announcement of this store, `<schema>/<lease>\n<term>\n<ttl_ms>\n<version>\n<holder>`:
/// the lease and the rest (see [`granted`]).
pub(super) fn granted_lease<'p>(payload: &'p str, prefix: &str) -> Option<(&'p str, &'p str)> {
    payload.strip_prefix(prefix)?.split_once('\n')
}

/// The holder a grant announcement names (the part after the lease, see [`granted_lease`]), as
/// `inspect` would show it right after the grant (the full TTL remaining).
pub(super) fn granted(lease: &LeaseName, fields: &str) -> leasehold_core::Result<Observation> {
    let mut lines = fields.splitn(4, '\n');
    let (Some(term), Some(ttl_ms), Some(version), Some(id)) = (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err(leasehold_core::Error::corrupt(
            STORE,
            lease,
            format!("grant announcement: {} lines, expected 4", fields.split('\n').count()),
        ));
    };
    let store_remaining = ttl_ms.parse::<u64>().ok().map(Duration::from_millis);
    let fields = HolderFields {
        id,
        term: term.into(),
        ttl_ms: ttl_ms.into(),
        version,
        store_remaining,
    };
    let info = HolderInfo::from_record(STORE, lease, fields, &TTL_RANGE)?;
    Ok(Observation {
        lease: lease.clone(),
        last_term: info.term,
        holder: Some(info),
        previous_end: None,
    })
}

/// What a notification says, beyond the lease and who made the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind<'p> {
    /// A takeover, a break, an expiry, or a release that did not give a lock back: everyone
    /// looks.
    Any,
    /// A release that gave its lock back: the head of the queue wakes by the lock.
    Queued,
    /// A handover to this successor: only it can take the lease now.
    HandOver(&'p str),
}

/// A `<schema>/<lease>/<by>[\n<flag>]` payload of this store: the lease, who made the change, and
/// what kind of change it is.
pub(super) fn parse<'p>(payload: &'p str, prefix: &str) -> Option<(&'p str, &'p str, Kind<'p>)> {
    let (change, flag) = match payload.split_once('\n') {
        Some((change, flag)) => (change, Some(flag)),
        None => (payload, None),
    };
    // Lease names have no '/', candidate ids may.
    let (lease, by) = change.strip_prefix(prefix)?.split_once('/')?;
    let kind = match flag {
        Some(QUEUED) => Kind::Queued,
        Some(flag) => flag.strip_prefix(HANDOVER).map_or(Kind::Any, Kind::HandOver),
        None => Kind::Any,
    };
    Some((lease, by, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_the_lease_the_candidate_and_a_queued_release() {
        assert_eq!(parse("s/a/c1", "s/"), Some(("a", "c1", Kind::Any)));
        assert_eq!(parse("s/a/team/c1\nqueued", "s/"), Some(("a", "team/c1", Kind::Queued)));
        assert_eq!(
            parse("s/a/c1\nhandover:team/c2", "s/"),
            Some(("a", "c1", Kind::HandOver("team/c2")))
        );
        assert_eq!(parse("s/a/c1\nsomething-else", "s/"), Some(("a", "c1", Kind::Any)));
        assert_eq!(parse("other/a/c1\nqueued", "s/"), None);
        assert_eq!(parse("s/a", "s/"), None);
    }

    #[test]
    fn a_grant_announcement_reads_as_an_observation_and_is_no_change() {
        let lease = LeaseName::new("a").unwrap();
        let payload = "s/a\n17\n2000\n00112233aabbccdd\nteam/c 1";
        // Not a change of this store, whichever schema (were it on the changes' channel).
        assert_eq!(parse(payload, "s/"), None);
        assert_eq!(parse(payload, "s/a\n17/"), None);
        let (name, fields) = granted_lease(payload, "s/").unwrap();
        assert_eq!(name, "a");
        assert_eq!(granted_lease(payload, "t/"), None);
        let seen = granted(&lease, fields).unwrap();
        assert_eq!(seen.last_term, leasehold_core::Term(17));
        let holder = seen.holder.unwrap();
        assert_eq!(holder.id.as_str(), "team/c 1");
        assert_eq!(holder.term, leasehold_core::Term(17));
        assert_eq!(holder.ttl, Duration::from_millis(2000));
        assert_eq!(holder.store_remaining, Some(Duration::from_millis(2000)));
        assert!(!holder.orphaned && !holder.reserved);
        for bad in [
            "17\n2000\n00112233aabbccdd",
            "x\n2000\n00112233aabbccdd\nc",
            "17\n2000\nzz\nc",
        ] {
            assert!(granted(&lease, bad).is_err(), "{bad:?}");
        }
    }
}
