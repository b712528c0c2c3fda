//! The wrapper stores: `LimitStore` admits renewals and releases before queued acquires and reads
//! and never lets more than N requests in; `CountingStore` counts by operation; both forward
//! `capabilities()` and `can_break()` truthfully.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, CountingStore, Expiry, Grant, LeaseName, LeaseStore,
    LimitStore, MemoryStore, Notifications, Observation, Operation, Renewed, RequestLimit, Result, Term, Transition,
    async_trait,
};
use tokio::sync::Semaphore;

/// A store whose every request waits at a gate the test opens one request at a time, recording
/// the order in which requests entered the store and the most that were in it at once. It cannot
/// break leases (the trait's defaults).
#[derive(Debug)]
struct Gated {
    gate: Semaphore,
    log: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    entered: Vec<(Operation, u32)>,
    inside: usize,
    most_inside: usize,
}

impl Default for Gated {
    fn default() -> Self {
        Gated {
            gate: Semaphore::new(0),
            log: Mutex::default(),
        }
    }
}

impl Gated {
    async fn pass(&self, operation: Operation, tag: u32) {
        {
            let mut log = self.log.lock().unwrap();
            log.entered.push((operation, tag));
            log.inside += 1;
            log.most_inside = log.most_inside.max(log.inside);
        }
        self.gate.acquire().await.expect("gate open").forget();
        // Stay inside for a moment, so that requests that are let in overlap.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.log.lock().unwrap().inside -= 1;
    }

    fn entered(&self) -> Vec<(Operation, u32)> {
        self.log.lock().unwrap().entered.clone()
    }
}

fn lease() -> LeaseName {
    LeaseName::new("l").unwrap()
}

/// The tag of a request travels in the candidate id (acquire) or the term (renew, release).
fn grant(tag: u32) -> Grant {
    Grant {
        lease: lease(),
        holder: CandidateId::new("c").unwrap(),
        term: Term(u64::from(tag)),
        ttl: Duration::from_secs(1),
        token: String::new(),
    }
}

fn request(tag: u32) -> AcquireRequest {
    AcquireRequest {
        lease: lease(),
        candidate: CandidateId::new(tag.to_string()).unwrap(),
        ttl: Duration::from_secs(1),
        takeover: None,
    }
}

#[async_trait]
impl LeaseStore for Gated {
    fn name(&self) -> &'static str {
        "gated"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: Duration::from_millis(1)..=Duration::from_secs(60),
            expiry: Expiry::ServerClock,
            notifications: Notifications::None,
            announces: leasehold_core::Announces::None,
            fifo: true,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.pass(Operation::Acquire, request.candidate.as_str().parse().unwrap())
            .await;
        Ok(Acquired::Held(Observation::free(lease(), Term(0), None)))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.pass(Operation::Renew, grant.term.0 as u32).await;
        Ok(Renewed::Renewed(grant.clone()))
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.pass(Operation::Release, grant.term.0 as u32).await;
        Ok(())
    }

    async fn inspect(&self, _lease: &LeaseName) -> Result<Observation> {
        self.pass(Operation::Inspect, 0).await;
        Ok(Observation::free(lease(), Term(0), None))
    }

    async fn history(&self, _lease: &LeaseName, _limit: usize) -> Result<Vec<Transition>> {
        self.pass(Operation::History, 0).await;
        Ok(Vec::new())
    }
}

/// Starts one request of `operation` tagged `tag` on its own task.
fn start(store: &Arc<LimitStore<Gated>>, operation: Operation, tag: u32) -> tokio::task::JoinHandle<()> {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        match operation {
            Operation::Acquire => drop(store.acquire(&request(tag)).await),
            Operation::Renew => drop(store.renew(&grant(tag)).await),
            Operation::Release => drop(store.release(&grant(tag)).await),
            Operation::Inspect => drop(store.inspect(&lease()).await),
            _ => unreachable!(),
        }
    })
}

