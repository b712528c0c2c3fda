//! Lease groups: [`LeaseGroup`] (the algorithm, its guarantees and bounds are documented there).

mod member;
mod plan;
mod record;
mod status;

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::elector::{Elector, ElectorBuilder, Leader, RunError};
use crate::error::{Error, Result};
use crate::store::LeaseStore;
use crate::timing::Timing;
use crate::types::{CandidateId, LeaseName};
pub use status::{GroupMember, GroupStatus, ShardStatus};
use status::{fnv1a, shard_lease};

/// Shards in a group at most.
pub const MAX_SHARDS: u32 = 100_000;

/// Lets a caller adjust the timing of a member's elector.
type Configure = Arc<dyn Fn(ElectorBuilder) -> ElectorBuilder + Send + Sync>;

/// A member of a lease group: it joins, owns its share of the shards, and runs a task per owned
/// shard. More in docs/groups.md (tuning, comparison with KCL, Event Hubs and Kafka).
///
/// A lease group is `N` shards, each owned by at most one live member at any instant, balanced
/// over the members, with a fencing term per shard. It costs the same at 10,000 shards as at 10:
/// a member's lease is the only thing renewed.
///
/// - Each member holds a *member lease*, `{group}.m.{hash of its id}-w{weight}`, for as long as it
///   runs, through an [`Elector`] (the engine's one state machine): the group's membership is the
///   list of held member leases.
/// - Each shard has a *shard record* `{group}.s.{shard}` ([`LeaseStore::write_shard`]) naming its
///   owner, the term of the owner's member lease, and the shard's fencing term, which is one
///   higher on every change of owner. Records are never renewed.
/// - A member believes a shard only while it believes its member lease at the term its record
///   names: the shard's [`Leader`] is a leadership scoped to the member lease (its `valid_until`,
///   deposition and [`Leader::ensure_valid`] are the member lease's, checked in one place), and
///   the shard's task is cancelled with the member lease and aborted at its `valid_until`. A
///   member whose member lease ends drops every shard and claims again under its next term.
/// - A record naming a member that no longer leads its member lease at that term is claimable:
///   the member lease ended by the rules the engine applies to any lease (expired by the store's
///   clock or session, or its version seen unchanged for a TTL where the store has no clock), so
///   its owner stopped believing the shard before. A claim is one conditional write of the record
///   at the version read; of members racing, one wins.
///
/// Every `rebalance_every` each member lists the member leases (one request) and plans who should
/// own each shard, a pure function of what it saw, so members that see the same plan the same:
/// quotas of floor or ceil of `N × weight / total weight`; owners keep their shards up to their
/// quota; shards of members that left go to the members furthest below their quota, spread;
/// shards above an owner's quota move to the members below theirs, at most
/// `max_moves_per_round` per round. A member reads the shard records
/// ([`LeaseStore::shard_records`]) only when something may have changed: the membership differs
/// from the last read, a write conflicted or has an unknown outcome, or the plan is not reached
/// yet; with a stable membership and every shard owned as planned, a member makes one listing per
/// round and its member lease's renewals, whatever the shard count.
///
/// A planned move: the owner cancels the shard's task, waits for it to return, and writes the
/// record naming the successor under the successor's member term (no expiry in between); the
/// successor starts the task once a read shows the record naming it. A task that returns gives
/// its shard up (the record is written free); a leaving member writes each of its records free
/// once its task has returned, so the others claim them at their next round.
///
/// Bounds (with the default `rebalance_every = ttl / 4`): after a join, `ceil(moves /
/// max_moves_per_round)` rounds plus the tasks' stop time; after a crash, the dead member's shards
/// are owned again one round after its member lease ends (one TTL after its last renewal, or
/// after the first listing showing its last version on stores without a clock), plus the
/// electors' `lock_delay`.
///
/// A member joins only once it can list the group, and leaves it when three rounds in a row
/// failed over at least two TTLs (it could not see the records moved to it); it joins again once
/// a listing succeeds.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{LeaseGroup, MemoryStore, ShardLeader};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = Arc::new(MemoryStore::new());
/// let group = LeaseGroup::builder(store.clone(), "partitions", 8)
///     .member_id("worker-1")
///     .ttl(Duration::from_secs(1))
///     .build()?;
/// let stop = tokio::time::sleep(Duration::from_millis(600));
/// group
///     .run_until(
///         |shard: ShardLeader| async move {
///             // One task per owned shard: fence every write with the shard's own term.
///             shard.ensure_valid(Duration::from_millis(100))?;
///             println!("shard {} term {}", shard.shard(), shard.term());
///             shard.cancelled().await;
///             Ok::<(), leasehold_core::Error>(())
///         },
///         stop,
///     )
///     .await?;
/// let status = LeaseGroup::status(store.as_ref(), "partitions").await?;
/// assert_eq!(status.shards.len(), 8); // every shard was owned (and given back at the end)
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseGroup {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn LeaseStore>,
    group: LeaseName,
    shards: u32,
    id: CandidateId,
    weight: u32,
    ttl: Duration,
    rebalance_every: Duration,
    max_moves: usize,
    /// A dead member's shards are claimed no sooner than this after they were first seen
    /// without a live owner (the member elector's `lock_delay`).
    lock_delay: Duration,
    member: Elector,
    /// The shards whose task runs now.
    owned: Mutex<BTreeSet<u32>>,
}

