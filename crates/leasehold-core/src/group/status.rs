//! What a listing shows of a group ([`GroupStatus`]), and the names of its leases.

use super::record::Claim;
use crate::error::Result;
use crate::shard_record::ShardRecord;
use crate::types::{CandidateId, LeaseName, Observation, Term};

/// What a store shows of a group: its members and the owner of each shard.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group.
    pub group: LeaseName,
    /// Members holding a member lease, by id.
    pub members: Vec<GroupMember>,
    /// Every shard the store has a record of, by shard number.
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

/// A shard, as its record shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The shard number.
    pub shard: u32,
    /// The record's owner and the term of the owner's member lease it is scoped to (`None`:
    /// released, free to claim).
    pub owner: Option<(CandidateId, Term)>,
    /// The shard's fencing term: one higher on every change of owner.
    pub term: Term,
    /// Whether the owner leads its member lease at the record's member term, as the member
    /// listing shows it: its claim holds. A record whose owner does not is claimable (its owner
    /// no longer believes it).
    pub live: bool,
    /// The record as the store keeps it.
    pub record: ShardRecord,
}

impl ShardStatus {
    /// The shard's live owner and the shard's fencing term, if any: `None` while the record is
    /// free or names a member that no longer leads the member lease it names.
    pub fn owner(&self) -> Option<(&CandidateId, Term)> {
        self.owner.as_ref().filter(|_| self.live).map(|(id, _)| (id, self.term))
    }
}

pub(super) fn shard_lease(group: &LeaseName, shard: u32, shards: u32) -> Result<LeaseName> {
    let width = (shards.saturating_sub(1)).to_string().len();
    LeaseName::new(format!("{group}.s.{shard:0width$}"))
}

/// The members of a group in a listing of `{group}.m.`: each held member lease (other names
/// are ignored), by id.
pub(super) fn members(group: &LeaseName, listing: Vec<Observation>) -> Vec<GroupMember> {
    let members_prefix = format!("{group}.m.");
    let mut members = Vec::new();
    for lease in listing {
        let Some(rest) = lease.lease.as_str().strip_prefix(&members_prefix) else {
            continue;
        };
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
    }
    members.sort_by(|a, b| a.id.cmp(&b.id));
    members
}

/// The shard number of a record named `{group}.s.{shard}`.
pub(super) fn shard_number(group: &LeaseName, record: &ShardRecord) -> Option<u32> {
    let rest = record.name.as_str().strip_prefix(group.as_str())?.strip_prefix(".s.")?;
    rest.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| rest.parse().ok())
        .flatten()
}

/// The shards of a group from its records (other names are ignored), by number, judged live
/// against `members`.
///
/// # Errors
///
/// [`Error::CorruptRecord`](crate::Error::CorruptRecord) for a record that is not leasehold's.
pub(super) fn shards(
    store: &'static str,
    group: &LeaseName,
    records: Vec<ShardRecord>,
    members: &[GroupMember],
) -> Result<Vec<ShardStatus>> {
    let mut shards = Vec::new();
    for record in records {
        let Some(shard) = shard_number(group, &record) else {
            continue;
        };
        let claim = Claim::parse(store, &record)?;
        let term = claim.term();
        let owner = match claim {
            Claim::Owned { owner, member_term, .. } => Some((owner, member_term)),
            Claim::Free { .. } => None,
        };
        let live = owner.as_ref().is_some_and(|(id, member_term)| {
            members
                .iter()
                .any(|m| m.id == *id && m.lease.holder.as_ref().is_some_and(|h| h.term == *member_term))
        });
        shards.push(ShardStatus {
            shard,
            owner,
            term,
            live,
            record,
        });
    }
    shards.sort_by_key(|s| s.shard);
    Ok(shards)
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

    fn member(id: &str, term: u64) -> GroupMember {
        let lease = LeaseName::new(format!("g.m.{:016x}-w1", fnv1a(id))).unwrap();
        GroupMember {
            id: CandidateId::new(id).unwrap(),
            weight: 1,
            lease: Observation {
                lease,
                holder: Some(HolderInfo {
                    id: CandidateId::new(id).unwrap(),
                    term: Term(term),
                    ttl: Duration::from_secs(2),
                    version: "v".into(),
                    store_remaining: None,
                    orphaned: false,
                    reserved: false,
                }),
                last_term: Term(term),
                previous_end: None,
            },
        }
    }

    fn record(name: &str, value: &str) -> ShardRecord {
        ShardRecord {
            name: LeaseName::new(name).unwrap(),
            version: "1".into(),
            value: value.into(),
        }
    }

    #[test]
    fn an_owner_counts_only_under_its_current_member_term() {
        let group = LeaseName::new("g").unwrap();
        let records = vec![
            record("g.s.1", "leasehold1 owned 4 3 b"),
            record("g.s.0", "leasehold1 owned 7 2 b"),
            record("g.s.2", "leasehold1 free 9"),
            record("g.sx", "leasehold1 free 1"),
        ];
        let shards = shards("m", &group, records, &[member("b", 3)]).unwrap();
        let seen: Vec<(u32, Option<(&CandidateId, Term)>)> = shards.iter().map(|s| (s.shard, s.owner())).collect();
        let b = CandidateId::new("b").unwrap();
        assert_eq!(seen, vec![(0, None), (1, Some((&b, Term(4)))), (2, None)]);
        assert!(!shards[0].live, "b leads its member lease at term 3, not 2");
    }
}
