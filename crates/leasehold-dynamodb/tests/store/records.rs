//! Records: versions, reservations, history, deleted items, withdrawn grants, wall clocks hours
//! off.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use leasehold_core::{Acquired, CandidateId, Elector, EndReason, LeaseName, LeaseStore, Renewed, Term, random_u64};
use leasehold_dynamodb::aws_sdk_dynamodb::types::AttributeValue;

use super::{SIX_HOURS, expect_corrupt, fresh_lease, granted, request};
use crate::common::{self, DynamoBackend, TABLE};

/// A contender whose wall clock is 6 hours fast and one 6 hours slow: takeover timing and terms
/// are exactly as with correct clocks, because the store compares no wall-clock time; the clocks
/// only show up in the audit trail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_hours_off_changes_nothing() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let fast = backend
        .store()
        .await
        .unwrap()
        .with_audit_clock(|| SystemTime::now() + SIX_HOURS);
    let slow = backend
        .store()
        .await
        .unwrap()
        .with_audit_clock(|| SystemTime::now() - SIX_HOURS);
    let ttl = Duration::from_secs(1);
    let retry = ttl / 5;
    let slack = Duration::from_millis(400);

    for (name, crashed, successor, successor_id) in [
        ("fast-crashes", &fast, &slow, "slow"),
        ("slow-crashes", &slow, &fast, "fast"),
    ] {
        let lease = fresh_lease(name);
        // The first holder takes the lease and then stops renewing, as a crashed process would.
        let sent = Instant::now();
        let first = granted(crashed, &request(&lease, "crashed", ttl, None)).await;
        let old_valid_until = sent + ttl.mul_f64(0.99);

        let elector = Elector::builder(Arc::new(successor.clone()), lease.as_str())
            .candidate_id(successor_id)
            .ttl(ttl)
            .retry_every(retry)
            .build()
            .unwrap();
        let leader = tokio::time::timeout(ttl * 5, elector.campaign())
            .await
            .expect("takeover in time")
            .unwrap();
        let took = leader.elected_at().saturating_duration_since(sent);
        assert!(
            leader.elected_at() >= old_valid_until,
            "{name}: the successor led {took:?} after the crashed holder's grant, before its valid_until"
        );
        assert!(
            took <= ttl + retry.mul_f64(1.2) + slack,
            "{name}: takeover took {took:?}"
        );
        let term = leader.term();
        assert_eq!(term, Term(first.term.0 + 1), "{name}: the next term");
        leader.resign().await;

        // The skew is visible only in the audit trail.
        let history = successor.history(&lease, 10).await.unwrap();
        assert_eq!(history.len(), 2, "{name}: {history:?}");
        let (old, new) = (&history[0], &history[1]);
        assert_eq!((old.term, new.term), (first.term, term));
        assert!(matches!(old.ended, Some((_, EndReason::Expired))), "{name}: {old:?}");
        assert!(matches!(new.ended, Some((_, EndReason::Released))), "{name}: {new:?}");
        let offset = |t: SystemTime| match t.duration_since(SystemTime::now()) {
            Ok(ahead) => ahead.as_secs_f64() / 3600.0,
            Err(behind) => -behind.duration().as_secs_f64() / 3600.0,
        };
        let (crashed_clock, successor_clock) = if name == "fast-crashes" {
            (6.0, -6.0)
        } else {
            (-6.0, 6.0)
        };
        assert!((offset(old.acquired_at) - crashed_clock).abs() < 0.1, "{name}: {old:?}");
        assert!(
            (offset(new.acquired_at) - successor_clock).abs() < 0.1,
            "{name}: {new:?}"
        );
        eprintln!(
            "{name}: takeover {took:?} after the crashed grant (ttl {ttl:?}); terms {} -> {term}",
            first.term
        );
    }
}

