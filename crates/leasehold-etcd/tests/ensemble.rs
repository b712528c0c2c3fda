//! Store nodes dying under a leaseholder, on the 3-node etcd ensemble
//! (`scripts/services up etcd-ensemble`):
//!
//! 1. the etcd cluster's leader node is killed (-9) while a leaseholder leads: leadership
//!    continues or fails over, never two at once;
//! 2. the node the client is connected to is killed: the client carries on through another
//!    endpoint of its multi-endpoint URL.
//!
//! The killed nodes are restarted with `scripts/services up etcd-ensemble` afterwards (also when
//! the test fails).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::SafetyChecker;
use leasehold_core::{Elector, LeaseName, LeaseStore};
use leasehold_etcd::EtcdStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(4);

/// A value from the environment or from the `target/services/env` file the services script
/// writes.
fn service_env(key: &str) -> Option<String> {
    if let Ok(value) = std::env::var(key) {
        return Some(value);
    }
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/services/env");
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let line = line.trim().strip_prefix("export ").unwrap_or(line.trim());
        let (k, v) = line.split_once('=')?;
        (k == key).then(|| v.trim_matches('"').to_string())
    })
}

fn node_url(n: usize) -> String {
    service_env(&format!("LEASEHOLD_ETCD_NODE{n}_URL")).expect("node URL in the services env")
}

fn node_address(n: usize) -> String {
    node_url(n)
        .trim_start_matches("etcd://")
        .trim_end_matches('/')
        .to_string()
}

/// Restarts whatever nodes are down when dropped, so a failing test leaves the ensemble whole.
struct Restart;

