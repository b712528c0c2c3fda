//! Planned handover on ZooKeeper ([`LeaseStore::hand_over`]), beyond the shared scenario: the
//! successor goes before candidates queued ahead of it with terms still increasing, only the
//! queue's head takes an untaken reservation over, only the successor's change stream is woken,
//! and a garbled reservation is a typed error. Against the ZooKeeper test server
//! (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use std::time::Duration;

use futures::StreamExt;
use leasehold_conformance::require_server;
use leasehold_core::{AcquireRequest, Acquired, EndReason, Error, Grant, LeaseStore, Observation, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

use crate::common;
use common::{TTL, id, lease, request};

fn takeover(candidate: &str, version: &str) -> AcquireRequest {
    AcquireRequest {
        takeover: Some(version.to_string()),
        ..request(candidate)
    }
}

fn granted(answer: Acquired) -> Grant {
    match answer {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("expected a grant, got Held({seen:?})"),
    }
}

fn held(answer: Acquired) -> Observation {
    match answer {
        Acquired::Held(seen) => seen,
        Acquired::Granted(grant) => panic!("expected Held, got {grant:?}"),
    }
}

/// Who the observation shows, at which term, and whether reserved.
fn shows(seen: &Observation) -> Option<(String, u64, bool)> {
    seen.holder.as_ref().map(|h| (h.id.to_string(), h.term.0, h.reserved))
}

struct Setup {
    raw: zk::Client,
    chroot: String,
    url: String,
}

async fn setup() -> Option<Setup> {
    let server = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL")?;
    let chroot = format!("/leasehold-handover-{:016x}", random_u64());
    let url = format!("{}{chroot}", server.trim_end_matches('/'));
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(server.trim_start_matches("zk://").trim_end_matches('/'))
        .await
        .expect("raw client");
    Some(Setup { raw, chroot, url })
}

impl Setup {
    /// A store of its own: one process's view, with its own sessions.
    async fn store(&self) -> ZookeeperStore {
        ZookeeperStore::connect(&self.url).await.expect("connect")
    }

    async fn candidates(&self) -> Vec<String> {
        let mut names = self
            .raw
            .list_children(&format!("{}/jobs/candidates", self.chroot))
            .await
            .expect("list candidates");
        names.sort_by_key(|n| n.rsplit_once('-').map(|(_, seq)| seq.to_string()));
        names
    }
}

/// A hands over to C while B waits ahead of C: C is granted at once, with a term above A's; B's
/// place ahead of C is gone (B queues again behind C on its next acquire), so that when C
/// releases, B's grant has a term above C's. The history says A's term was handed over.
#[tokio::test]
async fn the_successor_goes_before_candidates_queued_ahead_and_terms_keep_increasing() {
    let Some(s) = setup().await else { return };
    let (a, b, c) = (s.store().await, s.store().await, s.store().await);
    let first = granted(a.acquire(&request("a")).await.expect("acquire"));
    let seen = held(b.acquire(&request("b")).await.expect("queue b"));
    assert_eq!(shows(&seen), Some(("a".into(), first.term.0, false)));
    held(c.acquire(&request("c")).await.expect("queue c"));
    let queued = s.candidates().await;
    assert_eq!(queued.len(), 3, "{queued:?}");

    a.hand_over(&first, &id("c")).await.expect("hand over");
    let seen = held(b.acquire(&request("b")).await.expect("b's acquire"));
    assert_eq!(
        shows(&seen),
        Some(("c".into(), first.term.0, true)),
        "B, ahead of C in the queue, is told the lease is reserved for C"
    );
    let taken = granted(c.acquire(&request("c")).await.expect("c's acquire"));
    assert!(taken.term > first.term, "{} > {}", taken.term, first.term);
    assert_eq!(
        s.candidates().await,
        vec![queued[2].clone()],
        "C's znode heads the queue; B's place ahead of it is gone"
    );

    let seen = held(b.acquire(&request("b")).await.expect("b queues again"));
    assert_eq!(shows(&seen), Some(("c".into(), taken.term.0, false)));
    let requeued = s.candidates().await;
    assert_eq!(requeued.len(), 2, "B queued again, behind C: {requeued:?}");
    assert_eq!(requeued[0], queued[2]);

    c.release(&taken).await.expect("release");
    let next = granted(b.acquire(&request("b")).await.expect("b's grant"));
    assert!(
        next.term > taken.term,
        "B's term {} must be above C's {} (B had queued before C's znode)",
        next.term,
        taken.term
    );
    let history = b.history(&lease(), 10).await.expect("history");
    let ended = |term| {
        history
            .iter()
            .find(|t| t.term == term)
            .and_then(|t| t.ended)
            .map(|(_, why)| why)
    };
    assert_eq!(ended(first.term), Some(EndReason::HandedOver), "{history:?}");
    assert_eq!(ended(taken.term), Some(EndReason::Released), "{history:?}");
    let terms: Vec<_> = history.iter().map(|t| t.term).collect();
    assert_eq!(terms, vec![first.term, taken.term, next.term], "{history:?}");
}

/// A reservation nobody takes: a takeover naming another version, or asked by a candidate that
/// is not the head of the queue, is answered `Held`; the head's takeover with the version it saw
/// is granted, with a term above the handed-over one.
#[tokio::test]
async fn only_the_queue_head_takes_over_an_untaken_reservation_by_its_version() {
    let Some(s) = setup().await else { return };
    let (a, b, d) = (s.store().await, s.store().await, s.store().await);
    let first = granted(a.acquire(&request("a")).await.expect("acquire"));
    held(b.acquire(&request("b")).await.expect("queue b"));
    held(d.acquire(&request("d")).await.expect("queue d"));
    a.hand_over(&first, &id("nobody")).await.expect("hand over");

    let seen = a.inspect(&lease()).await.expect("inspect");
    let holder = seen.holder.clone().expect("the reservation shows a holder");
    assert!(
        holder.reserved && holder.orphaned && holder.id == id("nobody") && holder.term == first.term,
        "{seen:?}"
    );
    assert_eq!(holder.ttl, TTL);
    assert_eq!(a.list("").await.expect("list"), vec![seen.clone()]);

    let answer = held(
        b.acquire(&takeover("b", "reserved-12345"))
            .await
            .expect("bogus takeover"),
    );
    assert_eq!(shows(&answer), shows(&seen), "another version takes nothing over");
    let answer = held(d.acquire(&takeover("d", &holder.version)).await.expect("d's takeover"));
    assert_eq!(shows(&answer), shows(&seen), "D is not the head of the queue");
    let taken = granted(b.acquire(&takeover("b", &holder.version)).await.expect("b's takeover"));
    assert!(taken.term > first.term);
    let seen = d.inspect(&lease()).await.expect("inspect");
    assert_eq!(shows(&seen), Some(("b".into(), taken.term.0, false)));
    let again = held(d.acquire(&takeover("d", &holder.version)).await.expect("late takeover"));
    assert_eq!(shows(&again), Some(("b".into(), taken.term.0, false)));
}

/// A handover wakes its successor's change stream at once, though the successor waits behind
/// another candidate (whose znode is still there): it needs no poll. A candidate queued behind
/// the successor is not woken by the handover.
#[tokio::test]
async fn a_handover_rings_the_successor_only() {
    let Some(s) = setup().await else { return };
    let (a, b, c, d) = (s.store().await, s.store().await, s.store().await, s.store().await);
    let first = granted(a.acquire(&request("a")).await.expect("acquire"));
    let mut streams = Vec::new();
    for (store, who) in [(&b, "b"), (&c, "c"), (&d, "d")] {
        let stream = store
            .changes(&lease(), &id(who))
            .await
            .expect("changes")
            .expect("ZooKeeper notifies");
        held(store.acquire(&request(who)).await.expect("queue"));
        streams.push(stream);
    }
    // Each stream polled all along, as the engine polls it; its yields reported.
    let (tx, mut woken) = tokio::sync::mpsc::unbounded_channel();
    for (who, mut stream) in ["b", "c", "d"].into_iter().zip(streams) {
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.next().await.is_some() {
                let _ = tx.send(who);
            }
        });
    }
    // Let the streams settle on their watches.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(woken.try_recv().is_err(), "nobody is woken before the handover");

    a.hand_over(&first, &id("c")).await.expect("hand over");
    let mut seen = Vec::new();
    while !seen.contains(&"c") {
        let who = tokio::time::timeout(TTL / 4, woken.recv())
            .await
            .unwrap_or_else(|_| panic!("the successor's stream yields at once, not after a poll; woken: {seen:?}"))
            .expect("the streams live");
        seen.push(who);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(who) = woken.try_recv() {
        seen.push(who);
    }
    assert!(
        !seen.contains(&"d"),
        "D, queued behind the successor, is not woken by the handover: {seen:?}"
    );
    let taken = granted(c.acquire(&request("c")).await.expect("c takes the lease"));
    assert!(taken.term > first.term);
}

