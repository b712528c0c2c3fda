//! What a member judges from a listing of the member leases ([`View`]), how it times the
//! member leases of stores without a clock and clears those nobody renews, and the group's gauges.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use super::super::plan::Member;
use super::super::status::{GroupMember, members};
use super::{IMBALANCE, Inner, OWNED, Rounds, UNOWNED, UNOWNED_SECONDS};
use crate::elector::now;
use crate::types::{CandidateId, Expiry, LeaseName, Observation, Term};

/// What one listing of the member leases shows, as this member judges it.
pub(super) struct View {
    /// Live members, the member term each leads at, and since when its lease's version is seen.
    pub(super) live: Vec<(GroupMember, Term, Instant)>,
    /// Members whose leaving marker is live.
    pub(super) leavers: Vec<CandidateId>,
    /// Live members not moved to yet: where only a contender ends a record, a member lease
    /// counts as live until its version has been seen unchanged for a TTL, but as one to move
    /// shards to only once this member has seen it renewed (a member that joined after another
    /// died would otherwise move shards to the dead one, which nobody runs).
    pub(super) unconfirmed: Vec<CandidateId>,
    /// (id, member term) of every live member, this member's own included, in order.
    pub(super) membership: Vec<(CandidateId, Term)>,
    /// `membership` and the leavers: the records are read again when it changes.
    pub(super) read_key: Vec<(CandidateId, Term)>,
    /// Member leases (and markers) nobody renews any more: (name, TTL).
    pub(super) dead: Vec<(LeaseName, Duration)>,
    /// When the listing was judged.
    pub(super) at: Instant,
}

impl View {
    pub(super) fn of(inner: &Inner, rounds: &mut Rounds, listing: Vec<Observation>, my_term: Term) -> View {
        let at = now();
        let observed = inner.store.capabilities().expiry == Expiry::ObservedByContenders;
        // This member by its own lease (an earlier one under another weight is no member), each
        // other by its freshest live lease.
        let mut live: Vec<(GroupMember, Term, Instant)> = Vec::new();
        let mut dead = Vec::new();
        let mut leavers = Vec::new();
        let mut unconfirmed = Vec::new();
        for m in members(&inner.group, listing) {
            let Some(holder) = m.lease.holder.clone() else { continue };
            let alive = rounds.alive(&m.lease, observed, at);
            if m.weight == 0 {
                // A leaving marker: planned without, until its member lease ends.
                if alive {
                    leavers.push(m.id.clone());
                } else {
                    dead.push((m.lease.lease.clone(), holder.ttl));
                }
                continue;
            }
            let mine = m.lease.lease == *inner.member.lease();
            if !mine && alive && !rounds.confirmed(&m.lease, observed) {
                unconfirmed.push(m.id.clone());
            }
            if mine || (m.id != inner.id && alive) {
                let since = rounds.versions.get(&m.lease.lease).map_or(at, |v| v.1);
                match live.iter_mut().find(|(l, _, _)| l.id == m.id) {
                    Some(entry) if entry.2 >= since => {}
                    Some(entry) => *entry = (m, holder.term, since),
                    None => live.push((m, holder.term, since)),
                }
            } else if !alive {
                dead.push((m.lease.lease.clone(), holder.ttl));
            }
        }
        let mut membership: Vec<(CandidateId, Term)> = live
            .iter()
            .filter(|(m, _, _)| m.id != inner.id)
            .map(|(m, t, _)| (m.id.clone(), *t))
            .collect();
        membership.push((inner.id.clone(), my_term));
        membership.sort();
        // A leaver's marker changes what is planned: it counts as a change of membership.
        let mut read_key = membership.clone();
        read_key.extend(leavers.iter().map(|id| (id.clone(), Term(0))));
        View {
            live,
            leavers,
            unconfirmed,
            membership,
            read_key,
            dead,
            at,
        }
    }
}

