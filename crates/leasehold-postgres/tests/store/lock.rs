//! The lock session: its advisory lock, blackholes, resets, orphaned rows, abandoned grants,
//! breaks, reservations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, SafetyChecker};
use leasehold_core::{AcquireRequest, Acquired, Elector, EndReason, Event, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;

use super::{acquire, candidate, granted, request};
use crate::common::{self, lock_holder, server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_session_holds_the_advisory_lock() {
    let Some(pg) = server() else { return };
    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let lease = common::lease("locks");
    let key = store.lock_key(&lease);
    let mut raw = pg.raw().await;
    assert_eq!(lock_holder(&mut raw, key).await, None);

    let grant = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
    let pid = lock_holder(&mut raw, key)
        .await
        .expect("the lock is held while the lease is");
    let (row_key, row_pid, app): (Option<i64>, Option<i32>, Option<String>) = sqlx::query_as(
        "SELECT l.lock_key, l.lock_pid, a.application_name FROM leasehold.leases AS l
         LEFT JOIN pg_stat_activity AS a ON a.pid = l.lock_pid WHERE l.name = $1",
    )
    .bind(lease.as_str())
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert_eq!(
        (row_key, row_pid),
        (Some(key), Some(pid)),
        "the row names the lock and its session"
    );
    assert_eq!(app.as_deref(), Some("leasehold-lock"));

    // A second candidate of the same store does not get the lock again (it is re-entrant).
    match acquire(&store, &lease, "b", Duration::from_secs(5)).await {
        Acquired::Held(o) => assert_eq!(o.holder.map(|h| h.id), Some(candidate("a"))),
        other => panic!("a second candidate on the same session must be told Held: {other:?}"),
    }
    // Another store neither.
    let other = PostgresStore::connect(&pg.url).await.unwrap();
    assert!(matches!(
        acquire(&other, &lease, "c", Duration::from_secs(5)).await,
        Acquired::Held(_)
    ));

    let renewed = match store.renew(&grant).await.unwrap() {
        Renewed::Renewed(g) => g,
        lost => panic!("{lost:?}"),
    };
    assert_eq!(renewed.term, grant.term);
    assert_ne!(renewed.token, grant.token, "every renewal writes a new record version");
    store.release(&renewed).await.unwrap();
    assert_eq!(lock_holder(&mut raw, key).await, None, "released: the lock is free");
    // The same candidate again: a new term, on the same session.
    let again = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
    assert!(again.term > grant.term);
    store.release(&again).await.unwrap();
}

/// A holder whose connection is silently blackholed (no FIN, no RST): its engine steps down
/// before its deadline, the server ends its session through `idle_session_timeout` within the
/// TTL, and a second candidate takes over within TTL + retry + slack, never before the old
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_loses_the_lock_within_the_ttl() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(2);
    let retry = ttl / 5;
    let lease = common::lease("blackhole");
    let checker = SafetyChecker::new();
    let (store_a, faults) = pg.faulty_store().await.unwrap();
    let key = store_a.lock_key(&lease);
    let build = |store: PostgresStore, id: &str| {
        let elector = Elector::builder(Arc::new(store), lease.as_str())
            .candidate_id(id)
            .ttl(ttl)
            .retry_every(retry)
            .build()
            .unwrap();
        checker.watch(&elector);
        elector
    };
    let a = build(store_a, "A");
    let b = build(PostgresStore::connect(&pg.url).await.unwrap(), "B");
    let leader_a = a.campaign().await.unwrap();
    let b_campaign = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await.unwrap() }
    });
    tokio::time::sleep(ttl).await;
    let mut raw = pg.raw().await;
    let a_pid = lock_holder(&mut raw, key).await.expect("A holds the lock");

    let blackholed = Instant::now();
    faults.set(Direction::Both, Fault::Blackhole);
    tokio::time::timeout(ttl, leader_a.cancelled())
        .await
        .expect("A's work is cancelled within the TTL");
    let cancelled = Instant::now();
    let a_valid_until = leader_a.valid_until();
    assert!(
        cancelled < a_valid_until,
        "A must stop believing before its valid_until"
    );

    let freed = loop {
        if lock_holder(&mut raw, key).await != Some(a_pid) {
            break blackholed.elapsed();
        }
        assert!(
            blackholed.elapsed() < ttl * 2,
            "the server never ended A's silent session"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let leader_b = tokio::time::timeout(ttl * 3, b_campaign)
        .await
        .expect("B takes over")
        .unwrap();
    let b_after = leader_b.elected_at().duration_since(blackholed);
    eprintln!(
        "blackhole: A cancelled after {:?} ({:?} before its valid_until); the server freed A's lock after {:?}; \
         B elected after {:?} at term {} (A had term {})",
        cancelled - blackholed,
        a_valid_until - cancelled,
        freed,
        b_after,
        leader_b.term(),
        leader_a.term()
    );
    assert!(
        freed <= ttl + Duration::from_millis(300),
        "the lock must be freed within the TTL: {freed:?}"
    );
    assert!(
        leader_b.elected_at() >= a_valid_until,
        "B elected before A's valid_until"
    );
    assert!(
        b_after <= ttl + retry.mul_f64(1.2) + ttl / 2 + Duration::from_millis(500),
        "B took over after {b_after:?}"
    );
    assert!(leader_b.term() > leader_a.term());
    faults.heal();
    leader_b.resign().await;
    drop(leader_a);
    checker.assert_safe().await;
}

/// A connection reset ends the holder's session (and frees its lock) while the holder still
/// believes its grant. Another candidate that takes the free lock finds the row naming the
/// holder: the store says the record is orphaned (while the holder's session lived it did not)
/// and replaces it only by a takeover of exactly its version, which the engine asks for once it
/// has seen that version unchanged for a whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_outlives_its_lock_is_orphaned_and_taken_over_only_by_its_version() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(1);
    let lease = common::lease("outlived");
    let (store_a, faults) = pg.faulty_store().await.unwrap();
    let a = granted(acquire(&store_a, &lease, "a", ttl).await);
    let store_b = PostgresStore::connect(&pg.url).await.unwrap();
    let mut raw = pg.raw().await;
    let with_takeover = |version: &str| AcquireRequest {
        takeover: Some(version.to_string()),
        ..request(&lease, "b", ttl)
    };

    // While A's session lives, its row is not orphaned, and no takeover replaces it.
    let live = match acquire(&store_b, &lease, "b", ttl).await {
        Acquired::Held(o) => o.holder.expect("the row names A"),
        granted => panic!("B took a held lease: {granted:?}"),
    };
    assert!(!live.orphaned, "a live holder is not orphaned: {live:?}");
    assert!(!store_b.inspect(&lease).await.unwrap().holder.unwrap().orphaned);
    assert!(matches!(
        store_b.acquire(&with_takeover(&live.version)).await.unwrap(),
        Acquired::Held(_)
    ));

    faults.set(Direction::Both, Fault::Reset);
    let reset = Instant::now();
    while lock_holder(&mut raw, store_b.lock_key(&lease)).await.is_some() {
        assert!(reset.elapsed() < ttl, "a reset ends the session at once");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The lock is free, the row still names A: Held, orphaned, and no store-side countdown.
    let first = match acquire(&store_b, &lease, "b", ttl).await {
        Acquired::Held(o) => o,
        granted => panic!("B must not take a lease whose holder may still believe it: {granted:?}"),
    };
    let holder = first.holder.expect("the row names A");
    assert_eq!((holder.id.as_str(), holder.term), ("a", a.term));
    assert!(holder.orphaned, "{holder:?}");
    assert_eq!(holder.store_remaining, None, "the engine does the counting");
    let inspected = store_b.inspect(&lease).await.unwrap().holder.unwrap();
    assert!(
        inspected.orphaned && inspected.version == holder.version,
        "{inspected:?}"
    );
    // Without a takeover, or with another version, the row stays; the lock is not kept.
    assert!(matches!(acquire(&store_b, &lease, "b", ttl).await, Acquired::Held(_)));
    assert!(matches!(
        store_b.acquire(&with_takeover("00000000000000ff")).await.unwrap(),
        Acquired::Held(_)
    ));
    assert_eq!(lock_holder(&mut raw, store_b.lock_key(&lease)).await, None);
    // A takeover of exactly that version replaces it.
    let b = granted(store_b.acquire(&with_takeover(&holder.version)).await.unwrap());
    assert!(b.term > a.term);
    let history = store_b.history(&lease, 10).await.unwrap();
    let ended: Vec<_> = history.iter().map(|t| (t.term, t.ended.map(|(_, why)| why))).collect();
    assert_eq!(ended, vec![(a.term, Some(EndReason::Expired)), (b.term, None)]);
    // A learns at its next renewal.
    faults.heal();
    assert!(matches!(store_a.renew(&a).await, Ok(Renewed::Lost(_)) | Err(_)));
    match store_a.renew(&a).await.unwrap() {
        Renewed::Lost(o) => assert_eq!(o.holder.map(|h| (h.id, h.term)), Some((candidate("b"), b.term))),
        renewed => panic!("A was replaced: {renewed:?}"),
    }
    store_b.release(&b).await.unwrap();
}

/// The engine side of an orphaned row: an elector that first sees the row after the holder's
/// session ended is elected only a full TTL after that (the old holder may believe its grant
/// until then), and soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_takes_over_an_orphaned_row_after_its_ttl() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(1);
    let retry = ttl / 5;
    let lease = common::lease("orphan-elector");
    let (store_a, faults) = pg.faulty_store().await.unwrap();
    let a = granted(acquire(&store_a, &lease, "a", ttl).await);
    let mut raw = pg.raw().await;
    faults.set(Direction::Both, Fault::Reset);
    let key = store_a.lock_key(&lease);
    while lock_holder(&mut raw, key).await.is_some() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = Elector::builder(Arc::new(PostgresStore::connect(&pg.url).await.unwrap()), lease.as_str())
        .candidate_id("b")
        .ttl(ttl)
        .retry_every(retry)
        .build()
        .unwrap();
    let started = Instant::now();
    let leader = tokio::time::timeout(ttl * 4, b.campaign())
        .await
        .expect("B takes the orphaned row over")
        .unwrap();
    let after = leader.elected_at().duration_since(started);
    eprintln!("orphaned row taken over {after:?} after B started (ttl {ttl:?})");
    assert!(
        after >= ttl,
        "B was elected {after:?} after it first looked: before the TTL"
    );
    assert!(after <= ttl + retry * 2 + Duration::from_millis(500), "{after:?}");
    assert!(leader.term() > a.term);
    leader.resign().await;
    faults.heal();
}

