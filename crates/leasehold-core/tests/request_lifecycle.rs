//! The engine owns every store call's lifecycle: the driver polls it, a call the machine stops
//! waiting for (its `request_timeout` passed) runs on in a task of its own to completion, and
//! only a call still running a TTL after it was sent is cut off. Stores need not be cancel safe
//! for the engine's sake: no backend has to spawn, detach or queue its requests to survive a
//! dropped future.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Elector, Grant, LeaseName, LeaseStore, MemoryStore,
    Observation, Renewed, Result, Transition,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// What happened to each acquire call: when it started, and when it completed or was dropped.
#[derive(Debug, Default)]
struct Calls {
    started: Vec<Instant>,
    completed: Vec<Instant>,
    dropped: Vec<Instant>,
}

/// A memory store whose acquire takes `delay` (`None`: never answers); the first acquire may
/// panic (`panic_first`).
#[derive(Debug, Clone)]
struct SlowAcquire {
    inner: MemoryStore,
    delay: Option<Duration>,
    calls: Arc<Mutex<Calls>>,
    panic_first: Panic,
    /// Only the first acquire takes `delay`; the others are answered at once.
    only_first: bool,
}

/// When the first acquire panics, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Panic {
    Never,
    /// As soon as it is called: in its future's first poll, before any await.
    AtOnce,
    /// After its delay: in a later poll, while the driver waits for it.
    AfterItsDelay,
}

/// Records a drop before completion.
struct DropWatch {
    calls: Arc<Mutex<Calls>>,
    done: bool,
}

impl Drop for DropWatch {
    fn drop(&mut self) {
        if !self.done
            && let Ok(mut calls) = self.calls.lock()
        {
            calls.dropped.push(Instant::now());
        }
    }
}

#[async_trait]
impl LeaseStore for SlowAcquire {
    fn name(&self) -> &'static str {
        "slow"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let first = {
            let mut calls = self.calls.lock().unwrap();
            calls.started.push(Instant::now());
            calls.started.len() == 1
        };
        assert!(
            !(first && self.panic_first == Panic::AtOnce),
            "the first acquire panics"
        );
        let mut watch = DropWatch {
            calls: self.calls.clone(),
            done: false,
        };
        match self.delay {
            _ if self.only_first && !first => {}
            Some(delay) => sleep(delay).await,
            None => std::future::pending::<()>().await,
        }
        assert!(
            !(first && self.panic_first == Panic::AfterItsDelay),
            "the first acquire panics after its delay"
        );
        let reply = self.inner.acquire(request).await;
        watch.done = true;
        self.calls.lock().unwrap().completed.push(Instant::now());
        reply
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.inner.renew(grant).await
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
}

