//! Graceful handover latency on etcd: a leader resigns, the candidate queued behind it (on a
//! store of its own, as another process would be) is elected. Prints the p50 and range from
//! `resign()` called and from `resign()` returned to the successor's `campaign()` returning.
//!
//! ```sh
//! eval "$(scripts/services env | sed 's/^/export /')"
//! cargo run --release -p leasehold-etcd --example handover_latency -- 30
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::Elector;
use leasehold_etcd::EtcdStore;

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name}: p50 {:.2} ms, min {:.2} ms, max {:.2} ms ({} runs)",
        ms(samples[samples.len() / 2]),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).map_or(Ok(30), |a| a.parse())?;
    let url = std::env::var("LEASEHOLD_ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".into());
    let a = Arc::new(EtcdStore::connect(&url).await?);
    let b = Arc::new(EtcdStore::connect(&url).await?);
    let run = leasehold_core::random_u64() % 1_000_000;
    let (mut from_call, mut from_return) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let lease = format!("handover-{run}-{i}");
        let ttl = Duration::from_secs(2);
        let leader = Elector::builder(a.clone(), lease.as_str())
            .ttl(ttl)
            .candidate_id("a")
            .build()?;
        let successor = Elector::builder(b.clone(), lease.as_str())
            .ttl(ttl)
            .candidate_id("b")
            .build()?;
        let held = leader.campaign().await?;
        let waiting = tokio::spawn(async move {
            let next = successor.campaign().await;
            (Instant::now(), next, successor)
        });
        // Let the successor queue and set its watch.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let called = Instant::now();
        held.resign().await;
        let returned = Instant::now();
        let (elected, next, _successor) = waiting.await?;
        let next = next?;
        from_call.push(elected - called);
        from_return.push(elected.saturating_duration_since(returned));
        next.resign().await;
    }
    summary("from resign() called", from_call);
    summary("from resign() returned", from_return);
    // The round trips a handover is made of, each alone on the same etcd.
    let address = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut client = etcd_client::Client::connect([address], None).await?;
    let key = format!("handover-{run}-rtt");
    let (mut txn, mut grant, mut keepalive, mut get) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut get_at = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let id = client.lease_grant(5, None).await?.id();
        grant.push(t.elapsed());
        let t = Instant::now();
        client.lease_keep_alive(id).await?;
        keepalive.push(t.elapsed());
        let t = Instant::now();
        let put = etcd_client::TxnOp::put(key.clone(), "x", Some(etcd_client::PutOptions::new().with_lease(id)));
        let written = client.txn(etcd_client::Txn::new().and_then([put])).await?;
        txn.push(t.elapsed());
        let t = Instant::now();
        client.get(key.clone(), None).await?;
        get.push(t.elapsed());
        // What a successor woken by a deletion without a release marker pays to tell.
        let revision = written.header().map_or(0, etcd_client::ResponseHeader::revision);
        let at = etcd_client::GetOptions::new()
            .with_revision(revision)
            .with_serializable();
        let t = Instant::now();
        client.get(key.clone(), Some(at)).await?;
        get_at.push(t.elapsed());
        client.lease_revoke(id).await?;
    }
    summary("etcd lease grant", grant);
    summary("etcd keepalive (a new stream each, as etcd-client sends it)", keepalive);
    summary("etcd txn (one put)", txn);
    summary("etcd get", get);
    summary(
        "etcd get at a revision, serializable (a successor's release-marker read)",
        get_at,
    );
    Ok(())
}