impl Inner {
    /// `{group}.m.{hash of the id}`: the member lease's name without its weight.
    fn member_lease_stem(&self) -> String {
        format!("{}.m.{:016x}", self.group, fnv1a(self.id.as_str()))
    }

    /// The record name of `shard`.
    fn record_name(&self, shard: u32) -> LeaseName {
        shard_lease(&self.group, shard, self.shards).expect("checked when the group was built")
    }
}

impl fmt::Debug for LeaseGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGroup")
            .field("group", &self.inner.group)
            .field("shards", &self.inner.shards)
            .field("id", &self.inner.id)
            .field("weight", &self.inner.weight)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// Builds a [`LeaseGroup`].
#[must_use]
pub struct LeaseGroupBuilder {
    store: Arc<dyn LeaseStore>,
    group: String,
    shards: u32,
    id: Option<String>,
    weight: u32,
    ttl: Duration,
    rebalance_every: Option<Duration>,
    max_moves: Option<usize>,
    configure: Configure,
}

impl fmt::Debug for LeaseGroupBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGroupBuilder")
            .field("group", &self.group)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl LeaseGroupBuilder {
    /// This member's id (default: [`CandidateId::generate`]). Its records name it.
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// This member's weight, 1 to 1000 (default 1): shards are shared in proportion.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The TTL of the member lease. Default 10 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often the member lists the group and plans, more than zero and at most 30 days.
    /// Default `ttl / 4`.
    pub fn rebalance_every(mut self, every: Duration) -> Self {
        self.rebalance_every = Some(every);
        self
    }

    /// How many shards may move between live members per round, at least 1. Default
    /// `shards / 4`, at least 1 and at most 32.
    pub fn max_moves_per_round(mut self, moves: usize) -> Self {
        self.max_moves = Some(moves);
        self
    }

    /// Adjusts the member's elector beyond the TTL, e.g.
    /// `.electors(|b| b.lock_delay(Duration::from_secs(1)))`: its timing is every shard's (a
    /// shard is believed exactly while the member lease is), and its `lock_delay` delays the
    /// claim of a dead member's shards.
    ///
    /// Give every member of a group the same `lock_delay`: the member that claims a crashed
    /// member's shard applies its own, and no member can see another's (see docs/groups.md).
    pub fn electors(mut self, configure: impl Fn(ElectorBuilder) -> ElectorBuilder + Send + Sync + 'static) -> Self {
        self.configure = Arc::new(configure);
        self
    }

    /// Validates everything and builds the member.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] when the group name, or a member lease or shard record named
    /// after it, is not a valid lease name; [`Error::InvalidCandidateId`]; [`Error::InvalidConfig`]
    /// for a shard count outside 1 to [`MAX_SHARDS`], a weight outside 1 to 1000, a
    /// `rebalance_every` of zero or over 30 days, or a `max_moves_per_round` of zero; what
    /// [`ElectorBuilder::build`] checks for the member's elector (with what
    /// [`LeaseGroupBuilder::electors`] sets).
    pub fn build(self) -> Result<LeaseGroup> {
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::config("shards", self.shards, "1 to 100000"));
        }
        if !(1..=1000).contains(&self.weight) {
            return Err(Error::config("weight", self.weight, "1 to 1000"));
        }
        let group = LeaseName::new(self.group)?;
        // The longest shard record name must be valid too.
        shard_lease(&group, self.shards - 1, self.shards)?;
        let id = match self.id {
            Some(id) => CandidateId::new(id)?,
            None => CandidateId::generate(),
        };
        let rebalance_every = self.rebalance_every.unwrap_or(self.ttl / 4);
        // Bounded like the TTL, so that no round's deadline overflows.
        if rebalance_every.is_zero() || rebalance_every > Timing::MAX_DURATION {
            return Err(Error::config(
                "rebalance_every",
                rebalance_every,
                "greater than zero and at most 30 days",
            ));
        }
        if self.max_moves == Some(0) {
            // No shard would ever move between live members: a join would never get one.
            return Err(Error::config("max_moves_per_round", 0, "at least 1"));
        }
        let member_lease = format!("{group}.m.{:016x}-w{}", fnv1a(id.as_str()), self.weight);
        // The leaving marker's name must be valid too.
        LeaseName::new(format!("{group}.m.{:016x}-w0", fnv1a(id.as_str())))?;
        let member = (self.configure)(Elector::builder(self.store.clone(), member_lease))
            .ttl(self.ttl)
            .candidate_id(id.as_str())
            .hand_over_requests(false)
            .build()?;
        let lock_delay = member.timing().lock_delay.unwrap_or_default();
        let max_moves = self
            .max_moves
            .unwrap_or_else(|| (self.shards as usize / 4).clamp(1, 32));
        Ok(LeaseGroup {
            inner: Arc::new(Inner {
                store: self.store,
                group,
                shards: self.shards,
                id,
                weight: self.weight,
                ttl: self.ttl,
                rebalance_every,
                max_moves,
                lock_delay,
                member,
                owned: Mutex::default(),
            }),
        })
    }
}

