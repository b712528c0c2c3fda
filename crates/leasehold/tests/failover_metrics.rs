//! The failover and handover histograms against real servers: one crash, one release and one
//! hand-over per backend, each compared with the time the test measured itself.
//!
//! Runs for each of `LEASEHOLD_{REDIS,ETCD,POSTGRES}_URL` that is set and whose feature is on
//! (`scripts/services up redis etcd postgres`); skips loudly otherwise, fails under `CI=true`.
//! One test in this binary: the `metrics` recorder is global to the process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold::{AcquireRequest, Acquired, CandidateId, Elector, LeaseName, LeaseStore, Renewed};
use metrics::{Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use std::time::Instant;

const TTL: Duration = Duration::from_secs(2);

/// Every histogram sample, by series (`name{label=value,...}`).
#[derive(Default)]
struct Samples(Mutex<BTreeMap<String, Vec<f64>>>);

struct Series(String);

impl HistogramFn for Series {
    fn record(&self, value: f64) {
        samples()
            .0
            .lock()
            .unwrap()
            .entry(self.0.clone())
            .or_default()
            .push(value);
    }
}

fn samples() -> &'static Samples {
    static SAMPLES: OnceLock<Samples> = OnceLock::new();
    SAMPLES.get_or_init(Samples::default)
}

struct Recording;

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
        let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        Histogram::from_arc(Arc::new(Series(format!("{}{{{}}}", key.name(), labels.join(",")))))
    }
}

/// The failover and handover samples of `lease`.
fn recorded(lease: &str) -> BTreeMap<String, Vec<f64>> {
    samples()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(series, _)| {
            (series.starts_with("leasehold_failover_seconds") || series.starts_with("leasehold_handover_seconds"))
                && series.contains(&format!("lease={lease}"))
        })
        .map(|(s, v)| (s.clone(), v.clone()))
        .collect()
}

fn lease_name(store: &str, what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("fm-{store}-{what}-{nanos}")
}

/// How long the successor follows before the leader lets go: longer than a TTL (its first
/// sight of the holder is old news by then), plus a random phase of 0.5-1.5 s.
fn settle() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    TTL + Duration::from_millis(500 + u64::from(nanos) % 1000)
}

async fn elector(url: &str, lease: &str, id: &str) -> Elector {
    let store = leasehold::connect(url).await.expect("connect");
    Elector::builder(store, lease)
        .ttl(TTL)
        .candidate_id(id)
        .build()
        .expect("valid timing")
}

/// What one scenario measured and what the histograms recorded.
struct Outcome {
    what: &'static str,
    truth: Duration,
    recorded: BTreeMap<String, Vec<f64>>,
}

/// A holder (raw store calls on its own connection) renews, then stops without a release; the
/// truth is from its last renewal's reply to the successor's election.
async fn crash(url: &str, store: &str) -> Outcome {
    let lease = lease_name(store, "crash");
    let crasher: Arc<dyn LeaseStore> = leasehold::connect(url).await.expect("connect");
    let request = AcquireRequest {
        lease: LeaseName::new(&lease).unwrap(),
        candidate: CandidateId::new("crasher").unwrap(),
        ttl: TTL,
        takeover: None,
    };
    let Acquired::Granted(mut grant) = crasher.acquire(&request).await.expect("acquire") else {
        panic!("a fresh lease is free")
    };
    let b = elector(url, &lease, "b").await;
    let successor = tokio::spawn(async move { b.campaign().await });
    let crash_at = Instant::now() + settle();
    let mut last = Instant::now();
    while Instant::now() < crash_at {
        tokio::time::sleep(TTL / 3).await;
        grant = match crasher.renew(&grant).await.expect("renew") {
            Renewed::Renewed(g) => g,
            Renewed::Lost(o) => panic!("lost {o:?}"),
        };
        last = Instant::now();
    }
    let leader = successor.await.unwrap().expect("b campaigns");
    let truth = leader.elected_at().duration_since(last);
    leader.resign().await;
    drop(crasher);
    Outcome {
        what: "crash",
        truth,
        recorded: recorded(&lease),
    }
}

/// An elected leader resigns (a release) or hands over to the successor.
async fn let_go(url: &str, store: &str, hand_over: bool) -> Outcome {
    let what = if hand_over { "hand_over" } else { "release" };
    let lease = lease_name(store, what);
    let a = elector(url, &lease, "a").await;
    let first = a.campaign().await.expect("a campaigns");
    let b = elector(url, &lease, "b").await;
    let successor = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(settle()).await;
    let start = Instant::now();
    if hand_over {
        first.hand_over(&CandidateId::new("b").unwrap()).await;
    } else {
        first.resign().await;
    }
    let leader = successor.await.unwrap().expect("b campaigns");
    let truth = leader.elected_at().duration_since(start);
    leader.resign().await;
    Outcome {
        what,
        truth,
        recorded: recorded(&lease),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_release_and_hand_over_land_once_in_their_histogram_on_real_servers() {
    metrics::set_global_recorder(Recording).expect("the only recorder");
    let mut backends = Vec::new();
    for (feature_on, var, store) in [
        (cfg!(feature = "redis"), "LEASEHOLD_REDIS_URL", "redis"),
        (cfg!(feature = "etcd"), "LEASEHOLD_ETCD_URL", "etcd"),
        (cfg!(feature = "postgres"), "LEASEHOLD_POSTGRES_URL", "postgres"),
    ] {
        match std::env::var(var) {
            Ok(url) if feature_on => backends.push((store, url)),
            _ if std::env::var("CI").as_deref() == Ok("true") && feature_on => panic!("{var} is not set"),
            _ => eprintln!("SKIPPED {store}: {var} unset or the `{store}` feature is off"),
        }
    }
    let mut wrong = Vec::new();
    for (store, url) in &backends {
        for outcome in [
            crash(url, store).await,
            let_go(url, store, false).await,
            let_go(url, store, true).await,
        ] {
            let Outcome { what, truth, recorded } = outcome;
            println!(
                "{store} {what}: measured {:.4} s, recorded {recorded:?}",
                truth.as_secs_f64()
            );
            let expected = if what == "crash" {
                "leasehold_failover_seconds{"
            } else {
                "leasehold_handover_seconds{"
            };
            let samples: Vec<(&String, f64)> = recorded
                .iter()
                .flat_map(|(s, v)| v.iter().map(move |x| (s, *x)))
                .collect();
            let truth = truth.as_secs_f64();
            // A crash counts from the last renewal, which both sides see: within 10%. A release
            // or hand-over counts from when the successor learned of it: the release's own trip
            // to the store (before that) is not in it, so it may be less, never more.
            let ok = match samples.as_slice() {
                [(series, value)] if series.starts_with(expected) => {
                    if what == "crash" {
                        // etcd expires a lease up to 0.5 s late (its lessor looks twice a
                        // second), which no follower can see: it counts a TTL back from when the
                        // expiry reached it, so it may read up to that much less.
                        let unseen = if *store == "etcd" { 0.5 } else { 0.0 };
                        *value <= 1.1 * truth && *value >= 0.9 * truth - unseen
                    } else {
                        *value <= truth + 0.001
                    }
                }
                _ => false,
            };
            if !ok {
                wrong.push(format!("{store} {what}"));
            }
        }
    }
    assert!(wrong.is_empty(), "wrong series or values: {wrong:?}");
}
