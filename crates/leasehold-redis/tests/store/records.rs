//! The keys: corrupt keys, history, handovers, terms that never go back or repeat, TTLs, prefixes.

use std::time::Duration;

use leasehold_core::{EndReason, Error, Grant, LeaseStore, Renewed, Term};
use leasehold_redis::RedisStore;

use super::{backend, dump, lease, next};
use crate::common::{TTL, grant, id, raw_cmd, request};

/// Every kind of foreign or garbled key is a typed error naming the lease, for every operation,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_keys_are_typed_errors_and_left_alone() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    type Setup = &'static [&'static [&'static str]];
    let cases: &[(&str, &str, Setup)] = &[
        ("a string lease record", "lease", &[&["SET", "{key}", "garbage"]]),
        ("a list lease record", "lease", &[&["RPUSH", "{key}", "x"]]),
        (
            "a foreign hash",
            "lease",
            &[
                &["HSET", "{key}", "owner", "someone", "until", "tomorrow"],
                &["PEXPIRE", "{key}", "60000"],
            ],
        ),
        (
            "a record with a text term",
            "lease",
            &[
                &[
                    "HSET", "{key}", "holder", "h", "term", "ten", "ttl", "1000", "version", "v",
                ],
                &["PEXPIRE", "{key}", "60000"],
            ],
        ),
        (
            "a record without expiry",
            "lease",
            &[&[
                "HSET", "{key}", "holder", "h", "term", "1", "ttl", "1000", "version", "v",
            ]],
        ),
        (
            "a record with a garbled reserved field",
            "lease",
            &[
                &[
                    "HSET", "{key}", "holder", "h", "term", "1", "ttl", "1000", "version", "v", "reserved", "yes",
                ],
                &["PEXPIRE", "{key}", "60000"],
            ],
        ),
        ("a string state", "state", &[&["SET", "{key}", "7"]]),
        ("a foreign state hash", "state", &[&["HSET", "{key}", "term", "-3"]]),
        ("a string history", "history", &[&["SET", "{key}", "x"]]),
    ];
    for (what, which, setup) in cases {
        let lease = lease("corrupt");
        let keys = backend.config.keys(&lease);
        let key = match *which {
            "lease" => keys.lease.clone(),
            "state" => keys.state.clone(),
            _ => keys.history.clone(),
        };
        for command in *setup {
            let args: Vec<String> = command.iter().map(|a| a.replace("{key}", &key)).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            raw_cmd(&backend, &args).await;
        }
        let before = dump(&backend, &keys).await;
        let fake = Grant {
            lease: lease.clone(),
            holder: id("h"),
            term: Term(1),
            ttl: TTL,
            token: "v".into(),
        };
        let results: Vec<(&str, Result<String, Error>)> = vec![
            (
                "acquire",
                store
                    .acquire(&request(&lease, "a", TTL))
                    .await
                    .map(|a| format!("{a:?}")),
            ),
            ("renew", store.renew(&fake).await.map(|r| format!("{r:?}"))),
            ("release", store.release(&fake).await.map(|r| format!("{r:?}"))),
            (
                "hand_over",
                store.hand_over(&fake, &id("c")).await.map(|r| format!("{r:?}")),
            ),
            ("inspect", store.inspect(&lease).await.map(|o| format!("{o:?}"))),
            ("history", store.history(&lease, 10).await.map(|h| format!("{h:?}"))),
            ("break_lease", store.break_lease(&lease).await.map(|t| format!("{t:?}"))),
        ];
        for (op, result) in results {
            match result {
                Err(Error::CorruptRecord {
                    store: "redis",
                    lease: named,
                    detail,
                }) => {
                    assert_eq!(named, lease.as_str(), "{what}: {op}");
                    assert!(
                        detail.contains(&key),
                        "{what}: {op}: the detail names the key: {detail}"
                    );
                }
                other => panic!("{what}: {op} must fail with CorruptRecord, got {other:?}"),
            }
        }
        assert_eq!(dump(&backend, &keys).await, before, "{what}: nothing may be written");
        println!("{what}: {}", store.inspect(&lease).await.unwrap_err());
    }
}

