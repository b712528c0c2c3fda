//! Fault switches shared by the in-process [`FaultyStore`] and the TCP
//! [`FaultProxy`](crate::FaultProxy), and the in-process store wrapper itself.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, Error, Grant, LeaseName, LeaseStore, Observation,
    Renewed, Result, Term, Transition,
};
use tokio::sync::watch;

/// What happens to the traffic of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Traffic flows normally.
    #[default]
    Pass,
    /// Traffic arrives this much later (order is kept).
    Delay(Duration),
    /// Traffic is silently dropped; connections stay open (a partition).
    Blackhole,
    /// Connections are broken abruptly (a TCP reset).
    Reset,
}

/// A direction of traffic between a client and its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to store: a faulted request is never applied.
    Request,
    /// Store to client: a faulted reply is lost *after* the request was applied.
    Reply,
    /// Both directions.
    Both,
}

/// The faults currently in force, one per direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultState {
    /// Client to store.
    pub request: Fault,
    /// Store to client.
    pub reply: Fault,
}

impl FaultState {
    /// The fault of one direction ([`Direction::Both`] answers the request direction).
    pub fn get(&self, direction: Direction) -> Fault {
        match direction {
            Direction::Request | Direction::Both => self.request,
            Direction::Reply => self.reply,
        }
    }
}

/// A store operation, for counting requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LeaseStore::acquire`].
    Acquire,
    /// [`LeaseStore::renew`].
    Renew,
    /// [`LeaseStore::release`].
    Release,
    /// [`LeaseStore::inspect`].
    Inspect,
    /// [`LeaseStore::history`].
    History,
    /// [`LeaseStore::changes`].
    Changes,
    /// [`LeaseStore::withdraw`].
    Withdraw,
    /// [`LeaseStore::break_lease`].
    BreakLease,
}

impl Op {
    const ALL: [Op; 8] = [
        Op::Acquire,
        Op::Renew,
        Op::Release,
        Op::Inspect,
        Op::History,
        Op::Changes,
        Op::Withdraw,
        Op::BreakLease,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// How many requests of each kind went through a [`FaultyStore`] (attempted, faulted or not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestCounts {
    /// [`LeaseStore::acquire`] calls.
    pub acquire: u64,
    /// [`LeaseStore::renew`] calls.
    pub renew: u64,
    /// [`LeaseStore::release`] calls.
    pub release: u64,
    /// [`LeaseStore::inspect`] calls.
    pub inspect: u64,
    /// [`LeaseStore::history`] calls.
    pub history: u64,
    /// [`LeaseStore::changes`] calls.
    pub changes: u64,
    /// [`LeaseStore::withdraw`] calls.
    pub withdraw: u64,
    /// [`LeaseStore::break_lease`] calls.
    pub break_lease: u64,
}

impl RequestCounts {
    /// All requests together.
    pub fn total(&self) -> u64 {
        self.acquire
            + self.renew
            + self.release
            + self.inspect
            + self.history
            + self.changes
            + self.withdraw
            + self.break_lease
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "acquire {} renew {} release {} inspect {} history {} changes {} withdraw {} break {}",
            self.acquire,
            self.renew,
            self.release,
            self.inspect,
            self.history,
            self.changes,
            self.withdraw,
            self.break_lease
        )
    }
}

/// A cloneable switchboard of faults, per direction, changed at runtime by a test and honoured by
/// a [`FaultyStore`] or a [`FaultProxy`](crate::FaultProxy).
///
/// It also counts the requests a [`FaultyStore`] sees (a proxy sees bytes, not requests, and
/// leaves the counts at zero).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_conformance::{Direction, Fault, Faults};
///
/// let faults = Faults::new();
/// faults.set(Direction::Both, Fault::Blackhole);
/// faults.set(Direction::Reply, Fault::Delay(Duration::from_millis(50)));
/// assert_eq!(faults.get(Direction::Request), Fault::Blackhole);
/// faults.heal();
/// assert_eq!(faults.get(Direction::Reply), Fault::Pass);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<FaultsInner>,
}

#[derive(Debug, Default)]
struct FaultsInner {
    state: watch::Sender<FaultState>,
    counts: [AtomicU64; Op::ALL.len()],
}

impl Faults {
    /// A switchboard with every direction passing.
    pub fn new() -> Self {
        Faults::default()
    }

    /// Sets the fault of `direction` (both, for [`Direction::Both`]).
    pub fn set(&self, direction: Direction, fault: Fault) {
        self.inner.state.send_modify(|state| match direction {
            Direction::Request => state.request = fault,
            Direction::Reply => state.reply = fault,
            Direction::Both => {
                *state = FaultState {
                    request: fault,
                    reply: fault,
                }
            }
        });
    }

    /// Lets all traffic pass again.
    pub fn heal(&self) {
        self.set(Direction::Both, Fault::Pass);
    }

    /// The fault of `direction` now ([`Direction::Both`] answers the request direction).
    pub fn get(&self, direction: Direction) -> Fault {
        self.state().get(direction)
    }