/// Raw store semantics: Held names holder and term, a takeover needs the exact version, a
/// repeated grant to the same candidate has a new term, renew after a takeover is Lost, a
/// release is free at once, and break_lease ends the term as broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_version_semantics() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let (a, b) = (backend.store().await.unwrap(), backend.store().await.unwrap());
    let lease = fresh_lease("versions");
    let ttl = Duration::from_secs(2);

    let g1 = granted(&a, &request(&lease, "a", ttl, None)).await;
    assert_eq!(g1.term, Term(1));
    let held = match b
        .acquire(&request(&lease, "b", ttl, Some("0000000000000000".into())))
        .await
        .unwrap()
    {
        Acquired::Held(observation) => observation.holder.expect("a holder"),
        other => panic!("a wrong takeover version must not take it: {other:?}"),
    };
    assert_eq!(
        (held.id.as_str(), held.term, held.version.as_str()),
        ("a", g1.term, g1.token.as_str())
    );
    // A renewal changes the version: the observation before it no longer takes over.
    let g1 = match a.renew(&g1).await.unwrap() {
        Renewed::Renewed(grant) => grant,
        other => panic!("{other:?}"),
    };
    assert_ne!(g1.token, held.version);
    assert!(matches!(
        b.acquire(&request(&lease, "b", ttl, Some(held.version))).await.unwrap(),
        Acquired::Held(_)
    ));
    // The candidate itself campaigning again: its earlier leadership ended, a new term.
    let g2 = granted(&a, &request(&lease, "a", ttl, None)).await;
    assert_eq!(g2.term, Term(2));
    assert!(
        matches!(a.renew(&g1).await.unwrap(), Renewed::Lost(_)),
        "the old term is gone"
    );
    // The exact version takes over.
    let g3 = granted(&b, &request(&lease, "b", ttl, Some(g2.token.clone()))).await;
    assert_eq!(g3.term, Term(3));
    match a.renew(&g2).await.unwrap() {
        Renewed::Lost(observation) => {
            let holder = observation.holder.expect("the new holder");
            assert_eq!((holder.id.as_str(), holder.term), ("b", Term(3)));
        }
        other => panic!("{other:?}"),
    }
    a.release(&g2).await.expect("releasing a lost grant is not an error");
    assert_eq!(a.inspect(&lease).await.unwrap().holder.map(|h| h.term), Some(Term(3)));
    assert_eq!(b.break_lease(&lease).await.unwrap(), Some(Term(3)));
    assert_eq!(b.break_lease(&lease).await.unwrap(), None);
    let free = a.inspect(&lease).await.unwrap();
    assert_eq!(
        (free.holder, free.last_term, free.previous_end),
        (None, Term(3), Some(EndReason::Broken))
    );
    let g4 = granted(&a, &request(&lease, "a", ttl, None)).await;
    assert_eq!(g4.term, Term(4));
    a.release(&g4).await.unwrap();

    let history = a.history(&lease, 100).await.unwrap();
    let summary: Vec<(u64, &str, Option<EndReason>)> = history
        .iter()
        .map(|t| (t.term.0, t.holder.as_str(), t.ended.map(|(_, r)| r)))
        .collect();
    assert_eq!(
        summary,
        [
            (1, "a", Some(EndReason::Expired)),
            (2, "a", Some(EndReason::Expired)),
            (3, "b", Some(EndReason::Broken)),
            (4, "a", Some(EndReason::Released)),
        ]
    );
    let last_two: Vec<u64> = a.history(&lease, 2).await.unwrap().iter().map(|t| t.term.0).collect();
    assert_eq!(last_two, [3, 4]);
}

/// A grant the engine never learnt of (its acquire's answer was lost): `withdraw` of that
/// candidate ends the term as released, so the lease is free at once; another candidate's
/// withdraw changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdraw_releases_a_grant_the_engine_never_saw() {
    let Some(endpoint) = common::endpoint() else { return };
    let store = DynamoBackend::with_table(endpoint, TABLE).store().await.unwrap();
    let lease = fresh_lease("withdraw");
    let grant = granted(&store, &request(&lease, "a", Duration::from_secs(2), None)).await;
    store.withdraw(&lease, &CandidateId::new("b").unwrap()).await.unwrap();
    assert_eq!(
        store.inspect(&lease).await.unwrap().holder.map(|h| h.term),
        Some(grant.term)
    );
    store.withdraw(&lease, &CandidateId::new("a").unwrap()).await.unwrap();
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!((seen.holder, seen.previous_end), (None, Some(EndReason::Released)));
    let history = store.history(&lease, 10).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|t| (t.term, t.ended.map(|(_, r)| r)))
            .collect::<Vec<_>>(),
        [(grant.term, Some(EndReason::Released))]
    );
}

