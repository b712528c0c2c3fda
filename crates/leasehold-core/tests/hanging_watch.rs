//! A store whose change notifications never answer must not stall a campaign (found by the
//! conformance suite: the driver once awaited `changes()` without a timeout).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, Elector, Grant, LeaseName, LeaseStore, MemoryStore,
    Observation, Renewed, Result, Transition,
};

/// A store whose change-notification call never answers, as a watch request lost in a network
/// partition does with a client that has no timeout of its own. Everything else works.
#[derive(Debug)]
struct ChangesNeverAnswer(MemoryStore);

#[async_trait]
impl LeaseStore for ChangesNeverAnswer {
    fn name(&self) -> &'static str {
        "changes-never-answer"
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.0.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.0.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.0.release(grant).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.0.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.0.history(lease, limit).await
    }
    async fn changes(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<Option<Changes>> {
        std::future::pending().await
    }
}

/// The driver awaits `store.changes()` before its loop with no `request_timeout`, so a
/// notification call that hangs keeps the candidate from ever sending an acquire (and a dropped
/// `campaign()` leaves the driver task stuck forever). Expected: the call is bounded by
/// `request_timeout`, after which the candidate polls, and wins the free lease.
#[tokio::test]

async fn a_hanging_changes_call_does_not_stop_the_campaign() {
    let store = Arc::new(ChangesNeverAnswer(MemoryStore::new()));
    let elector = Elector::builder(store.clone(), "free-lease")
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let campaign = tokio::time::timeout(Duration::from_secs(3), elector.campaign()).await;
    let acquires = store.0.history(elector.lease(), 10).await.unwrap().len();
    assert!(
        campaign.is_ok(),
        "the free lease was not won within 3 TTLs ({acquires} grants): the driver is stuck in changes()"
    );
}
