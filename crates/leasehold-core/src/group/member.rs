//! A member's leadership of its member lease ([`lead`]): rounds that list the members, read the
//! shard records when something may have changed, plan, claim and move shards, and run a task per
//! owned shard inside the member's leadership.
//!
//! Nothing here keeps time of its own but the round interval: a shard is believed through a
//! leadership scoped to the member lease ([`Leader::scoped`]), so it ends with the member lease
//! at the engine's step-down point, and the shard tasks are futures of the member's own task,
//! aborted with it at `valid_until`. A write whose outcome is unknown is not believed: the next
//! round reads the records back.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, info_span, warn};

use super::plan::{Member, plan_claimed};
use super::record::Claim;
use super::status::shard_number;
use super::{Inner, ShardLeader};
use view::{View, record_metrics};

mod view;
use crate::elector::{Asked, Leader, Scope};
use crate::error::{Error, Result};
use crate::shard_record::ShardWrite;
use crate::types::{CandidateId, Expiry, LeaseName, Observation, Term};

/// Writes sent at once (claims at a cold start, releases at a leave).
const WRITES_AT_ONCE: usize = 16;

/// A member leaves the group when this many rounds in a row failed, over at least two TTLs
/// since its last successful round: it cannot see the records, so it would never run the
/// shards the others move to it.
const FAILED_ROUNDS_TO_LEAVE: u32 = 3;

/// Shards owned per member (this member's count).
const OWNED: &str = "leasehold_group_shards_owned";
/// Shards with no live owner, as this member sees them.
const UNOWNED: &str = "leasehold_group_unowned_shards";
/// How long the longest-unowned shard has been unowned, as this member sees it.
const UNOWNED_SECONDS: &str = "leasehold_group_unowned_seconds";
/// The most shards one member owns, over the mean.
const IMBALANCE: &str = "leasehold_group_imbalance";
/// Shards this member moved to another (`kind="planned"`), and shards it claimed from a member
/// that no longer leads the member lease its record names (`kind="forced"`).
const MOVES: &str = "leasehold_group_moves_total";
/// Seconds from a planned move's decision to the successor's task starting, as the successor
/// sees it (the record's write to its read).
const HANDOVER_SECONDS: &str = "leasehold_group_handover_seconds";

/// A shard record as this member last knew it.
#[derive(Clone, Debug)]
struct Known {
    version: String,
    claim: Claim,
}

/// How a shard's task ended.
struct Ended {
    shard: u32,
    /// The record's version after this member's last write of it.
    version: String,
    /// The record's claim after that write.
    claim: Claim,
    /// The shard was given up already (its handle resigned): nothing more to write.
    released: bool,
}

/// What a member keeps between rounds of one leadership of its member lease.
struct Rounds {
    /// Per shard, the record as last read or written (`None`: no record, or never read).
    records: Vec<Option<Known>>,
    /// Shards whose task runs, with their scope (to revoke them).
    running: HashMap<u32, Arc<Scope>>,
    /// Shards being moved away: revoked, their task stopping; then written to the successor.
    moving: HashMap<u32, (CandidateId, Term)>,
    /// The membership (id, member term) when the records were last read.
    read_under: Option<Vec<(CandidateId, Term)>>,
    /// The records must be read again: a write conflicted or has an unknown outcome, or the
    /// plan is not reached yet.
    stale: bool,
    /// Member lease versions and when each was first seen (stores without a clock).
    versions: HashMap<LeaseName, (String, Instant)>,
    /// Member leases whose version this member has seen change.
    renewed: std::collections::HashSet<LeaseName>,
    /// Since when each shard has been seen without a live owner.
    unowned_since: HashMap<u32, Instant>,
    /// When the last planned move to this member was decided, by shard (for the hand-over time).
    moved_in: HashMap<u32, Instant>,
    /// The highest term of each shard this member has run a task under.
    ran: HashMap<u32, Term>,
    /// Each record's version at the last read.
    last_read: Vec<Option<String>>,
    tasks: JoinSet<Ended>,
    /// Dead members' leases being cleared (stores without a clock), by name.
    clearing: HashMap<LeaseName, tokio::task::AbortHandle>,
    clearings: JoinSet<()>,
}