/// `history` and `inspect` tell how each term ended: expired (at the time the server let it go),
/// released, broken, or replaced by the same candidate's new term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_records_how_every_term_ended() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("history");
    let short = Duration::from_millis(100);

    let a = grant(&store, &lease, "a", short).await;
    let held = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert!(held.store_remaining.unwrap() <= short && held.ttl == short, "{held:?}");
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!(
        (seen.holder.is_none(), seen.previous_end, seen.last_term),
        (true, Some(EndReason::Expired), a.term)
    );
    match store.renew(&a).await.unwrap() {
        Renewed::Lost(o) => assert!(o.holder.is_none()),
        other => panic!("renewing an expired grant: {other:?}"),
    }

    let b1 = grant(&store, &lease, "b", TTL).await;
    // The same candidate again: its earlier leadership ended, a new term.
    let b2 = grant(&store, &lease, "b", TTL).await;
    assert!(b2.term > b1.term && b1.term > a.term);
    match store.renew(&b1).await.unwrap() {
        Renewed::Lost(o) => assert_eq!(o.holder.map(|h| h.term), Some(b2.term)),
        other => panic!("the replaced term must be lost: {other:?}"),
    }
    assert_eq!(store.break_lease(&lease).await.unwrap(), Some(b2.term));
    assert_eq!(
        store.inspect(&lease).await.unwrap().previous_end,
        Some(EndReason::Broken)
    );
    assert_eq!(store.break_lease(&lease).await.unwrap(), None);

    let c = grant(&store, &lease, "c", TTL).await;
    store.release(&c).await.unwrap();
    store.release(&c).await.unwrap();
    assert_eq!(
        store.inspect(&lease).await.unwrap().previous_end,
        Some(EndReason::Released)
    );
    let d = grant(&store, &lease, "d", TTL).await;

    let history = store.history(&lease, 100).await.unwrap();
    let summary: Vec<_> = history
        .iter()
        .map(|t| (t.holder.as_str(), t.term, t.ended.map(|(_, r)| r)))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("a", a.term, Some(EndReason::Expired)),
            ("b", b1.term, Some(EndReason::Expired)),
            ("b", b2.term, Some(EndReason::Broken)),
            ("c", c.term, Some(EndReason::Released)),
            ("d", d.term, None),
        ]
    );
    // a's end is when the server let it go: about `short` after it was granted.
    let (a_ended, _) = history[0].ended.unwrap();
    let lived = a_ended.duration_since(history[0].acquired_at).unwrap();
    // (The grant's time is its stream entry's id, taken a moment after the deadline's clock.)
    assert!(
        lived + Duration::from_millis(3) >= short && lived < short + Duration::from_millis(50),
        "{lived:?}"
    );
    assert_eq!(
        store
            .history(&lease, 2)
            .await
            .unwrap()
            .iter()
            .map(|t| t.term)
            .collect::<Vec<_>>(),
        vec![c.term, d.term]
    );
    assert!(store.history(&lease, 0).await.unwrap().is_empty());

    // An expired last term shows as ended before anyone takes over.
    store.release(&d).await.unwrap();
    let e = grant(&store, &lease, "e", short).await;
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    let last = store.history(&lease, 1).await.unwrap().pop().unwrap();
    assert_eq!(
        (last.term, last.ended.map(|(_, r)| r)),
        (e.term, Some(EndReason::Expired))
    );
}

