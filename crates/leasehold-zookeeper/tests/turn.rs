//! A waiting candidate's turn taken by a read (the `turn` module), beyond the shared scenario
//! `a_release_is_the_next_candidates_turn`: after a release the turn finds its records written
//! by the release; after a break (no release to write them) the turn's records are due, the
//! holder reads as the turn's term meanwhile, and the confirming renewal writes its history
//! entry and announcement; a break between the turn and its records ends the term once.
//! Against the ZooKeeper test server (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use futures::StreamExt;
use leasehold_conformance::require_server;
use leasehold_core::{Acquired, Change, EndReason, Grant, LeaseStore, Renewed, Transition, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use tokio::sync::mpsc;

use crate::common;
use common::{TTL, id, lease, request};

/// A holds the lease; B waits behind it as the engine does (its change stream asked for before
/// it queued), the stream polled all along; and an operator's store.
struct Scene {
    a: ZookeeperStore,
    b: ZookeeperStore,
    operator: ZookeeperStore,
    held: Grant,
    turns: mpsc::UnboundedReceiver<Change>,
    _forward: tokio::task::JoinHandle<()>,
}

async fn scene() -> Option<Scene> {
    let server = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL")?;
    let url = format!("{}/leasehold-turn-{:016x}", server.trim_end_matches('/'), random_u64());
    let connect = || ZookeeperStore::connect(&url);
    let (a, b, operator) = (
        connect().await.expect("a"),
        connect().await.expect("b"),
        connect().await.expect("operator"),
    );
    let Acquired::Granted(held) = a.acquire(&request("a")).await.expect("a's acquire") else {
        panic!("a fresh lease is granted");
    };
    let mut changes = b.changes(&lease(), &id("b")).await.expect("changes").expect("a stream");
    assert!(
        matches!(b.acquire(&request("b")).await.expect("b's acquire"), Acquired::Held(_)),
        "b queues behind a"
    );
    let (tx, turns) = mpsc::unbounded_channel();
    let forward = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    // Time for the stream to watch A's znode; what it said before is not what this is about.
    tokio::time::sleep(TTL / 4).await;
    let mut turns = turns;
    while turns.try_recv().is_ok() {}
    Some(Scene {
        a,
        b,
        operator,
        held,
        turns,
        _forward: forward,
    })
}

impl Scene {
    /// B's turn, within a TTL.
    async fn turn(&mut self) -> Grant {
        let wait = async {
            loop {
                match self.turns.recv().await.expect("b's stream ended") {
                    Change::YourTurn(turn) => return turn.grant,
                    _ => continue,
                }
            }
        };
        let grant = tokio::time::timeout(TTL, wait).await.expect("b's turn within a TTL");
        assert_eq!((&grant.holder, grant.ttl), (&id("b"), TTL));
        assert!(grant.term > self.held.term, "{} > {}", grant.term, self.held.term);
        grant
    }

    async fn history(&self) -> Vec<Transition> {
        self.operator.history(&lease(), 10).await.expect("history")
    }

    /// Who the operator's `inspect` shows, at which term.
    async fn shows(&self) -> Option<(String, u64)> {
        let seen = self.operator.inspect(&lease()).await.expect("inspect");
        seen.holder.map(|h| (h.id.to_string(), h.term.0))
    }
}

fn ended(t: &Transition) -> Option<EndReason> {
    t.ended.map(|(_, reason)| reason)
}

/// A releases: its release hands the lease to waiting B in its own transaction (B's history
/// entry and announcement), so B's turn is a read and nothing is due: the history shows B's
/// term before B's first renewal.
#[tokio::test]
async fn a_turn_after_a_release_finds_its_records_written() {
    let Some(mut s) = scene().await else { return };
    s.a.release(&s.held).await.expect("a's release");
    let turn = s.turn().await;
    let history = s.history().await;
    let terms: Vec<_> = history
        .iter()
        .map(|t| (t.term, t.holder.to_string(), ended(t)))
        .collect();
    assert_eq!(
        terms,
        vec![
            (s.held.term, "a".into(), Some(EndReason::Released)),
            (turn.term, "b".into(), None)
        ]
    );
    assert_eq!(s.shows().await, Some(("b".into(), turn.term.0)));
    assert!(matches!(s.b.renew(&turn).await.expect("renew"), Renewed::Renewed(_)));
    assert_eq!(s.history().await.len(), 2, "the renewal writes nothing more");
    s.b.release(&turn).await.expect("b's release");
}

/// An operator breaks A's term: no release writes B's records, so B's turn leads with them due.
/// Meanwhile B reads as the holder at the turn's term (never free); B's confirming renewal
/// writes its history entry and announces it.
#[tokio::test]
async fn after_a_break_the_turns_records_are_written_by_its_renewal() {
    let Some(mut s) = scene().await else { return };
    let mut announced = s
        .operator
        .announcements(&lease())
        .await
        .expect("announcements")
        .expect("a stream");
    assert_eq!(
        s.operator.break_lease(&lease()).await.expect("break"),
        Some(s.held.term)
    );
    let turn = s.turn().await;
    assert_eq!(
        s.shows().await,
        Some(("b".into(), turn.term.0)),
        "the turn reads as B's term before its records"
    );
    let listed = s.operator.list("").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].holder.as_ref().map(|h| (h.id.to_string(), h.term)),
        Some(("b".into(), turn.term)),
        "list shows the same"
    );
    let before: Vec<_> = s.history().await.iter().map(|t| (t.term, ended(t))).collect();
    assert_eq!(
        before,
        vec![(s.held.term, Some(EndReason::Broken))],
        "no entry for B's term before its renewal"
    );

    assert!(matches!(s.b.renew(&turn).await.expect("renew"), Renewed::Renewed(_)));
    let after: Vec<_> = s
        .history()
        .await
        .iter()
        .map(|t| (t.term, t.holder.to_string(), ended(t)))
        .collect();
    assert_eq!(
        after,
        vec![
            (s.held.term, "a".into(), Some(EndReason::Broken)),
            (turn.term, "b".into(), None)
        ],
        "the renewal wrote B's entry"
    );
    let seen = tokio::time::timeout(TTL, async {
        loop {
            let seen = announced.next().await.expect("the announcements end");
            if seen.holder.as_ref().is_some_and(|h| h.id == id("b")) {
                return seen;
            }
        }
    })
    .await
    .expect("B announced within a TTL of its renewal");
    assert_eq!(seen.holder.map(|h| h.term), Some(turn.term));
    assert_eq!(s.shows().await, Some(("b".into(), turn.term.0)));
    assert!(matches!(s.b.renew(&turn).await.expect("renew"), Renewed::Renewed(_)));
    assert_eq!(s.history().await.len(), 2, "written once");
    s.b.release(&turn).await.expect("b's release");
}

