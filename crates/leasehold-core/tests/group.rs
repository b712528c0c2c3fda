//! Lease groups over the in-memory store on tokio's paused clock: balance from cold, no moves
//! while membership is stable, a crashed member's shards spread over the others, a join moves
//! few shards, and never two owners of a shard at once, with terms increasing on every change.
//! (The shared conformance suite runs groups on the real backends.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, EndReason, Error, Grant, LeaseGroup, LeaseName,
    LeaseStore, MemoryStore, Observation, Renewed, Result, ShardLeader, Term, Transition, async_trait,
};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);
const SHARDS: u32 = 64;

/// One member's connection to the shared store; `kill` makes every request fail, as if the
/// member's process hung or was cut off.
#[derive(Debug)]
struct Link {
    store: MemoryStore,
    dead: AtomicBool,
    /// `renew` calls, `renew_many` calls, and the grants those renewed.
    renews: AtomicUsize,
    batches: AtomicUsize,
    batched: AtomicUsize,
    /// Takeovers by version are applied at once but answered this much later (none: at once).
    takeover_reply_delay: Mutex<Option<Duration>>,
    /// Takeovers by version of a shard record that the store granted.
    shard_takeovers: AtomicUsize,
    /// When set, the next takeover by version of a shard record waits for this before the
    /// store sees it (a request on its way); `takeover_held` is set while it waits.
    takeover_gate: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    takeover_held: AtomicBool,
}

impl Link {
    fn check(&self) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(Error::unreachable("memory", "the member is cut off"))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl LeaseStore for Link {
    fn name(&self) -> &'static str {
        self.store.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.check()?;
        if request.takeover.is_some() && request.lease.as_str().contains(".s.") {
            let gate = self.takeover_gate.lock().unwrap().take();
            if let Some(gate) = gate {
                self.takeover_held.store(true, Ordering::SeqCst);
                let _ = gate.await;
                self.takeover_held.store(false, Ordering::SeqCst);
            }
        }
        let acquired = self.store.acquire(request).await?;
        if request.takeover.is_some() && matches!(acquired, Acquired::Granted(_)) {
            if request.lease.as_str().contains(".s.") {
                self.shard_takeovers.fetch_add(1, Ordering::SeqCst);
            }
            let delay = *self.takeover_reply_delay.lock().unwrap();
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
        }
        Ok(acquired)
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        self.store.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.check()?;
        self.store.release(grant).await
    }
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.batched.fetch_add(grants.len(), Ordering::SeqCst);
        self.check()?;
        self.store.renew_many(grants).await
    }
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.check()?;
        self.store.hand_over(grant, to).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.check()?;
        self.store.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.check()?;
        self.store.history(lease, limit).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.check()?;
        self.store.list(prefix).await
    }
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.check()?;
        self.store.changes(lease, candidate).await
    }
}

/// What every shard task records: who runs each shard now, every term, overlaps.
#[derive(Default)]
struct Book {
    running: Mutex<HashMap<u32, (String, Term)>>,
    terms: Mutex<HashMap<u32, Vec<Term>>>,
    violations: Mutex<Vec<String>>,
    starts: AtomicUsize,
    /// When each shard's work last stopped, and the longest time a shard ran nowhere between a
    /// stop and the next start.
    stopped_at: Mutex<HashMap<u32, tokio::time::Instant>>,
    longest_gap: Mutex<Duration>,
}

impl Book {
    fn start(&self, shard: &ShardLeader) {
        let me = shard.holder().to_string();
        self.starts.fetch_add(1, Ordering::SeqCst);
        let mut running = self.running.lock().unwrap();
        if let Some((other, term)) = running.get(&shard.shard()) {
            self.violations.lock().unwrap().push(format!(
                "shard {}: {me} (term {}) started while {other} (term {term}) still runs",
                shard.shard(),
                shard.term()
            ));
        }
        running.insert(shard.shard(), (me, shard.term()));
        if let Some(stopped) = self.stopped_at.lock().unwrap().remove(&shard.shard()) {
            let mut longest = self.longest_gap.lock().unwrap();
            *longest = (*longest).max(stopped.elapsed());
        }
        let mut terms = self.terms.lock().unwrap();
        let terms = terms.entry(shard.shard()).or_default();
        if terms.last().is_some_and(|last| *last >= shard.term()) {
            self.violations.lock().unwrap().push(format!(
                "shard {}: term {} after {:?}",
                shard.shard(),
                shard.term(),
                terms
            ));
        }
        terms.push(shard.term());
    }

