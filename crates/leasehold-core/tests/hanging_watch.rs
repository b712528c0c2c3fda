//! Streams that hang or end: a store whose change notifications never answer must not stall a
//! campaign (found by the conformance suite: the driver once awaited `changes()` without a
//! timeout), and a follower whose announcements end must still hear of the next leader.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, Announces, CandidateId, Capabilities, Changes, Elector, Grant, LeaderInfo,
    LeaseName, LeaseStore, MemoryStore, Notifications, Observation, Renewed, Result, Term, Transition,
};

/// A store whose change-notification call never answers, as a watch request lost in a network
/// partition does with a client that has no timeout of its own. Everything else works.
#[derive(Debug)]
struct ChangesNeverAnswer(MemoryStore);

#[async_trait]
impl LeaseStore for ChangesNeverAnswer {
    fn name(&self) -> &'static str {
        "changes-never-answer"
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.0.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.0.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.0.release(grant).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.0.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.0.history(lease, limit).await
    }
    async fn changes(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<Option<Changes>> {
        std::future::pending().await
    }
}

/// The driver awaits `store.changes()` before its loop with no `request_timeout`, so a
/// notification call that hangs keeps the candidate from ever sending an acquire (and a dropped
/// `campaign()` leaves the driver task stuck forever). Expected: the call is bounded by
/// `request_timeout`, after which the candidate polls, and wins the free lease.
#[tokio::test]

async fn a_hanging_changes_call_does_not_stop_the_campaign() {
    let store = Arc::new(ChangesNeverAnswer(MemoryStore::new()));
    let elector = Elector::builder(store.clone(), "free-lease")
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let campaign = tokio::time::timeout(Duration::from_secs(3), elector.campaign()).await;
    let acquires = store.0.history(elector.lease(), 10).await.unwrap().len();
    assert!(
        campaign.is_ok(),
        "the free lease was not won within 3 TTLs ({acquires} grants): the driver is stuck in changes()"
    );
}

/// A store shaped like ZooKeeper after a server restart: it announces grants only, says its
/// change notifications cover expiry (so a follower that has seen the holder waits for them,
/// with only a safety poll 10 TTLs away), but its change streams have gone silent, and its
/// announcement streams end when [`Self::end_announcements`] is called (the session that
/// carried them ended). A stream asked for afterwards works.
#[derive(Debug)]
struct AnnouncementsEnd {
    store: MemoryStore,
    ended: tokio::sync::watch::Sender<u64>,
}

impl AnnouncementsEnd {
    fn end_announcements(&self) {
        self.ended.send_modify(|n| *n += 1);
    }
}

#[async_trait]
impl LeaseStore for AnnouncementsEnd {
    fn name(&self) -> &'static str {
        "announcements-end"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            notifications: Notifications::ReleaseAndExpiry,
            announces: Announces::Grants,
            ..self.store.capabilities()
        }
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.store.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.store.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.store.release(grant).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.store.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.store.history(lease, limit).await
    }
    async fn changes(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(Some(Box::pin(futures::stream::pending())))
    }
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let Some(all) = self.store.announcements(lease).await? else {
            return Ok(None);
        };
        let mut ended = self.ended.subscribe();
        ended.borrow_and_update();
        let mut last = Term(0);
        let grants = all.filter(move |o| {
            let term = o.holder.as_ref().map_or(Term(0), |h| h.term);
            let new = term > last;
            last = last.max(term);
            std::future::ready(new)
        });
        Ok(Some(Box::pin(grants.take_until(async move {
            let _ = ended.changed().await;
        }))))
    }
}

/// A follower whose announcements end (a ZooKeeper session that ended with a server restart)
/// must hear of the next leader all the same: the driver once dropped the ended stream of a store
/// that announces grants only, and never asked again, so with silent change notifications the
/// follower did not see a new leader until its safety poll, 10 TTLs later (found by the suite's
/// `store_restart_then_leader_crash` on ZooKeeper, under load). Expected: the ended stream makes
/// the follower read within a retry interval and ask for announcements again, which then tell it
/// of the next leader at once.
#[tokio::test]
async fn a_follower_whose_announcements_end_hears_of_the_next_leader() {
    let ttl = Duration::from_secs(1);
    let store = Arc::new(AnnouncementsEnd {
        store: MemoryStore::new(),
        ended: tokio::sync::watch::channel(0).0,
    });
    let elector = |id: &str| {
        Elector::builder(store.clone(), "announced")
            .ttl(ttl)
            .candidate_id(id)
            .build()
            .unwrap()
    };
    let (a, b, c) = (elector("a"), elector("b"), elector("c"));
    let first = a.campaign().await.unwrap();
    let mut b_sees = b.observe();
    let follower = tokio::spawn(async move { b.campaign().await.map(drop) });
    let sees = |holder: &'static str, term: Term| {
        move |l: &Option<LeaderInfo>| {
            l.as_ref()
                .is_some_and(|l| l.holder.as_str() == holder && l.term >= term)
        }
    };
    let waited = tokio::time::timeout(ttl * 2, b_sees.wait_for(sees("a", first.term()))).await;
    assert!(waited.is_ok_and(|r| r.is_ok()), "b never saw a lead");
    store.end_announcements();
    tokio::time::sleep(ttl / 2).await;
    first.resign().await;
    let second = tokio::time::timeout(ttl * 3, c.campaign())
        .await
        .expect("c wins the released lease")
        .unwrap();
    let waited = tokio::time::timeout(ttl / 2, b_sees.wait_for(sees("c", second.term())))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(
        waited,
        "b did not see c lead at term {} within TTL/2 of its election (it sees {:?})",
        second.term(),
        b_sees.borrow().as_ref().map(|l| (l.holder.clone(), l.term))
    );
    follower.abort();
}