/// The member lease's leadership: the member's task in [`Elector::run`](crate::Elector::run).
///
/// `shutdown` is the member's leave: its shards' tasks are cancelled while the member lease is
/// still renewed (however long they take), each record is written free once its task has
/// returned, and then this returns (the member lease is released). Meanwhile a *leaving marker*,
/// a lease `{group}.m.{hash}-w0`, tells the others to plan without this member, so that they
/// claim each record as soon as it is free.
pub(super) async fn lead<F, Fut, E>(
    inner: Arc<Inner>,
    member: Leader,
    task: Arc<F>,
    shutdown: impl Future<Output = ()>,
) -> Result<()>
where
    F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    // Aborted at `valid_until` (a member too busy to see its step-down in time), this future is
    // dropped with its shard tasks: what the member reports owning goes with them.
    let _owned = ClearOwned(inner.clone());
    let mut rounds = Rounds {
        records: vec![None; inner.shards as usize],
        running: HashMap::new(),
        moving: HashMap::new(),
        read_under: None,
        stale: true,
        versions: HashMap::new(),
        renewed: std::collections::HashSet::new(),
        unowned_since: HashMap::new(),
        moved_in: HashMap::new(),
        ran: HashMap::new(),
        last_read: Vec::new(),
        tasks: JoinSet::new(),
        clearing: HashMap::new(),
        clearings: JoinSet::new(),
    };
    // The first round waits a whole interval: members that start together see each other
    // before anyone plans, instead of the first claiming every shard.
    let mut next = tokio::time::Instant::now() + inner.rebalance_every;
    let mut planned_at = tokio::time::Instant::now();
    let mut failed = 0;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut leaving = false;
    let outcome = loop {
        tokio::select! {
            () = member.cancelled() => break Ok(()),
            () = &mut shutdown => {
                leaving = true;
                break Ok(());
            }
            Some(ended) = rounds.tasks.join_next() => {
                // Every task stopped by now at once (a join's moves revoke many together): their
                // records are written together.
                let mut ended: Vec<Ended> = ended.into_iter().collect();
                while let Some(more) = rounds.tasks.try_join_next() {
                    ended.extend(more);
                }
                after_tasks(&inner, &mut rounds, ended).await;
                continue;
            }
            () = tokio::time::sleep_until(next) => {}
        }
        let began = tokio::time::Instant::now();
        let listed = round(&inner, &member, &mut rounds, &task).await;
        match listed {
            Ok(listed_in) => {
                failed = 0;
                planned_at = tokio::time::Instant::now();
                // A slow listing spaces the rounds out: listing takes at most a fifth of the
                // member's time with the store.
                next = began + inner.rebalance_every.max(listed_in * 5);
            }
            Err(error) => {
                failed += 1;
                let since = planned_at.elapsed();
                if failed >= FAILED_ROUNDS_TO_LEAVE && since >= inner.ttl * 2 {
                    warn!(%error, failed, ?since, "no round succeeded for two TTLs; leaving the group");
                    break Err(error);
                }
                warn!(%error, "the round failed; keeping the current shards");
                next = began + inner.rebalance_every;
            }
        }
    };
    // The member lease ends (a shutdown, a step-down, or this member leaves): every shard's task
    // is cancelled with it; once each has returned, its record is given back, so that the others
    // claim it at once instead of waiting for the member lease to end.
    let marker = if leaving { inner.mark_leaving().await } else { None };
    for scope in rounds.running.values() {
        scope.revoke();
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(WRITES_AT_ONCE));
    let mut frees = JoinSet::new();
    while let Some(ended) = rounds.tasks.join_next().await {
        let Ok(ended) = ended else { continue };
        inner.owned.lock().expect("group lock").remove(&ended.shard);
        if ended.released {
            continue;
        }
        let (inner, slots) = (inner.clone(), slots.clone());
        frees.spawn(async move {
            let _slot = slots.acquire().await;
            let free = Claim::Free {
                term: ended.claim.term(),
            };
            let _ = write(&inner, ended.shard, Some(ended.version), free).await;
        });
    }
    inner.owned.lock().expect("group lock").clear();
    while frees.join_next().await.is_some() {}
    if let Some(marker) = marker {
        let _ = tokio::time::timeout(inner.ttl, inner.store.release(&marker)).await;
    }
    outcome
}

