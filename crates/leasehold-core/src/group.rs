//! Lease groups: [`LeaseGroup`] (the algorithm, its guarantees and bounds are documented there).

mod plan;
mod status;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::batch::RenewBatcher;
use crate::elector::{Elector, ElectorBuilder, Leader, RunError, now};
use crate::error::{Error, Result};
use crate::store::LeaseStore;
use crate::timing::Timing;
use crate::types::{AcquireRequest, Acquired, CandidateId, Expiry, Grant, LeaseName, Observation};
use plan::{Member, plan_claimed};
pub use status::{GroupMember, GroupStatus, ShardStatus};
use status::{fnv1a, parse, shard_lease};

/// Shards in a group at most.
pub const MAX_SHARDS: u32 = 100_000;

/// Lets a caller adjust the timing of every elector of a group (member and shards).
type Configure = Arc<dyn Fn(ElectorBuilder) -> ElectorBuilder + Send + Sync>;

/// A member of a lease group: it joins, owns its share of the shards, and runs a task per owned
/// shard. More in docs/groups.md (tuning, comparison with KCL, Event Hubs and Kafka).
///
/// A lease group is `N` shards, each led by at most one live member at any instant, balanced over
/// the members, with a fencing term per shard.
///
/// A group is plain leases in one store, so it works on every backend:
///
/// - each member holds a *member lease*, `{group}.m.{hash of its id}-w{weight}`, for as long as it
///   runs: the group's membership is the list of held member leases;
/// - each shard is a lease `{group}.s.{shard}` (zero-padded), campaigned for by an [`Elector`]
///   with the member's id: a shard's owner is its leader, with everything a single lease
///   guarantees (believed leadership counted from the request's send time, a term that strictly
///   increases on every change of owner, [`Leader::ensure_valid`] before side effects, the task
///   cancelled and aborted when leadership ends).
///
/// Every `rebalance_every` each member lists the group ([`LeaseStore::list`], one request) and
/// plans who should own each shard, a pure function of what it saw, so members that see the
/// same plan the same: quotas of floor or ceil of `N × weight / total weight`; owners keep their shards up to their
/// quota; shards of members that left (or whose member lease expired) go to the members furthest
/// below their quota, spread; shards above an owner's quota move to the members below theirs, at
/// most `max_moves_per_round` per round. A member campaigns only for the shards planned for it,
/// so a shard released for a planned move is taken by its planned successor (already waiting on
/// it, notified of the release) and not by whoever races first. The owner releases a planned
/// move only when two of its consecutive rounds planned it, so the successor, whose own round
/// planned the same, is already waiting: no expiry gap on planned moves.
///
/// Bounds (with the default `rebalance_every = ttl / 4`; rounds are spaced further when a listing
/// is slow): after a join, `ceil(moves / max_moves_per_round)` rounds of about two
/// `rebalance_every` each, plus the tasks' own stop time; after a crash, the dead member's shards
/// are owned again within one TTL (its member and shard leases expire) plus one round plus the
/// store's retry interval; on stores without a clock (and for rows orphaned by an ended session)
/// within one TTL from the listing that first showed each record's last version, plus a round or
/// two: every member times the versions it lists, finds the member dead once its lease's version
/// is a TTL old, and replaces each stranded shard record by its version once that is a TTL old
/// too (then releases it, so the shard's elector takes it at once instead of timing it again).
/// A member keeps campaigning for the unowned shards it went after (its claims count as its own
/// in its plan), so takeovers finishing in any order do not re-spread the rest.
///
/// A member joins only once it can list the group, and leaves it when three rounds in a row
/// failed over at least two TTLs (it could not plan, so it would never campaign for the shards
/// the others hand over to it); it joins again once a listing succeeds.
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
/// assert_eq!(status.shards.len(), 8); // every shard was led (and released at the end)
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseGroup {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn LeaseStore>,
    /// The store for the shards' electors: their renewals go out together
    /// ([`RenewBatcher`], one [`LeaseStore::renew_many`] per window).
    shard_store: Arc<dyn LeaseStore>,
    group: LeaseName,
    shards: u32,
    id: CandidateId,
    weight: u32,
    ttl: Duration,
    rebalance_every: Duration,
    max_moves: usize,
    configure: Configure,
    member: Elector,
    /// Every shard campaign of this member, by shard: [`LeaseGroup::owned`] lists those that lead.
    running: Electors,
    /// Takeovers by version under way ([`Inner::replace_and_release`]): each runs in a task of
    /// its own, so that no caller's cancellation separates its acquire from its release.
    takeovers: watch::Sender<usize>,
    /// One lock per shard this member has campaigned for ([`Inner::shard_lock`]): held by a
    /// shard's campaign for its whole life and by its takeover until that has released what it
    /// took, so that at most one of them, under this member's id, acts on the shard's lease.
    shard_locks: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
}

