//! Lease groups over the in-memory store on tokio's paused clock: balance from cold, no moves
//! while membership is stable, a crashed member's shards spread over the others, a join moves
//! few shards, and never two owners of a shard at once, with terms increasing on every change.
//! (The shared conformance suite runs groups on the real backends.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, CountingStore, Error, Grant, LeaseGroup, LeaseName,
    LeaseStore, MemoryStore, Observation, Operation, Renewed, Result, ShardLeader, Term, Transition, async_trait,
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
    async fn shard_records(&self, prefix: &str) -> Result<Vec<leasehold_core::ShardRecord>> {
        self.check()?;
        self.store.shard_records(prefix).await
    }
    async fn write_shard(
        &self,
        name: &LeaseName,
        expected: Option<&str>,
        value: &str,
    ) -> Result<leasehold_core::ShardWrite> {
        self.check()?;
        self.store.write_shard(name, expected, value).await
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

/// Every metric series registered (name and labels), whatever its kind.
#[derive(Default)]
struct SeriesSeen(Mutex<std::collections::BTreeSet<String>>);

impl SeriesSeen {
    fn note(&self, key: &metrics::Key) {
        let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        self.0
            .lock()
            .unwrap()
            .insert(format!("{}{{{}}}", key.name(), labels.join(",")));
    }
}

impl metrics::Recorder for SeriesSeen {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.note(key);
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.note(key);
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        self.note(key);
        metrics::Histogram::noop()
    }
}

/// A member's requests and metric series do not grow with its shards: alone with 8 shards and
/// with 2,048, once it owns them all it makes the same requests over 10 TTLs (its member lease's
/// renewals and one listing of the members per round; no shard record is read or written while
/// nothing changes), and registers the same series (the group's and its member lease's).
#[tokio::test(start_paused = true)]
async fn a_members_requests_do_not_grow_with_its_shards() {
    let mut per_ttl = Vec::new();
    let mut series = Vec::new();
    for shards in [8, 2048] {
        let seen = SeriesSeen::default();
        let _local = metrics::set_default_local_recorder(&seen);
        let store = Arc::new(CountingStore::new(MemoryStore::new()));
        let group = LeaseGroup::builder(store.clone(), "cost", shards)
            .member_id("alone")
            .ttl(TTL)
            .build()
            .unwrap();
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let member = group.clone();
        let handle = tokio::spawn(async move {
            member
                .run_until(
                    |shard: ShardLeader| async move {
                        shard.cancelled().await;
                        Ok::<(), Error>(())
                    },
                    shutdown,
                )
                .await
        });
        let started = tokio::time::Instant::now();
        while group.owned().len() < shards as usize {
            assert!(started.elapsed() < TTL * 10, "{shards} shards not all owned");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(TTL).await;
        let before = store.counts();
        tokio::time::sleep(TTL * 10).await;
        let counts = store.counts();
        let requests: u64 = Operation::ALL.iter().map(|op| counts.get(*op) - before.get(*op)).sum();
        let records = counts.get(Operation::ShardRecords) - before.get(Operation::ShardRecords)
            + counts.get(Operation::WriteShard)
            - before.get(Operation::WriteShard);
        println!("{shards} shards: {requests} requests over 10 TTLs ({records} on shard records)");
        assert_eq!(
            records, 0,
            "{shards} shards: shard records read or written while nothing changed"
        );
        per_ttl.push(requests);
        stop.cancel();
        handle.await.unwrap().unwrap();
        let names = seen.0.lock().unwrap().len();
        println!("{shards} shards: {names} metric series");
        series.push(names);
    }
    assert_eq!(series[0], series[1], "metric series grew with the shards: {series:?}");
    assert!(
        per_ttl[1] <= per_ttl[0] + 2,
        "requests grew with the shards: {per_ttl:?} over 10 TTLs at 8 and 2,048 shards"
    );
    // 10 TTLs: renewals every TTL / 3 and a listing every TTL / 4, about 70.
    assert!(per_ttl[1] <= 80, "{per_ttl:?}");
}
