//! leasehold's whole conformance suite against `DirStore`: a `Backend` that makes independent
//! clients of one directory and can vandalise a record, then one `suite!` line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::Backend;
use leasehold_core::{Error, LeaseName, LeaseStore, Result, async_trait};
use leasehold_example_custom_store::DirStore;
use tempfile::TempDir;

/// One store directory per scenario, removed when the scenario's backend is dropped.
struct Dir {
    path: PathBuf,
    _dir: TempDir,
}

fn dir_store() -> Dir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    Dir {
        path: dir.path().join("leases"),
        _dir: dir,
    }
}

#[async_trait]
impl Backend for Dir {
    fn name(&self) -> &'static str {
        "dir"
    }

    /// A new `DirStore` on the same directory, as another process would open it.
    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(DirStore::open(&self.path)?))
    }

    /// What a foreign program might leave in a lease's file.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let store = DirStore::open(&self.path)?;
        std::fs::write(store.path_of(lease), b"{\"holder\": 42}").map_err(|e| Error::store("dir", e))
    }

    /// Every write is a file written and renamed: 1,000 leases at the default 2 s TTL need 1,500
    /// of them a second, more than a loaded test machine gives. At 10 s it is 300.
    fn many_leases_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(10))
    }

    async fn remove(&self, lease: &LeaseName) -> Result<bool> {
        let store = DirStore::open(&self.path)?;
        std::fs::remove_file(store.path_of(lease)).map_err(|e| Error::store("dir", e))?;
        Ok(true)
    }
}

leasehold_conformance::suite!(dir, dir_store());