/// A reservation ([`LeaseStore::hand_over`]) is no grant: the successor's renewal or release at
/// the handed-over term is refused and leaves it reserved; a takeover of an untaken reservation
/// and a withdrawal by the successor keep the term ended handed over; a reservation left at an
/// older term (by code that does not know it) reserves nothing, and the next grant removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_no_grant() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let store = backend.store().await.unwrap();
    let ttl = Duration::from_secs(2);
    let c = CandidateId::new("c").unwrap();
    let ends = |history: &[leasehold_core::Transition]| {
        history
            .iter()
            .map(|t| (t.term, t.holder.to_string(), t.ended.map(|(_, r)| r)))
            .collect::<Vec<_>>()
    };

    let lease = fresh_lease("reserved");
    let a = granted(&store, &request(&lease, "a", ttl, None)).await;
    store.hand_over(&a, &c).await.unwrap();
    let reserved = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert!(
        reserved.reserved && reserved.id == c && reserved.term == a.term,
        "{reserved:?}"
    );
    // The successor holding a grant at the old term (it cannot, but a bug might think so).
    let as_if_c = leasehold_core::Grant {
        holder: c.clone(),
        token: reserved.version.clone(),
        ..a.clone()
    };
    match store.renew(&as_if_c).await.unwrap() {
        Renewed::Lost(seen) => assert!(seen.holder.is_some_and(|h| h.reserved && h.version == reserved.version)),
        other => panic!("a reservation must not renew as a grant: {other:?}"),
    }
    store.release(&as_if_c).await.unwrap();
    store
        .hand_over(&as_if_c, &CandidateId::new("d").unwrap())
        .await
        .unwrap();
    let still = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert_eq!(still, reserved, "the reservation is unchanged");

    // Untaken: a contender that watched its version takes over; A's term stays handed over.
    let b = granted(&store, &request(&lease, "b", ttl, Some(reserved.version.clone()))).await;
    assert!(b.term > a.term);
    assert_eq!(
        ends(&store.history(&lease, 10).await.unwrap()),
        [
            (a.term, "a".into(), Some(EndReason::HandedOver)),
            (b.term, "b".into(), None)
        ]
    );
    let item = backend.get_raw(&lease).await.unwrap();
    assert!(
        !item.contains_key("reserved_term") && !item.contains_key("handed_over_at"),
        "a grant removes the reservation: {item:?}"
    );

    // The successor gives up: withdrawn, free at once, still handed over.
    store.hand_over(&b, &c).await.unwrap();
    store.withdraw(&lease, &c).await.unwrap();
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!((seen.holder, seen.previous_end), (None, Some(EndReason::HandedOver)));
    assert_eq!(
        ends(&store.history(&lease, 10).await.unwrap())[1],
        (b.term, "b".into(), Some(EndReason::HandedOver))
    );

    // A reservation of an older term, left by code that does not know it: not reserved.
    let lease = fresh_lease("stale-reservation");
    let s = |v: &str| AttributeValue::S(v.into());
    let n = |v: &str| AttributeValue::N(v.into());
    backend
        .put_raw(
            &lease,
            &[
                ("term", n("4")),
                ("last_holder", s("c")),
                ("holder", s("c")),
                ("ttl_ms", n("2000")),
                ("version", s("0123456789abcdef")),
                ("reserved_term", n("3")),
                ("handed_over_at", n("1700000000000")),
            ],
        )
        .await
        .unwrap();
    let holder = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert!(!holder.reserved && holder.term == Term(4), "{holder:?}");
    let renewed = store
        .renew(&leasehold_core::Grant {
            lease: lease.clone(),
            holder: c.clone(),
            term: Term(4),
            ttl,
            token: holder.version.clone(),
        })
        .await
        .unwrap();
    assert!(matches!(renewed, Renewed::Renewed(_)), "{renewed:?}");
    backend
        .put_raw(
            &lease,
            &[
                ("term", n("4")),
                ("last_holder", s("c")),
                ("holder", s("c")),
                ("ttl_ms", n("2000")),
                ("version", s("0123456789abcdef")),
                ("reserved_term", n("5")),
                ("handed_over_at", n("1700000000000")),
            ],
        )
        .await
        .unwrap();
    expect_corrupt(
        "a reservation above the term",
        &lease,
        store.inspect(&lease).await,
        "reserved_term 5 is above term 4",
    );
}