/// The electors of a member's shard campaigns, by shard.
type Electors = Arc<Mutex<BTreeMap<u32, Elector>>>;

/// A shard's lock ([`Inner::shard_lock`]), held by its campaign and shared with its takeover.
type ShardHeld = Arc<tokio::sync::OwnedMutexGuard<()>>;

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
    /// This member's id (default: [`CandidateId::generate`]). It is the holder of its shards.
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// This member's weight, 1 to 1000 (default 1): shards are shared in proportion.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The TTL of the member's and the shards' leases. Default 10 s.
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

    /// Adjusts the electors of the shards beyond the TTL, e.g.
    /// `.electors(|b| b.lock_delay(Duration::from_secs(1)))` (the member's own lease keeps the
    /// defaults for its TTL).
    ///
    /// Give every member of a group the same `lock_delay`: the member that takes a crashed
    /// member's shard over applies its own (as each contender does for a single lease), and no
    /// member can see another's (see docs/groups.md, "Tuning").
    pub fn electors(mut self, configure: impl Fn(ElectorBuilder) -> ElectorBuilder + Send + Sync + 'static) -> Self {
        self.configure = Arc::new(configure);
        self
    }

    /// Validates everything and builds the member.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] when the group name, or a shard lease named after it, is not a
    /// valid lease name; [`Error::InvalidCandidateId`]; [`Error::InvalidConfig`] for a shard
    /// count outside 1 to [`MAX_SHARDS`], a weight outside 1 to 1000, a `rebalance_every` of
    /// zero or over 30 days, or a `max_moves_per_round` of zero; what [`ElectorBuilder::build`]
    /// checks, for the member's elector and for the shards' (with what
    /// [`LeaseGroupBuilder::electors`] sets).
    pub fn build(self) -> Result<LeaseGroup> {
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::config("shards", self.shards, "1 to 100000"));
        }
        if !(1..=1000).contains(&self.weight) {
            return Err(Error::config("weight", self.weight, "1 to 1000"));
        }
        let group = LeaseName::new(self.group)?;
        // The longest shard lease name must be valid too.
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
        // The member lease keeps the engine's default timing: `electors` tunes the shards.
        let member = Elector::builder(self.store.clone(), member_lease)
            .ttl(self.ttl)
            .candidate_id(id.as_str())
            .build()?;
        let max_moves = self
            .max_moves
            .unwrap_or_else(|| (self.shards as usize / 4).clamp(1, 32));
        // A renewal may wait this long for the others of its batch: 1/20 of the default
        // renew_every (ttl / 3), at most 100 ms.
        let window = (self.ttl / 60).min(Duration::from_millis(100));
        let shard_store: Arc<dyn LeaseStore> = Arc::new(RenewBatcher::new(self.store.clone(), window));
        // What `electors` set is checked here, on the elector of the last shard, built as every
        // round builds its campaigns' electors: not at a round, which could only log it.
        shard_elector(
            &self.configure,
            &shard_store,
            &shard_lease(&group, self.shards - 1, self.shards)?,
            self.ttl,
            &id,
        )?;
        Ok(LeaseGroup {
            inner: Arc::new(Inner {
                shard_store,
                store: self.store,
                group,
                shards: self.shards,
                id,
                weight: self.weight,
                ttl: self.ttl,
                rebalance_every,
                max_moves,
                configure: self.configure,
                member,
                running: Electors::default(),
                takeovers: watch::Sender::new(0),
                shard_locks: Mutex::default(),
            }),
        })
    }
}