/// The ownership of one shard, handed to the task that runs while this member owns it: a
/// [`Leader`] (through `Deref`) whose term is the shard's fencing term and whose validity is the
/// member lease's, plus the shard number.
#[derive(Debug)]
pub struct ShardLeader {
    shard: u32,
    leader: Leader,
}

impl ShardLeader {
    /// The shard, `0..shards`.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The shard's leadership: its lease is the shard's record, its term the shard's.
    pub fn leader(&self) -> &Leader {
        &self.leader
    }
}

impl Deref for ShardLeader {
    type Target = Leader;

    fn deref(&self) -> &Leader {
        &self.leader
    }
}

impl LeaseGroup {
    /// A builder for member `id` of `group`, a group of `shards` shards over `store`.
    pub fn builder(store: Arc<dyn LeaseStore>, group: impl Into<String>, shards: u32) -> LeaseGroupBuilder {
        LeaseGroupBuilder {
            store,
            group: group.into(),
            shards,
            id: None,
            weight: 1,
            ttl: Duration::from_secs(10),
            rebalance_every: None,
            max_moves: None,
            configure: Arc::new(|b| b),
        }
    }

    /// This member's id.
    pub fn id(&self) -> &CandidateId {
        &self.inner.id
    }

    /// The group's name.
    pub fn group(&self) -> &LeaseName {
        &self.inner.group
    }

    /// The shards whose task runs on this member now, in order.
    pub fn owned(&self) -> Vec<u32> {
        self.inner.owned.lock().expect("group lock").iter().copied().collect()
    }

    /// The record name of `shard` of `group` (of `shards` shards: the number is zero-padded to
    /// the width of the largest).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] when the name would be too long.
    pub fn shard_lease(group: &LeaseName, shard: u32, shards: u32) -> Result<LeaseName> {
        shard_lease(group, shard, shards)
    }

