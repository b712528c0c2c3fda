//! leasehold's metrics served to Prometheus: `cargo run --example prometheus`.
//!
//! Installs the `metrics-exporter-prometheus` recorder with an HTTP listener on 127.0.0.1 (port
//! `LEASEHOLD_METRICS_PORT`, or any free port), then campaigns for the lease `prometheus-demo`
//! on `LEASEHOLD_STORE` (default: SQLite in a temp dir) and works while leader, until Ctrl-C.
//! Run two of them on one store and scrape both:
//!
//! ```text
//! LEASEHOLD_STORE=sqlite:///tmp/demo.db LEASEHOLD_METRICS_PORT=9464 cargo run --example prometheus &
//! LEASEHOLD_STORE=sqlite:///tmp/demo.db LEASEHOLD_METRICS_PORT=9465 cargo run --example prometheus &
//! curl -s 127.0.0.1:9464/metrics | grep -E '^leasehold_(is_leader|term)'
//! ```
//!
//! Every series leasehold records is described in the README ("Metrics"); alert on, for example,
//! `sum(leasehold_is_leader) by (lease) != 1` and
//! `rate(leasehold_store_requests_total{outcome=~"transient|permanent"}[5m]) > 0`.

use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use leasehold::{Elector, Leader};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Buckets (seconds) for leasehold's time histograms: renew round trips (milliseconds) up to
/// failovers (a TTL or two).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Installs the Prometheus recorder as the global `metrics` recorder, serving
/// `http://127.0.0.1:{port}/metrics` (port 0: any free port). Returns the address. Call it
/// inside a tokio runtime, before building electors.
pub fn install_exporter(port: u16) -> Result<SocketAddr, Box<dyn Error>> {
    // The exporter binds the listener itself and does not say which port it got, so a free
    // port is found first (another process could take it in between: then install fails).
    let port = match port {
        0 => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port(),
        port => port,
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(SECONDS_BUCKETS)?
        .install()?;
    Ok(addr)
}

/// The work a leader does: a fenced step every 100 ms until leadership ends.
pub async fn work(leader: Leader) -> Result<(), leasehold::Error> {
    loop {
        leader.ensure_valid(Duration::from_millis(100))?;
        // ... a side effect here, written with `leader.term()` as its fencing token ...
        leader.heartbeat();
        tokio::select! {
            () = leader.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let port = match std::env::var("LEASEHOLD_METRICS_PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 0,
    };
    let addr = install_exporter(port)?;
    println!("metrics: http://{addr}/metrics");

    let dir = tempfile::tempdir()?;
    let url = std::env::var("LEASEHOLD_STORE")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("leases.db").display()));
    let store = leasehold::connect(&url).await?;
    let elector = Elector::builder(store, "prometheus-demo")
        .ttl(Duration::from_secs(5))
        .build()?;
    println!(
        "{} campaigns for prometheus-demo on {}",
        elector.id(),
        leasehold::redact(&url)
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    elector.run_until(work, shutdown).await?;
    println!("stopped");
    Ok(())
}