/// The leadership of one shard, handed to the task that runs while this member owns it: every
/// method of [`Leader`] (through `Deref`), plus the shard number.
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

    /// The shard's leadership.
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

    /// The shards this member leads now, in order.
    pub fn owned(&self) -> Vec<u32> {
        let running = self.inner.running.lock().expect("group lock");
        running.iter().filter(|(_, e)| e.is_leader()).map(|(s, _)| *s).collect()
    }

    /// The lease of `shard` of `group` (of `shards` shards: the number is zero-padded to the
    /// width of the largest).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] when the name would be too long.
    pub fn shard_lease(group: &LeaseName, shard: u32, shards: u32) -> Result<LeaseName> {
        shard_lease(group, shard, shards)
    }

    /// Lists `group` in `store`: its members and the holder of each shard (one
    /// [`LeaseStore::list`] request). Members whose lease a contender would already take over
    /// (an unchanged record on a store without a clock) are still listed: the listing is a
    /// snapshot, not a judgement of liveness.
    ///
    /// # Errors
    ///
    /// What [`LeaseStore::list`] returns; [`Error::InvalidLeaseName`] for a bad group name.
    pub async fn status(store: &dyn LeaseStore, group: &str) -> Result<GroupStatus> {
        let group = LeaseName::new(group)?;
        let listing = store.list(&format!("{group}.")).await?;
        Ok(parse(&group, listing))
    }

    /// Joins the group and runs `task` once per shard this member owns, until `shutdown`
    /// completes: then the member lease is released (so the other members plan its shards for
    /// themselves at their next round), and every task is cancelled, given until its
    /// `valid_until` to return, and its shard released once it has.
    ///
    /// A task that returns gives its shard up (it is released); the member campaigns for it again
    /// at its next round if it is still planned here. A task's error is logged.
    ///
    /// # Errors
    ///
    /// Only when the group cannot run at all (e.g. the store rejects the TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (instead of completing `shutdown`) stops every shard campaign too:
    /// each cancels its task and releases its shard in a task of its own, without waiting here;
    /// a takeover of a dead member's or stranded record under way still releases what it took.
    pub async fn run_until<F, Fut, E>(&self, task: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let task = Arc::new(task);
        let mut shutdown = std::pin::pin!(shutdown);
        let span = info_span!("group", group = %self.inner.group, member = %self.inner.id);
        let every = self.inner.rebalance_every;
        loop {
            // A member joins only once it can list the group: a member that cannot plan would
            // count as live, with a full quota that the others hand over to it and that it never
            // campaigns for.
            let member = tokio::select! {
                member = self.join().instrument(span.clone()) => member?,
                () = &mut shutdown => return Ok(()),
            };
            info!(parent: &span, "joined the group");
            let mut member_state = Rounds::new(self.inner.running.clone());
            // The first round waits a whole interval: members that start together see each
            // other before anyone plans, instead of the first taking every shard.
            let mut next = tokio::time::Instant::now() + every;
            let mut planned_at = tokio::time::Instant::now();
            let mut failed = 0u32;
            let stop = loop {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    () = member.cancelled() => break false,
                    () = &mut shutdown => break true,
                }
                let began = tokio::time::Instant::now();
                match self.round(&mut member_state, &task).instrument(span.clone()).await {
                    Ok(()) => {
                        failed = 0;
                        planned_at = tokio::time::Instant::now();
                    }
                    Err(error) => {
                        failed += 1;
                        let since = planned_at.elapsed();
                        if failed >= FAILED_ROUNDS_TO_LEAVE && since >= self.inner.ttl * 2 {
                            warn!(parent: &span, %error, failed, ?since, "no round succeeded for two TTLs; leaving the group");
                            break false;
                        }
                        warn!(parent: &span, %error, "the round failed; keeping the current shards");
                    }
                }
                // A slow listing (a scan of a big table) spaces the rounds out, so that listing
                // takes at most a fifth of this member's time with the store.
                next = began + every.max(member_state.listed_in * 5);
            };
            // The member lease goes first: from the others' next round on, this member is no
            // live member, so they plan its shards for themselves (those released at once are
            // taken at once; the others' campaigns wait on the rest) instead of planning them
            // back to it while its slowest task stops. Each shard lease is still released only
            // once its task has returned.
            member.resign().await;
            self.stop_all(member_state).await;
            // Takeovers that the stopped shards (or a dropped round) started still release what
            // they took before `run_until` returns.
            self.inner.takeovers_settled().await;
            if stop {
                return Ok(());
            }
            info!(parent: &span, "left the group; joining again once a listing succeeds");
        }
    }

    /// Lists the group until a listing succeeds (every `rebalance_every`), then campaigns for
    /// the member lease.
    async fn join(&self) -> Result<Leader> {
        while let Err(error) = self.inner.list().await {
            warn!(%error, "cannot list the group; joining once a listing succeeds");
            tokio::time::sleep(self.inner.rebalance_every).await;
        }
        self.inner.member.campaign().await
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

    /// One round: list, plan, start and stop shard campaigns.
    async fn round<F, Fut, E>(&self, rounds: &mut Rounds, task: &Arc<F>) -> Result<()>
    where
        F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let inner = &self.inner;
        let began = tokio::time::Instant::now();
        let listing = inner.list().await?;
        rounds.listed_in = began.elapsed();
        let status = parse(&inner.group, listing);
        let at = now();
        let observed = inner.store.capabilities().expiry == Expiry::ObservedByContenders;
        let mut members: Vec<Member> = status
            .members
            .iter()
            .filter(|m| m.id != inner.id && rounds.alive(&m.lease, observed, at))
            .map(|m| Member {
                id: m.id.clone(),
                weight: m.weight,
            })
            .collect();
        members.push(Member {
            id: inner.id.clone(),
            weight: inner.weight,
        });
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members.dedup_by(|a, b| a.id == b.id);
        if members.first().is_some_and(|m| m.id == inner.id) {
            self.clear_dead_members(&status, rounds, observed, at).await;
        }
        let mut owners: Vec<Option<CandidateId>> = vec![None; inner.shards as usize];
        for shard in status.shards.iter().filter(|s| s.shard < inner.shards) {
            if let Some(h) = &shard.lease.holder
                && rounds.alive(&shard.lease, observed, at)
            {
                owners[shard.shard as usize] = Some(h.id.clone());
            }
        }
        for (shard, owner) in owners.iter().enumerate() {
            let shard = shard as u32;
            if owner.is_some() {
                rounds.unowned_since.remove(&shard);
            } else {
                rounds.unowned_since.entry(shard).or_insert(at);
            }
        }
        // What this member leads is more current than any listing.
        let leading = self.owned();
        for &s in &leading {
            owners[s as usize] = Some(inner.id.clone());
        }
        // This member's other campaigns are its claims: the plan keeps them here (up to the
        // quota) instead of spreading them afresh as the other shards change hands.
        let mut claims: Vec<Option<CandidateId>> = vec![None; inner.shards as usize];
        for &s in rounds.shards.keys() {
            if let Some(claim) = claims.get_mut(s as usize) {
                *claim = Some(inner.id.clone());
            }
        }
        let plan = plan_claimed(&members, &owners, &claims, inner.max_moves);
        let mut pending = HashMap::new();
        let mut stopping = Vec::new();
        for shard in 0..inner.shards {
            let mine = plan.targets[shard as usize].as_ref() == Some(&inner.id);
            let running = rounds.shards.contains_key(&shard);
            if mine && !running {
                // Held by someone who is no live member: a forced move once this member gets it.
                let record = status
                    .shards
                    .binary_search_by_key(&shard, |s| s.shard)
                    .ok()
                    .map(|i| &status.shards[i].lease);
                let live_owner = owners[shard as usize]
                    .as_ref()
                    .is_some_and(|o| members.iter().any(|m| &m.id == o));
                let stranded = record
                    .and_then(|r| r.holder.as_ref())
                    .is_some_and(|h| h.id != inner.id && !live_owner);
                if stranded {
                    metrics::counter!(MOVES, "group" => inner.group.to_string(), "kind" => "forced").increment(1);
                }
                // A record that only a contender ends (no clock, or an orphaned row): this
                // member has been timing its version already (also while the record still
                // counts as alive: a dead member's shards were renewed after its member lease);
                // the shard's new elector would start timing it afresh, a TTL more.
                let takeover = record.filter(|_| stranded).and_then(|r| rounds.takeover(r, observed));
                debug!(
                    shard,
                    stranded,
                    takeover = takeover.is_some(),
                    "campaigning for the shard"
                );
                let started = self.start(shard, task, takeover)?;
                rounds.shards.insert(shard, started);
            } else if !mine && running {
                if leading.contains(&shard) {
                    let to = plan.targets[shard as usize].clone();
                    if rounds.pending.get(&shard) == Some(&to) {
                        info!(shard, to = ?to, "handing the shard over (planned move)");
                        metrics::counter!(MOVES, "group" => inner.group.to_string(), "kind" => "planned").increment(1);
                        if let Some(running) = rounds.shards.get(&shard) {
                            *running.successor.lock().expect("group lock") = to;
                        }
                        stopping.push(shard);
                    } else {
                        pending.insert(shard, to);
                    }
                } else {
                    stopping.push(shard);
                }
            }
        }
        self.stop(rounds, &stopping).await;
        rounds.pending = pending;
        rounds.reap();
        self.record(&status, &members, &owners, rounds, at);
        Ok(())
    }

    /// On stores where only contenders end a record (no clock, or an orphaned row), nobody would
    /// ever replace a dead member's lease: the first live member by id takes each one over by
    /// its version once it has been seen unchanged for its TTL (the engine's rule), and releases
    /// it, so that listings stop showing the member.
    ///
    /// A record is judged by itself, not by its holder's id: a live member's earlier lease
    /// under another weight (`-w1` when it runs as `-w2` now) is as dead as any once nobody
    /// renews it. Only this member's own current lease is never taken over (its elector keeps
    /// it; a renewal that failed for a TTL is its elector's business).
    async fn clear_dead_members(&self, status: &GroupStatus, rounds: &mut Rounds, observed: bool, at: Instant) {
        let inner = &self.inner;
        for dead in &status.members {
            let Some(holder) = &dead.lease.holder else { continue };
            if dead.lease.lease == *inner.member.lease()
                || !(observed || holder.orphaned)
                || rounds.alive(&dead.lease, observed, at)
            {
                continue;
            }
            let lease = dead.lease.lease.clone();
            match inner
                .replace_and_release(lease, holder.ttl, holder.version.clone(), None)
                .await
            {
                Ok(true) => info!(member = %dead.id, "cleared the lease of a member that stopped renewing it"),
                Ok(false) => {}
                Err(error) => debug!(member = %dead.id, %error, "could not clear a dead member's lease"),
            }
        }
    }

    /// Starts campaigning for `shard`, running `task` whenever this member leads it; with
    /// `takeover`, first replaces the stranded record (see [`Takeover`]).
    fn start<F, Fut, E>(&self, shard: u32, task: &Arc<F>, takeover: Option<Takeover>) -> Result<Running>
    where
        F: Fn(ShardLeader) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let inner = &self.inner;
        let lease = shard_lease(&inner.group, shard, inner.shards)?;
        let elector = shard_elector(&inner.configure, &inner.shard_store, &lease, inner.ttl, &inner.id)?;
        // The takeover ends the holder's term uncleanly, as the elector's own would: after the
        // electors' lock delay too, never sooner.
        let lock_delay = elector.timing().lock_delay.unwrap_or_default();
        let takeover = takeover.map(|t| Takeover {
            due: t.due + lock_delay,
            ..t
        });
        let stop = CancellationToken::new();
        let successor = Arc::new(Mutex::new(None));
        let task = task.clone();
        let run = {
            let elector = elector.clone();
            let stop = stop.clone();
            let successor = successor.clone();
            let inner = self.inner.clone();
            async move {
                // Not before an earlier campaign of this shard, and its takeover, have ended: a
                // takeover still under way (its campaign stopped, or `run_until` dropped, while
                // it waited for its acquire) would otherwise end the term this campaign leads
                // with (a candidate's acquire gets a new term over its own record), or hand it
                // to a read-back, and then release its own.
                let lock = inner.shard_lock(shard);
                let held: ShardHeld = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    held = lock.lock_owned() => Arc::new(held),
                };
                if let Some(takeover) = takeover {
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = takeover.run(&inner, shard, held.clone()) => {}
                    }
                }
                let outcome = elector
                    .run_until_handing_over(
                        move |leader| {
                            let task = task.clone();
                            async move { task(ShardLeader { shard, leader }).await }
                        },
                        async move {
                            stop.cancelled().await;
                            successor.lock().expect("group lock").take()
                        },
                    )
                    .await;
                match outcome {
                    Ok(()) => {}
                    Err(RunError::Task(error)) => warn!(shard, %error, "the shard's task failed; shard released"),
                    Err(error) => warn!(shard, %error, "the shard's election ended"),
                }
                drop(held);
            }
        };
        let handle = tokio::spawn(run.instrument(info_span!("shard", shard)));
        inner.running.lock().expect("group lock").insert(shard, elector);
        Ok(Running {
            stop,
            successor,
            handle,
        })
    }

    /// Stops campaigning for `shards`, all at once: cancels their tasks, waits for them, and
    /// releases the leases.
    async fn stop(&self, rounds: &mut Rounds, shards: &[u32]) {
        let stopped: Vec<Running> = shards.iter().filter_map(|s| rounds.shards.remove(s)).collect();
        for running in &stopped {
            running.stop.cancel();
        }
        for running in stopped {
            let _ = running.handle.await;
        }
        let mut electors = self.inner.running.lock().expect("group lock");
        for shard in shards {
            electors.remove(shard);
        }
    }

    /// Stops every shard at once and waits for all of them.
    async fn stop_all(&self, mut rounds: Rounds) {
        let shards: Vec<u32> = rounds.shards.keys().copied().collect();
        self.stop(&mut rounds, &shards).await;
    }

    /// Records the group's gauges as this member sees them.
    fn record(
        &self,
        status: &GroupStatus,
        members: &[Member],
        owners: &[Option<CandidateId>],
        rounds: &Rounds,
        at: Instant,
    ) {
        let group = self.inner.group.to_string();
        let owned = self.owned().len();
        metrics::gauge!(OWNED, "group" => group.clone()).set(owned as f64);
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
        let mean = self.inner.shards as f64 / members.len().max(1) as f64;
        let max = counts.values().copied().max().unwrap_or(0);
        metrics::gauge!(IMBALANCE, "group" => group).set(max as f64 / mean);
        debug!(
            members = members.len(),
            shards = status.shards.len(),
            owned,
            unowned,
            "round"
        );
    }
}

