//! A release that failed on a live connection (its statement dropped, its replies never come)
//! while the store's lock session goes on renewing another lease of the same TTL: Postgres's own
//! lock session. The contract (a failed release or withdrawal never keeps the lease) is the
//! shared scenario `a_failed_release_does_not_keep_the_lease`, on every backend.
//!
//! The engine does not ask again once it has stopped campaigning, and every lease of a store is
//! an advisory lock of its one lock session, which the renewals of its other leases keep alive:
//! if the failed release left the lock on that session, the candidate queued next would be
//! answered `Held` for as long as the store renews anything. It does not: a failure that breaks
//! the session frees its locks (the row is then orphaned and taken over after a TTL, by its
//! version), a failure that leaves the session gives the lock back (`ending`), and a grant nobody
//! renews for a TTL is given back at the session's next statement (`expire_abandoned`). The
//! queue place of a candidate is its store's queue watcher (a lock wait on another key), not a
//! lock held for the candidate, and the store has no `withdraw` request that could fail.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, Faults};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Elector, LeaseName, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;

use common::{lease, server};

const TTL: Duration = Duration::from_secs(2);
const DELAY: Duration = Duration::from_millis(300);

fn request(lease: &LeaseName, who: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(who).expect("a valid candidate id"),
        ttl: TTL,
        takeover: None,
    }
}

async fn granted(store: &PostgresStore, lease: &LeaseName, who: &str) -> leasehold_core::Grant {
    match store.acquire(&request(lease, who)).await {
        Ok(Acquired::Granted(g)) => g,
        other => panic!("{who} must be granted {lease}: {other:?}"),
    }
}

/// Fails `operation`: its request is held back `DELAY` in the proxy, then `fault` is applied to
/// requests (a reset breaks the connections, so the held-back statement never reaches the server;
/// a blackhole drops it on a connection that stays open).
async fn fail<T: Send + 'static>(
    faults: &Faults,
    fault: Fault,
    operation: impl std::future::Future<Output = leasehold_core::Result<T>> + Send + 'static,
) -> leasehold_core::Result<T> {
    faults.set(Direction::Request, Fault::Delay(DELAY));
    let running = tokio::spawn(operation);
    tokio::time::sleep(DELAY / 2).await;
    faults.set(Direction::Request, fault);
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the failed operation answers")
        .expect("the operation's task");
    faults.heal();
    outcome
}

/// `h` holds `jobs` and leads `other` (same TTL, same store, one lock session); its release of
/// `jobs` fails, and its store goes on renewing `other`. `c` (another store, direct connection,
/// an elector: the engine takes over an orphaned row by its version) must lead `jobs` within
/// three TTLs, at a higher term, and `h`'s grant must answer `Lost` after (never two holders).
async fn release_fails_while_other_renews(fault: Fault) {
    let Some(pg) = server() else { return };
    let (h, faults) = pg.faulty_store().await.expect("h connects");
    let h = Arc::new(h);
    let c: Arc<dyn LeaseStore> = Arc::new(PostgresStore::connect(&pg.url).await.expect("c connects"));
    let jobs = lease("left-jobs");
    let other = lease("left-other");
    let grant_other = granted(&h, &other, "h").await;
    let grant_h = granted(&h, &jobs, "h").await;

    let failed = {
        let (h, grant_h) = (h.clone(), grant_h.clone());
        fail(&faults, fault, async move { h.release(&grant_h).await }).await
    };
    assert!(failed.is_err(), "the release was not failed: {failed:?}");
    let failed_at = Instant::now();

    let renewing = {
        let (h, mut grant) = (h.clone(), grant_other.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(Renewed::Renewed(g)) = h.renew(&grant).await {
                    grant = g;
                }
                tokio::time::sleep(TTL / 4).await;
            }
        })
    };
    let elector = Elector::builder(c.clone(), jobs.as_str())
        .candidate_id("c")
        .ttl(TTL)
        .build()
        .expect("c's elector");
    let leader = tokio::time::timeout(TTL * 3, elector.campaign()).await;
    let took = failed_at.elapsed();
    let leader = leader
        .unwrap_or_else(|_| {
            panic!(
                "c does not lead {jobs} {took:?} after h's release failed ({fault:?}) while h's store renews {other}"
            )
        })
        .expect("c campaigns");
    assert!(
        leader.term() > grant_h.term,
        "c's term {:?} after h's {:?}",
        leader.term(),
        grant_h.term
    );
    // Never two holders: h's grant of `jobs` is not renewed any more, and h's store says so (a
    // statement that fails, as the first after a reset may, is asked again: an error proves
    // nothing either way).
    let mut lost = None;
    for _ in 0..10 {
        match h.renew(&grant_h).await {
            Ok(Renewed::Lost(seen)) => {
                lost = Some(seen);
                break;
            }
            Ok(Renewed::Renewed(g)) => panic!("h's grant renewed while c leads: {g:?}"),
            Err(e) => {
                eprintln!("{fault:?}: h's renew of {jobs} failed, asked again: {e}");
                tokio::time::sleep(TTL / 10).await;
            }
        }
    }
    let lost = lost.unwrap_or_else(|| panic!("{fault:?}: h's renew of {jobs} never answered"));
    assert_eq!(
        lost.holder.map(|x| x.id.to_string()),
        Some("c".to_string()),
        "h's lost renewal shows c as holder"
    );
    assert!(!leader.is_cancelled(), "c still leads");
    let seen = c.inspect(&jobs).await.expect("inspect");
    assert_eq!(seen.holder.map(|x| x.id.to_string()), Some("c".to_string()));
    renewing.abort();
    eprintln!("{fault:?}: c led {took:?} after the failed release");
    leader.resign().await;
}

/// The release's statement is dropped on a live connection (its replies never come, the lock
/// session goes on): the failure gives the lock back (`ending`), or a grant nobody renews is
/// given back at the session's next statement (`expire_abandoned`). A release whose connection
/// is reset (the session ends), and a candidate that stopped waiting, are the shared scenario
/// `a_failed_release_does_not_keep_the_lease`.
#[tokio::test]
async fn a_release_dropped_on_a_live_connection_frees_the_lease_while_other_leases_renew() {
    release_fails_while_other_renews(Fault::Blackhole).await;
}
