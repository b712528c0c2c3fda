//! A renewal of a grant the store no longer holds is a relock (take the lock again if the row
//! still names the grant); it must not wait for a lock that the lease's next holder has.

use crate::common;

use std::time::{Duration, Instant};

use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;

use common::{lease, server};

/// A lease group hands shards over while its renewal batcher may still have their renewals
/// queued: each such renewal reached the lock session as a relock, which waited the whole
/// `lock_timeout` (250 ms) for the successor's lock, one after the other, while the session
/// served nothing else; the member lease's renewal behind them timed out (seen as members
/// leaving a group on a loaded machine). Five renewals of a handed-over grant whose successor
/// took it answer Lost, together well within one `lock_timeout` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_hand_over_does_not_wait_for_the_successors_lock() {
    let Some(pg) = server() else { return };
    let (old, new) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let name = lease("handed");
    let request = |who: &str| AcquireRequest {
        lease: name.clone(),
        candidate: CandidateId::new(who).unwrap(),
        ttl: Duration::from_secs(30),
        takeover: None,
    };
    let Acquired::Granted(grant) = old.acquire(&request("old")).await.unwrap() else {
        panic!("granted")
    };
    let successor = CandidateId::new("new").unwrap();
    old.hand_over(&grant, &successor).await.unwrap();
    let Acquired::Granted(_) = new.acquire(&request("new")).await.unwrap() else {
        panic!("the successor is granted")
    };

    let started = Instant::now();
    for _ in 0..5 {
        match old.renew(&grant).await.unwrap() {
            Renewed::Lost(seen) => {
                assert_eq!(seen.holder.expect("held").id, successor);
            }
            renewed => panic!("lost: {renewed:?}"),
        }
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(5 * 250),
        "five renewals of a handed-over grant took {took:?}: each waited for the successor's lock"
    );
}