/// The elector of a shard's campaign: the group's TTL and member id over what `configure` (the
/// builder's `electors`) sets. The group moves its shards itself: no shard reads hand-over
/// requests, whatever `electors` set.
fn shard_elector(
    configure: &Configure,
    store: &Arc<dyn LeaseStore>,
    lease: &LeaseName,
    ttl: Duration,
    id: &CandidateId,
) -> Result<Elector> {
    configure(Elector::builder(store.clone(), lease.as_str()))
        .ttl(ttl)
        .candidate_id(id.as_str())
        .hand_over_requests(false)
        .build()
}

/// A member leaves the group when this many rounds in a row failed, over at least two TTLs
/// since its last successful round (or its join): it cannot plan, so it would never campaign for
/// the shards that the others hand over to it.
const FAILED_ROUNDS_TO_LEAVE: u32 = 3;

/// Shards owned per member (this member's count).
const OWNED: &str = "leasehold_group_shards_owned";
/// Shards with no live owner, as this member sees them.
const UNOWNED: &str = "leasehold_group_unowned_shards";
/// How long the longest-unowned shard has been unowned, as this member sees it.
const UNOWNED_SECONDS: &str = "leasehold_group_unowned_seconds";
/// The most shards one member owns, over the mean.
const IMBALANCE: &str = "leasehold_group_imbalance";
/// Shards this member handed over (`kind="planned"`), and shards it went after whose holder is no
/// live member any more (`kind="forced"`).
const MOVES: &str = "leasehold_group_moves_total";