/// Empties the member's [`LeaseGroup::owned`](super::LeaseGroup::owned) when dropped: when its
/// leadership ends, however it ends.
struct ClearOwned(Arc<Inner>);

impl Drop for ClearOwned {
    fn drop(&mut self) {
        self.0.owned.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One round. The listing's duration, or why the round failed.
async fn round<F, Fut, E>(inner: &Arc<Inner>, member: &Leader, rounds: &mut Rounds, task: &Arc<F>) -> Result<Duration>
where
    F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    let began = tokio::time::Instant::now();
    let mut view = View::of(inner, rounds, inner.list_members().await?, member.term());
    let listed_in = began.elapsed();
    if rounds.stale || rounds.read_under.as_ref() != Some(&view.read_key) {
        // Until two reads in a row agree, the others' claims and moves are under way (a move to
        // this member is seen only by reading): read again at the next round.
        rounds.stale = read_records(inner, rounds).await?;
        rounds.read_under = Some(view.read_key.clone());
        // Whether a record's owner still leads the member term it names is judged by a listing
        // taken after the record was read: one taken before may predate the owner's member
        // lease (the model check's `a_claim_judged_on_an_older_listing_is_caught`).
        view = View::of(inner, rounds, inner.list_members().await?, member.term());
    }
    let View {
        live,
        leavers,
        unconfirmed,
        membership,
        dead,
        at,
        ..
    } = view;
    let observed = inner.store.capabilities().expiry == Expiry::ObservedByContenders;
    let first = live.iter().map(|(m, _, _)| &m.id).min() == Some(&inner.id);
    if observed && first {
        rounds.clear(inner, dead);
    }
    let me = (inner.id.clone(), member.term());
    let mut plan_members: Vec<Member> = live
        .iter()
        .filter(|(m, _, _)| m.id != inner.id)
        .map(|(m, _, _)| Member {
            id: m.id.clone(),
            weight: if leavers.contains(&m.id) { 0 } else { m.weight },
        })
        .collect();
    plan_members.push(Member {
        id: inner.id.clone(),
        weight: inner.weight,
    });
    let term_of = |id: &CandidateId| membership.iter().find(|(m, _)| m == id).map(|(_, t)| *t);
    // A record's owner counts only while it leads its member lease at the record's member term.
    let owners: Vec<Option<CandidateId>> = rounds
        .records
        .iter()
        .map(|known| match known.as_ref().map(|k| &k.claim) {
            Some(Claim::Owned { owner, member_term, .. }) if term_of(owner) == Some(*member_term) => {
                Some(owner.clone())
            }
            _ => None,
        })
        .collect();
    let claims: Vec<Option<CandidateId>> = (0..inner.shards)
        .map(|s| rounds.running.contains_key(&s).then(|| inner.id.clone()))
        .collect();
    let plan = plan_claimed(&plan_members, &owners, &claims, inner.max_moves);
    for (shard, owner) in owners.iter().enumerate() {
        if owner.is_some() {
            rounds.unowned_since.remove(&(shard as u32));
        } else {
            rounds.unowned_since.entry(shard as u32).or_insert(at);
        }
    }
    let mut claim = Vec::new();
    let mut converged = true;
    for shard in 0..inner.shards {
        let target = plan.targets[shard as usize].as_ref();
        let owner = owners[shard as usize].as_ref();
        if owner != target {
            converged = false;
        }
        let running = rounds.running.contains_key(&shard) || rounds.moving.contains_key(&shard);
        let known = rounds.records[shard as usize].clone();
        if target == Some(&inner.id) {
            if running {
                continue;
            }
            match (owner, known) {
                // A term this member already ran (its task returned, and giving it up failed):
                // claimed again under a higher term, never run twice.
                (Some(o), Some(known))
                    if *o == inner.id && rounds.ran.get(&shard).is_some_and(|t| *t >= known.claim.term()) =>
                {
                    claim.push((shard, Some(known), false));
                }
                // Named by its record under this member term (moved here, or a write of ours
                // whose answer was lost): confirmed by the read.
                (Some(o), Some(known)) if *o == inner.id => {
                    if let Some(decided) = rounds.moved_in.remove(&shard) {
                        metrics::histogram!(HANDOVER_SECONDS, "group" => inner.group.to_string())
                            .record(decided.elapsed().as_secs_f64());
                    }
                    start(inner, member, rounds, task, shard, known);
                }
                (None, known) => {
                    let delay = inner.lock_delay;
                    let since = rounds.unowned_since.get(&shard).copied().unwrap_or(at);
                    let forced =
                        matches!(&known, Some(Known { claim: Claim::Owned { owner, .. }, .. }) if *owner != inner.id);
                    if forced && at < since + delay {
                        continue;
                    }
                    claim.push((shard, known, forced));
                }
                (Some(_), _) => {
                    // Planned here from a live owner: it stops its task and writes the record.
                    rounds.moved_in.entry(shard).or_insert(at);
                }
            }
        } else if let Some(to) = target
            && !rounds.moving.contains_key(&shard)
            && !unconfirmed.contains(to)
            && let Some(to_term) = term_of(to)
        {
            // (Not to a member not seen renewing yet: it may be one that died before this member
            // joined, which nobody would run the shard for. The move waits until it is seen
            // renewing, or leaves the plan once it is judged dead.)
            if rounds.running.contains_key(&shard) {
                // A planned move: the task stops first, then the record names the successor.
                info!(shard, to = %to, "moving the shard (planned)");
                rounds.moving.insert(shard, (to.clone(), to_term));
                if let Some(scope) = rounds.running.get(&shard) {
                    scope.revoke();
                }
            } else if owner == Some(&inner.id)
                && let Some(known) = known
            {
                // Named by its record under this member term, not run here (moved here while
                // this member's plan still had it elsewhere, or its task ended and giving it up
                // failed): run it (under a higher term if this member ran this one before); a
                // later round moves it if the plan still says so. Moving it on unrun would send
                // it back and forth between members whose plans disagree for a round.
                if rounds.ran.get(&shard).is_some_and(|t| *t >= known.claim.term()) {
                    claim.push((shard, Some(known), false));
                } else {
                    start(inner, member, rounds, task, shard, known);
                }
            }
        }
    }
    if !converged {
        rounds.stale = true;
    }
    let claimed = claim_all(inner, &me, claim).await;
    for (shard, outcome) in claimed {
        match outcome {
            Some(known) if matches!(&known.claim, Claim::Owned { owner, .. } if *owner == inner.id) => {
                rounds.records[shard as usize] = Some(known.clone());
                start(inner, member, rounds, task, shard, known);
            }
            Some(known) => {
                rounds.records[shard as usize] = Some(known);
                rounds.stale = true;
            }
            None => rounds.stale = true,
        }
    }
    record_metrics(inner, rounds, &owners, &plan_members, at);
    Ok(listed_in)
}

/// Reads every record of the group into `rounds.records`. Whether any record's version differs
/// from the last read's.
async fn read_records(inner: &Inner, rounds: &mut Rounds) -> Result<bool> {
    let records = inner.read_records().await?;
    let mut fresh: Vec<Option<Known>> = vec![None; inner.shards as usize];
    for record in records {
        let Some(shard) = shard_number(&inner.group, &record).filter(|s| *s < inner.shards) else {
            continue;
        };
        match Claim::parse(inner.store.name(), &record) {
            Ok(claim) => {
                fresh[shard as usize] = Some(Known {
                    version: record.version,
                    claim,
                });
            }
            // A record this member cannot read is left alone: nobody claims it (its owner, if
            // any, keeps it); an operator must repair it.
            Err(error) => warn!(shard, %error, "a shard record that is not leasehold's"),
        }
    }
    let versions: Vec<Option<String>> = fresh.iter().map(|k| k.as_ref().map(|k| k.version.clone())).collect();
    let changed = versions != rounds.last_read;
    rounds.last_read = versions;
    rounds.records = fresh;
    Ok(changed)
}

/// Claims `shards` for this member (each one conditional write, many at once): what each
/// record is now, if known (a write whose outcome is unknown answers `None`).
async fn claim_all(
    inner: &Arc<Inner>,
    me: &(CandidateId, Term),
    shards: Vec<(u32, Option<Known>, bool)>,
) -> Vec<(u32, Option<Known>)> {
    let writes = shards.into_iter().map(|(shard, known, forced)| {
        let inner = inner.clone();
        let me = me.clone();
        async move {
            let term = known.as_ref().map_or(Term(0), |k| k.claim.term());
            let claim = Claim::Owned {
                term: Term(term.0 + 1),
                member_term: me.1,
                owner: me.0,
            };
            let outcome = write(&inner, shard, known.map(|k| k.version), claim).await;
            if forced
                && outcome
                    .as_ref()
                    .is_some_and(|k| matches!(&k.claim, Claim::Owned { owner, .. } if *owner == inner.id))
            {
                metrics::counter!(MOVES, "group" => inner.group.to_string(), "kind" => "forced").increment(1);
            }
            (shard, outcome)
        }
    });
    futures::stream::iter(writes)
        .buffer_unordered(WRITES_AT_ONCE)
        .collect()
        .await
}

/// Writes `claim` to `shard`'s record at `expected`: the record as it is after the write (ours,
/// or what conflicted), `None` when the outcome is unknown.
async fn write(inner: &Inner, shard: u32, expected: Option<String>, claim: Claim) -> Option<Known> {
    let name = inner.record_name(shard);
    let value = claim.value();
    let answer = tokio::time::timeout(inner.ttl, inner.store.write_shard(&name, expected.as_deref(), &value)).await;
    match answer {
        Ok(Ok(ShardWrite::Written(record))) => Some(Known {
            version: record.version,
            claim,
        }),
        Ok(Ok(ShardWrite::Conflict(Some(record)))) => match Claim::parse(inner.store.name(), &record) {
            Ok(claim) => Some(Known {
                version: record.version,
                claim,
            }),
            Err(error) => {
                warn!(shard, %error, "a shard record that is not leasehold's");
                None
            }
        },
        Ok(Ok(ShardWrite::Conflict(None))) => None,
        Ok(Err(error)) => {
            debug!(shard, %error, "a shard record's write failed; reading it back next round");
            None
        }
        Err(_) => {
            debug!(
                shard,
                "a shard record's write got no answer within the TTL; reading it back next round"
            );
            None
        }
    }
}

/// Starts `shard`'s task, owned through `known` (a record naming this member under its member
/// term).
fn start<F, Fut, E>(inner: &Arc<Inner>, member: &Leader, rounds: &mut Rounds, task: &Arc<F>, shard: u32, known: Known)
where
    F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    let (leader, scope) = member.scoped(inner.record_name(shard), known.claim.term());
    let scope = Arc::new(scope);
    rounds.ran.insert(shard, known.claim.term());
    rounds.running.insert(shard, scope.clone());
    inner.owned.lock().expect("group lock").insert(shard);
    debug!(shard, term = %known.claim.term(), "running the shard");
    let work = task(ShardLeader { shard, leader });
    let inner = inner.clone();
    rounds
        .tasks
        .spawn(run_shard(inner, shard, known, scope, work).instrument(info_span!("shard", shard)));
}