    fn stop(&self, shard: &ShardLeader) {
        let mut running = self.running.lock().unwrap();
        if running
            .get(&shard.shard())
            .is_some_and(|(_, term)| *term == shard.term())
        {
            running.remove(&shard.shard());
            self.stopped_at
                .lock()
                .unwrap()
                .insert(shard.shard(), tokio::time::Instant::now());
        }
    }

    /// Shards run per member.
    fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (member, _) in self.running.lock().unwrap().values() {
            *counts.entry(member.clone()).or_default() += 1;
        }
        counts
    }
}

/// A member's link to `store`, with no faults.
fn link(store: &MemoryStore) -> Arc<Link> {
    Arc::new(Link {
        store: store.clone(),
        dead: AtomicBool::new(false),
        renews: AtomicUsize::new(0),
        batches: AtomicUsize::new(0),
        batched: AtomicUsize::new(0),
        takeover_reply_delay: Mutex::new(None),
        shard_takeovers: AtomicUsize::new(0),
        takeover_gate: Mutex::new(None),
        takeover_held: AtomicBool::new(false),
    })
}

struct Member {
    link: Arc<Link>,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<Result<()>>,
}

fn join(store: &MemoryStore, book: &Arc<Book>, id: &str) -> Member {
    join_with(store, book, id, None)
}

/// `join`, with the shard electors' lock delay set.
fn join_with(store: &MemoryStore, book: &Arc<Book>, id: &str, lock_delay: Option<Duration>) -> Member {
    let link = link(store);
    let mut group = LeaseGroup::builder(link.clone(), "orders", SHARDS)
        .member_id(id)
        .ttl(TTL);
    if let Some(delay) = lock_delay {
        group = group.electors(move |b| b.lock_delay(delay));
    }
    let group = group.build().unwrap();
    let stop = CancellationToken::new();
    let book = book.clone();
    let shutdown = stop.clone().cancelled_owned();
    let handle = tokio::spawn(async move {
        group
            .run_until(
                move |shard: ShardLeader| {
                    let book = book.clone();
                    async move {
                        book.start(&shard);
                        shard.cancelled().await;
                        book.stop(&shard);
                        Ok::<(), Error>(())
                    }
                },
                shutdown,
            )
            .await
    });
    Member { link, stop, handle }
}