/// Lets the spawned tasks run until nothing moves (current-thread runtime: deterministic).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn renewals_and_releases_are_admitted_before_queued_acquires() {
    let store = Arc::new(LimitStore::new(Gated::default(), 2));
    let mut tasks = Vec::new();
    // Two acquires fill the store; three acquires and an inspect queue first, then two
    // renewals and a release arrive.
    for (operation, tag) in [
        (Operation::Acquire, 1),
        (Operation::Acquire, 2),
        (Operation::Acquire, 3),
        (Operation::Acquire, 4),
        (Operation::Inspect, 0),
        (Operation::Acquire, 5),
        (Operation::Renew, 6),
        (Operation::Release, 7),
        (Operation::Renew, 8),
    ] {
        tasks.push(start(&store, operation, tag));
        settle().await;
    }
    assert_eq!(store.in_flight(), 2);
    assert_eq!(store.queued(), 7);
    assert_eq!(
        store.inner().entered(),
        [(Operation::Acquire, 1), (Operation::Acquire, 2)]
    );

    // Each request that finishes lets exactly one more in: urgent ones first, in arrival order.
    for _ in 0..7 {
        store.inner().gate.add_permits(1);
        settle().await;
        assert_eq!(store.in_flight(), 2);
    }
    store.inner().gate.add_permits(2);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        store.inner().entered(),
        [
            (Operation::Acquire, 1),
            (Operation::Acquire, 2),
            (Operation::Renew, 6),
            (Operation::Release, 7),
            (Operation::Renew, 8),
            (Operation::Acquire, 3),
            (Operation::Acquire, 4),
            (Operation::Inspect, 0),
            (Operation::Acquire, 5),
        ]
    );
    assert_eq!(store.inner().log.lock().unwrap().most_inside, 2);
    assert_eq!((store.in_flight(), store.queued()), (0, 0));
}

/// A renewal that arrives after a request has finished and before the queue moved still goes
/// before every queued acquire: a freed slot always goes to the oldest urgent waiter.
#[tokio::test(flavor = "current_thread")]
async fn a_freed_slot_goes_to_a_renewal_that_arrived_last() {
    let store = Arc::new(LimitStore::new(Gated::default(), 1));
    let mut tasks = vec![start(&store, Operation::Acquire, 1)];
    settle().await;
    for tag in 2..=20 {
        tasks.push(start(&store, Operation::Acquire, tag));
    }
    settle().await;
    tasks.push(start(&store, Operation::Renew, 99));
    settle().await;
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!(store.inner().entered()[1], (Operation::Renew, 99));
    store.inner().gate.add_permits(100);
    for task in tasks {
        task.await.unwrap();
    }
}

/// Many requests of every kind from many tasks on a multi-threaded runtime: never more than N in
/// the inner store at once, and every request gets through. The same storm with a limit too high
/// to matter has many more inside at once (so the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_the_limit_in_flight() {
    async fn storm(limit: usize) -> usize {
        let store = Arc::new(LimitStore::new(Gated::default(), limit));
        store.inner().gate.add_permits(Semaphore::MAX_PERMITS);
        let operations = [
            Operation::Acquire,
            Operation::Renew,
            Operation::Release,
            Operation::Inspect,
        ];
        let tasks: Vec<_> = (0..400u32)
            .map(|i| start(&store, operations[i as usize % operations.len()], i))
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!((store.in_flight(), store.queued()), (0, 0));
        let log = store.inner().log.lock().unwrap();
        assert_eq!(log.entered.len(), 400);
        log.most_inside
    }
    let most = storm(3).await;
    assert!((1..=3).contains(&most), "{most} in flight at once");
    let unlimited = storm(10_000).await;
    assert!(unlimited > 3, "the storm never overlapped: {unlimited}");
}

