//! `racing_writes_have_one_winner` catches a store that checks a record and then writes it
//! without a lock, as the `s3s-fs` S3 server does: the scenario must fail against such a store,
//! and pass against the same store writing with compare-and-set (`MemoryStore`, also in
//! `memory.rs`).

use std::sync::Arc;

use leasehold_conformance::{Backend, scenarios};
use leasehold_core::{
    AcquireRequest, Acquired, Capabilities, Grant, LeaseName, LeaseStore, MemoryStore, Observation, Renewed, Result,
    Transition, async_trait,
};

/// A store that reads the lease, decides, and then overwrites it unconditionally: each acquire
/// that found the lease free (or named its version) wins, however many found it so at once.
/// With `safe_create`, a lease never written is created with compare-and-set (only replaces
/// race).
#[derive(Debug)]
struct CheckThenWrite {
    store: MemoryStore,
    safe_create: bool,
}

#[async_trait]
impl LeaseStore for CheckThenWrite {
    fn name(&self) -> &'static str {
        "check-then-write"
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let seen = self.store.inspect(&request.lease).await?;
        if self.safe_create && seen.last_term.0 == 0 {
            return self.store.acquire(request).await;
        }
        let grantable = match &seen.holder {
            None => true,
            Some(holder) => holder.id == request.candidate || request.takeover.as_ref() == Some(&holder.version),
        };
        if !grantable {
            return Ok(Acquired::Held(seen));
        }
        // The time a request to a server takes between its check and its write: long enough that
        // every racing writer checks before any writes, however the runtime schedules them (a
        // single yield let the create round go one at a time under CI load).
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // An unconditional write: whatever is there now is replaced.
        self.store.break_lease(&request.lease).await?;
        let write = AcquireRequest {
            takeover: None,
            ..request.clone()
        };
        self.store.acquire(&write).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.store.renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.store.release(grant).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.store.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.store.history(lease, limit).await
    }
}

struct CheckThenWriteBackend(CheckThenWrite);

#[async_trait]
impl Backend for CheckThenWriteBackend {
    fn name(&self) -> &'static str {
        "check-then-write"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(CheckThenWrite {
            store: self.0.store.clone(),
            safe_create: self.0.safe_create,
        }))
    }

    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        self.0.store.corrupt(lease);
        Ok(())
    }
}

/// The failure names how many writers won.
async fn race_failure(store: MemoryStore, safe_create: bool) -> String {
    let backend: Arc<dyn Backend> = Arc::new(CheckThenWriteBackend(CheckThenWrite { store, safe_create }));
    let outcome = tokio::spawn(scenarios::racing_writes_have_one_winner(backend)).await;
    let panic = outcome
        .expect_err("the race scenario must fail against a check-then-write store")
        .into_panic();
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writes_catch_check_then_write() {
    let message = race_failure(MemoryStore::new(), false).await;
    eprintln!("{message}");
    assert!(
        message.contains("round 1, create:") && message.contains("winners of 16 writers racing"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writes_catch_check_then_write_on_replace() {
    let message = race_failure(MemoryStore::observed_expiry(), true).await;
    eprintln!("{message}");
    assert!(
        message.contains("round 1, replace:") && message.contains("winners of 16 writers racing"),
        "{message}"
    );
}