/// A stranded shard record that this member has seen unchanged since before a campaign for it
/// starts: at `due` (its TTL after the listing that first showed this version) the member
/// replaces it by its version and releases it, as [`LeaseGroup::clear_dead_members`] does with
/// member leases, so that the shard's elector finds it free instead of timing the version
/// again from its own first sight (a second TTL). If the holder renewed meanwhile (another
/// version) the store refuses, and the elector times the record itself.
#[derive(Debug)]
struct Takeover {
    version: String,
    due: Instant,
}

impl Takeover {
    /// `held`: the shard's lock, kept until the takeover has ended, also if this is dropped.
    async fn run(self, inner: &Arc<Inner>, shard: u32, held: ShardHeld) {
        tokio::time::sleep_until(tokio::time::Instant::from_std(self.due)).await;
        let Ok(lease) = shard_lease(&inner.group, shard, inner.shards) else {
            return;
        };
        match inner
            .replace_and_release(lease, inner.ttl, self.version, Some(held))
            .await
        {
            Ok(true) => debug!(shard, "replaced the record of a holder that stopped renewing it"),
            Ok(false) => {}
            Err(error) => debug!(shard, %error, "could not replace a stranded shard's record"),
        }
    }
}

impl Inner {
    /// Lists the group (one [`LeaseStore::list`]). A listing is on no lease's critical path and
    /// can be long (a scan of many pages): a slow one still gives a plan, a little late, so it
    /// is bounded by three TTLs.
    async fn list(&self) -> Result<Vec<Observation>> {
        let timeout = self.ttl * 3;
        tokio::time::timeout(timeout, self.store.list(&format!("{}.", self.group)))
            .await
            .map_err(|_| Error::Timeout {
                store: self.store.name(),
                operation: "list",
                after: timeout,
            })?
    }

