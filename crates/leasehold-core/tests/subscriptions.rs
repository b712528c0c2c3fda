//! A candidate keeps its change notifications only while it follows: a leader never uses them
//! (it learns of a loss from its renewals), and on some stores each one costs a watch, a
//! listening connection's routing or a read per change (1,000 leaders would keep 1,000).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, Elector, Grant, LeaseName, LeaseStore, MemoryStore,
    Observation, Renewed, Result, Transition,
};

/// A memory store that counts the change streams alive.
#[derive(Debug, Default)]
struct Tracked {
    inner: MemoryStore,
    alive: Arc<AtomicUsize>,
}

/// Counts one stream alive until dropped.
struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl LeaseStore for Tracked {
    fn name(&self) -> &'static str {
        "tracked"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
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
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let Some(changes) = self.inner.changes(lease, candidate).await? else {
            return Ok(None);
        };
        self.alive.fetch_add(1, Ordering::SeqCst);
        let alive = Alive(self.alive.clone());
        Ok(Some(
            changes
                .map(move |change| {
                    let _ = &alive;
                    change
                })
                .boxed(),
        ))
    }
}

fn elector(store: &Arc<Tracked>, id: &str) -> Elector {
    Elector::builder(store.clone(), "subscriptions")
        .candidate_id(id)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap()
}

async fn alive_becomes(store: &Tracked, n: usize) {
    let waited = tokio::time::timeout(Duration::from_secs(2), async {
        while store.alive.load(Ordering::SeqCst) != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{} change streams alive, expected {n}",
        store.alive.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn leaders_drop_their_change_notifications_and_followers_keep_them() {
    let store = Arc::new(Tracked::default());
    let a = elector(&store, "a");
    let leader_a = a.campaign().await.unwrap();
    alive_becomes(&store, 0).await;

    let b = elector(&store, "b");
    let campaign_b = tokio::spawn(async move { b.campaign().await });
    alive_becomes(&store, 1).await;

    leader_a.resign().await;
    let leader_b = tokio::time::timeout(Duration::from_secs(2), campaign_b)
        .await
        .expect("b elected after a resigned")
        .unwrap()
        .unwrap();
    alive_becomes(&store, 0).await;
    leader_b.resign().await;
}
