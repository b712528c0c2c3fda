//! Stores around a store: [`LimitStore`] bounds the requests in flight, lets renewals and
//! releases go first and can keep slots for them alone (its [`RequestLimit`] serves backends that
//! limit their own requests too); [`CountingStore`] counts requests by operation. Both forward
//! [`capabilities`](LeaseStore::capabilities) and [`can_break`](LeaseStore::can_break)
//! unchanged, and stack: `LimitStore::new(CountingStore::new(store), 8)`.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::error::Result;
use crate::shard_record::{ShardRecord, ShardWrite};
use crate::store::{Announcements, Changes, LeaseStore, Operation};
use crate::types::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Grant, LeaseName, Observation, Renewed, Term, Transition,
};

/// A store that lets at most `max_in_flight` requests reach the inner store at once, and when
/// requests queue, admits renewals and releases before anything else (acquires, reads,
/// withdrawals, watches, breaks), each class in arrival order.
///
/// A leader's renewal then never waits behind a crowd of followers' polls: with many candidates
/// on one connection or rate-limited account, the requests that keep a lease alive (or hand it
/// on) go first. Like object_store's `LimitStore`, it is a store itself, so it stacks with other
/// wrappers and works for any backend.
///
/// Going first is not enough when every slot is taken by slow acquires: a renewal would still
/// wait for one of them to finish. [`LimitStore::reserve_urgent`] keeps `k` of the slots for
/// renewals and releases alone: everything else may hold at most `max_in_flight - k` slots at
/// once, so a renewal is admitted at once unless `max_in_flight` renewals and releases already
/// run.
///
/// # Cancel safety
///
/// Dropping a request's future while it waits gives up its place in the queue; dropping it while
/// it runs drops the inner store's future (see the inner store's `# Cancel safety`). Either way
/// its slot is freed at once.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{Elector, LimitStore, LeaseStore, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = Arc::new(LimitStore::new(MemoryStore::new(), 4));
/// assert_eq!(store.max_in_flight(), 4);
/// assert!(store.can_break()); // MemoryStore can, and the limiter passes it on
/// let elector = Elector::builder(store, "jobs").ttl(Duration::from_secs(1)).build()?;
/// let leader = elector.campaign().await?;
/// leader.resign().await;
/// # Ok(()) }
/// ```
///
/// With slots kept for renewals and releases:
///
/// ```
/// use leasehold_core::{LimitStore, MemoryStore, Operation};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // 8 requests at once, 2 of them only renewals and releases: acquires, reads and watches
/// // never hold more than 6 slots.
/// let store = LimitStore::new(MemoryStore::new(), 8).reserve_urgent(2);
/// assert_eq!((store.max_in_flight(), store.limit().urgent_reserved()), (8, 2));
///
/// let limit = store.limit();
/// let mut reads = Vec::new();
/// for _ in 0..6 {
///     reads.push(limit.admit(Operation::Inspect).await);
/// }
/// // A seventh read would wait; a renewal is admitted at once.
/// let renewal = limit.admit(Operation::Renew).await;
/// assert_eq!(limit.in_flight(), 7);
/// # drop((reads, renewal)); }
/// ```
#[derive(Debug)]
pub struct LimitStore<S> {
    inner: S,
    limit: RequestLimit,
}

impl<S: LeaseStore> LimitStore<S> {
    /// Wraps `inner`, letting at most `max_in_flight` requests (at least 1) run at once.
    pub fn new(inner: S, max_in_flight: usize) -> Self {
        LimitStore::with_limit(inner, RequestLimit::new(max_in_flight))
    }

    /// Wraps `inner` under a [`RequestLimit`] that other stores (or a backend's own requests)
    /// may share.
    pub fn with_limit(inner: S, limit: RequestLimit) -> Self {
        LimitStore { inner, limit }
    }

    /// Keeps `k` of the slots for renewals and releases (at most `max_in_flight - 1`, so that
    /// other requests keep one): other requests may then hold at most `max_in_flight - k` at
    /// once. Applies to the [`RequestLimit`] and every store sharing it (see
    /// [`RequestLimit::reserve_urgent`]).
    #[must_use]
    pub fn reserve_urgent(self, k: usize) -> Self {
        LimitStore {
            inner: self.inner,
            limit: self.limit.reserve_urgent(k),
        }
    }

    /// The bound given to [`LimitStore::new`].
    pub fn max_in_flight(&self) -> usize {
        self.limit.max()
    }