/// A grant whose caller gave up right after it (the engine drops an acquire at its request
/// timeout): the history item of the term it ended is not written, and the `prev_*` slot of the
/// lease item still holds that term. Nothing is lost: `history` reads the slot, and the next
/// grant writes the history item before it reuses the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_an_abandoned_grant() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let store = backend.store().await.unwrap();
    let lease = fresh_lease("abandoned");
    let ttl = Duration::from_secs(2);
    for who in ["a", "b", "c"] {
        let grant = granted(&store, &request(&lease, who, ttl, None)).await;
        store.release(&grant).await.unwrap();
    }
    // As if the grant of term 3 had stopped after its UpdateItem: history item 2 missing, the
    // slot full.
    let history_key = |term: u64| {
        HashMap::from([
            ("lease".to_string(), AttributeValue::S(lease.to_string())),
            ("sk".to_string(), AttributeValue::S(format!("history#{term:020}"))),
        ])
    };
    let client = store.client();
    client
        .delete_item()
        .table_name(TABLE)
        .set_key(Some(history_key(2)))
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name(TABLE)
        .key("lease", AttributeValue::S(lease.to_string()))
        .key("sk", AttributeValue::S("lease".into()))
        .update_expression(
            "SET prev_term = :t, prev_holder = :h, prev_acquired_at = :a, prev_ended_at = :e, prev_end = :r",
        )
        .expression_attribute_values(":t", AttributeValue::N("2".into()))
        .expression_attribute_values(":h", AttributeValue::S("b".into()))
        .expression_attribute_values(":a", AttributeValue::N("1700000000000".into()))
        .expression_attribute_values(":e", AttributeValue::N("1700000001000".into()))
        .expression_attribute_values(":r", AttributeValue::S("released".into()))
        .send()
        .await
        .unwrap();
    let summary = |history: Vec<leasehold_core::Transition>| -> Vec<(u64, String, Option<EndReason>)> {
        history
            .into_iter()
            .map(|t| (t.term.0, t.holder.to_string(), t.ended.map(|(_, r)| r)))
            .collect()
    };
    let released = |term: u64, who: &str| (term, who.to_string(), Some(EndReason::Released));
    assert_eq!(
        summary(store.history(&lease, 10).await.unwrap()),
        [released(1, "a"), released(2, "b"), released(3, "c")],
        "history reads term 2 from the slot"
    );
    // The next grant cannot take the one-request path (the slot is full); it writes history
    // item 2 first, then grants.
    let g4 = granted(&store, &request(&lease, "d", ttl, None)).await;
    assert_eq!(g4.term, Term(4));
    store.release(&g4).await.unwrap();
    let item = client
        .get_item()
        .table_name(TABLE)
        .set_key(Some(history_key(2)))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(item.item().is_some(), "history item 2 was written by the next grant");
    assert_eq!(
        summary(store.history(&lease, 10).await.unwrap()),
        [released(1, "a"), released(2, "b"), released(3, "c"), released(4, "d")]
    );
    // And the slot is empty again: the grant after that takes the one-request path.
    let g5 = granted(&store, &request(&lease, "e", ttl, None)).await;
    assert_eq!(g5.term, Term(5));
}

/// Someone deletes the lease item: the next grant still has a term above every earlier one,
/// read from the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_item_does_not_send_the_term_back() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let store = backend.store().await.unwrap();
    let lease = fresh_lease("deleted");
    let ttl = Duration::from_secs(2);
    for _ in 0..2 {
        let grant = granted(&store, &request(&lease, "a", ttl, None)).await;
        store.release(&grant).await.unwrap();
    }
    let g3 = granted(&store, &request(&lease, "b", ttl, None)).await;
    assert_eq!(g3.term, Term(3));
    store
        .client()
        .delete_item()
        .table_name(TABLE)
        .key("lease", AttributeValue::S(lease.to_string()))
        .key("sk", AttributeValue::S("lease".into()))
        .send()
        .await
        .unwrap();
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!(
        (seen.holder, seen.last_term),
        (None, Term(2)),
        "the history knows term 2 ended"
    );
    let next = granted(&store, &request(&lease, "c", ttl, None)).await;
    assert!(next.term > Term(2), "term {} after the item was deleted", next.term);
}

