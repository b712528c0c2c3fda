//! The Postgres server restarts while a lease is held (`scripts/services restart postgres`).
//!
//! Its own test binary: the restart ends every session of the server, so nothing else may run
//! against it meanwhile (cargo runs test binaries one after another).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::SafetyChecker;
use leasehold_core::{Elector, EndReason, Event, LeaseStore};
use leasehold_postgres::PostgresStore;

use common::server;

/// The leader's renewals fail while the server is down: it stops believing before its
/// `valid_until`, nobody leads during the outage, a leader is elected afterwards at a higher
/// term (the term lives in the table, so it survives the restart), and history agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_while_a_lease_is_held() {
    let Some(pg) = server() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services");
    let ttl = Duration::from_secs(1);
    let lease = common::lease("restart");
    let checker = SafetyChecker::new();
    let mut electors = Vec::new();
    for id in ["A", "B"] {
        let store = Arc::new(PostgresStore::connect(&pg.url).await.unwrap());
        // A leader that must hear from the store every ~0.25 s: any restart outlasts that, so it
        // must step down (a quicker outage could be bridged: the next renewal takes the lock
        // again if nobody replaced the row).
        let elector = Elector::builder(store, lease.as_str())
            .candidate_id(id)
            .ttl(ttl)
            .renew_every(Duration::from_millis(150))
            .step_down_margin(Duration::from_millis(750))
            .retry_every(ttl / 5)
            .build()
            .unwrap();
        checker.watch(&elector);
        electors.push(elector);
    }
    let mut seen = electors[1].observe();
    let leader = electors[0].campaign().await.unwrap();
    let old_term = leader.term();
    let b = electors[1].clone();
    let b_campaign = tokio::spawn(async move { b.campaign().await.unwrap() });
    tokio::time::sleep(ttl).await;
    leader.ensure_valid(Duration::ZERO).expect("A leads before the restart");

    let cancellation = tokio::spawn({
        let leader = leader.clone();
        async move {
            leader.cancelled().await;
            Instant::now()
        }
    });
    let restarting = Instant::now();
    let status = tokio::task::spawn_blocking(move || Command::new(script).args(["restart", "postgres"]).output())
        .await
        .unwrap()
        .expect("scripts/services runs");
    assert!(
        status.status.success(),
        "scripts/services restart postgres failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let restarted = restarting.elapsed();

    let cancelled = tokio::time::timeout(ttl * 2, cancellation)
        .await
        .expect("the leader steps down")
        .unwrap();
    let valid_until = leader.valid_until();
    assert!(
        cancelled < valid_until,
        "the leader must stop believing before its valid_until"
    );
    let a_id = electors[0].id().clone();
    let deposed = checker.records().await.into_iter().find_map(|r| match r.event {
        Event::Deposed {
            term, believed_until, ..
        } if r.candidate == a_id && term == old_term => Some(believed_until),
        _ => None,
    });
    if let Some(believed_until) = deposed {
        assert!(believed_until <= valid_until);
    }

    // A new leader, A again or B, at a higher term.
    let (new_leader, new_term) = tokio::time::timeout(ttl * 5, async {
        loop {
            let current = seen.borrow_and_update().clone();
            if let Some(info) = current.filter(|i| i.term > old_term) {
                return (info.holder, info.term);
            }
            seen.changed().await.unwrap();
        }
    })
    .await
    .expect("a leader after the restart");
    eprintln!(
        "restart took {restarted:?}; A (term {old_term}) stepped down {:?} after the restart began, \
         {:?} before its valid_until; {new_leader} leads at term {new_term} {:?} after the restart began",
        cancelled - restarting,
        valid_until - cancelled,
        restarting.elapsed()
    );
    assert!(new_term > old_term, "terms never go back");

    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let history = store.history(&lease, 10).await.unwrap();
    let terms: Vec<_> = history.iter().map(|t| t.term).collect();
    assert!(terms.windows(2).all(|w| w[1] > w[0]), "{history:?}");
    let old = history
        .iter()
        .find(|t| t.term == old_term)
        .expect("the old term is recorded");
    assert_eq!(old.ended.map(|(_, why)| why), Some(EndReason::Expired), "{history:?}");
    assert_eq!(history.last().map(|t| t.term), Some(new_term));

    drop(leader);
    if let Ok(Ok(b)) = tokio::time::timeout(ttl, b_campaign).await {
        b.resign().await;
    }
    checker.assert_safe().await;
}