/// A reset lock session does not depose a leader whose row nobody replaced: its next renewal
/// takes the lock again on a new session, at the same term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_survives_a_reset_of_its_lock_session() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(2);
    let lease = common::lease("relock");
    let (store_a, faults) = pg.faulty_store().await.unwrap();
    let key = store_a.lock_key(&lease);
    let checker = SafetyChecker::new();
    let a = Elector::builder(Arc::new(store_a), lease.as_str())
        .candidate_id("A")
        .ttl(ttl)
        .build()
        .unwrap();
    checker.watch(&a);
    let b = Elector::builder(Arc::new(PostgresStore::connect(&pg.url).await.unwrap()), lease.as_str())
        .candidate_id("B")
        .ttl(ttl)
        .build()
        .unwrap();
    checker.watch(&b);
    let mut events = a.events();
    let leader = a.campaign().await.unwrap();
    let b_campaign = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    tokio::time::sleep(ttl / 2).await;
    let mut raw = pg.raw().await;
    let before = lock_holder(&mut raw, key).await.expect("A holds the lock");

    faults.set(Direction::Both, Fault::Reset);
    tokio::time::sleep(Duration::from_millis(50)).await;
    faults.heal();
    tokio::time::sleep(ttl * 2).await;
    leader
        .ensure_valid(Duration::ZERO)
        .unwrap_or_else(|e| panic!("A must still lead: {e}"));
    let after = lock_holder(&mut raw, key).await.expect("A holds the lock again");
    assert_ne!(before, after, "on a new session");
    let seen = PostgresStore::connect(&pg.url)
        .await
        .unwrap()
        .inspect(&lease)
        .await
        .unwrap();
    assert_eq!(
        seen.holder.map(|h| (h.id, h.term)),
        Some((candidate("A"), leader.term()))
    );
    assert!(!b_campaign.is_finished(), "B must not have been elected");
    while let Ok(event) = events.try_recv() {
        assert!(!matches!(event, Event::Deposed { .. }), "A was deposed: {event:?}");
    }
    b_campaign.abort();
    leader.resign().await;
    checker.assert_safe().await;
}