/// A break between B's turn and its records' write ends B's term (recorded as broken, once):
/// B's renewal finds it lost and writes nothing, and the lease reads as free.
#[tokio::test]
async fn a_break_before_the_turns_records_ends_its_term_once() {
    let Some(mut s) = scene().await else { return };
    assert_eq!(
        s.operator.break_lease(&lease()).await.expect("break a"),
        Some(s.held.term)
    );
    let turn = s.turn().await;
    assert_eq!(
        s.operator.break_lease(&lease()).await.expect("break b"),
        Some(turn.term),
        "the operator breaks B's turn, records due or not"
    );
    assert!(
        matches!(s.b.renew(&turn).await.expect("renew"), Renewed::Lost(_)),
        "B's renewal finds its term ended"
    );
    let history: Vec<_> = s
        .history()
        .await
        .iter()
        .map(|t| (t.term, t.holder.to_string(), ended(t)))
        .collect();
    assert_eq!(
        history,
        vec![
            (s.held.term, "a".into(), Some(EndReason::Broken)),
            (turn.term, "b".into(), Some(EndReason::Broken))
        ]
    );
    let seen = s.operator.inspect(&lease()).await.expect("inspect");
    assert!(seen.holder.is_none(), "{seen:?}");
    assert_eq!(
        (seen.last_term, seen.previous_end),
        (turn.term, Some(EndReason::Broken))
    );
}
