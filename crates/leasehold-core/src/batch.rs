//! [`RenewBatcher`]: the renewals of many electors on one store, sent together.

use std::fmt;
use std::mem;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::shard_record::{ShardRecord, ShardWrite};
use crate::store::{Announcements, Changes, LeaseStore};
use crate::types::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Grant, LeaseName, Observation, Renewed, Term, Transition,
};

/// A store that gathers the renewals arriving within `window` of each other into one
/// [`LeaseStore::renew_many`] call, and forwards everything else unchanged.
///
/// With many leases held in one process (the shards of a [`LeaseGroup`](crate::LeaseGroup),
/// thousands of electors), renewals then cost about one request per `window` instead of one per
/// lease per `renew_every` on stores that renew many grants in one request. It is safe: an
/// elector counts its lease from the moment it asked for the renewal, which is before the batch
/// is sent, so a renewal that waits for its batch only shortens what the elector believes. The
/// renewals of electors that joined one batch fall due together again, so batches stay whole.
///
/// Keep `window` small next to `renew_every` (the group uses `renew_every / 20`, at most 100 ms):
/// it is time every renewal may lose.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{CountingStore, Elector, LeaseStore, MemoryStore, Operation, RenewBatcher};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let counted = Arc::new(CountingStore::new(MemoryStore::new()));
/// let store = Arc::new(RenewBatcher::new(counted.clone(), Duration::from_millis(20)));
/// let mut leaders = Vec::new();
/// for lease in ["a", "b", "c"] {
///     let elector = Elector::builder(store.clone(), lease).ttl(Duration::from_secs(3)).build()?;
///     leaders.push(elector.campaign().await?);
/// }
/// tokio::time::sleep(Duration::from_millis(1_100)).await; // one renewal each, at renew_every
/// assert!(leaders.iter().all(|l| l.remaining() > Duration::from_secs(2))); // renewed
/// assert_eq!(counted.counts().get(Operation::RenewMany), 1); // all three at once
/// assert_eq!(counted.counts().get(Operation::Renew), 0);
/// # Ok(()) }
/// ```
pub struct RenewBatcher<S> {
    inner: Arc<S>,
    window: Duration,
    waiting: Arc<Mutex<Vec<Waiting>>>,
}

struct Waiting {
    grant: Grant,
    reply: oneshot::Sender<Result<Renewed>>,
}

impl<S> fmt::Debug for RenewBatcher<S>
where
    S: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenewBatcher")
            .field("inner", &self.inner)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl<S: LeaseStore> RenewBatcher<S> {
    /// Gathers the renewals arriving within `window` of the first one.
    pub fn new(inner: S, window: Duration) -> Self {
        RenewBatcher {
            inner: Arc::new(inner),
            window,
            waiting: Arc::default(),
        }
    }

    /// The store around which this one is.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }
}

/// One error for each grant of a batch that failed as a whole, of the same kind (transient,
/// permanent or neither) as the batch's.
fn for_each(store: &'static str, error: &Error, grants: usize) -> Vec<Result<Renewed>> {
    let reason = format!("renewing {grants} leases together: {error}");
    (0..grants)
        .map(|_| {
            Err(if error.is_transient() {
                Error::unreachable(store, reason.clone())
            } else if error.is_permanent() {
                Error::refused(store, "renew_many", reason.clone())
            } else {
                Error::store(store, reason.clone())
            })
        })
        .collect()
}

#[async_trait]
impl<S: LeaseStore> LeaseStore for RenewBatcher<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(request).await
    }

    /// Waits for the batch this renewal joins (the first one to arrive opens it and sends it,
    /// from its own task, `window` later).
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock().expect("batch lock");
            waiting.push(Waiting {
                grant: grant.clone(),
                reply,
            });
            waiting.len() == 1
        };
        if first {
            let (inner, waiting, window) = (self.inner.clone(), self.waiting.clone(), self.window);
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                let batch = mem::take(&mut *waiting.lock().expect("batch lock"));
                let grants: Vec<Grant> = batch.iter().map(|w| w.grant.clone()).collect();
                let store = inner.name();
                let answers: Vec<Result<Renewed>> = match inner.renew_many(&grants).await {
                    Ok(answers) if answers.len() == grants.len() => answers,
                    Ok(answers) => {
                        let error = Error::engine(format!(
                            "renew_many answered {} of {} grants",
                            answers.len(),
                            grants.len()
                        ));
                        for_each(store, &error, grants.len())
                    }
                    Err(error) => for_each(store, &error, grants.len()),
                };
                for (waiting, answer) in batch.into_iter().zip(answers) {
                    let _ = waiting.reply.send(answer);
                }
            });
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::unreachable(
                self.name(),
                "the renewal batch ended without a reply",
            ))
        })
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        self.inner.renew_many(grants).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.release(grant).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.inner.hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.inner.withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.inner.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.inner.list(prefix).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.inner.shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.inner.write_shard(name, expected, value).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.inner.candidates(lease).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.inner.changes(lease, candidate).await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.inner.announcements(lease).await
    }

    fn can_break(&self) -> bool {
        self.inner.can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.inner.break_lease(lease).await
    }
}
