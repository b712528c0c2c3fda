//! The failover and handover histograms tell the truth: one crash, one release and one
//! hand-over each land once, in their own series, with the time the store itself saw
//! (within 10%).
//!
//! Paused time; every store reply comes [`REPLY`] after the store applied the request (a
//! notification at once), so each interval has a size. Two stores: the `MemoryStore` as it is
//! (a new record version with every renewal, renewals announced), and the same store shaped like
//! Redis with expiry events (one version per term, as its token; grants and ends announced,
//! renewals not; an expiry wakes the followers, who do not read the lease meanwhile).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, Announces, CandidateId, Capabilities, Changes, Elector, Grant, LeaseName,
    LeaseStore, MemoryStore, Notifications, Observation, Renewed, Result, Transition, async_trait,
};
use metrics::{Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
const REPLY: Duration = Duration::from_millis(20);

// ---- a recorder of histogram samples (thread-local: these tests run on one thread) ----

type Samples = Arc<Mutex<BTreeMap<String, Vec<f64>>>>;

#[derive(Default)]
struct Recording(Samples);

struct Series(String, Samples);

impl HistogramFn for Series {
    fn record(&self, value: f64) {
        self.1.lock().unwrap().entry(self.0.clone()).or_default().push(value);
    }
}

impl Recorder for Recording {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        Histogram::from_arc(Arc::new(Series(series, self.0.clone())))
    }
}

/// The failover and handover samples.
fn recorded(samples: &Samples) -> BTreeMap<String, Vec<f64>> {
    samples
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| s.starts_with("leasehold_failover_seconds") || s.starts_with("leasehold_handover_seconds"))
        .map(|(s, v)| (s.clone(), v.clone()))
        .collect()
}

// ---- the store: MemoryStore, replies late, optionally shaped like Redis ----

#[derive(Clone, Debug)]
struct Shaped {
    inner: MemoryStore,
    like_redis: bool,
    /// When the store last applied a renewal, a release or a hand-over.
    applied: Arc<Mutex<BTreeMap<&'static str, Instant>>>,
}

impl Shaped {
    fn new(like_redis: bool) -> Arc<Self> {
        Arc::new(Shaped {
            inner: MemoryStore::new(),
            like_redis,
            applied: Arc::default(),
        })
    }

    fn applied(&self, what: &'static str) -> Instant {
        self.applied.lock().unwrap()[what]
    }

    fn note(&self, what: &'static str) {
        self.applied.lock().unwrap().insert(what, Instant::now());
    }

    /// Redis's record version is the grant's token, one per term.
    fn observation(&self, mut o: Observation) -> Observation {
        if self.like_redis
            && let Some(h) = &mut o.holder
        {
            h.version = format!("term-{}", h.term.0);
        }
        o
    }

    fn grant(&self, mut g: Grant) -> Grant {
        if self.like_redis {
            g.token = format!("term-{}", g.term.0);
        }
        g
    }
}

#[async_trait]
impl LeaseStore for Shaped {
    fn name(&self) -> &'static str {
        "shaped"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.like_redis {
            caps.announces = Announces::Grants;
            // Redis with keyspace events: a follower waits for the expiry's notification.
            caps.notifications = Notifications::ReleaseAndExpiry;
        }
        caps
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let reply = match self.inner.acquire(request).await? {
            Acquired::Granted(g) => Acquired::Granted(self.grant(g)),
            Acquired::Held(o) => Acquired::Held(self.observation(o)),
        };
        tokio::time::sleep(REPLY).await;
        Ok(reply)
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let reply = match self.inner.renew(grant).await? {
            Renewed::Renewed(g) => {
                self.note("renew");
                Renewed::Renewed(self.grant(g))
            }
            Renewed::Lost(o) => Renewed::Lost(self.observation(o)),
        };
        tokio::time::sleep(REPLY).await;
        Ok(reply)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.release(grant).await?;
        self.note("release");
        tokio::time::sleep(REPLY).await;
        Ok(())
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.inner.hand_over(grant, to).await?;
        self.note("hand_over");
        tokio::time::sleep(REPLY).await;
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let o = self.observation(self.inner.inspect(lease).await?);
        tokio::time::sleep(REPLY).await;
        Ok(o)
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let Some(changes) = self.inner.changes(lease, candidate).await? else {
            return Ok(None);
        };
        if !self.like_redis {
            return Ok(Some(changes));
        }
        // Like Redis's expiry events: the server's clock ends the lease (at most 10 ms late),
        // which wakes every follower (the memory store expires a lease when it is next read).
        let (store, lease) = (self.inner.clone(), lease.clone());
        let expiry = futures::stream::unfold((), move |()| {
            let (store, lease) = (store.clone(), lease.clone());
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let _ = store.inspect(&lease).await;
                }
            }
        });
        Ok(Some(Box::pin(futures::stream::select(changes, expiry))))
    }

    /// Like Redis: grants only (a renewal keeps the holder and its term).
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let Some(stream) = self.inner.announcements(lease).await? else {
            return Ok(None);
        };
        if !self.like_redis {
            return Ok(Some(stream));
        }
        let this = self.clone();
        let mut last = None;
        Ok(Some(Box::pin(stream.filter_map(move |o| {
            let holder = o.holder.as_ref().map(|h| (h.id.clone(), h.term));
            let new = holder != last;
            last = holder;
            let o = this.observation(o);
            async move { new.then_some(o) }
        }))))
    }
}

