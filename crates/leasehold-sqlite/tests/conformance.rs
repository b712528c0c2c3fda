//! The shared conformance suite (one lease file, every client its own store).
//!
//! The backend: SQLite: every client is its own `SqliteStore` (its own pool and writer) on one file in a
//! temporary directory, as separate processes would be; faults are injected in process.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{Error, LeaseName, LeaseStore, Result};
use leasehold_sqlite::SqliteStore;
use sqlx::{ConnectOptions, Connection, sqlite::SqliteConnectOptions};
use tempfile::TempDir;

use leasehold_conformance::Backend;

/// One lease file in a new temporary directory, removed when the backend is dropped.
fn sqlite() -> Option<Arc<dyn Backend>> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    Some(Arc::new(Sqlite {
        path: dir.path().join("leases.db"),
        _dir: dir,
    }))
}

#[derive(Debug)]
struct Sqlite {
    path: PathBuf,
    _dir: TempDir,
}

impl Sqlite {
    /// A plain connection to the lease file, as a foreign program would open it.
    async fn raw(&self) -> Result<sqlx::SqliteConnection> {
        SqliteConnectOptions::new()
            .filename(&self.path)
            .connect()
            .await
            .map_err(|e| Error::store("sqlite", e))
    }
}

#[async_trait]
impl Backend for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        let url = format!("sqlite://{}", self.path.display());
        Ok(Arc::new(SqliteStore::connect(&url).await?))
    }

    /// Text where the term belongs, as a foreign program might write.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let sql = |e: sqlx::Error| Error::store("sqlite", e);
        let mut conn = self.raw().await?;
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

    async fn remove(&self, lease: &LeaseName) -> Result<bool> {
        let sql = |e: sqlx::Error| Error::store("sqlite", e);
        let mut conn = self.raw().await?;
        sqlx::query("DELETE FROM leasehold_leases WHERE name = ?1")
            .bind(lease.as_str())
            .execute(&mut conn)
            .await
            .map_err(sql)?;
        conn.close().await.map_err(sql)?;
        Ok(true)
    }
}

leasehold_conformance::suite!(sqlite, sqlite());