/// One session holds several leases. A lease whose elector stopped renewing (and did not
/// release) while the others go on is given back after its TTL, so that other candidates are
/// not locked out by a session that the server will never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_grant_on_a_shared_session_is_given_back() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(1);
    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let (kept, abandoned) = (common::lease("kept"), common::lease("abandoned"));
    let mut grant = granted(acquire(&store, &kept, "a", ttl).await);
    let left = granted(acquire(&store, &abandoned, "a", ttl).await);
    let other = PostgresStore::connect(&pg.url).await.unwrap();
    let started = Instant::now();
    let taken = loop {
        grant = match store.renew(&grant).await.unwrap() {
            Renewed::Renewed(g) => g,
            lost => panic!("the renewed lease was lost: {lost:?}"),
        };
        if let Acquired::Granted(g) = acquire(&other, &abandoned, "b", ttl).await {
            break g;
        }
        assert!(started.elapsed() < ttl * 3, "the abandoned lease was never given back");
        tokio::time::sleep(ttl / 4).await;
    };
    let after = started.elapsed();
    assert!(after >= ttl, "given back before its TTL: {after:?}");
    assert!(taken.term > left.term);
    let history = other.history(&abandoned, 10).await.unwrap();
    assert_eq!(history[0].ended.map(|(_, why)| why), Some(EndReason::Expired));
    assert!(matches!(store.renew(&left).await.unwrap(), Renewed::Lost(_)));
    store.release(&grant).await.unwrap();
    other.release(&taken).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_lease_ends_the_term_and_the_holder_learns_at_its_next_renewal() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("break");
    let (holder, operator, next) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    assert_eq!(
        operator.break_lease(&lease).await.unwrap(),
        None,
        "a free lease: nothing to break"
    );
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    assert_eq!(operator.break_lease(&lease).await.unwrap(), Some(grant.term));
    let seen = operator.inspect(&lease).await.unwrap();
    assert!(seen.holder.is_none());
    assert_eq!(seen.previous_end, Some(EndReason::Broken));
    // The holder's session still has the lock until its next renewal, which answers Lost and
    // gives the lock back.
    assert!(matches!(acquire(&next, &lease, "b", ttl).await, Acquired::Held(_)));
    assert!(matches!(holder.renew(&grant).await.unwrap(), Renewed::Lost(o) if o.holder.is_none()));
    let taken = granted(acquire(&next, &lease, "b", ttl).await);
    assert!(taken.term > grant.term);
    let history = next.history(&lease, 10).await.unwrap();
    assert_eq!(history[0].ended.map(|(_, why)| why), Some(EndReason::Broken));
    next.release(&taken).await.unwrap();
}

