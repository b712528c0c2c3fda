//! The sharing of the announcement watch, which only this store's own state shows: etcd does not
//! tell a client how many watches it has, and a count of connections (the fault proxy's) does not
//! see watches, which share one connection. So this test reads `Inner::announcers`, and lives
//! here rather than in `tests/` (there it would need an accessor in the library for it).

use leasehold_conformance::require_server;
use leasehold_core::{LeaseName, LeaseStore};

use crate::EtcdStore;

fn watched(store: &EtcdStore) -> Vec<String> {
    let announcers = store.inner.announcers.lock().expect("announcers lock");
    announcers.keys().map(|l| l.as_str().to_string()).collect()
}

/// Followers of a lease in one store share one watch, which goes with the last stream.
///
/// On one thread (`current_thread`), a task woken before the test awaits a round trip to etcd
/// runs while the test waits for the answer: the watch's task, woken when the last stream is
/// dropped, has ended (and removed its entry) by the time `inspect` answers. No timer.
#[tokio::test(flavor = "current_thread")]
async fn followers_share_one_watch_that_ends_with_the_last() {
    let Some(url) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let prefix = format!("leasehold-announce-unit/{}", leasehold_core::random_u64());
    let store = EtcdStore::connect(&format!("{}/{prefix}", url.trim_end_matches('/')))
        .await
        .expect("connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let first = store
        .announcements(&lease)
        .await
        .expect("subscribes")
        .expect("announces");
    let second = store
        .announcements(&lease)
        .await
        .expect("subscribes")
        .expect("announces");
    let sender = {
        let announcers = store.inner.announcers.lock().expect("announcers lock");
        announcers.get(&lease).expect("watched").sender.clone()
    };
    assert_eq!(watched(&store), ["jobs"]);
    assert_eq!(sender.receiver_count(), 2, "both streams on the one watch");
    drop(first);
    store.inspect(&lease).await.expect("inspects");
    assert_eq!(watched(&store), ["jobs"], "one follower still follows");
    drop(second);
    store.inspect(&lease).await.expect("inspects");
    assert!(watched(&store).is_empty(), "the watch outlived its last stream");
}
