//! Postgres-specific behaviour against a real server: the lock session, expiry when the holder
//! goes silent, locks that outlive their rows and rows that outlive their locks, notifications,
//! breaking, the schema, and secrets. Each test skips (loudly) when the server is down.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, SafetyChecker};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, DeposedReason, Elector, EndReason, Error, Event, LeaseName, LeaseStore,
    Renewed,
};
use leasehold_postgres::{PostgresConfig, PostgresStore};

use common::{lock_holder, server};

fn candidate(id: &str) -> CandidateId {
    CandidateId::new(id).expect("a valid candidate id")
}

fn request(lease: &LeaseName, who: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: candidate(who),
        ttl,
        takeover: None,
    }
}

async fn acquire(store: &PostgresStore, lease: &LeaseName, who: &str, ttl: Duration) -> Acquired {
    store
        .acquire(&request(lease, who, ttl))
        .await
        .unwrap_or_else(|e| panic!("acquire by {who}: {e}"))
}

fn granted(acquired: Acquired) -> leasehold_core::Grant {
    match acquired {
        Acquired::Granted(grant) => grant,
        Acquired::Held(observation) => panic!("expected a grant, the lease is held: {observation:?}"),
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_breaks_are_notified() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("notify");
    let (holder, waiter) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    let mut changes = waiter
        .changes(&lease, &candidate("b"))
        .await
        .unwrap()
        .expect("a stream");
    let mut mine = holder
        .changes(&lease, &candidate("a"))
        .await
        .unwrap()
        .expect("a stream");
    let mut other = waiter
        .changes(&common::lease("other"), &candidate("b"))
        .await
        .unwrap()
        .unwrap();
    // Both listeners connect in the background.
    let mut raw = pg.raw().await;
    let started = Instant::now();
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = 'leasehold-listen' AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&mut raw)
        .await
        .unwrap();
        if listening >= 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the listeners never connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.release(&grant).await.unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("a release is notified")
        .expect("the stream lives");
    eprintln!("release notified after {:?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let own = futures::FutureExt::now_or_never(mine.next());
    assert!(own.is_none(), "a candidate is not told of its own release");
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    waiter.break_lease(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("a break is notified")
        .expect("the stream lives");
    let _ = holder.renew(&grant).await;
    // Another lease's stream heard nothing.
    assert!(futures::FutureExt::now_or_never(other.next()).is_none());
}

/// Every grant is announced to the announcement streams of other stores as `inspect` shows it
/// right after the grant, and wakes no change stream: not this version's, nor an older
/// version's listener on the `leasehold` channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_announced_and_wake_no_change_stream() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("announce");
    let (holder, follower) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let mut changes = follower
        .changes(&lease, &candidate("b"))
        .await
        .unwrap()
        .expect("a stream");
    let mut announced = follower.announcements(&lease).await.unwrap().expect("announcements");
    let mut other = follower.announcements(&common::lease("other")).await.unwrap().unwrap();
    // An older version's listener: it listens on `leasehold` only.
    let mut old = sqlx::postgres::PgListener::connect(&pg.url).await.unwrap();
    old.listen("leasehold").await.unwrap();
    // The follower's listener connects in the background: the holder is granted again (a new
    // term each time, by the holder itself, which notifies no change) until one is announced.
    let started = Instant::now();
    let mut first = None;
    while first.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no grant was ever announced"
        );
        granted(acquire(&holder, &lease, "a", ttl).await);
        first = tokio::time::timeout(Duration::from_millis(100), announced.next())
            .await
            .ok()
            .map(|seen| seen.expect("the stream lives"));
    }
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    let seen = tokio::time::timeout(Duration::from_secs(2), announced.next())
        .await
        .expect("a grant is announced")
        .expect("the stream lives");
    let inspected = holder.inspect(&lease).await.unwrap();
    let shown = seen.holder.clone().expect("a holder");
    assert_eq!(shown.id, candidate("a"));
    assert_eq!(shown.term, grant.term);
    assert_eq!(shown.ttl, ttl);
    assert_eq!(shown.version, grant.token);
    assert_eq!(shown.store_remaining, Some(ttl));
    assert!(!shown.orphaned && !shown.reserved);
    assert_eq!(seen.last_term, grant.term);
    assert_eq!(seen.lease, lease);
    let inspected_holder = inspected.holder.expect("held");
    assert_eq!(
        (
            &inspected_holder.id,
            inspected_holder.term,
            inspected_holder.ttl,
            &inspected_holder.version
        ),
        (&shown.id, shown.term, shown.ttl, &shown.version),
        "what inspect shows"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        futures::FutureExt::now_or_never(changes.next()).is_none(),
        "a grant wakes no change stream"
    );
    assert!(
        futures::FutureExt::now_or_never(other.next()).is_none(),
        "another lease's grant"
    );
    loop {
        match tokio::time::timeout(Duration::from_millis(100), old.try_recv()).await {
            Err(_) => break,
            Ok(notification) => {
                let notification = notification.unwrap().expect("the old listener lives");
                assert!(
                    !notification.payload().contains(lease.as_str()),
                    "an older version's listener was told of a grant: {:?}",
                    notification.payload()
                );
            }
        }
    }
    holder.release(&grant).await.unwrap();
}

