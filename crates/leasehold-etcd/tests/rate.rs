//! What holding 1,000 leases costs etcd: one `EtcdStore` (one process), 1,000 `Elector`s with a
//! 2 s TTL (renewing every third of it, the default), held for a measuring window. Counted twice:
//! the store operations the engine asks for (`CountingStore`) and the gRPC requests the etcd
//! server received (its own `/metrics`, `grpc_server_started_total` per method; a keepalive
//! round is one `LeaseKeepAlive` stream). The server's counters are server-wide: run it on an
//! otherwise idle etcd (the idle rate before the elections is printed too).
//!
//! ```text
//! cargo test -p leasehold-etcd --test integration -- rate:: --ignored --nocapture
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use leasehold_conformance::require_server;
use leasehold_core::{CountingStore, Elector, Leader, Operation};
use leasehold_etcd::EtcdStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASES: usize = 1000;
const TTL: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(10);
const BATCH: usize = 50;

/// `grpc_server_started_total` per gRPC method, from the server's `/metrics`.
async fn started(address: &str) -> BTreeMap<String, u64> {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("metrics connect");
    let ask = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(ask.as_bytes()).await.expect("metrics ask");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("metrics read");
    text.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{"))
        .filter_map(|l| {
            let method = l.split("grpc_method=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse::<f64>().ok()?;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some((method.to_string(), count as u64))
        })
        .collect()
}

fn per_second(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>, window: Duration) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(m, n)| {
            (
                m.clone(),
                (n - before.get(m).copied().unwrap_or(0)) as f64 / window.as_secs_f64(),
            )
        })
        .filter(|(_, rate)| *rate > 0.0)
        .collect()
}

fn show(rates: &[(String, f64)]) -> String {
    let total = rates.iter().map(|(_, r)| r).fold(0.0, |sum, r| sum + r);
    let each: Vec<String> = rates.iter().map(|(m, r)| format!("{m} {r:.1}")).collect();
    format!("{total:.1}/s ({})", each.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints requests per second, asserts nothing timed"]
async fn requests_per_second_holding_1000_leases() {
    let Some(server) = require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let address = server.trim_start_matches("etcd://").trim_end_matches('/').to_string();
    let idle_before = started(&address).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = per_second(&started(&address).await, &idle_before, Duration::from_secs(2));
    println!("etcd idle before: {}", show(&idle));

    let store = EtcdStore::connect(&format!("etcd://{address}/leasehold-rate"))
        .await
        .expect("connect");
    let counting = Arc::new(CountingStore::new(store));
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let electors: Vec<Elector> = (0..LEASES)
        .map(|i| {
            Elector::builder(counting.clone(), format!("rate-{run}-{i}"))
                .candidate_id("holder")
                .ttl(TTL)
                .build()
                .expect("valid timing")
        })
        .collect();
    // In batches: a burst of 1,000 first acquires does not settle within the engine's request
    // timeout at this TTL (a third of 2 s); holding them is what is measured.
    let began = Instant::now();
    let mut leaders: Vec<Leader> = Vec::with_capacity(LEASES);
    for batch in electors.chunks(BATCH) {
        let elected = join_all(batch.iter().map(Elector::campaign)).await;
        leaders.extend(elected.into_iter().map(|l| l.expect("campaign")));
    }
    println!(
        "{LEASES} leases granted in {:.2}s (batches of {BATCH})",
        began.elapsed().as_secs_f64()
    );
    // Let the first renewals settle into their rhythm.
    tokio::time::sleep(TTL).await;

    let ops_before = counting.counts();
    let etcd_before = started(&address).await;
    tokio::time::sleep(WINDOW).await;
    let etcd_after = started(&address).await;
    let ops = counting.counts().since(&ops_before);

    let lost = leaders
        .iter()
        .filter(|l| l.ensure_valid(Duration::ZERO).is_err())
        .count();
    let window = WINDOW.as_secs_f64();
    let store_ops: Vec<String> = Operation::ALL
        .iter()
        .filter(|op| ops.get(**op) > 0)
        .map(|op| format!("{} {:.1}", op.as_str(), ops.get(*op) as f64 / window))
        .collect();
    println!(
        "holding {LEASES} leases, TTL {TTL:?}, over {WINDOW:?}: store operations {:.1}/s ({}), {} failed; {lost} lost",
        ops.total() as f64 / window,
        store_ops.join(", "),
        ops.failed
    );
    println!(
        "etcd requests received: {}",
        show(&per_second(&etcd_after, &etcd_before, WINDOW))
    );
    assert_eq!(lost, 0, "a lease was lost while held");
    join_all(leaders.into_iter().map(Leader::resign)).await;
}