/// A waiting request that is dropped gives up its place, and a slot handed to it just before it
/// was dropped goes on to the next waiter: slots are never lost.
#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_waiter_loses_no_slot() {
    let store = Arc::new(LimitStore::new(Gated::default(), 1));
    let first = start(&store, Operation::Acquire, 1);
    settle().await;

    // Dropped while it waits: it leaves the queue.
    let aborted = start(&store, Operation::Renew, 2);
    settle().await;
    // Handed the slot, then dropped before it could run.
    let third = grant(3);
    let mut handed = Box::pin(store.renew(&third));
    assert!(futures::poll!(handed.as_mut()).is_pending());
    let last = start(&store, Operation::Acquire, 4);
    settle().await;
    assert_eq!(store.queued(), 3);

    aborted.abort();
    settle().await;
    assert_eq!(store.queued(), 2);
    store.inner().gate.add_permits(1);
    while !first.is_finished() {
        tokio::task::yield_now().await;
    }
    // The slot went to the oldest urgent waiter, which has not run yet.
    assert_eq!(store.queued(), 1);
    assert_eq!(store.inner().entered(), [(Operation::Acquire, 1)]);
    drop(handed);
    settle().await;
    assert_eq!(
        store.inner().entered(),
        [(Operation::Acquire, 1), (Operation::Acquire, 4)]
    );
    store.inner().gate.add_permits(1);
    last.await.unwrap();
    assert!(aborted.await.unwrap_err().is_cancelled());
    assert_eq!((store.in_flight(), store.queued()), (0, 0));

    // A request dropped while it runs frees its slot too.
    let running = start(&store, Operation::Inspect, 0);
    settle().await;
    assert_eq!(store.in_flight(), 1);
    running.abort();
    settle().await;
    assert_eq!(store.in_flight(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn counting_store_counts_by_operation_and_failure() {
    let store = CountingStore::new(MemoryStore::new());
    let acquired = store.acquire(&request(1)).await.unwrap();
    let Acquired::Granted(grant) = acquired else {
        panic!("the lease was free: {acquired:?}")
    };
    store.renew(&grant).await.unwrap();
    store.renew(&grant).await.unwrap();
    let before = store.counts();
    store.inspect(&lease()).await.unwrap();
    store.release(&grant).await.unwrap();
    assert_eq!(store.break_lease(&lease()).await.unwrap(), None);
    let mut too_long = request(2);
    too_long.ttl = Duration::from_secs(365 * 24 * 3600);
    assert!(store.acquire(&too_long).await.is_err());

    let counts = store.counts();
    assert_eq!(counts.get(Operation::Acquire), 2);
    assert_eq!(counts.get(Operation::Renew), 2);
    assert_eq!(counts.get(Operation::Inspect), 1);
    assert_eq!(counts.get(Operation::Release), 1);
    assert_eq!(counts.get(Operation::BreakLease), 1);
    assert_eq!(counts.get(Operation::History), 0);
    assert_eq!(counts.total(), 7);
    assert_eq!(counts.failed, 1);
    let since = counts.since(&before);
    assert_eq!((since.total(), since.get(Operation::Renew), since.failed), (4, 0, 1));
}

#[test]
fn wrappers_forward_capabilities_and_break_lease_truthfully() {
    let memory = MemoryStore::observed_expiry();
    assert!(memory.can_break());
    let wrapped = LimitStore::new(CountingStore::new(memory.clone()), 2);
    assert_eq!(wrapped.capabilities(), memory.capabilities());
    assert_eq!(wrapped.name(), "memory");
    assert!(wrapped.can_break());

    let gated = LimitStore::new(CountingStore::new(Gated::default()), 2);
    assert!(!gated.can_break());
    assert_eq!(gated.capabilities(), Gated::default().capabilities());
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_that_cannot_break_says_so_through_wrappers() {
    let store = CountingStore::new(LimitStore::new(Gated::default(), 1));
    let err = store.break_lease(&lease()).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert_eq!(err.to_string(), "gated store does not support break_lease");
}

/// Two stores under one shared `RequestLimit` (and a backend's own request holding a slot) share
/// its bound: a renewal of either store goes before an acquire of the other.
#[tokio::test(flavor = "current_thread")]
async fn stores_sharing_a_limit_share_its_slots() {
    let limit = RequestLimit::new(1);
    let a = Arc::new(LimitStore::with_limit(Gated::default(), limit.clone()));
    let b = Arc::new(LimitStore::with_limit(Gated::default(), limit.clone()));
    let own = limit.admit(Operation::Inspect).await;
    let acquire_a = start(&a, Operation::Acquire, 1);
    settle().await;
    let renew_b = start(&b, Operation::Renew, 2);
    settle().await;
    assert_eq!((limit.in_flight(), limit.queued()), (1, 2));
    drop(own);
    settle().await;
    assert_eq!(b.inner().entered(), [(Operation::Renew, 2)]);
    assert!(a.inner().entered().is_empty());
    b.inner().gate.add_permits(1);
    settle().await;
    assert_eq!(a.inner().entered(), [(Operation::Acquire, 1)]);
    a.inner().gate.add_permits(1);
    acquire_a.await.unwrap();
    renew_b.await.unwrap();
    assert_eq!(limit.in_flight(), 0);
}

/// With every slot taken by slow acquires, a renewal waits for one of them unless slots are kept
/// for renewals and releases: `reserve_urgent(1)` of 3 lets acquires hold only 2, and the renewal
/// is admitted at once while the third acquire still queues.
#[tokio::test(flavor = "current_thread")]
async fn a_reserved_slot_admits_a_renewal_while_acquires_fill_the_rest() {
    async fn renewal_admitted_at_once(store: LimitStore<Gated>) -> (bool, Vec<(Operation, u32)>) {
        let store = Arc::new(store);
        let mut tasks = Vec::new();
        for tag in 1..=3 {
            tasks.push(start(&store, Operation::Acquire, tag));
            settle().await;
        }
        tasks.push(start(&store, Operation::Renew, 9));
        settle().await;
        let entered = store.inner().entered();
        let admitted = entered.contains(&(Operation::Renew, 9));
        store.inner().gate.add_permits(Semaphore::MAX_PERMITS);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!((store.in_flight(), store.queued()), (0, 0));
        (admitted, entered)
    }

    let (admitted, entered) = renewal_admitted_at_once(LimitStore::new(Gated::default(), 3).reserve_urgent(1)).await;
    assert!(admitted, "the renewal waited: {entered:?}");
    assert_eq!(
        entered,
        [(Operation::Acquire, 1), (Operation::Acquire, 2), (Operation::Renew, 9)]
    );

    // The same without the reservation: the acquires take every slot and the renewal waits.
    let (admitted, entered) = renewal_admitted_at_once(LimitStore::new(Gated::default(), 3)).await;
    assert!(!admitted, "the renewal got in without a reserved slot: {entered:?}");
    assert_eq!(
        entered,
        [
            (Operation::Acquire, 1),
            (Operation::Acquire, 2),
            (Operation::Acquire, 3)
        ]
    );
}

/// Requests that are not urgent never hold more than `max - k` slots, even while the kept slots
/// are free; renewals and releases may hold all `max`; a slot an acquire frees goes to a queued
/// renewal first, and one a renewal frees goes to a queued acquire only within its share.
#[tokio::test(flavor = "current_thread")]
async fn reserved_slots_are_never_taken_by_other_requests() {
    let store = Arc::new(LimitStore::new(Gated::default(), 3).reserve_urgent(2));
    assert_eq!((store.max_in_flight(), store.limit().urgent_reserved()), (3, 2));
    let mut tasks = Vec::new();
    for (operation, tag) in [
        (Operation::Acquire, 1),
        (Operation::Inspect, 0),
        (Operation::Acquire, 2),
    ] {
        tasks.push(start(&store, operation, tag));
        settle().await;
    }
    // Two slots are free, but they are kept: only one acquire is in.
    assert_eq!((store.in_flight(), store.queued()), (1, 2));
    assert_eq!(store.inner().entered(), [(Operation::Acquire, 1)]);

    // Renewals and a release take the kept slots; the third of them waits for a slot.
    for (operation, tag) in [(Operation::Renew, 5), (Operation::Release, 6), (Operation::Renew, 7)] {
        tasks.push(start(&store, operation, tag));
        settle().await;
    }
    assert_eq!((store.in_flight(), store.queued()), (3, 3));

    // The acquire finishes (it entered first): its slot goes to the waiting renewal, not to the
    // inspect that waited longer.
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!(
        store.inner().entered(),
        [
            (Operation::Acquire, 1),
            (Operation::Renew, 5),
            (Operation::Release, 6),
            (Operation::Renew, 7),
        ]
    );
    assert_eq!((store.in_flight(), store.queued()), (3, 2));

    // The first renewal finishes: the freed slot lets the inspect in (one non-urgent slot).
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!(store.inner().entered().last(), Some(&(Operation::Inspect, 0)));
    assert_eq!((store.in_flight(), store.queued()), (3, 1));

    // The release finishes: a slot is free, but the acquire may not have a second one.
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!((store.in_flight(), store.queued()), (2, 1));
    assert_eq!(store.inner().entered().len(), 5);

    // The last renewal finishes: two slots free, and still the acquire waits.
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!((store.in_flight(), store.queued()), (1, 1));
    assert_eq!(store.inner().entered().len(), 5);

    // The inspect finishes: now the acquire gets in.
    store.inner().gate.add_permits(1);
    settle().await;
    assert_eq!(store.inner().entered().last(), Some(&(Operation::Acquire, 2)));
    store.inner().gate.add_permits(1);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.inner().log.lock().unwrap().most_inside, 3);
    assert_eq!((store.in_flight(), store.queued()), (0, 0));
}

/// A reservation is clamped so that other requests keep one slot, and a shared limit's
/// reservation applies to every store that shares it.
#[tokio::test(flavor = "current_thread")]
async fn a_reservation_leaves_one_slot_and_is_shared() {
    let limit = RequestLimit::new(2);
    let store = LimitStore::with_limit(MemoryStore::new(), limit.clone()).reserve_urgent(5);
    assert_eq!((limit.urgent_reserved(), store.limit().urgent_reserved()), (1, 1));
    let read = limit.admit(Operation::Inspect).await;
    let renewal = limit.admit(Operation::Renew).await;
    assert_eq!((limit.in_flight(), limit.queued()), (2, 0));
    drop((read, renewal));
    assert_eq!(RequestLimit::new(1).reserve_urgent(3).urgent_reserved(), 0);
}

/// Storms on a multi-threaded runtime with a reservation: at most `max` inside, and the kept
/// slots are not lost (every request gets through, nothing stays held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_keeps_the_bound_under_a_storm() {
    let store = Arc::new(LimitStore::new(Gated::default(), 4).reserve_urgent(2));
    store.inner().gate.add_permits(Semaphore::MAX_PERMITS);
    let operations = [
        Operation::Acquire,
        Operation::Renew,
        Operation::Inspect,
        Operation::Release,
    ];
    let tasks: Vec<_> = (0..400u32)
        .map(|i| start(&store, operations[i as usize % operations.len()], i))
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!((store.in_flight(), store.queued()), (0, 0));
    let log = store.inner().log.lock().unwrap();
    assert_eq!(log.entered.len(), 400);
    assert!((1..=4).contains(&log.most_inside), "{} inside at once", log.most_inside);
}