/// A shard's task, and what its handle asks, until the task has stopped.
async fn run_shard<Fut, E>(inner: Arc<Inner>, shard: u32, known: Known, scope: Arc<Scope>, work: Fut) -> Ended
where
    Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    let mut ended = Ended {
        shard,
        version: known.version,
        claim: known.claim,
        released: false,
    };
    // Dropped once it returned (or panicked): its handle goes with it, and the work has stopped.
    let mut work = Some(Box::pin(work));
    loop {
        let step = match work.as_mut() {
            Some(running) => tokio::select! {
                result = std::panic::AssertUnwindSafe(running.as_mut()).catch_unwind() => Ok(result),
                asked = scope.next() => Err(asked),
            },
            None => Err(scope.next().await),
        };
        match step {
            Ok(result) => {
                work = None;
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => warn!(shard, %error, "the shard's task failed; shard released"),
                    Err(_) => warn!(shard, "the shard's task panicked; shard released"),
                }
            }
            Err(Asked::Resign(ack) | Asked::HandOver(Some(ack))) => {
                release(&inner, &mut ended).await;
                let _ = ack.send(());
            }
            Err(Asked::HandOver(None) | Asked::SteppedDown) => scope.revoke(),
            Err(Asked::WorkStopped) => return ended,
        }
    }
}

