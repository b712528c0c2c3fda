//! What a service needs that `leasehold run` has: a give-up policy for a store that refuses us,
//! a health check, and the reservation of a hand-over visible in `observe()`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, Elector, Error, Grant, Health, LeaseName, LeaseStore,
    MemoryStore, Observation, Renewed, Result, RunError, Transition, async_trait,
};

const TTL: Duration = Duration::from_secs(2);
const OK: u8 = 0;
const REFUSE: u8 = 1;
const DOWN: u8 = 2;

/// The memory store, which can be made to refuse every request (a wrong password) or to be
/// unreachable.
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryStore,
    mode: AtomicU8,
}

impl Flaky {
    fn check(&self, operation: &'static str) -> Result<()> {
        match self.mode.load(Ordering::SeqCst) {
            REFUSE => Err(Error::refused(
                "flaky",
                operation,
                "authentication failed: check the password",
            )),
            DOWN => Err(Error::unreachable("flaky", "connection refused")),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl LeaseStore for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.check("acquire")?;
        self.inner.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.check("renew")?;
        self.inner.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.check("release")?;
        self.inner.release(grant).await
    }
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.check("hand_over")?;
        self.inner.hand_over(grant, to).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.check("inspect")?;
        self.inner.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.inner.changes(lease, candidate).await
    }
}

fn elector(store: &Arc<Flaky>, id: &str) -> leasehold_core::ElectorBuilder {
    Elector::builder(store.clone(), "parity").ttl(TTL).candidate_id(id)
}

/// With `give_up_when_refused_for(10 s)`, a campaign against a store that refuses us ends with
/// the refusal after 10 s of it; `run` returns it as an election error. Without it, the
/// campaign goes on.
#[tokio::test(start_paused = true)]
async fn a_campaign_gives_up_after_refusals_for_the_configured_time() {
    let store = Arc::new(Flaky::default());
    store.mode.store(REFUSE, Ordering::SeqCst);
    let patient = elector(&store, "patient").build().unwrap();
    let patient = tokio::spawn(async move { patient.campaign().await.map(|_| ()) });
    let give_up = Duration::from_secs(10);
    let elector = elector(&store, "a").give_up_when_refused_for(give_up).build().unwrap();
    let started = tokio::time::Instant::now();
    let error = elector.campaign().await.expect_err("gives up");
    let took = started.elapsed();
    assert!(matches!(error, Error::Refused { .. }), "{error}");
    assert!(error.to_string().contains("authentication failed"), "{error}");
    assert!(took >= give_up && took <= give_up + TTL, "gave up after {took:?}");
    let run = elector.run(|_leader| async { Ok::<(), Error>(()) }).await;
    assert!(matches!(run, Err(RunError::Election(Error::Refused { .. }))), "{run:?}");
    // The default: still campaigning a minute later.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!patient.is_finished(), "a campaign without the option gave up");
    patient.abort();
}

/// Refusals interrupted by something else (the store answering) start over.
#[tokio::test(start_paused = true)]
async fn refusals_with_answers_in_between_do_not_give_up() {
    let memory = MemoryStore::new();
    let holder = Elector::builder(Arc::new(memory.clone()), "parity")
        .ttl(TTL)
        .candidate_id("holder")
        .build()
        .unwrap();
    let leader = holder.campaign().await.unwrap();
    // Only this candidate's own requests are refused now and then.
    let store = Arc::new(Flaky {
        inner: memory,
        mode: AtomicU8::new(OK),
    });
    let elector = elector(&store, "a")
        .give_up_when_refused_for(Duration::from_secs(10))
        .build()
        .unwrap();
    let flipper = {
        let store = store.clone();
        tokio::spawn(async move {
            for _ in 0..6 {
                store.mode.store(REFUSE, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(6)).await;
                store.mode.store(OK, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        })
    };
    let campaign = tokio::time::timeout(Duration::from_secs(50), elector.campaign()).await;
    flipper.abort();
    match campaign {
        Err(_) => {}
        Ok(outcome) => panic!("the campaign ended: {:?}", outcome.map(|l| l.term())),
    }
    drop(leader);
}

/// `Health`: healthy until the store is in trouble; unhealthy for a TTL after the last
/// trouble unless the store answers; ready only while leading.
#[tokio::test(start_paused = true)]
async fn health_follows_store_trouble_within_a_ttl() {
    let store = Arc::new(Flaky::default());
    let elector = elector(&store, "a").build().unwrap();
    let health = Health::new(&elector);
    assert!(health.healthy().is_ok() && !health.ready());
    let leader = elector.campaign().await.unwrap();
    tokio::task::yield_now().await;
    assert!(health.healthy().is_ok() && health.ready());
    store.mode.store(DOWN, Ordering::SeqCst);
    // The renewals fail: the leader steps down, and the store's trouble shows.
    leader.cancelled().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let trouble = health.healthy().expect_err("store trouble");
    assert!(trouble.to_string().contains("connection refused"), "{trouble}");
    assert!(!health.ready());
    // Store back: elected again, healthy at once.
    store.mode.store(OK, Ordering::SeqCst);
    let again = tokio::time::timeout(Duration::from_secs(30), elector.campaign())
        .await
        .expect("elected again")
        .unwrap();
    tokio::task::yield_now().await;
    assert!(health.healthy().is_ok() && health.ready());
    drop(again);
}

/// After a hand-over to a candidate that is not campaigning, `observe()` shows it with
/// `reserved`, not as a leader in office; once someone takes the lease, `reserved` is gone.
#[tokio::test(start_paused = true)]
async fn observe_shows_a_reservation_as_reserved() {
    let store = Arc::new(Flaky::default());
    let a = elector(&store, "a").build().unwrap();
    let first = a.campaign().await.unwrap();
    let c = elector(&store, "c").build().unwrap();
    let mut sees = c.observe();
    let follower = tokio::spawn(async move { c.campaign().await });
    sees.wait_for(|l| l.as_ref().is_some_and(|l| l.holder.as_str() == "a"))
        .await
        .unwrap();
    assert!(!sees.borrow().as_ref().unwrap().reserved);
    first.hand_over(&CandidateId::new("ghost").unwrap()).await;
    let seen = tokio::time::timeout(
        Duration::from_secs(1),
        sees.wait_for(|l| l.as_ref().is_some_and(|l| l.holder.as_str() == "ghost")),
    )
    .await
    .expect("the reservation seen")
    .unwrap()
    .clone()
    .unwrap();
    assert!(seen.reserved, "{seen:?}");
    // The ghost never takes it: after the TTL, c does, and leads in office.
    let leader = tokio::time::timeout(TTL * 5, follower).await.unwrap().unwrap().unwrap();
    assert!(leader.term() > seen.term);
}
