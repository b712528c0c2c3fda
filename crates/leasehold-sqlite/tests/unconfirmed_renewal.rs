//! A leader whose renewal is not confirmed by its step-down point releases the lease once its
//! work has stopped, rather than leaving it held until it expires; and one whose renewal shows
//! a newer term of its own (an acquire of its own applied late) releases that term.
//!
//! The case seen once in the benchmark's 100-candidate transitions (release build): a new leader
//! stepped down shortly after its first renewal and sent no release; its acquire had timed out and
//! a read-back had shown the grant; the lease then stayed held for a whole TTL (a store without a
//! clock: contenders wait until they have seen the same version unchanged for a TTL). Here the
//! store is made slow for one candidate on purpose: its acquire and its renewals are applied at
//! once but their replies come only after `request_timeout`. Real time, TTL 2 s: about 2 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, Elector, EndReason, Error, Event,
    Grant, LeaseName, LeaseStore, Observation, Renewed, Result, Term, Transition, async_trait,
};
use leasehold_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(2);
/// Longer than the default `request_timeout` (`ttl / 3`), shorter than the engine's bound on a
/// call (`ttl`): the engine gives up waiting and reads back, the reply still comes later.
const HOLD: Duration = Duration::from_millis(1_500);

/// A store whose acquire (while `slow_acquire`) and renewals (while `slow_renew`) are applied at
/// once and answered `HOLD` later.
#[derive(Debug)]
struct SlowReplies {
    inner: Arc<dyn LeaseStore>,
    slow_acquire: AtomicBool,
    slow_renew: AtomicBool,
}

impl SlowReplies {
    async fn held_if<T>(flag: &AtomicBool, reply: T) -> T {
        if flag.load(Ordering::SeqCst) {
            tokio::time::sleep(HOLD).await;
        }
        reply
    }
}

#[async_trait]
impl LeaseStore for SlowReplies {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let reply = self.inner.acquire(request).await;
        // Only a grant's reply is held: an acquire answered `Held` while the flag goes up must
        // not time out (its unknown outcome would bound what a later read-back may believe).
        if !matches!(reply, Ok(Acquired::Granted(_))) {
            return reply;
        }
        Self::held_if(&self.slow_acquire, reply).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let reply = self.inner.renew(grant).await;
        Self::held_if(&self.slow_renew, reply).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.release(grant).await
    }
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.inner.withdraw(lease, candidate).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.inner.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.inner.changes(lease, candidate).await
    }
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.inner.announcements(lease).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_deposed_by_an_unconfirmed_renewal_releases_once_its_work_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let direct: Arc<dyn LeaseStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let slow = Arc::new(SlowReplies {
        inner: Arc::new(SqliteStore::open(&path).await.unwrap()),
        slow_acquire: AtomicBool::new(false),
        slow_renew: AtomicBool::new(true),
    });
    let elector = |store: Arc<dyn LeaseStore>, id: &str| {
        Elector::builder(store, "jobs")
            .ttl(TTL)
            .candidate_id(id)
            .build()
            .unwrap()
    };
    let b = elector(direct.clone(), "b");
    let a = elector(slow.clone(), "a");
    let lease = LeaseName::new("jobs").unwrap();

    // b leads term 1; a's first acquire is answered Held (a has now seen term 1).
    let b_leader = b.campaign().await.unwrap();
    assert_eq!(b_leader.term(), Term(1));
    let mut a_events = a.events();
    let a_campaign = tokio::spawn({
        let a = a.clone();
        async move { a.campaign().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!a_campaign.is_finished());

    // b resigns; a's acquire is applied but answered too late: a reads back, finds its grant and
    // is elected, believing it from the acquire's send. Its first renewal is overdue (the
    // acquire was sent more than renew_every ago) and goes unanswered past the step-down point.
    slow.slow_acquire.store(true, Ordering::SeqCst);
    b_leader.resign().await;
    let a_leader = tokio::time::timeout(TTL * 2, a_campaign)
        .await
        .expect("a is elected from its read-back")
        .unwrap()
        .unwrap();
    assert_eq!(a_leader.term(), Term(2));
    // Elected after the acquire timed out (so from the read-back).
    let mut acquire_timed_out = false;
    loop {
        match a_events.recv().await.unwrap() {
            Event::StoreTrouble { error } => {
                acquire_timed_out |= matches!(
                    &*error,
                    Error::Timeout {
                        operation: "acquire",
                        ..
                    }
                );
            }
            Event::Elected { .. } => break,
            _ => {}
        }
    }
    assert!(acquire_timed_out, "a was elected by its acquire's own reply");
    // The machine's own step-down (nobody polls the handle, as in the benchmark): the leader a
    // sees becomes nobody.
    tokio::time::timeout(TTL, async {
        loop {
            if let Event::LeaderChanged(None) = a_events.recv().await.unwrap() {
                break;
            }
        }
    })
    .await
    .expect("a steps down at valid_until - step_down_margin");

    // The work stops at once (before `valid_until`, when work still running is aborted and
    // nothing is released). The store still recorded a's term (the renewal was applied): the
    // history below shows it ended by a release, not left to expire.
    a_leader.resign().await;
    let now = direct.inspect(&lease).await.unwrap();
    assert!(now.holder.is_none(), "the lease is still held: {now:?}");
    let history = direct.history(&lease, 10).await.unwrap();
    let term_2 = history
        .iter()
        .find(|t| t.term == Term(2))
        .expect("term 2 in the history");
    assert_eq!(term_2.holder.as_str(), "a");
    assert!(
        matches!(term_2.ended, Some((_, EndReason::Released))),
        "term 2 ended {:?}",
        term_2.ended
    );
}

/// SQLite gives a candidate's acquire a new term over its own record. An acquire of the leader's
/// own applied late (here: made directly) makes its record term 2 while it leads term 1; the
/// next renewal is answered `Lost`, showing the leader itself at term 2, which nobody believes.
/// Once the work has stopped, term 2 is released rather than left held until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_term_of_the_leaders_own_that_supersedes_it_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let direct: Arc<dyn LeaseStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let a = Elector::builder(Arc::new(SqliteStore::open(&path).await.unwrap()), "jobs")
        .ttl(TTL)
        .candidate_id("a")
        .build()
        .unwrap();
    let lease = LeaseName::new("jobs").unwrap();
    let mut a_events = a.events();
    let a_leader = a.campaign().await.unwrap();
    assert_eq!(a_leader.term(), Term(1));
    let late = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new("a").unwrap(),
        ttl: TTL,
        takeover: None,
    };
    let Acquired::Granted(newer) = direct.acquire(&late).await.unwrap() else {
        panic!("SQLite grants a candidate a new term over its own record")
    };
    assert_eq!(newer.term, Term(2));
    // The next renewal (within renew_every) finds term 2: a is deposed, and reports itself at
    // term 2 as the holder it sees.
    tokio::time::timeout(TTL, async {
        loop {
            if let Event::LeaderChanged(Some(info)) = a_events.recv().await.unwrap()
                && info.term == Term(2)
            {
                break;
            }
        }
    })
    .await
    .expect("a's renewal is answered Lost, showing term 2");
    a_leader.resign().await;
    let now = direct.inspect(&lease).await.unwrap();
    assert!(now.holder.is_none(), "the lease is still held: {now:?}");
    let history = direct.history(&lease, 10).await.unwrap();
    let term_2 = history
        .iter()
        .find(|t| t.term == Term(2))
        .expect("term 2 in the history");
    assert!(
        matches!(term_2.ended, Some((_, EndReason::Released))),
        "term 2 ended {:?}",
        term_2.ended
    );
}
