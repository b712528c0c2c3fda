use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Elector, MemoryStore};

#[tokio::test]
async fn campaign_and_resign() {
    let store = Arc::new(MemoryStore::new());
    let elector = Elector::builder(store, "demo").ttl(Duration::from_secs(1)).build().unwrap();
    let leader = elector.campaign().await.unwrap();
    assert_eq!(leader.term().0, 1);
    leader.resign().await;
}

#[tokio::test]
async fn debug_events() {
    let store = Arc::new(MemoryStore::new());
    let elector = Elector::builder(store, "demo").ttl(Duration::from_secs(1)).build().unwrap();
    let mut ev = elector.events();
    let r = elector.campaign().await;
    while let Ok(e) = ev.try_recv() { eprintln!("{e:?}"); }
    eprintln!("{r:?}");
}
