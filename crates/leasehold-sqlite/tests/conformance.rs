//! The shared conformance suite against SQLite. Every client is its own `SqliteStore` (its own
//! pool and writer) on one file, as separate processes would be.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::Backend;
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_sqlite::SqliteStore;
use sqlx::{ConnectOptions, Connection, sqlite::SqliteConnectOptions};
use tempfile::TempDir;

/// One lease file in a temporary directory, removed when the backend is dropped.
struct SqliteBackend {
    path: PathBuf,
    _dir: TempDir,
}

impl SqliteBackend {
    fn temporary() -> Arc<dyn Backend> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        Arc::new(SqliteBackend {
            path: dir.path().join("leases.db"),
            _dir: dir,
        })
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(SqliteStore::open(&self.path).await?))
    }

    /// Writes text where the term belongs, as a foreign program might.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let sql = |e: sqlx::Error| Error::store("sqlite", e);
        let mut conn = SqliteConnectOptions::new()
            .filename(&self.path)
            .connect()
            .await
            .map_err(sql)?;
        sqlx::query(
            "INSERT INTO leasehold_leases (name, holder, term) VALUES (?1, 'vandal', 'garbage')
             ON CONFLICT (name) DO UPDATE SET term = 'garbage'",
        )
        .bind(lease.as_str())
        .execute(&mut conn)
        .await
        .map_err(sql)?;
        conn.close().await.map_err(sql)
    }
}

leasehold_conformance::conformance_tests!(sqlite, async { SqliteBackend::temporary() });
