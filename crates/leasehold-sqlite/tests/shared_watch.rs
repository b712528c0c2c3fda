//! Every store of a process on one file shares one file watcher (one inotify instance on Linux),
//! however many stores and followers there are: a process with many stores must not run out of
//! inotify instances (128 per user by default), after which followers would poll.
//!
//! A test binary of its own: it counts the process's inotify descriptors.

#![cfg(target_os = "linux")]

use std::sync::Arc;

use futures::StreamExt;
use leasehold_core::{AcquireRequest, Acquired, LeaseStore};
use leasehold_sqlite::SqliteStore;

fn inotify_instances() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("inotify"))
        .count()
}

#[tokio::test]
async fn stores_on_one_file_share_one_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let before = inotify_instances();
    let mut stores = Vec::new();
    let mut streams = Vec::new();
    let mut announced = Vec::new();
    for i in 0..20 {
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let changes = store
            .changes(&"jobs".parse().unwrap(), &format!("c{i}").parse().unwrap())
            .await
            .unwrap()
            .expect("the store watches its file");
        announced.push(
            store
                .announcements(&"jobs".parse().unwrap())
                .await
                .unwrap()
                .expect("the store watches its file"),
        );
        stores.push(store);
        streams.push(changes);
    }
    assert_eq!(inotify_instances(), before + 1, "20 stores on one file, one watcher");

    // Each store's followers still learn of the grant (announced; a grant wakes nobody).
    let request = AcquireRequest {
        lease: "jobs".parse().unwrap(),
        candidate: "leader".parse().unwrap(),
        ttl: std::time::Duration::from_secs(60),
        takeover: None,
    };
    assert!(matches!(
        stores[0].acquire(&request).await.unwrap(),
        Acquired::Granted(_)
    ));
    for (i, announced) in announced.iter_mut().enumerate() {
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), announced.next())
            .await
            .unwrap_or_else(|_| panic!("store {i}'s follower not told"))
            .expect("the stream lives");
        assert_eq!(seen.holder.expect("a holder").id.as_str(), "leader");
    }

    // Another file gets a watcher of its own; once nobody watches, the watchers go.
    let other = SqliteStore::open(dir.path().join("other.db")).await.unwrap();
    let other_changes = other
        .changes(&"jobs".parse().unwrap(), &"x".parse().unwrap())
        .await
        .unwrap()
        .expect("watched");
    assert_eq!(inotify_instances(), before + 2);
    drop((streams, announced, stores, other_changes, other));
    let gone = async {
        while inotify_instances() > before {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), gone)
        .await
        .expect("the watchers stop when their stores are dropped");
}