impl Rounds {
    /// On stores where only a contender ends a record, nobody would ever end a dead member's
    /// lease, and listings would show it for ever: the first live member by id takes each over
    /// through an [`Elector`](crate::Elector) of its own (the engine's takeover by version, after
    /// its own TTL of watching) and resigns it at once.
    pub(super) fn clear(&mut self, inner: &Arc<Inner>, dead: Vec<(LeaseName, Duration)>) {
        while self.clearings.try_join_next().is_some() {}
        self.clearing.retain(|_, handle| !handle.is_finished());
        for (lease, ttl) in dead {
            if self.clearing.contains_key(&lease) {
                continue;
            }
            let elector = crate::Elector::builder(inner.store.clone(), lease.as_str())
                .ttl(ttl)
                .candidate_id(inner.id.as_str())
                .hand_over_requests(false)
                .build();
            let Ok(elector) = elector else { continue };
            let limit = ttl * 4;
            let handle = self.clearings.spawn(async move {
                if let Ok(Ok(leader)) = tokio::time::timeout(limit, elector.campaign()).await {
                    info!(lease = %leader.lease(), "cleared the lease of a member that stopped renewing it");
                    leader.resign().await;
                }
            });
            self.clearing.insert(lease, handle);
        }
    }

    /// Whether a held member lease counts as alive: on stores without a clock (and for orphaned
    /// records), only until its version has been seen unchanged for its TTL (the engine's
    /// record-version rule: its holder's last renewal was sent before the listing that first
    /// showed the version, so the holder stopped believing in it within a TTL of that listing).
    fn alive(&mut self, lease: &Observation, observed: bool, at: Instant) -> bool {
        let Some(holder) = &lease.holder else { return false };
        let seen = self
            .versions
            .entry(lease.lease.clone())
            .or_insert_with(|| (holder.version.clone(), at));
        if seen.0 != holder.version {
            *seen = (holder.version.clone(), at);
            self.renewed.insert(lease.lease.clone());
        }
        if !observed && !holder.orphaned {
            return true;
        }
        at < seen.1 + holder.ttl
    }

    /// Whether a live member lease is one to plan shards for: where the store ends it itself,
    /// yes; where only a contender does (or for an orphaned row), once its version has been seen
    /// change.
    fn confirmed(&self, lease: &Observation, observed: bool) -> bool {
        let orphaned = lease.holder.as_ref().is_some_and(|h| h.orphaned);
        (!observed && !orphaned) || self.renewed.contains(&lease.lease)
    }
}

/// Records the group's gauges as this member sees them.
pub(super) fn record_metrics(
    inner: &Inner,
    rounds: &Rounds,
    owners: &[Option<CandidateId>],
    members: &[Member],
    at: Instant,
) {
    let group = inner.group.to_string();
    let owned: BTreeSet<u32> = inner.owned.lock().expect("group lock").clone();
    metrics::gauge!(OWNED, "group" => group.clone()).set(owned.len() as f64);
    let unowned = owners.iter().filter(|o| o.is_none()).count();
    metrics::gauge!(UNOWNED, "group" => group.clone()).set(unowned as f64);
    let oldest = rounds
        .unowned_since
        .values()
        .map(|since| at.saturating_duration_since(*since))
        .max()
        .unwrap_or_default();
    metrics::gauge!(UNOWNED_SECONDS, "group" => group.clone()).set(oldest.as_secs_f64());
    let mut counts: HashMap<&CandidateId, usize> = members.iter().map(|m| (&m.id, 0)).collect();
    for owner in owners.iter().flatten() {
        *counts.entry(owner).or_default() += 1;
    }
    let mean = inner.shards as f64 / members.len().max(1) as f64;
    let max = counts.values().copied().max().unwrap_or(0);
    metrics::gauge!(IMBALANCE, "group" => group).set(max as f64 / mean);
    debug!(members = members.len(), owned = owned.len(), unowned, "round");
}