/// A handover rewrites the record to name the successor with `reserved` `1`, the same term, a
/// new version and a full TTL on the server's clock, ends the term `handed_over` and announces
/// it. Nothing takes the reservation for a grant of the successor at the old term (renew `Lost`,
/// release and hand_over no-ops); breaking it keeps the history's `handed_over`; an untaken one
/// expires like a silent holder, and the lease is free having been handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_over_writes_a_reserved_record() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("handover");
    let keys = backend.config.keys(&lease);
    let mut changes = store.changes(&lease, &id("c")).await.unwrap().unwrap();
    let ttl = Duration::from_millis(300);

    let a = grant(&store, &lease, "a", ttl).await;
    store.hand_over(&a, &id("c")).await.unwrap();
    assert_eq!(
        next(&mut changes).await,
        Ok(Some(leasehold_core::Change::Changed)),
        "a handover is announced"
    );
    let field = |name: &'static str| {
        let key = keys.lease.clone();
        let backend = &backend;
        async move {
            match raw_cmd(backend, &["HGET", &key, name]).await {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
                other => panic!("{name}: {other:?}"),
            }
        }
    };
    assert_eq!(
        (field("holder").await, field("term").await, field("reserved").await),
        ("c".to_string(), a.term.to_string(), "1".to_string())
    );
    assert_ne!(field("version").await, a.token);
    let seen = store.inspect(&lease).await.unwrap();
    let reserved = seen.holder.clone().unwrap();
    assert!(
        reserved.reserved && reserved.id == id("c") && reserved.term == a.term,
        "{seen:?}"
    );
    assert!(reserved.store_remaining.unwrap() > ttl / 2, "{reserved:?}");

    let as_c = Grant {
        holder: id("c"),
        token: reserved.version.clone(),
        ..a.clone()
    };
    match store.renew(&as_c).await.unwrap() {
        Renewed::Lost(lost) => assert!(lost.holder.is_some_and(|h| h.reserved)),
        other => panic!("a reservation renewed as a grant of the successor: {other:?}"),
    }
    store.release(&as_c).await.unwrap();
    store.hand_over(&as_c, &id("b")).await.unwrap();
    let again = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert_eq!(
        (again.id, again.version, again.reserved),
        (id("c"), reserved.version, true)
    );

    assert_eq!(store.break_lease(&lease).await.unwrap(), Some(a.term));
    assert_eq!(
        store.inspect(&lease).await.unwrap().previous_end,
        Some(EndReason::Broken)
    );
    let ends = |history: Vec<leasehold_core::Transition>| {
        history
            .iter()
            .map(|t| (t.term, t.ended.map(|(_, why)| why)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ends(store.history(&lease, 10).await.unwrap()),
        [(a.term, Some(EndReason::HandedOver))]
    );

    // Untaken: it expires on the server's clock, and the lease was last handed over.
    let b = grant(&store, &lease, "b", ttl).await;
    store.hand_over(&b, &id("nobody")).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!(
        (seen.holder, seen.previous_end, seen.last_term),
        (None, Some(EndReason::HandedOver), b.term)
    );
    let c = grant(&store, &lease, "c", ttl).await;
    assert!(c.term > b.term);
    assert_eq!(
        ends(store.history(&lease, 10).await.unwrap()),
        [
            (a.term, Some(EndReason::HandedOver)),
            (b.term, Some(EndReason::HandedOver)),
            (c.term, None)
        ]
    );
    store.release(&c).await.unwrap();
}

/// The history keeps about `history_limit` terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_capped() {
    let Some(backend) = backend() else { return };
    let mut config = backend.config.clone();
    config.history_limit = 5;
    let store = RedisStore::from_config(config).await.unwrap();
    let lease = lease("capped");
    let mut terms = Vec::new();
    for _ in 0..400 {
        let g = grant(&store, &lease, "a", TTL).await;
        store.release(&g).await.unwrap();
        terms.push(g.term);
    }
    let history = store.history(&lease, 1000).await.unwrap();
    // `MAXLEN ~` trims whole blocks of entries, so a little more than the limit is kept.
    assert!(
        history.len() >= 5 && history.len() < 200,
        "{} terms kept",
        history.len()
    );
    assert_eq!(history.last().unwrap().term, *terms.last().unwrap());
    let len = raw_cmd(&backend, &["XLEN", &backend.config.keys(&lease).history]).await;
    println!("history_limit 5: {} terms kept, stream length {len:?}", history.len());
}

/// Terms never go back, also when the server loses the lease's keys (what a restart without
/// persistence, `FLUSHDB` or eviction does): the next term starts from the server's clock in
/// microseconds, above every term granted before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_never_go_back_when_the_keys_are_lost() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("lost-keys");
    let first = grant(&store, &lease, "a", TTL).await;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    // Loopback: the server's clock is this machine's.
    assert!(
        first.term.0.abs_diff(now_us) < 60_000_000,
        "the first term is the server's time in µs: {}",
        first.term
    );
    let mut last = first.term;
    for _ in 0..50 {
        let g = grant(&store, &lease, "a", TTL).await;
        assert!(
            g.term > last,
            "terms go up while the counter lives: {} after {last}",
            g.term
        );
        last = g.term;
    }
    let keys = backend.config.keys(&lease);
    raw_cmd(&backend, &["DEL", &keys.lease, &keys.state, &keys.history]).await;
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!(
        (seen.holder, seen.last_term, seen.previous_end),
        (None, Term(0), None),
        "the keys are gone"
    );
    let after = grant(&store, &lease, "b", TTL).await;
    assert!(after.term > last, "term {} after the loss, {last} before", after.term);
    println!(
        "terms {}..={last} before the keys were lost, {} after",
        first.term, after.term
    );
}