    /// Reads `group` in `store`: its members (one [`LeaseStore::list`]) and each shard's record
    /// ([`LeaseStore::shard_records`]), its owner judged live against the member leases listed.
    /// Members whose lease a contender would already take over (an unchanged record on a store
    /// without a clock) are still listed: the listing is a snapshot, not a judgement over time.
    ///
    /// # Errors
    ///
    /// What the store returns; [`Error::InvalidLeaseName`] for a bad group name;
    /// [`Error::CorruptRecord`] for a shard record that is not leasehold's.
    pub async fn status(store: &dyn LeaseStore, group: &str) -> Result<GroupStatus> {
        let group = LeaseName::new(group)?;
        let members = status::members(&group, store.list(&format!("{group}.m.")).await?);
        let records = store.shard_records(&format!("{group}.s.")).await?;
        let shards = status::shards(store.name(), &group, records, &members)?;
        Ok(GroupStatus { group, members, shards })
    }

    /// Joins the group and runs `task` once per shard this member owns, until `shutdown`
    /// completes: then every task is cancelled, given until the member lease's `valid_until` to
    /// return, each shard's record written free once its task has returned, and the member lease
    /// released.
    ///
    /// A task that returns gives its shard up (its record is written free); the member claims it
    /// again at a later round if it is still planned here. A task's error is logged.
    ///
    /// # Errors
    ///
    /// Only when the group cannot run at all (e.g. the store rejects the TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (instead of completing `shutdown`) ends the member's leadership as
    /// dropping [`Elector::run_until`] does: the shard tasks are cancelled with it and aborted at
    /// its `valid_until`; records not written free are claimed by the others once the member
    /// lease has ended.
    pub async fn run_until<F, Fut, E>(&self, task: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let task = Arc::new(task);
        let mut shutdown = std::pin::pin!(shutdown);
        // The leave, as the member's task sees it (`shutdown` need not be `Send`).
        let leave = CancellationToken::new();
        let span = info_span!("group", group = %self.inner.group, member = %self.inner.id);
        loop {
            // A member joins only once it can list the group: a member that cannot see the
            // group would count as live, with a full quota that it never runs.
            tokio::select! {
                () = self.inner.wait_until_listed().instrument(span.clone()) => {}
                () = &mut shutdown => return Ok(()),
            }
            info!(parent: &span, "joining the group");
            // The member's task handles the leave itself (its shards stop while the member lease
            // is still renewed); dropping this future drops the elector's, as for any elector.
            let (inner, task, token) = (self.inner.clone(), task.clone(), leave.clone());
            let mut run = std::pin::pin!(
                self.inner
                    .member
                    .run(move |leader| {
                        let (inner, task, token) = (inner.clone(), task.clone(), token.clone());
                        member::lead(inner, leader, task, token.cancelled_owned())
                    })
                    .instrument(span.clone())
            );
            let outcome = loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    () = &mut shutdown, if !leave.is_cancelled() => leave.cancel(),
                }
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(_) if leave.is_cancelled() => return Ok(()),
                Err(RunError::Task(error)) => {
                    info!(parent: &span, %error, "left the group; joining again once a listing succeeds");
                }
                Err(RunError::Panicked) => warn!(parent: &span, "the member's rounds panicked; joining again"),
                Err(RunError::Election(error)) => return Err(error),
            }
        }
    }

    /// [`LeaseGroup::run_until`], forever.
    ///
    /// # Errors
    ///
    /// As [`LeaseGroup::run_until`].
    pub async fn run<F, Fut, E>(&self, task: F) -> Result<()>
    where
        F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.run_until(task, std::future::pending()).await
    }
}

impl Inner {
    /// Lists the member leases until a listing succeeds (every `rebalance_every`).
    async fn wait_until_listed(&self) {
        while let Err(error) = self.store.list(&format!("{}.m.", self.group)).await {
            warn!(%error, "cannot list the group; joining once a listing succeeds");
            tokio::time::sleep(self.rebalance_every).await;
        }
    }
}