/// Waits (on the paused clock) until the members' shard counts are `expected` (sorted,
/// descending) and every shard runs; returns how long it took.
async fn balanced(book: &Book, expected: &[usize], bound: Duration) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        let counts = book.counts();
        let mut sorted: Vec<usize> = counts.values().copied().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        if sorted == expected {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "not balanced to {expected:?} within {bound:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn groups_balance_stay_put_spread_a_crash_and_move_few_shards_on_a_join() {
    let store = MemoryStore::new();
    let book = Arc::new(Book::default());

    // Cold start: three members share 64 shards as 22/21/21.
    let members: Vec<Member> = ["a", "b", "c"].iter().map(|id| join(&store, &book, id)).collect();
    let took = balanced(&book, &[22, 21, 21], TTL * 10).await;
    println!("cold start balanced in {took:?}");

    // Stable membership for 10 TTLs: not one shard moves.
    let starts = book.starts.load(Ordering::SeqCst);
    tokio::time::sleep(TTL * 10).await;
    assert_eq!(
        book.starts.load(Ordering::SeqCst),
        starts,
        "shards moved while membership was stable"
    );

    // c is cut off: its shards go to a and b, spread (32/32), within a TTL and a few rounds.
    members[2].link.dead.store(true, Ordering::SeqCst);
    let took = balanced(&book, &[32, 32], TTL * 4).await;
    println!("crash: c's shards owned again after {took:?}");
    assert!(took <= TTL * 2, "took {took:?}");

    // d joins: it takes at most ceil(64 / 3) = 22 shards, everyone ends at 22/21/21.
    let starts = book.starts.load(Ordering::SeqCst);
    let d = join(&store, &book, "d");
    let took = balanced(&book, &[22, 21, 21], TTL * 20).await;
    let moves = book.starts.load(Ordering::SeqCst) - starts;
    println!("join: balanced after {took:?} with {moves} moves");
    assert!(moves <= 22, "{moves} moves");

    // A graceful leave (b stops): its shards are handed over, nobody else's move.
    let mut members = members;
    let b = members.remove(1);
    b.stop.cancel();
    b.handle.await.unwrap().unwrap();
    let took = balanced(&book, &[32, 32], TTL * 10).await;
    println!("leave: balanced after {took:?}");

    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    for m in members.iter().chain([&d]) {
        m.stop.cancel();
    }
}