/// Finding 9 of issue 12: restoring an older snapshot (RDB, or an AOF with `everysec` that lost
/// its last second) brings back an older term counter, and the counter used to go on from it,
/// granting terms that had been granted already. Every grant is now
/// `max(stored + 1, server time in µs)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_never_repeat_after_an_older_snapshot_is_restored() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("restored");
    let keys = backend.config.keys(&lease);
    let mut granted = Vec::new();
    for who in ["a", "b", "c", "d", "e"] {
        let g = grant(&store, &lease, who, TTL).await;
        store.release(&g).await.unwrap();
        granted.push(g.term);
    }
    // The snapshot was taken right after the first grant: the counter goes back to it.
    raw_cmd(&backend, &["HSET", &keys.state, "term", &granted[0].0.to_string()]).await;
    let after = grant(&store, &lease, "f", TTL).await;
    let highest = *granted.iter().max().unwrap();
    assert!(
        after.term > highest,
        "term {} granted after the restore; {granted:?} were granted before it",
        after.term
    );
    store.release(&after).await.unwrap();

    // Also when the restored lease record itself names an older term.
    raw_cmd(
        &backend,
        &[
            "HSET",
            &keys.lease,
            "holder",
            "a",
            "term",
            &granted[1].0.to_string(),
            "ttl",
            "60000",
            "version",
            "v",
        ],
    )
    .await;
    raw_cmd(&backend, &["PEXPIRE", &keys.lease, "60000"]).await;
    raw_cmd(&backend, &["HSET", &keys.state, "term", &granted[1].0.to_string()]).await;
    let again = grant(&store, &lease, "a", TTL).await;
    assert!(again.term > after.term, "term {} after {}", again.term, after.term);
    println!(
        "terms {granted:?}, then {} and {} after restores",
        after.term, again.term
    );
}

/// A counter at the largest term Redis can count to is corrupt, not a panic or a wrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_that_cannot_be_followed_is_corrupt() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("max-term");
    let g = grant(&store, &lease, "a", TTL).await;
    store.release(&g).await.unwrap();
    let keys = backend.config.keys(&lease);
    raw_cmd(&backend, &["HSET", &keys.state, "term", &i64::MAX.to_string()]).await;
    let err = store.acquire(&request(&lease, "a", TTL)).await.unwrap_err();
    assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
    assert!(err.to_string().contains("no term can follow"), "{err}");
}

/// TTLs: outside 10 ms..=24 h is `InvalidTtl`; a fraction of a millisecond is rounded up, never
/// down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_are_checked_and_rounded_up() {
    let Some(backend) = backend() else { return };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let lease = lease("ttl");
    for ttl in [Duration::from_millis(9), Duration::from_secs(24 * 3600 + 1)] {
        let err = store.acquire(&request(&lease, "a", ttl)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { ttl: t, .. } if t == ttl), "{err:?}");
    }
    grant(&store, &lease, "a", Duration::from_micros(1_000_001)).await;
    let seen = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert_eq!(seen.ttl, Duration::from_millis(1001));
    let pttl = raw_cmd(&backend, &["PTTL", &backend.config.keys(&lease).lease]).await;
    assert!(
        matches!(pttl, redis::Value::Int(ms) if ms > 990 && ms <= 1001),
        "{pttl:?}"
    );
}

/// Two prefixes (or databases) on one server are separate worlds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_keep_applications_apart() {
    let Some(backend) = backend() else { return };
    let mut other = backend.config.clone();
    other.prefix = "leasehold-test-other:".into();
    let (one, two) = (
        RedisStore::from_config(backend.config.clone()).await.unwrap(),
        RedisStore::from_config(other).await.unwrap(),
    );
    let lease = lease("prefix");
    grant(&one, &lease, "a", TTL).await;
    grant(&two, &lease, "b", TTL).await;
    assert_eq!(one.inspect(&lease).await.unwrap().holder.unwrap().id.as_str(), "a");
}