fn elector(store: &Arc<Shaped>, lease: &str, id: &str) -> Elector {
    Elector::builder(store.clone(), lease)
        .ttl(TTL)
        .candidate_id(id)
        .build()
        .unwrap()
}

/// What the store saw (from its last sign of the old holder to the successor's grant) and what
/// the histograms recorded.
struct Outcome {
    truth: Duration,
    recorded: BTreeMap<String, Vec<f64>>,
}

/// A holder (plain store calls) renews for a while, then stops without a release.
async fn crash(like_redis: bool) -> Outcome {
    let recording = Recording::default();
    let samples = recording.0.clone();
    let _local = metrics::set_default_local_recorder(&recording);
    let store = Shaped::new(like_redis);
    let request = AcquireRequest {
        lease: LeaseName::new("crash").unwrap(),
        candidate: CandidateId::new("crasher").unwrap(),
        ttl: TTL,
        takeover: None,
    };
    let Acquired::Granted(mut grant) = store.acquire(&request).await.unwrap() else {
        panic!("free")
    };
    let b = elector(&store, "crash", "b");
    let successor = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(1_370)).await;
    for _ in 0..4 {
        let Renewed::Renewed(g) = store.renew(&grant).await.unwrap() else {
            panic!("renewed")
        };
        grant = g;
        tokio::time::sleep(TTL / 3).await;
    }
    let leader = successor.await.unwrap().unwrap();
    let truth = leader.elected_at().duration_since(store.applied("renew").into_std());
    leader.resign().await;
    Outcome {
        truth,
        recorded: recorded(&samples),
    }
}

/// An elected leader resigns, or hands over to the successor.
async fn let_go(like_redis: bool, hand_over: bool) -> Outcome {
    let recording = Recording::default();
    let samples = recording.0.clone();
    let _local = metrics::set_default_local_recorder(&recording);
    let store = Shaped::new(like_redis);
    let a = elector(&store, "let-go", "a");
    let first = a.campaign().await.unwrap();
    let b = elector(&store, "let-go", "b");
    let successor = tokio::spawn(async move { b.campaign().await });
    // The successor follows for a while (the leader renews meanwhile).
    tokio::time::sleep(Duration::from_millis(4_370)).await;
    let what = if hand_over {
        first.hand_over(&CandidateId::new("b").unwrap()).await;
        "hand_over"
    } else {
        first.resign().await;
        "release"
    };
    let leader = successor.await.unwrap().unwrap();
    let truth = leader.elected_at().duration_since(store.applied(what).into_std());
    leader.resign().await;
    Outcome {
        truth,
        recorded: recorded(&samples),
    }
}

/// Exactly one sample in all the failover and handover series, in `series`, within 10% of
/// the truth.
fn assert_lands_once(what: &str, outcome: &Outcome, series: &str) {
    let Outcome { truth, recorded } = outcome;
    let all: Vec<(&String, &f64)> = recorded
        .iter()
        .flat_map(|(s, v)| v.iter().map(move |x| (s, x)))
        .collect();
    assert_eq!(all.len(), 1, "{what}: one sample in all, got {recorded:?}");
    let (got_series, value) = all[0];
    assert_eq!(got_series, series, "{what}: in the wrong series ({recorded:?})");
    let truth = truth.as_secs_f64();
    assert!(
        (value - truth).abs() <= 0.1 * truth,
        "{what}: recorded {value:.4} s, the store saw {truth:.4} s"
    );
}

const FAILOVER: &str = "leasehold_failover_seconds{lease=crash}";
const LET_GO: &str = "leasehold_handover_seconds{lease=let-go}";

#[tokio::test(start_paused = true)]
async fn crash_lands_once_in_failover() {
    assert_lands_once("crash", &crash(false).await, FAILOVER);
}

#[tokio::test(start_paused = true)]
async fn crash_lands_once_in_failover_when_versions_last_a_term() {
    assert_lands_once("crash (like Redis)", &crash(true).await, FAILOVER);
}

#[tokio::test(start_paused = true)]
async fn release_lands_once_in_handover() {
    assert_lands_once("release", &let_go(false, false).await, LET_GO);
}

#[tokio::test(start_paused = true)]
async fn release_lands_once_in_handover_when_versions_last_a_term() {
    assert_lands_once("release (like Redis)", &let_go(true, false).await, LET_GO);
}

#[tokio::test(start_paused = true)]
async fn hand_over_lands_once_in_handover() {
    assert_lands_once("hand-over", &let_go(false, true).await, LET_GO);
}

#[tokio::test(start_paused = true)]
async fn hand_over_lands_once_in_handover_when_versions_last_a_term() {
    assert_lands_once("hand-over (like Redis)", &let_go(true, true).await, LET_GO);
}