    /// Takes `lease` over by `version` (a record nobody renews: a dead member's, a stranded
    /// shard's) and releases it at once. `Ok(false)`: the store refused (the holder renewed
    /// meanwhile); `Err`: the store failed, or did not answer within a TTL.
    ///
    /// # Cancel safety
    ///
    /// The acquire and the release run together in a task of their own: dropping this future
    /// (the member stops, a shard's campaign is stopped, the caller's future is dropped) does
    /// not separate them, so a record this member took over is released even then, instead of
    /// being left with a fresh version that nobody believes and every contender times for
    /// another TTL. [`LeaseGroup::run_until`] waits for these tasks before it returns. `held`
    /// (a shard's lock) is kept until the task ends, so that the shard's next campaign does not
    /// start while the takeover can still change the record.
    async fn replace_and_release(
        self: &Arc<Self>,
        lease: LeaseName,
        ttl: Duration,
        version: String,
        held: Option<ShardHeld>,
    ) -> std::result::Result<bool, String> {
        let inner = self.clone();
        self.takeovers.send_modify(|n| *n += 1);
        let pair = tokio::spawn(async move {
            let _settled = TakeoverSettled(inner.clone());
            let _held = held;
            inner.replace_then_release(lease, ttl, version).await
        });
        pair.await
            .unwrap_or_else(|error| Err(format!("the takeover task ended: {error}")))
    }