impl Restart {
    fn now() {
        let script = service_env("LEASEHOLD_SERVICES_SCRIPT")
            .unwrap_or_else(|| format!("{}/../../scripts/services", env!("CARGO_MANIFEST_DIR")));
        let status = std::process::Command::new(script)
            .args(["up", "etcd-ensemble"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run scripts/services");
        assert!(status.success(), "scripts/services up etcd-ensemble failed");
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        Restart::now();
    }
}

/// The node (1..=3) that leads the etcd cluster.
async fn cluster_leader() -> usize {
    for _ in 0..50 {
        for n in 1..=3 {
            let Ok(mut client) = etcd_client::Client::connect([node_address(n)], None).await else {
                continue;
            };
            let Ok(status) = client.status().await else { continue };
            let me = status.header().map(|h| h.member_id());
            if status.leader() != 0 && Some(status.leader()) == me {
                return n;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no etcd node reports itself leader");
}

fn kill(n: usize) {
    let pid_file = service_env(&format!("LEASEHOLD_ETCD_NODE{n}_PID_FILE")).expect("pid file");
    let pid = std::fs::read_to_string(&pid_file).expect("read pid file");
    let pid = pid.lines().next().expect("pid").trim().to_string();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Candidates that campaign again whenever their leadership ends, until stopped.
fn campaigners(electors: &[Elector], stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    electors
        .iter()
        .map(|elector| {
            let (elector, mut stop) = (elector.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let leader = tokio::select! {
                        leader = elector.campaign() => match leader {
                            Ok(leader) => leader,
                            Err(_) => continue,
                        },
                        () = stopped(&mut stop) => return,
                    };
                    tokio::select! {
                        () = leader.cancelled() => {}
                        () = stopped(&mut stop) => {
                            leader.resign().await;
                            return;
                        }
                    }
                }
            })
        })
        .collect()
}

async fn make_electors(url: &str, lease: &str, checker: &SafetyChecker) -> Vec<Elector> {
    let mut electors = Vec::new();
    for who in ["A", "B", "C"] {
        let store: Arc<dyn LeaseStore> = Arc::new(EtcdStore::connect(url).await.expect("connect to the ensemble"));
        let elector = Elector::builder(store, lease)
            .candidate_id(who)
            .ttl(TTL)
            .request_timeout(TTL / 4)
            .build()
            .expect("elector");
        checker.watch(&elector);
        electors.push(elector);
    }
    electors
}

/// Waits until someone leads `lease`, and says who since when.
async fn someone_leads(checker: &SafetyChecker, lease: &LeaseName, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let open: Vec<_> = checker
            .intervals_of(lease)
            .await
            .into_iter()
            .filter(|i| i.end.is_none())
            .collect();
        if let [one] = open.as_slice() {
            return format!("{} at term {}", one.candidate, one.term);
        }
        assert!(
            Instant::now() < deadline,
            "nobody led {lease} within {within:?}: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nodes_die_under_a_leaseholder() {
    let Some(url) = leasehold_conformance::require_server("etcd-ensemble", "LEASEHOLD_ETCD_ENSEMBLE_URL") else {
        return;
    };
    let _restart = Restart;

    // 1. The cluster's leader node dies.
    let lease = format!("ensemble-leader-{:x}", leasehold_core::random_u64());
    let lease_name = LeaseName::new(lease.clone()).expect("lease name");
    let checker = SafetyChecker::new();
    let (stop, stopped) = watch::channel(false);
    let electors = make_electors(&url, &lease, &checker).await;
    let tasks = campaigners(&electors, &stopped);
    let before = someone_leads(&checker, &lease_name, TTL * 3).await;
    tokio::time::sleep(TTL).await;
    let victim = cluster_leader().await;
    let killed = Instant::now();
    kill(victim);
    println!("etcd node {victim} (the cluster leader) killed while {before} led");
    tokio::time::sleep(TTL * 3).await;
    let after = someone_leads(&checker, &lease_name, TTL * 3).await;
    let intervals = checker.intervals_of(&lease_name).await;
    let gaps = intervals
        .iter()
        .filter(|i| i.end.is_some_and(|end| end > killed))
        .count();
    println!(
        "after the kill: {after} leads; {gaps} leadership(s) ended after the kill; new cluster leader node {}",
        cluster_leader().await
    );
    let _ = stop.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(TTL * 2, task).await;
    }
    let summary = checker
        .check()
        .await
        .unwrap_or_else(|report| panic!("two leaders: {report}"));
    println!("leader node killed: {summary}");
    Restart::now();

    // 2. The node the client talks to dies (listed first in the client's URL); not the cluster
    // leader, so that this is about the client, not about an election in etcd.
    let leader_node = cluster_leader().await;
    let victim = (1..=3).find(|n| *n != leader_node).expect("a follower node");
    let others: Vec<String> = (1..=3).filter(|n| *n != victim).map(node_address).collect();
    let first_url = format!("etcd://{},{}", node_address(victim), others.join(","));
    let lease = format!("ensemble-client-{:x}", leasehold_core::random_u64());
    let lease_name = LeaseName::new(lease.clone()).expect("lease name");
    let checker = SafetyChecker::new();
    let (stop, stopped) = watch::channel(false);
    let electors = make_electors(&first_url, &lease, &checker).await;
    let tasks = campaigners(&electors, &stopped);
    let before = someone_leads(&checker, &lease_name, TTL * 3).await;
    tokio::time::sleep(TTL).await;
    kill(victim);
    let killed = Instant::now();
    println!("etcd node {victim} (first endpoint of the clients) killed while {before} led");
    let observer = EtcdStore::connect(&first_url).await;
    let observer = observer.expect("a new client reaches the other endpoints");
    let mut answered = None;
    for _ in 0..40 {
        if observer.inspect(&lease_name).await.is_ok() {
            answered = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answered = answered.expect("the client answers through another endpoint");
    tokio::time::sleep(TTL * 2).await;
    let after = someone_leads(&checker, &lease_name, TTL * 3).await;
    let ended = checker
        .intervals_of(&lease_name)
        .await
        .iter()
        .filter(|i| i.end.is_some_and(|end| end > killed))
        .count();
    println!(
        "client's node killed: a new client answered {answered:?} after; {after} leads; {ended} leadership(s) ended after the kill"
    );
    let _ = stop.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(TTL * 2, task).await;
    }
    let summary = checker
        .check()
        .await
        .unwrap_or_else(|report| panic!("two leaders: {report}"));
    println!("client's node killed: {summary}");
}