/// A table of leasehold's name but another shape: a typed error naming it, nothing dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_is_a_typed_error_and_left_alone() {
    let Some(pg) = server() else { return };
    let schema = common::schema("foreign");
    let mut raw = pg.raw().await;
    for sql in [
        format!("CREATE SCHEMA {schema}"),
        format!("CREATE TABLE {schema}.leases (id serial PRIMARY KEY, owner text)"),
        format!("INSERT INTO {schema}.leases (owner) VALUES ('someone else')"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut raw).await.unwrap();
    }
    let url = common::with_option(&pg.url, &format!("schema={schema}"));
    match PostgresStore::connect(&url).await {
        Err(Error::CorruptRecord { lease, detail, .. }) => {
            assert!(lease.contains(&format!("{schema}.leases")), "{lease}");
            assert!(detail.contains("owner") && detail.contains("expected"), "{detail}");
        }
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    let kept: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {schema}.leases")))
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the foreign table keeps its data");

    // A schema written by a newer leasehold.
    let newer = common::schema("newer");
    let url = common::with_option(&pg.url, &format!("schema={newer}"));
    drop(PostgresStore::connect(&url).await.unwrap());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE {newer}.meta SET schema_version = 99"
    )))
    .execute(&mut raw)
    .await
    .unwrap();
    match PostgresStore::connect(&url).await {
        Err(Error::CorruptRecord { detail, .. }) => assert!(detail.contains("99"), "{detail}"),
        other => panic!("expected CorruptRecord, got {other:?}"),
    }
    for schema in [schema, newer] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut raw)
            .await
            .unwrap();
    }
}