    /// The body of [`Inner::replace_and_release`]: the acquire bounded by a TTL; once it is
    /// granted, the release, retried on transient errors within another TTL. An acquire whose
    /// outcome is unknown (no answer within the TTL, a transient error) is read back, and the
    /// record released if it shows this member.
    async fn replace_then_release(
        &self,
        lease: LeaseName,
        ttl: Duration,
        version: String,
    ) -> std::result::Result<bool, String> {
        let request = AcquireRequest {
            lease,
            candidate: self.id.clone(),
            ttl,
            takeover: Some(version),
        };
        let grant = match tokio::time::timeout(self.ttl, self.store.acquire(&request)).await {
            Ok(Ok(Acquired::Granted(grant))) => grant,
            Ok(Ok(Acquired::Held(_))) => return Ok(false),
            Ok(Err(error)) if !error.is_transient() => return Err(error.to_string()),
            unknown => {
                let unknown = match unknown {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("no answer to the takeover within {}", crate::time::Human(self.ttl)),
                };
                match self.read_back_own(&request).await {
                    Some(grant) => grant,
                    None => return Err(unknown),
                }
            }
        };
        let deadline = tokio::time::Instant::now() + self.ttl;
        let mut pause = Duration::from_millis(50);
        loop {
            match tokio::time::timeout_at(deadline, self.store.release(&grant)).await {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(error)) if error.is_transient() && tokio::time::Instant::now() + pause < deadline => {
                    debug!(lease = %grant.lease, %error, "releasing a record taken over; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.ttl / 4);
                }
                Ok(Err(error)) => return Err(format!("took the record over, then could not release it: {error}")),
                Err(_) => {
                    return Err(format!(
                        "took the record over, then its release got no answer within {}",
                        crate::time::Human(self.ttl)
                    ));
                }
            }
        }
    }

    /// After a takeover's acquire with an unknown outcome: the record, if it shows this member,
    /// is that acquire's grant (nothing else of this member acts on the lease meanwhile: a
    /// shard's campaign waits for its takeover, and a dead member's lease is not this member's),
    /// to be given back as the engine gives back a grant of its own that it reads back while
    /// stopping. An acquire applied after this read (cut off a TTL after it was sent, as the
    /// engine cuts off its own calls, but perhaps applied later still) is not seen: a contender
    /// times its record, the shard's campaign supersedes it with a term of its own, or, landing
    /// after that campaign's grant, supersedes the campaign, which then steps down and releases
    /// the stray term (mutual exclusion holds; leadership moves for nothing).
    async fn read_back_own(&self, request: &AcquireRequest) -> Option<Grant> {
        let observation = tokio::time::timeout(self.ttl, self.store.inspect(&request.lease))
            .await
            .ok()?
            .ok()?;
        let holder = observation.holder.filter(|h| h.id == self.id && !h.reserved)?;
        debug!(lease = %request.lease, term = %holder.term, "a takeover with no answer was applied; releasing it");
        Some(Grant {
            lease: request.lease.clone(),
            holder: self.id.clone(),
            term: holder.term,
            ttl: request.ttl,
            token: holder.version,
        })
    }