/// Gives `ended`'s shard up: its record is written free (at the version this member wrote).
async fn release(inner: &Inner, ended: &mut Ended) {
    if ended.released {
        return;
    }
    ended.released = true;
    let free = Claim::Free {
        term: ended.claim.term(),
    };
    if let Some(known) = write(inner, ended.shard, Some(ended.version.clone()), free).await {
        ended.version = known.version;
        ended.claim = known.claim;
    }
}

/// After shards' tasks stopped: a planned move writes the successor into the record; a task
/// that returned on its own gives the shard up. The writes go out together.
async fn after_tasks(inner: &Arc<Inner>, rounds: &mut Rounds, ended: Vec<Ended>) {
    let mut writes = Vec::new();
    for ended in ended {
        let shard = ended.shard;
        rounds.running.remove(&shard);
        inner.owned.lock().expect("group lock").remove(&shard);
        rounds.stale = true;
        let moving = rounds.moving.remove(&shard);
        if ended.released {
            rounds.records[shard as usize] = Some(Known {
                version: ended.version,
                claim: ended.claim,
            });
            continue;
        }
        let inner = inner.clone();
        writes.push(async move {
            let mut ended = ended;
            let outcome = match moving {
                Some((to, member_term)) => {
                    let claim = Claim::Owned {
                        term: Term(ended.claim.term().0 + 1),
                        member_term,
                        owner: to.clone(),
                    };
                    let outcome = write(&inner, ended.shard, Some(ended.version.clone()), claim).await;
                    if outcome.is_some() {
                        metrics::counter!(MOVES, "group" => inner.group.to_string(), "kind" => "planned").increment(1);
                        debug!(shard = ended.shard, to = %to, "moved the shard");
                    }
                    outcome
                }
                None => {
                    release(&inner, &mut ended).await;
                    Some(Known {
                        version: ended.version,
                        claim: ended.claim,
                    })
                }
            };
            (ended.shard, outcome)
        });
    }
    let written: Vec<(u32, Option<Known>)> = futures::stream::iter(writes)
        .buffer_unordered(WRITES_AT_ONCE)
        .collect()
        .await;
    for (shard, outcome) in written {
        rounds.records[shard as usize] = outcome;
    }
}