fn elector(store: &SlowAcquire) -> Elector {
    Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id("a")
        .ttl(TTL)
        .renew_every(Duration::from_secs(3))
        .request_timeout(REQUEST_TIMEOUT)
        .jitter(0.0)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_call_the_machine_stopped_waiting_for_runs_to_completion() {
    let store = SlowAcquire {
        inner: MemoryStore::new(),
        delay: Some(REQUEST_TIMEOUT * 2),
        calls: Arc::default(),
        panic_first: Panic::Never,
        only_first: false,
    };
    let elector = elector(&store);
    let campaign = tokio::spawn(async move { elector.campaign().await });
    sleep(REQUEST_TIMEOUT * 2 + Duration::from_millis(10)).await;
    {
        let calls = store.calls.lock().unwrap();
        assert!(!calls.started.is_empty(), "{calls:?}");
        let first = calls.started[0];
        assert!(calls.dropped.is_empty(), "a store call was dropped half-way: {calls:?}");
        assert_eq!(
            calls.completed.first().copied(),
            Some(first + REQUEST_TIMEOUT * 2),
            "the first acquire ran to completion after the machine had given up on it: {calls:?}"
        );
    }
    campaign.abort();
}

#[tokio::test(start_paused = true)]
async fn a_call_that_never_answers_is_cut_off_one_ttl_after_it_was_sent() {
    let store = SlowAcquire {
        inner: MemoryStore::new(),
        delay: None,
        calls: Arc::default(),
        panic_first: Panic::Never,
        only_first: false,
    };
    let elector = elector(&store);
    let campaign = tokio::spawn(async move { elector.campaign().await });
    sleep(TTL + Duration::from_millis(10)).await;
    {
        let calls = store.calls.lock().unwrap();
        let first = calls.started[0];
        assert!(calls.completed.is_empty(), "{calls:?}");
        assert_eq!(
            calls.dropped.first().copied(),
            Some(first + TTL),
            "the engine's bound on a store call is the TTL: {calls:?}"
        );
        // The machine kept retrying meanwhile: it did not wait for the hung call.
        assert!(calls.started.len() >= 2, "{calls:?}");
    }
    campaign.abort();
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_comes_after_the_machine_gave_up_reaches_it() {
    // The first acquire is granted 6 s after it was sent; the machine gave up on it at 3 s and
    // read back in the same step. Its late reply must still reach the machine, which adopts it
    // (counted from the first send: it is ours, the store holds it for us), instead of it being
    // lost with the driver's handle on the call and the lease held by nobody's knowledge.
    let store = SlowAcquire {
        inner: MemoryStore::new(),
        delay: Some(REQUEST_TIMEOUT * 2),
        calls: Arc::default(),
        panic_first: Panic::Never,
        only_first: false,
    };
    let elector = elector(&store);
    let leader = tokio::time::timeout(TTL, elector.campaign())
        .await
        .expect("elected within a TTL")
        .expect("campaign");
    assert_eq!(leader.term().0, 1, "the first (late) grant is the one adopted");
    let first = store.calls.lock().unwrap().started[0];
    assert!(
        leader.elected_at() <= (first + REQUEST_TIMEOUT * 2 + Duration::from_millis(10)).into_std(),
        "elected when the late grant came"
    );
}

/// `run_until` returns only once its election's driver is done: a shutdown that comes while an
/// acquire is still out (applied later, granted) waits for that call and for the release of what
/// it granted. A lease group's next campaign of a shard relies on it: it starts once the previous
/// one's `run_until` returned, and an acquire of the old one landing after it would end the new
/// one's term (a store gives a candidate's acquire a new term over its own record).
#[tokio::test(start_paused = true)]
async fn run_until_returns_once_a_late_acquire_is_settled_and_released() {
    let store = SlowAcquire {
        inner: MemoryStore::new(),
        delay: Some(REQUEST_TIMEOUT * 2),
        calls: Arc::default(),
        panic_first: Panic::Never,
        only_first: false,
    };
    let elector = elector(&store);
    let started = Instant::now();
    let shutdown = sleep(Duration::from_millis(100));
    elector
        .run_until(
            |_leader| async { std::future::pending::<Result<(), std::convert::Infallible>>().await },
            shutdown,
        )
        .await
        .unwrap();
    let returned = Instant::now();
    {
        let calls = store.calls.lock().unwrap();
        assert_eq!(
            calls.completed.first().copied(),
            Some(started + REQUEST_TIMEOUT * 2),
            "{calls:?}"
        );
        assert!(
            returned >= started + REQUEST_TIMEOUT * 2,
            "run_until returned {:?} after the start, before its acquire was answered",
            returned - started
        );
    }
    let lease = LeaseName::new("jobs").unwrap();
    let obs = store.inner.inspect(&lease).await.unwrap();
    assert_eq!(obs.holder, None, "the late grant is released before run_until returns");
}

/// Finding 3 of issue 31: a leader whose task returns at once steps down, and `run_until`
/// returns; an acquire its machine gave up on before (sent at 0 s, applied at 9 s, TTL 10 s)
/// lands after that and grants a term that nobody renews or releases, so every other candidate
/// waits a TTL. The driver now waits for the acquires it gave up on once leadership ended, and
/// gives back what they grant: `run_until` returns once the late grant is released.
#[tokio::test(start_paused = true)]
async fn an_acquire_given_up_on_cannot_land_after_run_until_returned() {
    let store = SlowAcquire {
        inner: MemoryStore::new(),
        delay: Some(Duration::from_secs(9)),
        calls: Arc::default(),
        panic_first: Panic::Never,
        only_first: true,
    };
    let elector = elector(&store);
    let started = Instant::now();
    elector
        .run_until(
            |_leader| async { Ok::<(), std::convert::Infallible>(()) },
            std::future::pending(),
        )
        .await
        .unwrap();
    let returned = Instant::now() - started;
    sleep((started + Duration::from_secs(9) + Duration::from_millis(100)).saturating_duration_since(Instant::now()))
        .await;
    let lease = LeaseName::new("jobs").unwrap();
    let obs = store.inner.inspect(&lease).await.unwrap();
    let history = store.inner.history(&lease, 10).await.unwrap();
    assert_eq!(
        obs.holder, None,
        "run_until returned after {returned:?}; the acquire sent at 0 s was granted at 9 s and is still held: \
         {history:?}"
    );
    assert!(
        returned >= Duration::from_secs(9),
        "run_until returned after {returned:?}"
    );
}

/// The driver polls each call itself until it is answered (or the machine gives up on it and it
/// runs on in a task of its own): a store that panics there, in the call's first poll or in a
/// later one, fails that call with a transient error, as a panic in the call's own task does,
/// and the campaign goes on; the panic does not end the driver.
#[tokio::test(start_paused = true)]
async fn a_store_call_that_panics_fails_only_that_call() {
    for panic in [Panic::AtOnce, Panic::AfterItsDelay] {
        let store = SlowAcquire {
            inner: MemoryStore::new(),
            delay: Some(Duration::from_millis(50)),
            calls: Arc::default(),
            panic_first: panic,
            only_first: false,
        };
        let elector = elector(&store);
        let mut events = elector.events();
        let leader = tokio::time::timeout(TTL, elector.campaign())
            .await
            .expect("elected within a TTL")
            .expect("campaign");
        assert!(
            store.calls.lock().unwrap().started.len() >= 2,
            "{panic:?}: asked again after the panic"
        );
        let trouble = std::iter::from_fn(|| events.try_recv().ok()).find_map(|e| match e {
            leasehold_core::Event::StoreTrouble { error } => Some(error.to_string()),
            _ => None,
        });
        assert!(
            trouble.as_deref().is_some_and(|e| e.contains("panicked")),
            "{panic:?}: the panic is reported as the call's trouble: {trouble:?}"
        );
        leader.resign().await;
    }
}