    /// The faults now.
    pub fn state(&self) -> FaultState {
        *self.inner.state.borrow()
    }

    /// A receiver that sees every change of the faults.
    pub fn subscribe(&self) -> watch::Receiver<FaultState> {
        self.inner.state.subscribe()
    }

    /// Completes once the fault of `direction` is no longer `fault`.
    pub async fn lifted(&self, direction: Direction, fault: Fault) {
        let mut rx = self.subscribe();
        // The sender lives in `self`, so waiting cannot fail.
        let _ = rx.wait_for(|state| state.get(direction) != fault).await;
    }

    /// Counts one request of kind `op` (a [`FaultyStore`] does it for every call).
    pub fn record_request(&self, op: Op) {
        self.inner.counts[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// How many requests of kind `op` were counted.
    pub fn requests(&self, op: Op) -> u64 {
        self.inner.counts[op.index()].load(Ordering::Relaxed)
    }

    /// How many requests of each kind were counted.
    pub fn counts(&self) -> RequestCounts {
        let n = |op| self.requests(op);
        RequestCounts {
            acquire: n(Op::Acquire),
            renew: n(Op::Renew),
            release: n(Op::Release),
            inspect: n(Op::Inspect),
            history: n(Op::History),
            changes: n(Op::Changes),
            withdraw: n(Op::Withdraw),
            break_lease: n(Op::BreakLease),
        }
    }

    /// Sets every count back to zero.
    pub fn reset_counts(&self) {
        for counter in &self.inner.counts {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// A [`LeaseStore`] that wraps another and disrupts its traffic as its [`Faults`] say.
///
/// Per direction:
///
/// | fault | request (client to store) | reply (store to client) |
/// |---|---|---|
/// | `Delay(d)` | sleeps `d`, then calls the store | calls the store, then sleeps `d` |
/// | `Blackhole` | never calls the store; pends until lifted, then fails `Unreachable` | calls the store (the write **is** applied), pends until lifted, then fails `Unreachable` |
/// | `Reset` | fails `Unreachable` at once, store not called | calls the store, then fails `Unreachable` |
///
/// The engine's `request_timeout` cuts pending calls, as it would on a partitioned network.
/// A [`changes`](LeaseStore::changes) stream yields nothing while either direction is
/// blackholed, is delayed by the reply delay, and ends on a reset. `name` and `capabilities`
/// pass through. Every call is counted in the [`Faults`].
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    faults: Faults,
    inject: bool,
}

impl FaultyStore {
    /// Wraps `inner`, disrupted by `faults`.
    pub fn new(inner: Arc<dyn LeaseStore>, faults: Faults) -> Self {
        FaultyStore {
            inner,
            faults,
            inject: true,
        }
    }

    /// Wraps `inner` only to count its requests in `faults`, injecting nothing: for a store
    /// whose traffic already goes through a [`FaultProxy`](crate::FaultProxy) switched by the
    /// same `faults` (scenarios read the counts; a proxy sees bytes, not requests).
    pub fn counting(inner: Arc<dyn LeaseStore>, faults: Faults) -> Self {
        FaultyStore {
            inner,
            faults,
            inject: false,
        }
    }

    /// The switchboard of this store.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    fn unreachable(&self, why: &'static str) -> Error {
        Error::unreachable(self.inner.name(), format!("fault injection: {why}"))
    }

    /// Runs `operation` (which starts the inner call) through the faults.
    async fn call<T, F>(&self, op: Op, operation: impl FnOnce() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.faults.record_request(op);
        if !self.inject {
            return operation().await;
        }
        match self.faults.get(Direction::Request) {
            Fault::Pass => {}
            Fault::Delay(d) => tokio::time::sleep(d).await,
            Fault::Blackhole => {
                self.faults.lifted(Direction::Request, Fault::Blackhole).await;
                return Err(self.unreachable("request dropped by a blackhole"));
            }
            Fault::Reset => {
                return Err(self.unreachable("connection reset before the request was sent"));
            }
        }
        let result = operation().await;
        match self.faults.get(Direction::Reply) {
            Fault::Pass => result,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                result
            }
            Fault::Blackhole => {
                self.faults.lifted(Direction::Reply, Fault::Blackhole).await;
                Err(self.unreachable("reply dropped by a blackhole (the request was applied)"))
            }
            Fault::Reset => Err(self.unreachable("connection reset after the request was applied")),
        }
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.call(Op::Acquire, || self.inner.acquire(request)).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.call(Op::Renew, || self.inner.renew(grant)).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.call(Op::Release, || self.inner.release(grant)).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.call(Op::Withdraw, || self.inner.withdraw(lease, candidate)).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.call(Op::Inspect, || self.inner.inspect(lease)).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.call(Op::History, || self.inner.history(lease, limit)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.inner.list(prefix).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let Some(changes) = self.call(Op::Changes, || self.inner.changes(lease, candidate)).await? else {
            return Ok(None);
        };
        if !self.inject {
            return Ok(Some(changes));
        }
        let faults = self.faults.clone();
        let stream = futures::stream::unfold((changes, faults), |(mut changes, faults)| async move {
            loop {
                changes.next().await?;
                let state = faults.state();
                if state.request == Fault::Reset || state.reply == Fault::Reset {
                    return None;
                }
                if state.request == Fault::Blackhole || state.reply == Fault::Blackhole {
                    continue;
                }
                if let Fault::Delay(d) = state.reply {
                    tokio::time::sleep(d).await;
                }
                return Some(((), (changes, faults)));
            }
        });
        Ok(Some(Box::pin(stream)))
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.call(Op::BreakLease, || self.inner.break_lease(lease)).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use leasehold_core::MemoryStore;

    use super::*;

    fn request(lease: &LeaseName, who: &str) -> AcquireRequest {
        AcquireRequest {
            lease: lease.clone(),
            candidate: CandidateId::new(who).unwrap(),
            ttl: Duration::from_secs(5),
            takeover: None,
        }
    }

    fn setup() -> (Arc<MemoryStore>, FaultyStore, Faults, LeaseName) {
        let memory = Arc::new(MemoryStore::new());
        let faults = Faults::new();
        let faulty = FaultyStore::new(memory.clone(), faults.clone());
        (memory, faulty, faults, LeaseName::new("faulty").unwrap())
    }

    #[tokio::test]
    async fn request_blackhole_never_reaches_the_store() {
        let (memory, faulty, faults, lease) = setup();
        faults.set(Direction::Request, Fault::Blackhole);
        let pending = tokio::time::timeout(Duration::from_millis(100), faulty.acquire(&request(&lease, "a"))).await;
        assert!(pending.is_err(), "a blackholed request must pend");
        assert!(
            memory.inspect(&lease).await.unwrap().holder.is_none(),
            "the store must not see it"
        );
        assert_eq!(faults.counts().acquire, 1);

        // Lifting the fault fails the pending call: its request was lost.
        let req = request(&lease, "a");
        let call = faulty.acquire(&req);
        let heal = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            faults.heal();
        };
        let (result, ()) = tokio::join!(call, heal);
        assert!(matches!(result, Err(Error::Unreachable { .. })), "{result:?}");
        assert!(memory.inspect(&lease).await.unwrap().holder.is_none());
    }

    #[tokio::test]
    async fn reply_blackhole_applies_the_request() {
        let (memory, faulty, faults, lease) = setup();
        faults.set(Direction::Reply, Fault::Blackhole);
        let pending = tokio::time::timeout(Duration::from_millis(100), faulty.acquire(&request(&lease, "a"))).await;
        assert!(pending.is_err(), "a blackholed reply must pend");
        let holder = memory
            .inspect(&lease)
            .await
            .unwrap()
            .holder
            .expect("the acquire was applied");
        assert_eq!(holder.id.as_str(), "a");
    }

    #[tokio::test]
    async fn resets_and_delays() {
        let (memory, faulty, faults, lease) = setup();
        faults.set(Direction::Request, Fault::Reset);
        let err = faulty.acquire(&request(&lease, "a")).await.unwrap_err();
        assert!(err.is_transient() && err.to_string().contains("before"), "{err}");
        assert!(memory.inspect(&lease).await.unwrap().holder.is_none());

        faults.set(Direction::Both, Fault::Pass);
        faults.set(Direction::Reply, Fault::Reset);
        let err = faulty.acquire(&request(&lease, "a")).await.unwrap_err();
        assert!(err.is_transient() && err.to_string().contains("applied"), "{err}");
        assert!(memory.inspect(&lease).await.unwrap().holder.is_some());

        faults.set(Direction::Request, Fault::Delay(Duration::from_millis(60)));
        faults.set(Direction::Reply, Fault::Delay(Duration::from_millis(40)));
        let started = Instant::now();
        faulty.inspect(&lease).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        let counts = faults.counts();
        assert_eq!((counts.acquire, counts.inspect, counts.total()), (2, 1, 3), "{counts}");
        faults.reset_counts();
        assert_eq!(faults.counts().total(), 0);
        assert_eq!(faulty.name(), "memory");
        assert_eq!(faulty.capabilities(), memory.capabilities());
    }

    #[tokio::test]
    async fn changes_are_silenced_by_a_blackhole() {
        let (memory, faulty, faults, lease) = setup();
        let other = LeaseStore::acquire(&*memory, &request(&lease, "b")).await.unwrap();
        let Acquired::Granted(grant) = other else {
            panic!("free lease")
        };
        let mut changes = faulty
            .changes(&lease, &CandidateId::new("a").unwrap())
            .await
            .unwrap()
            .unwrap();
        faults.set(Direction::Both, Fault::Blackhole);
        memory.release(&grant).await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(100), changes.next()).await;
        assert!(silent.is_err(), "no change may pass a blackhole");
        faults.heal();
        memory.acquire(&request(&lease, "b")).await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
        assert_eq!(seen.unwrap(), Some(()));
    }
}