    /// How many requests run in the inner store now.
    pub fn in_flight(&self) -> usize {
        self.limit.in_flight()
    }

    /// How many requests wait for a slot now.
    pub fn queued(&self) -> usize {
        self.limit.queued()
    }

    /// The limit.
    pub fn limit(&self) -> &RequestLimit {
        &self.limit
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

/// The priority semaphore behind [`LimitStore`], for a backend that limits its own requests
/// (including ones that are not [`LeaseStore`] operations, such as checking a table): at most
/// `max` admitted at once; a slot freed goes to the oldest waiting renewal or release
/// ([`Operation::is_urgent`]), else to the oldest other waiter. With
/// [`reserve_urgent(k)`](RequestLimit::reserve_urgent), other requests hold at most `max - k`
/// slots at once, so `k` slots are always there for renewals and releases. A waiter is woken by
/// a one-shot hand-off, never by polling. Clones share the slots.
///
/// # Cancel safety
///
/// [`RequestLimit::admit`] is cancel safe: a waiter dropped leaves the queue, and a slot handed
/// to it just before goes on to the next waiter.
///
/// # Examples
///
/// ```
/// use leasehold_core::{Operation, RequestLimit};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limit = RequestLimit::new(1);
/// let held = limit.admit(Operation::Acquire).await;
/// assert_eq!((limit.in_flight(), limit.queued()), (1, 0));
/// drop(held);
/// assert_eq!(limit.in_flight(), 0);
///
/// // Two slots, one of them kept for renewals and releases.
/// let limit = RequestLimit::new(2).reserve_urgent(1);
/// let acquire = limit.admit(Operation::Acquire).await;
/// let renew = limit.admit(Operation::Renew).await; // at once: the kept slot
/// assert_eq!((limit.in_flight(), limit.queued()), (2, 0));
/// # drop((acquire, renew));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RequestLimit {
    slots: Arc<Slots>,
}

impl RequestLimit {
    /// A limit of `max` requests at once (at least 1).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        RequestLimit {
            slots: Arc::new(Slots {
                max,
                state: Mutex::new(SlotState {
                    held: 0,
                    other_held: 0,
                    reserved: 0,
                    urgent: VecDeque::new(),
                    other: VecDeque::new(),
                }),
            }),
        }
    }

    /// Keeps `k` slots for renewals and releases alone (clamped to `max - 1`, so that other
    /// requests keep at least one): requests of any other operation then hold at most `max - k`
    /// slots at once, and wait while they do even if slots are free. Renewals and releases may
    /// hold all `max`. Applies to every clone of this limit, and to requests admitted later.
    #[must_use]
    pub fn reserve_urgent(self, k: usize) -> Self {
        {
            let mut state = self.slots.lock();
            state.reserved = k.min(self.slots.max - 1);
            // A smaller reservation may let waiting requests in.
            self.slots.dispatch(&mut state);
        }
        self
    }

    /// How many slots are kept for renewals and releases (see [`RequestLimit::reserve_urgent`]).
    pub fn urgent_reserved(&self) -> usize {
        self.slots.lock().reserved
    }

    /// Waits for a slot for a request of `operation`; the slot is held until the returned
    /// [`Admitted`] is dropped.
    pub async fn admit(&self, operation: Operation) -> Admitted {
        self.slots.admit(operation).await
    }

    /// The bound given to [`RequestLimit::new`].
    pub fn max(&self) -> usize {
        self.slots.max
    }

    /// How many slots are held now.
    pub fn in_flight(&self) -> usize {
        self.slots.lock().held
    }

    /// How many requests wait for a slot now.
    pub fn queued(&self) -> usize {
        let state = self.slots.lock();
        let waiting = |queue: &VecDeque<oneshot::Sender<()>>| queue.iter().filter(|s| !s.is_closed()).count();
        waiting(&state.urgent) + waiting(&state.other)
    }
}

/// A slot of a [`RequestLimit`], held until dropped.
#[derive(Debug)]
#[must_use = "the slot is freed when this is dropped"]
pub struct Admitted {
    slots: Arc<Slots>,
    urgent: bool,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.slots.release(self.urgent);
    }
}

/// The slots of a [`RequestLimit`].
struct Slots {
    max: usize,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// Slots held (by requests of any operation), at most `max`.
    held: usize,
    /// Slots held by requests that are not urgent, at most `max - reserved`.
    other_held: usize,
    /// Slots kept for urgent requests.
    reserved: usize,
    /// Invariant (between calls): an urgent request waits only while every slot is held, and
    /// another only while every slot or all `max - reserved` of its own are held.
    urgent: VecDeque<oneshot::Sender<()>>,
    other: VecDeque<oneshot::Sender<()>>,
}