    /// The lock of `shard`'s campaigns and takeovers (one per shard, made on first use: at most
    /// `shards` of them).
    fn shard_lock(&self, shard: u32) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.shard_locks.lock().expect("group lock");
        locks.entry(shard).or_default().clone()
    }

    /// Completes once no takeover ([`Inner::replace_and_release`]) is under way: at most about
    /// three TTLs (its acquire, a read-back when that has no answer, and the release are each
    /// bounded by a TTL).
    async fn takeovers_settled(&self) {
        let mut under_way = self.takeovers.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let _ = under_way.wait_for(|n| *n == 0).await;
    }
}

/// Counts a takeover task as done when it ends, however it ends.
struct TakeoverSettled(Arc<Inner>);

impl Drop for TakeoverSettled {
    fn drop(&mut self) {
        self.0.takeovers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A running shard campaign.
struct Running {
    stop: CancellationToken,
    /// Set before `stop` for a planned move: the lease is handed over to this member.
    successor: Arc<Mutex<Option<CandidateId>>>,
    handle: JoinHandle<()>,
}

/// What a member keeps between rounds.
struct Rounds {
    shards: BTreeMap<u32, Running>,
    /// The member's [`Inner::running`]: `shards` are forgotten there when they are.
    running: Electors,
    /// Planned moves of shards this member leads, seen in the last round: handed over when the
    /// next round plans the same.
    pending: HashMap<u32, Option<CandidateId>>,
    /// For stores without a clock: each record version and when it was first seen.
    versions: HashMap<LeaseName, (String, Instant)>,
    /// Since when each shard has been seen without a live owner.
    unowned_since: HashMap<u32, Instant>,
    /// How long the last listing took.
    listed_in: Duration,
}

impl Rounds {
    fn new(running: Electors) -> Self {
        Rounds {
            shards: BTreeMap::new(),
            running,
            pending: HashMap::new(),
            versions: HashMap::new(),
            unowned_since: HashMap::new(),
            listed_in: Duration::ZERO,
        }
    }

    /// Whether a held record counts as alive: on stores without a clock (and for orphaned
    /// records), only until its version has been seen unchanged for its TTL.
    ///
    /// Every record's version is timed, also while its holder's session still holds it: when
    /// a row is orphaned (the session ended), its version has been timed since the listing
    /// that first showed it, not since the first listing that showed it orphaned. That is the
    /// record-version rule: the holder's last renewal wrote that version after it was sent, so
    /// the holder stopped believing in it before a TTL after the listing showed it.
    fn alive(&mut self, lease: &Observation, observed: bool, at: Instant) -> bool {
        let Some(holder) = &lease.holder else { return false };
        let since = self.seen_since(&lease.lease, &holder.version, at);
        if !observed && !holder.orphaned {
            return true;
        }
        at < since + holder.ttl
    }

    /// Since when the version `version` of `lease` has been seen (listings up to `at`).
    fn seen_since(&mut self, lease: &LeaseName, version: &str, at: Instant) -> Instant {
        let seen = self
            .versions
            .entry(lease.clone())
            .or_insert_with(|| (version.to_string(), at));
        if seen.0 != version {
            *seen = (version.to_string(), at);
        }
        seen.1
    }

    /// What a new campaign may take over at once (or as soon as the TTL is up): a held
    /// record that only a contender ends (`observed`, or orphaned) and whose version this
    /// member has been timing.
    fn takeover(&self, record: &Observation, observed: bool) -> Option<Takeover> {
        let holder = record.holder.as_ref()?;
        if !observed && !holder.orphaned {
            return None;
        }
        let (version, since) = self.versions.get(&record.lease)?;
        (*version == holder.version).then(|| Takeover {
            version: version.clone(),
            due: *since + holder.ttl,
        })
    }

    /// Forgets campaigns whose task ended on its own (it gave the shard up).
    fn reap(&mut self) {
        let done: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, r)| r.handle.is_finished())
            .map(|(s, _)| *s)
            .collect();
        let mut running = self.running.lock().expect("group lock");
        for shard in done {
            self.shards.remove(&shard);
            running.remove(&shard);
        }
    }
}

impl Drop for Rounds {
    /// A member's rounds end with [`LeaseGroup::stop_all`], which has stopped every campaign
    /// already; when the future of [`LeaseGroup::run_until`] is dropped instead, this stops the
    /// campaigns still running, so that they release their shards (each in its own task, as a
    /// planned stop does) instead of leading them on, renewed, for a member that left. They are
    /// no longer this member's: [`LeaseGroup::owned`] stops listing them at once.
    fn drop(&mut self) {
        let mut running = self.running.lock().expect("group lock");
        for (shard, campaign) in &self.shards {
            campaign.stop.cancel();
            running.remove(shard);
        }
    }
}