/// Garbage in a lease's `reserved` znode is `Error::CorruptRecord` naming the lease and the
/// znode, for inspect and acquire alike; nothing is granted.
#[tokio::test]
async fn a_garbled_reservation_is_a_corrupt_record() {
    let Some(s) = setup().await else { return };
    let a = s.store().await;
    let first = granted(a.acquire(&request("a")).await.expect("acquire"));
    a.release(&first).await.expect("release");
    s.raw
        .create(
            &format!("{}/jobs/reserved", s.chroot),
            b"not a reservation",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("write garbage");
    for result in [
        a.inspect(&lease()).await.map(|_| ()),
        a.acquire(&request("b")).await.map(|_| ()),
    ] {
        match result {
            Err(e @ Error::CorruptRecord { .. }) => {
                let text = e.to_string();
                assert!(text.contains("jobs") && text.contains("reserved znode"), "{text}");
            }
            other => panic!("expected CorruptRecord, got {other:?}"),
        }
    }
}

/// `break_lease` of a reserved lease ends the reservation and returns the handed-over term: the
/// lease is free at once (its last term handed over), and the next candidate is granted with a
/// higher term. The successor, arriving late, is then told who holds it.
#[tokio::test]
async fn breaking_a_reservation_opens_the_lease() {
    let Some(s) = setup().await else { return };
    let (a, b, c) = (s.store().await, s.store().await, s.store().await);
    let first = granted(a.acquire(&request("a")).await.expect("acquire"));
    a.hand_over(&first, &id("c")).await.expect("hand over");
    assert_eq!(b.break_lease(&lease()).await.expect("break"), Some(first.term));
    let seen = b.inspect(&lease()).await.expect("inspect");
    assert!(
        seen.holder.is_none() && seen.last_term == first.term && seen.previous_end == Some(EndReason::HandedOver),
        "{seen:?}"
    );
    assert_eq!(b.break_lease(&lease()).await.expect("second break"), None);
    let next = granted(b.acquire(&request("b")).await.expect("b's acquire"));
    assert!(next.term > first.term);
    let seen = held(c.acquire(&request("c")).await.expect("c's acquire"));
    assert_eq!(shows(&seen), Some(("b".into(), next.term.0, false)));
}