/// Stores that open a new schema at the same moment agree; two schemas never share locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_created_once_and_kept_apart() {
    let Some(pg) = server() else { return };
    let schema = common::schema("together");
    let url = common::with_option(&pg.url, &format!("schema={schema}&history_limit=3"));
    let stores = futures::future::join_all((0..8).map(|_| PostgresStore::connect(&url))).await;
    let stores: Vec<PostgresStore> = stores.into_iter().map(|s| s.unwrap()).collect();
    let default = PostgresStore::connect(&pg.url).await.unwrap();
    let lease = common::lease("apart");
    assert_ne!(stores[0].lock_key(&lease), default.lock_key(&lease));
    let here = granted(acquire(&stores[0], &lease, "a", Duration::from_secs(5)).await);
    let there = granted(acquire(&default, &lease, "b", Duration::from_secs(5)).await);
    default.release(&there).await.unwrap();
    stores[0].release(&here).await.unwrap();
    // history_limit=3 keeps the last three terms.
    for _ in 0..5 {
        let g = granted(acquire(&stores[1], &lease, "a", Duration::from_secs(5)).await);
        stores[1].release(&g).await.unwrap();
    }
    let history = stores[2].history(&lease, 100).await.unwrap();
    let terms: Vec<u64> = history.iter().map(|t| t.term.0).collect();
    assert_eq!(terms, vec![4, 5, 6], "{history:?}");
    let mut raw = pg.raw().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut raw)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_configs_or_errors() {
    let Some(pg) = server() else { return };
    let secret = "hunter2-secret";
    let mut url = url::Url::parse(&pg.url).unwrap();
    url.set_password(Some(secret)).unwrap();
    let config = PostgresConfig::from_url(url.as_str()).unwrap();
    for shown in [config.to_string(), format!("{config:?}")] {
        assert!(!shown.contains(secret) && shown.contains("***"), "{shown}");
    }
    let mut shown = vec![];
    // A database that does not exist (the test server trusts any password).
    let mut missing = url.clone();
    missing.set_path("/no_such_database");
    shown.push(PostgresStore::connect(missing.as_str()).await.unwrap_err());
    // A port nobody listens on.
    let mut closed = url.clone();
    closed.set_port(Some(1)).unwrap();
    shown.push(PostgresStore::connect(closed.as_str()).await.unwrap_err());
    // Malformed.
    shown.push(
        PostgresStore::connect(&format!("{}?pool_size=lots", url.as_str()))
            .await
            .unwrap_err(),
    );
    shown.push(
        PostgresStore::connect(&url.as_str().replace("postgres://", "postgres:/"))
            .await
            .unwrap_err(),
    );
    let store = PostgresStore::connect(url.as_str()).await.unwrap();
    shown.push(Error::store("debug", format!("{store:?}")));
    for error in shown {
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains(secret), "the password leaked: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_rows_are_typed_errors() {
    let Some(pg) = server() else { return };
    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let mut raw = pg.raw().await;
    for (garbage, named) in [
        (
            "holder = 'x', term = -1, ttl_ms = 1000, version = '0123456789abcdef'",
            "term -1 is not a term",
        ),
        ("holder = 'x', term = 3, ttl_ms = 1000, version = 'nothex'", "hex"),
        (
            "holder = 'x', term = 3, ttl_ms = 10, version = '0123456789abcdef'",
            "ttl_ms",
        ),
        (
            "holder = 'x', term = 3, ttl_ms = NULL, version = '0123456789abcdef'",
            "all set or all NULL",
        ),
        (
            "holder = E'bad\\x01id', term = 3, ttl_ms = 1000, version = '0123456789abcdef'",
            "holder",
        ),
        (
            "holder = NULL, term = 3, ttl_ms = NULL, version = NULL, previous_end = 'exploded'",
            "end reason",
        ),
        // A held row's previous_end says whether it is a reservation: only `handed_over` does.
        ("previous_end = 'reserved'", "end reason"),
    ] {
        let lease = common::lease("garbage");
        let grant = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE leasehold.leases SET {garbage} WHERE name = '{lease}'"
        )))
        .execute(&mut raw)
        .await
        .unwrap();
        let other = PostgresStore::connect(&pg.url).await.unwrap();
        for (what, result) in [
            ("inspect", other.inspect(&lease).await.map(|_| ())),
            (
                "acquire",
                other
                    .acquire(&request(&lease, "b", Duration::from_secs(5)))
                    .await
                    .map(|_| ()),
            ),
            ("renew", store.renew(&grant).await.map(|_| ())),
            ("history", other.history(&lease, 5).await.map(|_| ())),
            (
                "acquire after",
                other
                    .acquire(&request(&lease, "b", Duration::from_secs(5)))
                    .await
                    .map(|_| ()),
            ),
        ] {
            match result {
                Err(Error::CorruptRecord { lease: l, detail, .. }) => {
                    assert_eq!(l, lease.as_str());
                    assert!(detail.contains(named), "{what} of {garbage}: {detail}");
                }
                other => panic!("{what} of {garbage}: expected CorruptRecord, got {other:?}"),
            }
        }
        assert_eq!(
            lock_holder(&mut raw, store.lock_key(&lease)).await,
            None,
            "no lock is kept on garbage"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_leads_and_hands_over() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(1);
    let lease = common::lease("elector");
    let checker = SafetyChecker::new();
    let mut electors = vec![];
    for id in ["A", "B"] {
        let store = Arc::new(PostgresStore::connect(&pg.url).await.unwrap());
        let elector = Elector::builder(store, lease.as_str())
            .candidate_id(id)
            .ttl(ttl)
            .build()
            .unwrap();
        checker.watch(&elector);
        electors.push(elector);
    }
    let first = electors[0].campaign().await.unwrap();
    let waiting = tokio::spawn({
        let b = electors[1].clone();
        async move { b.campaign().await.unwrap() }
    });
    tokio::time::sleep(ttl).await;
    let first_term = first.term();
    let resigned = Instant::now();
    first.resign().await;
    let second = waiting.await.unwrap();
    let handover = second.elected_at().duration_since(resigned);
    eprintln!("handover after a release: {handover:?}");
    assert!(
        handover < ttl / 5,
        "{handover:?}: a release is notified, no poll needed"
    );
    assert!(second.term() > first_term);
    second.resign().await;
    let events = checker.records().await;
    assert!(events.iter().any(|r| matches!(
        &r.event,
        Event::Deposed {
            reason: DeposedReason::Resigned,
            ..
        }
    )));
    checker.assert_safe().await;
}