impl SlotState {
    fn can_admit(&self, max: usize, urgent: bool) -> bool {
        self.held < max && (urgent || self.other_held < max - self.reserved)
    }

    fn take(&mut self, urgent: bool) {
        self.held += 1;
        if !urgent {
            self.other_held += 1;
        }
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Slots")
            .field("max", &self.max)
            .field("held", &state.held)
            .field("other_held", &state.other_held)
            .field("reserved", &state.reserved)
            .field("urgent_waiting", &state.urgent.len())
            .field("other_waiting", &state.other.len())
            .finish()
    }
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // No code panics while holding the lock; a poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a slot; the slot is held until the returned [`Admitted`] is dropped.
    async fn admit(self: &Arc<Self>, operation: Operation) -> Admitted {
        let urgent = operation.is_urgent();
        let receiver = {
            let mut state = self.lock();
            // Nobody of this class waits with a slot it could take (the invariant), so taking
            // one jumps no queue.
            if state.can_admit(self.max, urgent) {
                state.take(urgent);
                return Admitted {
                    slots: Arc::clone(self),
                    urgent,
                };
            }
            let (sender, receiver) = oneshot::channel();
            if urgent {
                state.urgent.push_back(sender);
            } else {
                state.other.push_back(sender);
            }
            receiver
        };
        let mut waiting = Waiting {
            slots: Arc::clone(self),
            receiver: Some(receiver),
            urgent,
        };
        let receiver = waiting.receiver.as_mut().expect("set above");
        // The sender lives in the queue until it is handed a slot; the queue lives as long as
        // `self`, which `waiting` keeps alive. So the message always comes.
        let _ = receiver.await;
        waiting.receiver = None;
        Admitted {
            slots: Arc::clone(self),
            urgent,
        }
    }

    /// Frees a slot held by an urgent request or another, and hands it on.
    fn release(&self, urgent: bool) {
        let mut state = self.lock();
        state.held -= 1;
        if !urgent {
            state.other_held -= 1;
        }
        self.dispatch(&mut state);
    }

    /// Hands free slots to waiters, the oldest urgent ones first, while the limits allow.
    fn dispatch(&self, state: &mut SlotState) {
        loop {
            let next = if state.can_admit(self.max, true) && !state.urgent.is_empty() {
                state.urgent.pop_front().map(|sender| (sender, true))
            } else if state.can_admit(self.max, false) {
                state.other.pop_front().map(|sender| (sender, false))
            } else {
                None
            };
            let Some((sender, urgent)) = next else { return };
            // A waiter that gave up has closed its receiver: try the next one.
            if sender.send(()).is_ok() {
                state.take(urgent);
            }
        }
    }
}

/// A request waiting for a slot. If it is dropped, it leaves the queue; if a slot was handed to
/// it in the meantime, the slot goes on to the next waiter.
struct Waiting {
    slots: Arc<Slots>,
    receiver: Option<oneshot::Receiver<()>>,
    urgent: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            receiver.close();
            if receiver.try_recv().is_ok() {
                self.slots.release(self.urgent);
            }
        }
    }
}

#[async_trait]
impl<S: LeaseStore> LeaseStore for LimitStore<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn can_break(&self) -> bool {
        self.inner.can_break()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let _slot = self.limit.admit(Operation::Acquire).await;
        self.inner.acquire(request).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let _slot = self.limit.admit(Operation::Renew).await;
        self.inner.renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let _slot = self.limit.admit(Operation::Release).await;
        self.inner.release(grant).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let _slot = self.limit.admit(Operation::RenewMany).await;
        self.inner.renew_many(grants).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let _slot = self.limit.admit(Operation::HandOver).await;
        self.inner.hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let _slot = self.limit.admit(Operation::Withdraw).await;
        self.inner.withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let _slot = self.limit.admit(Operation::Inspect).await;
        self.inner.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let _slot = self.limit.admit(Operation::History).await;
        self.inner.history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let _slot = self.limit.admit(Operation::List).await;
        self.inner.list(prefix).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        let _slot = self.limit.admit(Operation::Candidates).await;
        self.inner.candidates(lease).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let _slot = self.limit.admit(Operation::Changes).await;
        self.inner.changes(lease, candidate).await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let _slot = self.limit.admit(Operation::Changes).await;
        self.inner.announcements(lease).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let _slot = self.limit.admit(Operation::BreakLease).await;
        self.inner.break_lease(lease).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let _slot = self.limit.admit(Operation::ShardRecords).await;
        self.inner.shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let _slot = self.limit.admit(Operation::WriteShard).await;
        self.inner.write_shard(name, expected, value).await
    }
}