/// `list(prefix)` on a table of its own: the leases under a prefix, sorted, each as `inspect`
/// shows it (held, released, broken); history items and items that are no lease never listed;
/// the prefix is literal (`_`, `%`, `*`, `?`, `[`); a corrupt lease item is a CorruptRecord
/// naming it; every page of a Scan is read (a table with more items than one page holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_by_prefix() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = format!("leasehold-list-{:x}", random_u64());
    let backend = DynamoBackend::with_table(endpoint, &table);
    let store = backend.store().await.unwrap();
    let ttl = Duration::from_secs(5);
    let name = |n: &str| LeaseName::new(n).unwrap();

    let held = granted(&store, &request(&name("a-held"), "h1", ttl, None)).await;
    let released = granted(&store, &request(&name("a-released"), "h2", ttl, None)).await;
    store.release(&released).await.unwrap();
    granted(&store, &request(&name("a-broken"), "h3", ttl, None)).await;
    assert_eq!(store.break_lease(&name("a-broken")).await.unwrap(), Some(Term(1)));
    // A second term, so that its first is a history item.
    let again = granted(&store, &request(&name("a-released"), "h4", ttl, None)).await;
    store.release(&again).await.unwrap();
    granted(&store, &request(&name("a_x"), "u", ttl, None)).await;
    granted(&store, &request(&name("b-one"), "b", ttl, None)).await;
    // A history item of a lease without a lease item, and an item whose key is no lease name.
    for (key, sk) in [("ghost", "history#00000000000000000001"), ("not a lease!", "lease")] {
        let mut item = HashMap::from([
            ("lease".to_string(), AttributeValue::S(key.into())),
            ("sk".to_string(), AttributeValue::S(sk.into())),
            ("term".to_string(), AttributeValue::N("1".into())),
            ("holder".to_string(), AttributeValue::S("x".into())),
        ]);
        item.insert("last_holder".into(), AttributeValue::S("x".into()));
        store
            .client()
            .put_item()
            .table_name(&table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }

    let listed = store.list("a-").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|o| o.lease.as_str()).collect();
    assert_eq!(names, ["a-broken", "a-held", "a-released"]);
    for observation in &listed {
        assert_eq!(observation, &store.inspect(&observation.lease).await.unwrap());
    }
    let holder = listed[1].holder.as_ref().expect("a-held is held");
    assert_eq!((holder.id.as_str(), holder.term, holder.ttl), ("h1", held.term, ttl));
    assert_eq!(holder.version, held.token);
    assert_eq!(
        (listed[0].holder.is_none(), listed[0].last_term, listed[0].previous_end),
        (true, Term(1), Some(EndReason::Broken))
    );
    assert_eq!(
        (listed[2].holder.is_none(), listed[2].last_term, listed[2].previous_end),
        (true, Term(2), Some(EndReason::Released))
    );

    let all: Vec<String> = store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.lease.to_string())
        .collect();
    assert_eq!(all, ["a-broken", "a-held", "a-released", "a_x", "b-one"]);
    assert_eq!(
        store
            .list("a_")
            .await
            .unwrap()
            .iter()
            .map(|o| o.lease.as_str())
            .collect::<Vec<_>>(),
        ["a_x"]
    );
    for literal in ["a%", "a*", "a?", "[a", "%", "_", "ghost", "history#"] {
        assert!(store.list(literal).await.unwrap().is_empty(), "{literal}");
    }

    // Enough history items after the leases that the Scan takes more than one page (1 MB):
    // every lease is still listed.
    let padding = "p".repeat(60_000);
    for term in 0..20u64 {
        store
            .client()
            .put_item()
            .table_name(&table)
            .set_item(Some(HashMap::from([
                ("lease".to_string(), AttributeValue::S(format!("pad-{term}"))),
                ("sk".to_string(), AttributeValue::S(format!("history#{term:020}"))),
                ("padding".to_string(), AttributeValue::S(padding.clone())),
            ])))
            .send()
            .await
            .unwrap();
    }
    let pages = store.client().scan().table_name(&table).send().await.unwrap();
    assert!(
        pages.last_evaluated_key().is_some(),
        "the table fits one page: the test shows nothing"
    );
    assert_eq!(store.list("").await.unwrap().len(), 5);

    // A corrupt lease item fails the listing that includes it, naming it; others are unaffected.
    backend
        .put_raw(&name("c-bad"), &[("term", AttributeValue::S("garbage".into()))])
        .await
        .unwrap();
    expect_corrupt("list", &name("c-bad"), store.list("c").await, "term");
    assert_eq!(store.list("a-").await.unwrap().len(), 3);

    store.client().delete_table().table_name(&table).send().await.unwrap();
}
