//! The in-process store wrapper that injects faults, counted by core's [`CountingStore`].

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, CountingStore, Error, Grant,
    LeaseName, LeaseStore, Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};

use crate::faults::{Direction, Fault, Faults, RequestCounts};

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
/// blackholed, is delayed by the reply delay, and ends on a reset. `name`, `capabilities` and
/// `can_break` pass through. Every call, faulted or not, is counted by a core
/// [`CountingStore`] around the fault injection, and shows in [`Faults::counts`].
#[derive(Debug)]
pub struct FaultyStore {
    counted: Arc<Counted>,
}

/// The counter around the faults.
pub(crate) type Counted = CountingStore<Injected>;

impl FaultyStore {
    /// Wraps `inner`, disrupted by `faults`.
    pub fn new(inner: Arc<dyn LeaseStore>, faults: Faults) -> Self {
        FaultyStore::wrap(inner, faults, true)
    }

    /// Wraps `inner` only to count its requests in `faults`, injecting nothing: for a store
    /// whose traffic already goes through a [`FaultProxy`](crate::FaultProxy) switched by the
    /// same `faults` (scenarios read the counts; a proxy sees bytes, not requests).
    pub fn counting(inner: Arc<dyn LeaseStore>, faults: Faults) -> Self {
        FaultyStore::wrap(inner, faults, false)
    }

    fn wrap(inner: Arc<dyn LeaseStore>, faults: Faults, inject: bool) -> Self {
        let counted = Arc::new(CountingStore::new(Injected {
            inner,
            faults: faults.clone(),
            inject,
        }));
        faults.attach(&counted);
        FaultyStore { counted }
    }

    /// The switchboard of this store.
    pub fn faults(&self) -> &Faults {
        &self.counted.inner().faults
    }

    /// The requests this store alone has made (its [`Faults`] may count other stores too).
    pub fn counts(&self) -> RequestCounts {
        self.counted.counts().into()
    }
}

impl Drop for FaultyStore {
    fn drop(&mut self) {
        self.faults().retire(&self.counted);
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    fn name(&self) -> &'static str {
        self.counted.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.counted.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.counted.acquire(request).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.counted.renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.counted.release(grant).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.counted.renew_many(grants).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.counted.hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.counted.withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.counted.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.counted.history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.counted.list(prefix).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.counted.candidates(lease).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.counted.changes(lease, candidate).await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.counted.announcements(lease).await
    }

    fn can_break(&self) -> bool {
        self.counted.can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.counted.break_lease(lease).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.counted.shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.counted.write_shard(name, expected, value).await
    }
}

/// The fault injection of a [`FaultyStore`] (`inject: false`: none, only counted).
#[derive(Debug)]
pub(crate) struct Injected {
    inner: Arc<dyn LeaseStore>,
    faults: Faults,
    inject: bool,
}

impl Injected {
    /// A notification stream as the faults let it through: a reset ends it, a blackhole drops
    /// what comes meanwhile, a reply delay delays each item.
    fn notifications_through_faults<T: Send + 'static>(&self, stream: BoxStream<'static, T>) -> BoxStream<'static, T> {
        if !self.inject {
            return stream;
        }
        let faults = self.faults.clone();
        Box::pin(futures::stream::unfold(
            (stream, faults),
            |(mut stream, faults)| async move {
                loop {
                    let item = stream.next().await?;
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
                    return Some((item, (stream, faults)));
                }
            },
        ))
    }

    fn unreachable(&self, why: &'static str) -> Error {
        Error::unreachable(self.inner.name(), format!("fault injection: {why}"))
    }

    /// Runs `operation` (which starts the inner call) through the faults.
    async fn call<T, F>(&self, operation: impl FnOnce() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
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
impl LeaseStore for Injected {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.call(|| self.inner.acquire(request)).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.call(|| self.inner.renew(grant)).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.call(|| self.inner.release(grant)).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.call(|| self.inner.renew_many(grants)).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.call(|| self.inner.hand_over(grant, to)).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.call(|| self.inner.withdraw(lease, candidate)).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.call(|| self.inner.inspect(lease)).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.call(|| self.inner.history(lease, limit)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.call(|| self.inner.list(prefix)).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.call(|| self.inner.candidates(lease)).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let Some(changes) = self.call(|| self.inner.changes(lease, candidate)).await? else {
            return Ok(None);
        };
        Ok(Some(self.notifications_through_faults(changes)))
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let Some(announcements) = self.call(|| self.inner.announcements(lease)).await? else {
            return Ok(None);
        };
        Ok(Some(self.notifications_through_faults(announcements)))
    }

    fn can_break(&self) -> bool {
        self.inner.can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.call(|| self.inner.break_lease(lease)).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.call(|| self.inner.shard_records(prefix)).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.call(|| self.inner.write_shard(name, expected, value)).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

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
    async fn counts_of_every_store_of_the_faults_also_dropped_ones() {
        let memory: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let faults = Faults::new();
        let lease = LeaseName::new("counted").unwrap();
        let a = FaultyStore::new(memory.clone(), faults.clone());
        let b = FaultyStore::counting(memory.clone(), faults.clone());
        a.acquire(&request(&lease, "a")).await.unwrap();
        b.inspect(&lease).await.unwrap();
        b.list("").await.unwrap();
        assert_eq!((a.counts().total(), b.counts().total()), (1, 2));
        let counts = faults.counts();
        assert_eq!(
            (counts.acquire, counts.inspect, counts.list, counts.total()),
            (1, 1, 1, 3),
            "{counts}"
        );

        // A dropped store's requests still count; a reset starts from zero for every store.
        drop(a);
        assert_eq!(faults.counts().total(), 3);
        faults.reset_counts();
        b.inspect(&lease).await.unwrap();
        let c = FaultyStore::new(memory.clone(), faults.clone());
        faults.set(Direction::Request, Fault::Reset);
        assert!(c.inspect(&lease).await.is_err());
        drop(c);
        let counts = faults.counts();
        assert_eq!((counts.inspect, counts.failed, counts.total()), (2, 1, 2), "{counts}");
        assert!(b.can_break(), "can_break passes through");
    }

    #[tokio::test]
    async fn batched_renewals_and_hand_overs_are_counted() {
        let (memory, faulty, faults, lease) = setup();
        let Acquired::Granted(grant) = faulty.acquire(&request(&lease, "a")).await.unwrap() else {
            panic!("free lease")
        };
        let renewed = faulty.renew_many(std::slice::from_ref(&grant)).await.unwrap();
        let Ok(Renewed::Renewed(grant)) = renewed.into_iter().next().unwrap() else {
            panic!("the holder renews")
        };
        faulty.hand_over(&grant, &CandidateId::new("b").unwrap()).await.unwrap();
        let counts = faults.counts();
        assert_eq!(
            (counts.acquire, counts.renew_many, counts.hand_over, counts.total()),
            (1, 1, 1, 3),
            "{counts}"
        );
        assert_eq!(faulty.counts(), counts);
        let holder = memory.inspect(&lease).await.unwrap().holder.expect("reserved for b");
        assert_eq!(holder.id.as_str(), "b");
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
        // A release wakes the longest waiter: "a" (the memory store's grants wake nobody).
        let Acquired::Granted(grant) = memory.acquire(&request(&lease, "b")).await.unwrap() else {
            panic!("free lease")
        };
        memory.release(&grant).await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
        assert_eq!(seen.unwrap(), Some(leasehold_core::Change::Changed));
    }
}