/// A handover leaves the row naming the successor at the old term with `previous_end`
/// `handed_over`, `lock_pid` NULL and the lock given back (orphaned and reserved), and notifies.
/// Only the successor's acquire is granted; anyone else is `Held` (and keeps no lock) unless it
/// takes the reservation over by its version. Nothing takes the row for a grant of the successor
/// at the old term: renewing one (which would take the free lock again) is `Lost`, releasing it
/// changes nothing. The history keeps `handed_over` also when a reservation is taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_the_successor_named_without_a_lock() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("handover");
    let (store_a, store_b, store_c) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let key = store_a.lock_key(&lease);
    let mut raw = pg.raw().await;
    let mut changes = store_c.changes(&lease, &candidate("c")).await.unwrap().unwrap();
    // The listener connects in the background: wait until a probe gets through.
    let started = Instant::now();
    loop {
        sqlx::query("SELECT pg_notify('leasehold', $1)")
            .bind(format!("leasehold/{lease}/probe"))
            .execute(&mut raw)
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(50), changes.next())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the listener never connected"
        );
    }

    let a = granted(acquire(&store_a, &lease, "a", ttl).await);
    store_a.hand_over(&a, &candidate("c")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("a handover is notified")
        .expect("the stream lives");
    assert_eq!(lock_holder(&mut raw, key).await, None, "the reservation holds no lock");
    let row: (Option<String>, i64, Option<String>, Option<i32>, Option<String>) =
        sqlx::query_as("SELECT holder, term, previous_end, lock_pid, version FROM leasehold.leases WHERE name = $1")
            .bind(lease.as_str())
            .fetch_one(&mut raw)
            .await
            .unwrap();
    let version = row.4.clone().unwrap();
    assert_eq!(
        (row.0.as_deref(), row.1, row.2.as_deref(), row.3),
        (Some("c"), i64::try_from(a.term.0).unwrap(), Some("handed_over"), None)
    );
    assert_ne!(version, a.token, "a reservation has a version of its own");
    let seen = store_b.inspect(&lease).await.unwrap();
    let reserved = seen.holder.clone().unwrap();
    assert!(
        reserved.reserved && reserved.orphaned && reserved.id == candidate("c") && reserved.term == a.term,
        "{seen:?}"
    );
    match acquire(&store_b, &lease, "b", ttl).await {
        Acquired::Held(o) => assert!(o.holder.is_some_and(|h| h.reserved && h.orphaned)),
        granted => panic!("B took a lease reserved for C: {granted:?}"),
    }
    assert_eq!(lock_holder(&mut raw, key).await, None, "B keeps no lock");

    let as_c = leasehold_core::Grant {
        holder: candidate("c"),
        token: version.clone(),
        ..a.clone()
    };
    match store_c.renew(&as_c).await.unwrap() {
        Renewed::Lost(o) => assert!(o.holder.is_some_and(|h| h.reserved), "Lost shows the reservation"),
        renewed => panic!("a reservation renewed as a grant of the successor: {renewed:?}"),
    }
    store_c.release(&as_c).await.unwrap();
    store_a.release(&a).await.unwrap();
    assert_eq!(
        store_b.inspect(&lease).await.unwrap(),
        seen,
        "late releases change nothing"
    );
    assert_eq!(lock_holder(&mut raw, key).await, None);

    let c = granted(acquire(&store_c, &lease, "c", ttl).await);
    assert!(c.term > a.term);
    // A reservation nobody takes: taken over by its version, its term still handed over.
    store_c.hand_over(&c, &candidate("nobody")).await.unwrap();
    let version = store_b.inspect(&lease).await.unwrap().holder.unwrap().version;
    let b = granted(
        store_b
            .acquire(&AcquireRequest {
                takeover: Some(version),
                ..request(&lease, "b", ttl)
            })
            .await
            .unwrap(),
    );
    assert!(b.term > c.term);
    let history = store_b.history(&lease, 10).await.unwrap();
    let ended: Vec<_> = history.iter().map(|t| (t.term, t.ended.map(|(_, why)| why))).collect();
    assert_eq!(
        ended,
        vec![
            (a.term, Some(EndReason::HandedOver)),
            (c.term, Some(EndReason::HandedOver)),
            (b.term, None)
        ]
    );
    store_b.release(&b).await.unwrap();
}
