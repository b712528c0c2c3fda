//! What a listing shows of a group ([`GroupStatus`]), and the names of its leases.

use crate::error::Result;
use crate::types::{CandidateId, LeaseName, Observation, Term};

/// What a store shows of a group: its members and the holder of each shard lease.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group.
    pub group: LeaseName,
    /// Members holding a member lease, by id.
    pub members: Vec<GroupMember>,
    /// Every shard lease the store has a record of, by shard number.
    pub shards: Vec<ShardStatus>,
}

/// A member of a group, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupMember {
    /// Its id.
    pub id: CandidateId,
    /// Its weight.
    pub weight: u32,
    /// The member lease's record, as [`LeaseStore::inspect`](crate::LeaseStore::inspect) would show it.
    pub lease: Observation,
}

/// A shard, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The shard number.
    pub shard: u32,
    /// Its lease's record: the owner (`holder`) and its term, or free with the last term.
    pub lease: Observation,
}

impl ShardStatus {
    /// The holder of the shard's lease and its term, if any. `None` also while the lease is
    /// reserved for a hand-over's successor that has not taken it yet (`lease.holder` then shows
    /// that successor, `reserved`, with the previous holder's term): nobody runs the shard then.
    pub fn owner(&self) -> Option<(&CandidateId, Term)> {
        self.lease
            .holder
            .as_ref()
            .filter(|h| !h.reserved)
            .map(|h| (&h.id, h.term))
    }
}

pub(super) fn shard_lease(group: &LeaseName, shard: u32, shards: u32) -> Result<LeaseName> {
    let width = (shards.saturating_sub(1)).to_string().len();
    LeaseName::new(format!("{group}.s.{shard:0width$}"))
}

/// Sorts a listing of `{group}.` into members and shards; other names are ignored.
pub(super) fn parse(group: &LeaseName, listing: Vec<Observation>) -> GroupStatus {
    let mut members = Vec::new();
    let mut shards = Vec::new();
    let members_prefix = format!("{group}.m.");
    let shards_prefix = format!("{group}.s.");
    for lease in listing {
        let name = lease.lease.as_str();
        if let Some(rest) = name.strip_prefix(&members_prefix) {
            let weight = rest
                .split_once("-w")
                .filter(|(hash, _)| hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|(_, w)| w.parse::<u32>().ok());
            if let (Some(weight), Some(holder)) = (weight, &lease.holder) {
                members.push(GroupMember {
                    id: holder.id.clone(),
                    weight,
                    lease: lease.clone(),
                });
            }
        } else if let Some(rest) = name.strip_prefix(&shards_prefix)
            && rest.bytes().all(|b| b.is_ascii_digit())
            && let Ok(shard) = rest.parse::<u32>()
        {
            shards.push(ShardStatus { shard, lease });
        }
    }
    members.sort_by(|a, b| a.id.cmp(&b.id));
    shards.sort_by_key(|s| s.shard);
    GroupStatus {
        group: group.clone(),
        members,
        shards,
    }
}

/// FNV-1a, 64 bits: a stable short name for a member id in its lease name.
pub(super) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::types::HolderInfo;

    fn shard(reserved: bool) -> ShardStatus {
        let lease = LeaseName::new("g.s.0").unwrap();
        ShardStatus {
            shard: 0,
            lease: Observation {
                lease,
                holder: Some(HolderInfo {
                    id: CandidateId::new("b").unwrap(),
                    term: Term(7),
                    ttl: Duration::from_secs(2),
                    version: "v".into(),
                    store_remaining: None,
                    orphaned: false,
                    reserved,
                }),
                last_term: Term(7),
                previous_end: None,
            },
        }
    }

    #[test]
    fn a_reserved_successor_is_not_the_owner_yet() {
        let held = shard(false);
        assert_eq!(held.owner(), Some((&CandidateId::new("b").unwrap(), Term(7))));
        assert_eq!(shard(true).owner(), None);
    }
}