/// Finding 2 of issue 31: with the shard electors' `lock_delay`, every planned move (a join's
/// hand-overs) left its shard unowned for TTL + delay (3 s at TTL 2 s, delay 1 s), where
/// docs/groups.md promises no expiry gap on planned moves: the successor's lock-delay look saw the
/// reservation naming itself as a holder. Planned moves now leave no gap beyond a poll.
#[tokio::test(start_paused = true)]
async fn planned_moves_leave_no_gap_with_a_lock_delay() {
    let store = MemoryStore::new();
    let book = Arc::new(Book::default());
    let lock_delay = Some(Duration::from_secs(1));
    let a = join_with(&store, &book, "a", lock_delay);
    balanced(&book, &[SHARDS as usize], TTL * 10).await;
    let starts = book.starts.load(Ordering::SeqCst);
    let b = join_with(&store, &book, "b", lock_delay);
    let took = balanced(&book, &[32, 32], TTL * 20).await;
    let moves = book.starts.load(Ordering::SeqCst) - starts;
    let gap = *book.longest_gap.lock().unwrap();
    println!("join with a lock delay: balanced after {took:?} with {moves} moves, longest unowned gap {gap:?}");
    assert!(moves >= 32, "{moves} moves");
    assert!(gap < TTL / 2, "a planned move left its shard unowned for {gap:?}");
    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    a.stop.cancel();
    b.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn on_a_store_without_a_clock_a_dead_members_shards_move_and_its_lease_is_cleared() {
    let store = MemoryStore::observed_expiry();
    let book = Arc::new(Book::default());
    let a = join(&store, &book, "a");
    let b = join(&store, &book, "b");
    balanced(&book, &[32, 32], TTL * 10).await;
    let status = LeaseGroup::status(&store, "orders").await.unwrap();
    assert_eq!(status.members.len(), 2);

    // b is cut off: a sees b's member record unchanged for a TTL, then each shard's for another.
    b.link.dead.store(true, Ordering::SeqCst);
    let took = balanced(&book, &[64], TTL * 6).await;
    println!("observed expiry: b's shards owned by a after {took:?}");
    // Nothing but a contender ends a record here: a clears b's member lease, so listings stop
    // showing b.
    let cleared = tokio::time::timeout(TTL * 4, async {
        loop {
            let status = LeaseGroup::status(&store, "orders").await.unwrap();
            if status.members.iter().map(|m| m.id.as_str()).eq(["a"]) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(cleared.is_ok(), "b's member lease is still listed");
    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    a.stop.cancel();
    b.stop.cancel();
}

/// A member that takes a dead member's shard record over itself (stores without a clock) waits
/// the shard electors' lock delay too, as each elector would: never sooner than a TTL plus the
/// delay after the cut.
#[tokio::test(start_paused = true)]
async fn a_dead_members_shards_are_taken_over_no_sooner_than_the_electors_lock_delay() {
    let store = MemoryStore::observed_expiry();
    let book = Arc::new(Book::default());
    let lock_delay = TTL * 2;
    let a = join_with(&store, &book, "a", Some(lock_delay));
    let b = join_with(&store, &book, "b", Some(lock_delay));
    balanced(&book, &[32, 32], TTL * 10).await;
    b.link.dead.store(true, Ordering::SeqCst);
    let took = balanced(&book, &[64], TTL * 10).await;
    println!("observed expiry with a lock delay of {lock_delay:?}: b's shards owned by a after {took:?}");
    assert!(took >= TTL + lock_delay, "b's shards taken over after {took:?}");
    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    a.stop.cancel();
    b.stop.cancel();
}

/// A member that stops while its takeover of a stranded shard record (store without a clock) is
/// between the acquire and the release still releases the record: otherwise the record, now the
/// stopped member's with a fresh version, would be timed for another TTL by whoever is left.
#[tokio::test(start_paused = true)]
async fn a_takeover_cut_short_by_the_member_stopping_still_releases_the_record() {
    let store = MemoryStore::observed_expiry();
    let book = Arc::new(Book::default());
    let a = join(&store, &book, "a");
    let b = join(&store, &book, "b");
    balanced(&book, &[32, 32], TTL * 10).await;
    // a's takeovers are applied at once and answered a quarter TTL later.
    *a.link.takeover_reply_delay.lock().unwrap() = Some(TTL / 4);
    b.link.dead.store(true, Ordering::SeqCst);
    let applied = tokio::time::timeout(TTL * 6, async {
        while a.link.shard_takeovers.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(applied.is_ok(), "a never took a shard record of b's over");
    // a stops while that takeover's reply is on its way.
    a.stop.cancel();
    a.handle.await.unwrap().unwrap();
    let taken = a.link.shard_takeovers.load(Ordering::SeqCst);
    let status = LeaseGroup::status(&store, "orders").await.unwrap();
    let held_by_a: Vec<u32> = status
        .shards
        .iter()
        .filter(|s| s.owner().is_some_and(|(id, _)| id.as_str() == "a"))
        .map(|s| s.shard)
        .collect();
    assert!(
        held_by_a.is_empty(),
        "after a stopped, {} of its {taken} takeovers still hold shard records: {held_by_a:?}",
        held_by_a.len()
    );
    b.stop.cancel();
}

/// A takeover by version still on its way when its shard's campaign stops (here the member's
/// `run_until` is dropped, then run again) must not overlap the next campaign of that shard
/// under the same id: a late takeover ends the term the new campaign leads (the store gives a
/// candidate's acquire a new term over its own record) and then releases its own, so the lease
/// is free while the new campaign's task runs on (or a read-back of an ambiguous acquire adopts
/// the takeover's term, which the takeover then releases). The new campaign waits for the
/// takeover to end.
#[tokio::test(start_paused = true)]
async fn a_new_campaign_of_a_shard_waits_for_a_takeover_of_it_still_under_way() {
    let store = MemoryStore::observed_expiry();
    let book = Arc::new(Book::default());
    // Shard 0 of a one-shard group is held by "gone", no member: stranded. Its TTL is shorter
    // than the group's, so a campaign's takeover is due before an earlier one times out.
    let lease = LeaseGroup::shard_lease(&LeaseName::new("orders").unwrap(), 0, 1).unwrap();
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new("gone").unwrap(),
        ttl: TTL / 10,
        takeover: None,
    };
    assert!(matches!(store.acquire(&request).await.unwrap(), Acquired::Granted(_)));
    let link = link(&store);
    let (open, gate) = tokio::sync::oneshot::channel();
    *link.takeover_gate.lock().unwrap() = Some(gate);
    let group = LeaseGroup::builder(link.clone(), "orders", 1)
        .member_id("a")
        .ttl(TTL)
        .build()
        .unwrap();
    let run = |group: &LeaseGroup| {
        let group = group.clone();
        let book = book.clone();
        tokio::spawn(async move {
            group
                .run(move |shard: ShardLeader| {
                    let book = book.clone();
                    async move {
                        book.start(&shard);
                        shard.cancelled().await;
                        book.stop(&shard);
                        Ok::<(), Error>(())
                    }
                })
                .await
        })
    };
    let first = run(&group);
    // a takes the record over by its version: the request is on its way to the store.
    let held = tokio::time::timeout(TTL * 4, async {
        while !link.takeover_held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "a never took the stranded record over");
    first.abort();
    let _ = first.await;
    let second = run(&group);
    // The new campaign, if it does not wait, takes the record over itself and leads within
    // this time (its takeover is due a quarter TTL after its first round); the first takeover
    // is still under way (it gives up after a TTL).
    let _ = tokio::time::timeout(TTL * 9 / 10, async {
        while !book.running.lock().unwrap().contains_key(&0) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The first takeover reaches the store, is answered, and releases what it was granted.
    open.send(()).unwrap();
    // Whenever a's task runs shard 0 at a term from now on, the store shows a holding that term.
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let running = book.running.lock().unwrap().get(&0).cloned();
        if let Some((_, term)) = running {
            let holder = store.inspect(&lease).await.unwrap().holder;
            assert!(
                holder.as_ref().is_some_and(|h| h.id.as_str() == "a" && h.term == term),
                "a's task runs shard 0 at term {term:?} while the store shows {holder:?}"
            );
        }
    }
    assert!(book.running.lock().unwrap().contains_key(&0), "a does not lead shard 0");
    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    second.abort();
}

/// A takeover by version applied by the store but answered only after the member gave up on
/// it (a TTL) is read back and released, as the engine does with a grant of its own it reads
/// back while stopping: the record the member took over ends released, not superseded later by
/// the shard's own campaign (nor, on a store where only the member's next acquire ends it,
/// timed by contenders for another TTL).
#[tokio::test(start_paused = true)]
async fn a_takeover_answered_too_late_is_read_back_and_released() {
    let store = MemoryStore::observed_expiry();
    let book = Arc::new(Book::default());
    let lease = LeaseGroup::shard_lease(&LeaseName::new("orders").unwrap(), 0, 1).unwrap();
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new("gone").unwrap(),
        ttl: TTL / 10,
        takeover: None,
    };
    let Acquired::Granted(gone) = store.acquire(&request).await.unwrap() else {
        panic!("the record of \"gone\" was not granted");
    };
    let link = link(&store);
    *link.takeover_reply_delay.lock().unwrap() = Some(TTL * 2);
    let group = LeaseGroup::builder(link.clone(), "orders", 1)
        .member_id("a")
        .ttl(TTL)
        .build()
        .unwrap();
    let handle = {
        let group = group.clone();
        let book = book.clone();
        tokio::spawn(async move {
            group
                .run(move |shard: ShardLeader| {
                    let book = book.clone();
                    async move {
                        book.start(&shard);
                        shard.cancelled().await;
                        book.stop(&shard);
                        Ok::<(), Error>(())
                    }
                })
                .await
        })
    };
    balanced(&book, &[1], TTL * 5).await;
    let history = store.history(&lease, 10).await.unwrap();
    let taken = history
        .iter()
        .find(|t| t.term > gone.term && t.holder.as_str() == "a")
        .expect("a's takeover in the history");
    let first_of_a = history
        .iter()
        .filter(|t| t.holder.as_str() == "a")
        .map(|t| t.term)
        .min();
    assert_eq!(Some(taken.term), first_of_a);
    assert!(
        matches!(taken.ended, Some((_, EndReason::Released))),
        "the record a took over (term {}) ended {:?}: {history:#?}",
        taken.term,
        taken.ended
    );
    handle.abort();
}

/// A member whose `run_until` future is dropped (its task aborted) leaves the group: its shard
/// campaigns stop and release their shards, which the other member takes over, instead of
/// running on, renewed, without a member.
#[tokio::test(start_paused = true)]
async fn a_member_whose_run_is_dropped_gives_its_shards_up() {
    let store = MemoryStore::new();
    let book = Arc::new(Book::default());
    let a = join(&store, &book, "a");
    let b = join(&store, &book, "b");
    balanced(&book, &[32, 32], TTL * 10).await;
    b.handle.abort();
    let took = balanced(&book, &[64], TTL * 4).await;
    println!("b's run dropped: its shards owned by a after {took:?}");
    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    a.stop.cancel();
    a.handle.await.unwrap().unwrap();
}

/// A member whose `run_until` future is dropped owns nothing from then on: `owned()` does not
/// list the shards whose campaigns are stopping (nor keep them until a later run overwrites
/// them).
#[tokio::test(start_paused = true)]
async fn a_member_whose_run_is_dropped_owns_no_shard() {
    let store = MemoryStore::new();
    let book = Arc::new(Book::default());
    let group = LeaseGroup::builder(link(&store), "orders", 8)
        .member_id("a")
        .ttl(TTL)
        .build()
        .unwrap();
    let handle = {
        let group = group.clone();
        let book = book.clone();
        tokio::spawn(async move {
            group
                .run(move |shard: ShardLeader| {
                    let book = book.clone();
                    async move {
                        book.start(&shard);
                        shard.cancelled().await;
                        book.stop(&shard);
                        Ok::<(), Error>(())
                    }
                })
                .await
        })
    };
    balanced(&book, &[8], TTL * 5).await;
    assert_eq!(group.owned(), (0..8).collect::<Vec<u32>>());
    handle.abort();
    let _ = handle.await;
    assert_eq!(
        group.owned(),
        Vec::<u32>::new(),
        "owned right after the run was dropped"
    );
    tokio::time::sleep(TTL).await;
    assert_eq!(
        group.owned(),
        Vec::<u32>::new(),
        "owned a TTL after the run was dropped"
    );
    assert!(book.running.lock().unwrap().is_empty(), "shard tasks still run");
}

/// A member renews its shards together (one `renew_many` per renewal round, not one `renew`
/// per shard): with 64 shards over 10 TTLs (30 rounds at renew_every = TTL / 3), a few dozen
/// requests instead of about 1,900.
#[tokio::test(start_paused = true)]
async fn a_member_renews_its_shards_together() {
    let store = MemoryStore::new();
    let book = Arc::new(Book::default());
    let alone = join(&store, &book, "alone");
    balanced(&book, &[SHARDS as usize], TTL * 5).await;
    let (renews, batches, batched) = (
        alone.link.renews.load(Ordering::SeqCst),
        alone.link.batches.load(Ordering::SeqCst),
        alone.link.batched.load(Ordering::SeqCst),
    );
    tokio::time::sleep(TTL * 10).await;
    let renews = alone.link.renews.load(Ordering::SeqCst) - renews;
    let batches = alone.link.batches.load(Ordering::SeqCst) - batches;
    let batched = alone.link.batched.load(Ordering::SeqCst) - batched;
    let rounds = 30;
    println!("{renews} renew calls, {batches} renew_many calls renewing {batched} grants over 10 TTLs");
    // Shard renewals only come in batches; the member lease (one elector of its own) renews
    // through `renew`.
    assert!(renews <= rounds + 1, "{renews} single renewals in {rounds} rounds");
    assert!(
        batched >= SHARDS as usize * (rounds - 1),
        "only {batched} shard renewals in {rounds} rounds"
    );
    assert!(
        batches <= 2 * rounds,
        "{batches} renew_many calls for {batched} renewals in {rounds} rounds"
    );
    alone.stop.cancel();
    alone.handle.await.unwrap().unwrap();
}
