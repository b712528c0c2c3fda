//! The Prometheus example's exporter, scraped over real HTTP through an election (a handover),
//! a loss, and a failover.
//!
//! One test in this binary: the `metrics` recorder is global to the process.

#![cfg(feature = "sqlite")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{AcquireRequest, Acquired, CandidateId, Elector, LeaseName, LeaseStore, MemoryStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(dead_code, unreachable_pub)]
#[path = "../../../examples/prometheus.rs"]
mod example;

const LEASE: &str = "scraped";
const TTL: Duration = Duration::from_secs(1);

/// One sample of the exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

struct Scrape {
    text: String,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The value of the one sample named `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}\n{}", self.text);
        found[0].value
    }

    /// Like [`Scrape::value`], `None` while the series does not exist yet.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let exists = self.samples.iter().any(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        });
        exists.then(|| self.value(name, labels))
    }

    fn has_help(&self, name: &str) -> bool {
        self.text.lines().any(|l| l.starts_with(&format!("# HELP {name} ")))
    }
}

/// A real HTTP GET of `/metrics`, parsed.
async fn scrape(addr: std::net::SocketAddr) -> Scrape {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the exporter");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let samples = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("name value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            Sample {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap_or_else(|_| panic!("a number in {line:?}")),
            }
        })
        .collect();
    Scrape {
        text: body.to_string(),
        samples,
    }
}

/// Scrapes until `done` holds (at most 5 s).
async fn scrape_until(addr: std::net::SocketAddr, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = scrape(addr).await;
        if done(&s) {
            // The exporter renders counters, then gauges, then histograms, so a scrape rendered
            // while the elector records a transition can show part of it; one begun after this
            // one shows all of it.
            return scrape(addr).await;
        }
        assert!(Instant::now() < deadline, "never saw {what}:\n{}", s.text);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn intruder_acquires(store: &MemoryStore, ttl: Duration) -> leasehold::Grant {
    let request = AcquireRequest {
        lease: LeaseName::new(LEASE).unwrap(),
        candidate: CandidateId::new("intruder").unwrap(),
        ttl,
        takeover: None,
    };
    match store.acquire(&request).await.unwrap() {
        Acquired::Granted(grant) => grant,
        Acquired::Held(o) => panic!("the intruder found the lease held: {o:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_example_scrape_through_election_loss_and_failover() {
    let addr = example::install_exporter(0).expect("install the exporter");
    let store = Arc::new(MemoryStore::new());
    // Another holder first, so that the elector's acquire loses a race and its election
    // follows a release (a handover).
    let intruder = intruder_acquires(&store, Duration::from_secs(30)).await;
    let elector = Elector::builder(store.clone(), LEASE)
        .ttl(TTL)
        .candidate_id("a")
        .build()
        .unwrap();

    // Present from the build, described, before any campaign.
    let s = scrape(addr).await;
    let lease = ("lease", LEASE);
    assert_eq!(s.value("leasehold_is_leader", &[lease]), 0.0);
    assert_eq!(s.value("leasehold_lease_remaining_seconds", &[lease]), 0.0);
    assert_eq!(s.value("leasehold_term", &[lease]), 0.0);
    for outcome in ["ok", "lost_race", "transient", "permanent"] {
        let labels = [lease, ("store", "memory"), ("operation", "renew"), ("outcome", outcome)];
        assert_eq!(s.value("leasehold_store_requests_total", &labels), 0.0);
    }
    assert_eq!(
        s.value("leasehold_step_downs_total", &[lease, ("reason", "superseded")]),
        0.0
    );
    for name in [
        "leasehold_is_leader",
        "leasehold_term",
        "leasehold_lease_remaining_seconds",
        "leasehold_store_requests_total",
        "leasehold_store_trouble_total",
        "leasehold_step_downs_total",
    ] {
        assert!(s.has_help(name), "no HELP for {name}:\n{}", s.text);
    }
    // No candidate ids or error texts as labels.
    for sample in s.samples.iter().filter(|s| s.name.starts_with("leasehold_")) {
        for key in sample.labels.keys() {
            assert!(
                [
                    "lease",
                    "store",
                    "operation",
                    "outcome",
                    "reason",
                    "to",
                    "le",
                    "quantile"
                ]
                .contains(&key.as_str()),
                "unexpected label {key} on {sample:?}"
            );
        }
    }

    let runner = elector.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        runner
            .run_until(example::work, async {
                let _ = stop_rx.await;
            })
            .await
    });

    // Following the intruder: a lost race counted, its term seen.
    let s = scrape_until(addr, "an acquire lost to the intruder", |s| {
        s.value(
            "leasehold_store_requests_total",
            &[lease, ("operation", "acquire"), ("outcome", "lost_race")],
        ) >= 1.0
    })
    .await;
    assert_eq!(s.value("leasehold_term", &[lease]), intruder.term.0 as f64);
    assert_eq!(s.value("leasehold_is_leader", &[lease]), 0.0);
    assert!(!elector.is_leader());

    // The intruder lets go: the elector is elected at the next term, by handover.
    store.release(&intruder).await.unwrap();
    let s = scrape_until(addr, "is_leader 1", |s| s.value("leasehold_is_leader", &[lease]) == 1.0).await;
    let term = intruder.term.0 + 1;
    assert_eq!(s.value("leasehold_term", &[lease]), term as f64);
    let remaining = s.value("leasehold_lease_remaining_seconds", &[lease]);
    assert!(
        remaining > 0.0 && remaining <= TTL.as_secs_f64(),
        "remaining {remaining}"
    );
    assert!(
        s.value(
            "leasehold_store_requests_total",
            &[lease, ("operation", "acquire"), ("outcome", "ok")]
        ) >= 1.0
    );
    assert_eq!(s.value("leasehold_handover_seconds_count", &[lease]), 1.0);
    assert!(s.value("leasehold_handover_seconds_sum", &[lease]) < TTL.as_secs_f64());
    assert_eq!(s.value("leasehold_transitions_total", &[lease, ("to", "leader")]), 1.0);
    assert!(elector.is_leader());

    // Renewals succeed (the first after renew_every, TTL / 3).
    let s = scrape_until(addr, "a renewal", |s| {
        s.value(
            "leasehold_store_requests_total",
            &[lease, ("operation", "renew"), ("outcome", "ok")],
        ) >= 1.0
    })
    .await;
    assert_eq!(s.value("leasehold_is_leader", &[lease]), 1.0);
    let renew_count = s.value("leasehold_renew_seconds_count", &[lease]);
    assert!(renew_count >= 1.0, "{renew_count}");

    // A loss: an operator breaks the lease and the intruder takes it; the next renewal finds out.
    store.break_lease(&LeaseName::new(LEASE).unwrap()).await.unwrap();
    // The intruder never renews: its lease expires after this, and the elector fails over.
    let intruder_ttl = Duration::from_millis(1500);
    let intruder = intruder_acquires(&store, intruder_ttl).await;
    let intruder_acquired = Instant::now();
    // The step-down records its transition last.
    let s = scrape_until(addr, "is_leader 0 after the loss", |s| {
        s.get("leasehold_transitions_total", &[lease, ("to", "follower")]) == Some(1.0)
    })
    .await;
    assert_eq!(s.value("leasehold_lease_remaining_seconds", &[lease]), 0.0);
    assert_eq!(
        s.value("leasehold_step_downs_total", &[lease, ("reason", "superseded")]),
        1.0
    );
    assert_eq!(
        s.value("leasehold_step_downs_total", &[lease, ("reason", "renew_failed")]),
        0.0
    );
    assert!(
        s.value(
            "leasehold_store_requests_total",
            &[
                lease,
                ("store", "memory"),
                ("operation", "renew"),
                ("outcome", "lost_race")
            ]
        ) >= 1.0
    );
    assert!(!elector.is_leader());
    // The elector follows the intruder again: its term is what the gauge shows.
    let s = scrape_until(addr, "the intruder's term", |s| {
        s.value("leasehold_term", &[lease]) == intruder.term.0 as f64
    })
    .await;
    assert_eq!(s.value("leasehold_is_leader", &[lease]), 0.0);
    assert!(
        Instant::now() < intruder_acquired + intruder_ttl,
        "too slow to see the gap"
    );

    // The intruder's lease expires: the elector is elected again, by failover.
    let s = scrape_until(addr, "is_leader 1 after the failover", |s| {
        s.value("leasehold_is_leader", &[lease]) == 1.0
    })
    .await;
    assert_eq!(s.value("leasehold_term", &[lease]), (intruder.term.0 + 1) as f64);
    assert_eq!(s.value("leasehold_failover_seconds_count", &[lease]), 1.0);
    // From the first sighting of the intruder's record (after the step-down back-off) to the
    // election at its expiry: most of its TTL, not more.
    let failover = s.value("leasehold_failover_seconds_sum", &[lease]);
    assert!(
        failover > 0.5 && failover < intruder_ttl.as_secs_f64() + 0.5,
        "failover {failover}"
    );
    assert_eq!(s.value("leasehold_handover_seconds_count", &[lease]), 1.0);
    assert_eq!(s.value("leasehold_transitions_total", &[lease, ("to", "leader")]), 2.0);
    assert_eq!(
        s.value("leasehold_transitions_total", &[lease, ("to", "follower")]),
        1.0
    );
    assert!(s.value("leasehold_lease_remaining_seconds", &[lease]) > 0.0);

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run_until returns after shutdown")
        .unwrap()
        .unwrap();
}