impl Inner {
    /// Takes this member's leaving marker ([`lead`]): one acquire, its grant if granted.
    async fn mark_leaving(&self) -> Option<crate::types::Grant> {
        let lease = LeaseName::new(format!("{}-w0", self.member_lease_stem())).ok()?;
        let request = crate::types::AcquireRequest {
            lease,
            candidate: self.id.clone(),
            ttl: self.ttl,
            takeover: None,
        };
        match tokio::time::timeout(self.ttl / 2, self.store.acquire(&request)).await {
            Ok(Ok(crate::types::Acquired::Granted(grant))) => Some(grant),
            _ => None,
        }
    }

    /// Lists the member leases (one [`LeaseStore::list`](crate::LeaseStore::list)), bounded by
    /// three TTLs (a listing is on no lease's critical path).
    async fn list_members(&self) -> Result<Vec<Observation>> {
        let timeout = self.ttl * 3;
        tokio::time::timeout(timeout, self.store.list(&format!("{}.m.", self.group)))
            .await
            .map_err(|_| Error::Timeout {
                store: self.store.name(),
                operation: "list",
                after: timeout,
            })?
    }

    /// Reads every shard record of the group, bounded by three TTLs.
    async fn read_records(&self) -> Result<Vec<crate::ShardRecord>> {
        let timeout = self.ttl * 3;
        tokio::time::timeout(timeout, self.store.shard_records(&format!("{}.s.", self.group)))
            .await
            .map_err(|_| Error::Timeout {
                store: self.store.name(),
                operation: "shard_records",
                after: timeout,
            })?
    }
}