/// Finding 8 of issue 12: with `synchronous_commit = off` as the database's or the role's default,
/// the lock session inherited it, so an acknowledged grant could be lost in a server crash and its
/// term granted again. Every connection that writes lease records must commit synchronously
/// whatever the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_writes_commit_synchronously_whatever_the_defaults() {
    use sqlx::Connection as _;
    let Some(pg) = server() else { return };
    let name = common::schema("sync");
    let mut admin = pg.raw().await;
    for statement in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("CREATE DATABASE {name} OWNER {name}"),
        format!("ALTER DATABASE {name} SET synchronous_commit = off"),
        format!("ALTER ROLE {name} SET synchronous_commit = off"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let mut url = url::Url::parse(&pg.url).unwrap();
    url.set_username(&name).unwrap();
    url.set_path(&format!("/{name}"));

    // Any other session of that role in that database commits asynchronously.
    let mut plain = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    let inherited: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(inherited, "off", "the test's defaults did not apply");
    plain.close().await.unwrap();

    // Nor can the URL's own options weaken it.
    // (`%20`, not the form encoding's `+`: in leasehold's URL grammar a `+` stays a `+`.)
    let query = match url.query() {
        Some(query) => format!("{query}&options=-c%20synchronous_commit%3Doff"),
        None => "options=-c%20synchronous_commit%3Doff".to_string(),
    };
    url.set_query(Some(&query));
    let store = PostgresStore::connect(url.as_str()).await.unwrap();
    let lease = common::lease("sync");
    let grant = granted(acquire(&store, &lease, "a", Duration::from_secs(5)).await);
    let setting = store.write_session_setting("synchronous_commit").await;
    store.release(&grant).await.unwrap();
    drop(store);
    for statement in [
        format!("DROP DATABASE {name} WITH (FORCE)"),
        format!("DROP ROLE {name}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    let setting = setting.unwrap();
    assert_eq!(setting.lock_session, "on", "the lock session's synchronous_commit");
    assert_eq!(
        setting.pool, "on",
        "the pool's synchronous_commit (break_lease writes there)"
    );
}

/// Every renewal is announced to other stores' announcement streams as `inspect` shows it right
/// after (same holder and term, the new version, the full TTL), `renew` and `renew_many` alike;
/// a `renew_many` of 40 grants sends its records in a few notifications, each under Postgres's
/// 8000-byte payload limit, not one per lease. Without the renewal's announcement the streams
/// see nothing after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_announced_in_few_notifications() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(30);
    let run = leasehold_core::random_u64() & 0xffff_ffff;
    // Long names and holder ids: about 420 bytes per record, 40 records do not fit one payload.
    let who = "h".repeat(250);
    let leases: Vec<LeaseName> = (0..40)
        .map(|i| LeaseName::new(format!("renewed-{run:08x}-{i:02}-{}", "x".repeat(100))).unwrap())
        .collect();
    let (holder, follower) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let mut grants = Vec::new();
    for lease in &leases {
        grants.push(granted(acquire(&holder, lease, &who, ttl).await));
    }
    let mut streams = Vec::new();
    for lease in &leases {
        streams.push(follower.announcements(lease).await.unwrap().expect("announcements"));
    }
    let mut raw = sqlx::postgres::PgListener::connect(&pg.url).await.unwrap();
    raw.listen("leasehold_renewed").await.unwrap();
    // The follower's listener connects in the background: renew the first grant until one
    // renewal is announced.
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no renewal was ever announced"
        );
        let Renewed::Renewed(renewed) = holder.renew(&grants[0]).await.unwrap() else {
            panic!("renewed")
        };
        if let Ok(seen) = tokio::time::timeout(Duration::from_millis(100), streams[0].next()).await {
            let shown = seen.expect("the stream lives").holder.expect("a holder");
            if shown.version == renewed.token {
                assert_eq!((shown.term, shown.ttl), (grants[0].term, ttl));
                break;
            }
        }
    }
    while tokio::time::timeout(Duration::from_millis(100), raw.try_recv())
        .await
        .is_ok()
    {}

    let answers = holder.renew_many(&grants).await.unwrap();
    for ((answer, stream), grant) in answers.into_iter().zip(&mut streams).zip(&grants) {
        let Ok(Renewed::Renewed(renewed)) = answer else {
            panic!("renewed: {answer:?}")
        };
        let seen = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                let seen = stream.next().await.expect("the stream lives");
                if seen.holder.as_ref().is_some_and(|h| h.version == renewed.token) {
                    return seen;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the renewal of {} is announced", grant.lease));
        let shown = seen.holder.clone().expect("a holder");
        let inspected = holder.inspect(&grant.lease).await.unwrap().holder.expect("held");
        assert_eq!(seen.lease, grant.lease);
        assert_eq!(seen.last_term, grant.term);
        assert_eq!((&shown.id, shown.term, shown.ttl), (&grant.holder, grant.term, ttl));
        assert_eq!(shown.store_remaining, Some(ttl));
        assert!(!shown.orphaned && !shown.reserved);
        assert_eq!(
            (&inspected.id, inspected.term, inspected.ttl, &inspected.version),
            (&shown.id, shown.term, shown.ttl, &shown.version),
            "what inspect shows"
        );
    }
    let mut notifications = 0;
    let mut records = 0;
    while let Ok(notification) = tokio::time::timeout(Duration::from_millis(200), raw.try_recv()).await {
        let notification = notification.unwrap().expect("the raw listener lives");
        assert!(
            notification.payload().len() < 8000,
            "{} bytes",
            notification.payload().len()
        );
        notifications += 1;
        records += notification.payload().split("\n\n").count();
    }
    assert_eq!(records, 40, "one record per renewed lease");
    assert!(
        (2..=4).contains(&notifications),
        "{notifications} notifications for 40 records"
    );
}
