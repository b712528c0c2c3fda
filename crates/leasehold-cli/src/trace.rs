//! TEMPORARY: handover trace points (LEASEHOLD_TRACE_POINTS=1), for the issue-17 breakdown.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use leasehold::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, Grant, LeaseName, LeaseStore,
    Observation, Renewed, Result, Term, Transition, async_trait,
};

pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LEASEHOLD_TRACE_POINTS").is_some())
}

pub(crate) fn point(what: &str) {
    if enabled() {
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        eprintln!("TRACE {ns} {} {what}", std::process::id());
    }
}

pub(crate) fn wrap(store: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
    if enabled() { Arc::new(Traced(store)) } else { store }
}

#[derive(Debug)]
struct Traced(Arc<dyn LeaseStore>);

#[async_trait]
impl LeaseStore for Traced {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        point("store.acquire.sent");
        let r = self.0.acquire(request).await;
        point(match &r {
            Ok(Acquired::Granted(_)) => "store.acquire.granted",
            Ok(_) => "store.acquire.held",
            Err(_) => "store.acquire.error",
        });
        r
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.0.renew(grant).await
    }
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.0.renew_many(grants).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        point("store.release.sent");
        let r = self.0.release(grant).await;
        point("store.release.answered");
        r
    }
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.0.hand_over(grant, to).await
    }
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        point("store.withdraw.sent");
        let r = self.0.withdraw(lease, candidate).await;
        point("store.withdraw.answered");
        r
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        point("store.inspect.sent");
        let r = self.0.inspect(lease).await;
        point("store.inspect.answered");
        r
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.0.history(lease, limit).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.0.list(prefix).await
    }
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let r = self.0.changes(lease, candidate).await?;
        Ok(r.map(|s| {
            s.map(|()| {
                point("store.changes.item");
            })
            .boxed()
        }))
    }
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let r = self.0.announcements(lease).await?;
        Ok(r.map(|s| {
            s.map(|o| {
                point("store.announcement.item");
                o
            })
            .boxed()
        }))
    }
    fn can_break(&self) -> bool {
        self.0.can_break()
    }
    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.0.break_lease(lease).await
    }
}