/// A store that counts the requests made to the inner store, by operation, and how many failed:
/// for tests and benchmarks that measure requests per election (a follower's idle cost, a
/// handover), on any backend.
///
/// # Cancel safety
///
/// As the inner store's; a request is counted when it starts.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{CountingStore, Elector, MemoryStore, Operation};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = Arc::new(CountingStore::new(MemoryStore::new()));
/// let elector = Elector::builder(store.clone(), "jobs").ttl(Duration::from_secs(1)).build()?;
/// let leader = elector.campaign().await?;
/// leader.resign().await;
/// let counts = store.counts();
/// assert!(counts.get(Operation::Acquire) >= 1);
/// assert_eq!(counts.get(Operation::Release), 1);
/// assert_eq!(counts.failed, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: S,
    started: [AtomicU64; Operation::ALL.len()],
    failed: AtomicU64,
}

/// A snapshot of a [`CountingStore`]'s counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Requests started, indexed like [`Operation::ALL`].
    pub started: [u64; Operation::ALL.len()],
    /// Requests that answered an error (of any operation).
    pub failed: u64,
}

impl RequestCounts {
    /// Requests of `operation` started.
    #[must_use]
    pub fn get(&self, operation: Operation) -> u64 {
        self.started[operation as usize]
    }

    /// Requests of every operation started.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.started.iter().sum()
    }

    /// The requests made between `earlier` and `self`.
    ///
    /// ```
    /// use leasehold_core::{Operation, RequestCounts};
    ///
    /// let mut later = RequestCounts::default();
    /// later.started[Operation::Renew as usize] = 5;
    /// let mut earlier = RequestCounts::default();
    /// earlier.started[Operation::Renew as usize] = 2;
    /// assert_eq!(later.since(&earlier).get(Operation::Renew), 3);
    /// ```
    #[must_use]
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let mut started = self.started;
        for (count, before) in started.iter_mut().zip(earlier.started) {
            *count = count.saturating_sub(before);
        }
        RequestCounts {
            started,
            failed: self.failed.saturating_sub(earlier.failed),
        }
    }
}

impl<S: LeaseStore> CountingStore<S> {
    /// Wraps `inner` with every counter at zero.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            started: Default::default(),
            failed: AtomicU64::new(0),
        }
    }

    /// The counters now.
    pub fn counts(&self) -> RequestCounts {
        RequestCounts {
            started: std::array::from_fn(|i| self.started[i].load(Ordering::Relaxed)),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn start(&self, operation: Operation) {
        self.started[operation as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn finish<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

#[async_trait]
impl<S: LeaseStore> LeaseStore for CountingStore<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn can_break(&self) -> bool {
        self.inner.can_break()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.start(Operation::Acquire);
        self.finish(self.inner.acquire(request).await)
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.start(Operation::Renew);
        self.finish(self.inner.renew(grant).await)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.start(Operation::Release);
        self.finish(self.inner.release(grant).await)
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.start(Operation::RenewMany);
        self.finish(self.inner.renew_many(grants).await)
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.start(Operation::HandOver);
        self.finish(self.inner.hand_over(grant, to).await)
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.start(Operation::Withdraw);
        self.finish(self.inner.withdraw(lease, candidate).await)
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.start(Operation::Inspect);
        self.finish(self.inner.inspect(lease).await)
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.start(Operation::History);
        self.finish(self.inner.history(lease, limit).await)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.start(Operation::List);
        self.finish(self.inner.list(prefix).await)
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.start(Operation::Candidates);
        self.finish(self.inner.candidates(lease).await)
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.start(Operation::Changes);
        self.finish(self.inner.changes(lease, candidate).await)
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.start(Operation::Changes);
        self.finish(self.inner.announcements(lease).await)
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.start(Operation::BreakLease);
        self.finish(self.inner.break_lease(lease).await)
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.start(Operation::ShardRecords);
        self.finish(self.inner.shard_records(prefix).await)
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.start(Operation::WriteShard);
        self.finish(self.inner.write_shard(name, expected, value).await)
    }
}
