//! Redis restarted (without persistence, as `scripts/services` runs it) while a lease is held.
//!
//! The server forgets every key, the term counters included. Expected: the leader steps down
//! before its `valid_until`; nobody is granted the lease until the old leader's belief has
//! ended (the restart guard); the next term is above every term granted before the restart.
//!
//! It restarts the shared test server, so it only runs against the server that
//! `scripts/services` manages, and it is the only test in this binary.

use crate::common;

use common::{TTL, elector, request};

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{SafetyChecker, require_server};
use leasehold_core::{Acquired, Error, Event, LeaseName, LeaseStore, Term, random_u64};
use leasehold_redis::{RedisStore, RedisStoreError};

fn is_recent_restart(error: &Error) -> bool {
    matches!(error, Error::Store { source, .. }
        if matches!(source.downcast_ref::<RedisStoreError>(), Some(RedisStoreError::RecentRestart { .. })))
}

/// Acquires `lease` for `who`, waiting out the restart guard, and releases it; returns the term.
async fn acquire_when_allowed(store: &RedisStore, lease: &LeaseName, who: &str) -> Term {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(&request(lease, who, TTL)).await {
            Ok(Acquired::Granted(grant)) => {
                store.release(&grant).await.unwrap();
                return grant.term;
            }
            Err(e) if (is_recent_restart(&e) || e.is_transient()) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("{who} cannot acquire {lease}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_while_a_lease_is_held() {
    let Some(url) = require_server("redis", "LEASEHOLD_REDIS_URL") else {
        return;
    };
    let Some((script, managed)) = common::services().filter(|(_, managed)| *managed == url) else {
        eprintln!("SKIPPED redis_restart_while_a_lease_is_held: the server is not the one scripts/services manages");
        return;
    };
    let config = common::config(&url);
    let raw = RedisStore::from_config(config.clone()).await.unwrap();
    let mut unguarded_config = config.clone();
    unguarded_config.restart_guard = false;
    let unguarded = RedisStore::from_config(unguarded_config).await.unwrap();

    // Terms granted before the restart, on a lease of their own.
    let counted = LeaseName::new(format!("restart-counted-{:x}", random_u64())).unwrap();
    let mut before = Term(0);
    for _ in 0..20 {
        before = acquire_when_allowed(&raw, &counted, "counter").await;
    }

    // A leads, B follows.
    let lease = LeaseName::new(format!("restart-{:x}", random_u64())).unwrap();
    let checker = SafetyChecker::new();
    let a = elector(
        Arc::new(RedisStore::from_config(config.clone()).await.unwrap()),
        &lease,
        "A",
    );
    let b = elector(
        Arc::new(RedisStore::from_config(config.clone()).await.unwrap()),
        &lease,
        "B",
    );
    checker.watch(&a);
    checker.watch(&b);
    let leader_a = tokio::time::timeout(TTL * 10, a.campaign()).await.unwrap().unwrap();
    let campaign_b = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await.unwrap() }
    });
    tokio::time::sleep(TTL).await;
    let a_term = leader_a.term();
    let a_cancelled = tokio::spawn({
        let token = leader_a.cancellation_token();
        async move {
            token.cancelled().await;
            Instant::now()
        }
    });

    let restarting = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        Command::new(script)
            .args(["restart", "redis"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    })
    .await
    .unwrap()
    .expect("scripts/services runs");
    assert!(status.success(), "scripts/services restart redis: {status}");
    let back = Instant::now();
    println!("redis restarted in {:?} ({managed})", back - restarting);

    // Right after the restart the server knows nothing, and grants nothing (a long TTL for this
    // probe, so that a slow machine cannot outrun the guard).
    let fresh = LeaseName::new(format!("restart-fresh-{:x}", random_u64())).unwrap();
    let refused = loop {
        match raw.acquire(&request(&fresh, "early", Duration::from_secs(10))).await {
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
            other => break other,
        }
    };
    match refused {
        Err(e) if is_recent_restart(&e) => println!("right after the restart: {e}"),
        other => panic!("a grant right after a restart must be refused by the restart guard, got {other:?}"),
    }
    let seen = raw.inspect(&counted).await.unwrap();
    assert_eq!(
        (seen.holder, seen.last_term),
        (None, Term(0)),
        "the restart lost the keys (no persistence)"
    );
    // Without the guard the grant comes at once; its term is still above every earlier one.
    let unguarded_term = acquire_when_allowed(&unguarded, &counted, "unguarded").await;
    assert!(
        unguarded_term > before,
        "term {unguarded_term} after the restart, {before} before"
    );
    println!("terms: up to {before} before the restart, {unguarded_term} right after it (restart_guard=false)");

    // A steps down before its valid_until (its renewals fail, then find the lease gone).
    let a_cancelled = tokio::time::timeout(TTL * 3, a_cancelled)
        .await
        .expect("A steps down")
        .unwrap();
    let a_valid_until = leader_a.valid_until();
    assert!(
        a_cancelled < a_valid_until,
        "A's work was cancelled after its valid_until"
    );

    // B takes over with a higher term, and only once A's belief has ended.
    let leader_b = tokio::time::timeout(Duration::from_secs(15), campaign_b)
        .await
        .expect("B takes over")
        .unwrap();
    assert!(
        leader_b.term() > a_term,
        "B's term {} after A's {a_term}",
        leader_b.term()
    );
    assert!(
        leader_b.elected_at() >= a_valid_until,
        "B was elected while A could still believe it led"
    );
    let again = acquire_when_allowed(&raw, &counted, "counter").await;
    assert!(again > unguarded_term && again > before);

    let a_end = checker.records().await.into_iter().find_map(|r| match r.event {
        Event::Deposed { reason, .. } if r.candidate.as_str() == "A" => Some(reason),
        _ => None,
    });
    println!(
        "A (term {a_term}) cancelled {:?} after the restart began ({:?} before its valid_until): {}; \
         B elected {:?} after the server was back, {:?} after A's valid_until, at term {}",
        a_cancelled - restarting,
        a_valid_until - a_cancelled,
        a_end.map_or_else(|| "?".into(), |r| r.to_string()),
        leader_b.elected_at() - back,
        leader_b.elected_at() - a_valid_until,
        leader_b.term()
    );
    let history = raw.history(&lease, 10).await.unwrap();
    assert_eq!(
        history.iter().map(|t| t.term).collect::<Vec<_>>(),
        vec![leader_b.term()],
        "history before the restart is lost"
    );
    leader_b.resign().await;
    drop(leader_a);
    match checker.check().await {
        Ok(summary) => println!("{summary}"),
        Err(report) => panic!("{report}"),
    }
}
