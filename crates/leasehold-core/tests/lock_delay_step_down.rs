//! With a `lock_delay`, a leader deposed because no renewal was confirmed by its step-down point
//! leaves its lease to expire: a release would record a clean end, and the next candidate would
//! skip the delay that exists for exactly this holder (its side effects may still be in flight).
//! The machine's own timer and the leader's handle (`Leader::is_cancelled` / `cancelled`, which
//! step down by the clock when the driver has not yet) reach that step-down; both must leave the
//! lease (session 11 review: the handle's path released it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, Capabilities, Elector, EndReason, Grant, Leader, LeaseName, LeaseStore, MemoryStore,
    Observation, Renewed, Result, Term, Transition, async_trait,
};

/// A memory store whose renewals hang (never answered) once `hang` is set: a leader cut off
/// from the store for its renewals.
#[derive(Debug, Clone)]
struct HangingRenewals {
    inner: MemoryStore,
    hang: Arc<AtomicBool>,
}

#[async_trait]
impl LeaseStore for HangingRenewals {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        if self.hang.load(Ordering::SeqCst) {
            futures::future::pending::<()>().await;
        }
        self.inner.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.release(grant).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.inner.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }
}

/// A leader with a 5 s lock delay and a 2 s TTL whose renewals hang from now on; its store.
async fn leader_cut_off() -> (Leader, HangingRenewals) {
    let store = HangingRenewals {
        inner: MemoryStore::new(),
        hang: Arc::new(AtomicBool::new(false)),
    };
    let a = Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id("a")
        .ttl(Duration::from_millis(2_000))
        .jitter(0.0)
        .lock_delay(Duration::from_secs(5))
        .build()
        .unwrap();
    let leader = a.campaign().await.unwrap();
    store.hang.store(true, Ordering::SeqCst);
    (leader, store)
}

/// Once the driver has done what it does with the lease: it must not have been released.
async fn assert_left_to_expire(store: &HangingRenewals, term: Term) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = store.inner.inspect(&LeaseName::new("jobs").unwrap()).await.unwrap();
    assert!(
        seen.holder.is_some() || seen.previous_end != Some(EndReason::Released),
        "term {term}: a leader deposed for want of a confirmed renewal released its lease despite \
         the lock delay (a clean end: the next candidate skips the delay): {seen:?}"
    );
}

/// The work notices the step-down point by the clock before the driver does (the runtime was
/// busy: here the work's own thread), as `Leader::is_cancelled` is documented to allow, and
/// returns. The lease must be left to expire, as when the driver's timer steps down first.
#[tokio::test(flavor = "current_thread")]
async fn with_a_lock_delay_a_step_down_noticed_by_the_handle_leaves_the_lease_to_expire() {
    let (leader, store) = leader_cut_off().await;
    // Valid until (acquire sent) + 1.98 s, cancelled from 1.78 s on. The runtime is busy (this
    // thread) until 1.85 s after the election: the driver has not run since.
    let busy_until = leader.valid_until() - Duration::from_millis(130);
    std::thread::sleep(busy_until.saturating_duration_since(std::time::Instant::now()));
    assert!(leader.is_cancelled(), "past the step-down point");
    let term = leader.term();
    drop(leader); // the work returns
    assert_left_to_expire(&store, term).await;
}

/// The same leader whose driver reaches the step-down point first (the runtime is not busy).
#[tokio::test(flavor = "current_thread")]
async fn with_a_lock_delay_a_step_down_by_the_driver_leaves_the_lease_to_expire() {
    let (leader, store) = leader_cut_off().await;
    let after_step_down = leader.valid_until() - Duration::from_millis(130);
    tokio::time::sleep_until(after_step_down.into()).await;
    assert!(leader.is_cancelled(), "past the step-down point");
    let term = leader.term();
    drop(leader);
    assert_left_to_expire(&store, term).await;
}
