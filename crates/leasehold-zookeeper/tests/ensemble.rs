//! Store node failures on the 3-node ensemble (`scripts/services up zookeeper-ensemble`):
//! the ensemble's leader node is killed while a leaseholder leads, then the node the leader's
//! client is connected to. Leadership continues or fails over, never two at once; the client
//! reconnects to another member through the multi-host URL. Killed nodes are restarted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_conformance::{SafetyChecker, require_server};
use leasehold_core::{Elector, LeaseName, LeaseStore, random_u64};
use leasehold_zookeeper::ZookeeperStore;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(4);

/// One ensemble member, from the services env file.
#[derive(Clone, Debug)]
struct Node {
    n: usize,
    addr: String,
    pid_file: PathBuf,
}

fn env_value(key: &str) -> Option<String> {
    if let Ok(v) = std::env::var(key) {
        return Some(v);
    }
    let start = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    start.ancestors().find_map(|dir| {
        let text = std::fs::read_to_string(dir.join("target/services/env")).ok()?;
        text.lines().find_map(|line| {
            let line = line.trim().strip_prefix("export ").unwrap_or(line.trim());
            let (k, v) = line.split_once('=')?;
            (k == key).then(|| v.trim_matches('"').to_string())
        })
    })
}

fn nodes() -> Vec<Node> {
    (1..=3)
        .filter_map(|n| {
            let url = env_value(&format!("LEASEHOLD_ZOOKEEPER_NODE{n}_URL"))?;
            let pid_file = env_value(&format!("LEASEHOLD_ZOOKEEPER_NODE{n}_PID_FILE"))?;
            Some(Node {
                n,
                addr: url.trim_start_matches("zk://").to_string(),
                pid_file: pid_file.into(),
            })
        })
        .collect()
}

/// A four-letter-word command's reply, or "" when the node does not answer.
fn four_letter(addr: &str, cmd: &str) -> String {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr.parse().expect("addr"), Duration::from_secs(1)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(cmd.as_bytes());
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

fn mode(node: &Node) -> String {
    four_letter(&node.addr, "srvr")
        .lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(str::to_string))
        .unwrap_or_else(|| "down".to_string())
}

fn alive_connections(node: &Node) -> i64 {
    four_letter(&node.addr, "mntr")
        .lines()
        .find_map(|l| {
            l.strip_prefix("zk_num_alive_connections")
                .map(|v| v.trim().parse().unwrap_or(-1))
        })
        .unwrap_or(-1)
}

fn kill(node: &Node) {
    let pid = std::fs::read_to_string(&node.pid_file).expect("pid file");
    let pid = pid.lines().next().expect("a pid").trim().to_string();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid} (node {})", node.n);
    eprintln!("killed node {} (pid {pid})", node.n);
}

/// Restarts the ensemble's killed nodes, also when the test fails.
struct Restart;

impl Restart {
    fn now(&self) {
        let script = env_value("LEASEHOLD_SERVICES_SCRIPT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services"));
        let out = std::process::Command::new(script)
            .args(["up", "zookeeper-ensemble"])
            .output();
        match out {
            Ok(o) if o.status.success() => eprintln!("ensemble restarted"),
            Ok(o) => eprintln!("restarting the ensemble failed: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cannot run the services script: {e}"),
        }
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        self.now();
    }
}

/// An elector that campaigns again whenever its leadership ends.
fn run(elector: Elector) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match elector.campaign().await {
                Ok(leader) => leader.cancelled().await,
                Err(e) => panic!("{} cannot campaign: {e}", elector.id()),
            }
        }
    })
}

async fn current_leader(checker: &SafetyChecker, lease: &LeaseName) -> Option<(String, u64)> {
    checker
        .intervals_of(lease)
        .await
        .into_iter()
        .filter(|i| i.end.is_none())
        .map(|i| (i.candidate.to_string(), i.term.0))
        .next_back()
}

async fn wait_for_leader(checker: &SafetyChecker, lease: &LeaseName, limit: Duration) -> (String, u64) {
    let started = Instant::now();
    loop {
        if let Some(leader) = current_leader(checker, lease).await {
            return leader;
        }
        assert!(started.elapsed() < limit, "no leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_node_failures() {
    let Some(url) = require_server("zookeeper-ensemble", "LEASEHOLD_ZOOKEEPER_ENSEMBLE_URL") else {
        return;
    };
    let nodes = nodes();
    assert_eq!(nodes.len(), 3, "the env file names three ensemble nodes");
    let restart = Restart;
    let url = format!("{url}/leasehold-tests");

    // 1. Kill the ensemble's leader node while a leaseholder leads.
    let checker = SafetyChecker::new();
    let lease = LeaseName::new(format!("ensemble-{:x}", random_u64())).expect("valid");
    let mut tasks = Vec::new();
    for who in ["A", "B", "C"] {
        let store: Arc<dyn LeaseStore> = Arc::new(ZookeeperStore::connect(&url).await.expect("connect"));
        let elector = Elector::builder(store, lease.as_str())
            .candidate_id(who)
            .ttl(TTL)
            .build()
            .expect("valid");
        checker.watch(&elector);
        tasks.push(run(elector));
    }
    let (before, term) = wait_for_leader(&checker, &lease, TTL * 3).await;
    tokio::time::sleep(TTL / 2).await;
    let zk_leader = nodes
        .iter()
        .find(|n| mode(n) == "leader")
        .expect("an ensemble leader")
        .clone();
    eprintln!("{before} leads at term {term}; ensemble leader is node {}", zk_leader.n);
    let killed_at = Instant::now();
    kill(&zk_leader);
    tokio::time::sleep(TTL * 3).await;
    let (after, term_after) = wait_for_leader(&checker, &lease, TTL * 3).await;
    let modes: Vec<String> = nodes.iter().map(|n| format!("node{}={}", n.n, mode(n))).collect();
    eprintln!(
        "after killing the ensemble leader: {after} leads at term {term_after} ({}), {:.1}s later; {}",
        if (after.as_str(), term_after) == (before.as_str(), term) {
            "leadership continued"
        } else {
            "failed over"
        },
        killed_at.elapsed().as_secs_f64(),
        modes.join(" ")
    );
    if let Err(report) = checker.check().await {
        panic!("killing the ensemble leader: {report}");
    }
    for task in tasks.drain(..) {
        task.abort();
    }
    restart.now();

    // 2. Kill the node the leader's client is connected to: it reconnects through the URL.
    let checker = SafetyChecker::new();
    let lease = LeaseName::new(format!("ensemble-conn-{:x}", random_u64())).expect("valid");
    let before_counts: Vec<i64> = nodes.iter().map(alive_connections).collect();
    let store = ZookeeperStore::connect(&url).await.expect("connect");
    let store: Arc<dyn LeaseStore> = Arc::new(store);
    let a = Elector::builder(store.clone(), lease.as_str())
        .candidate_id("A")
        .ttl(TTL)
        .build()
        .expect("valid");
    checker.watch(&a);
    let leader_a = tokio::time::timeout(TTL * 3, a.campaign())
        .await
        .expect("A elected")
        .expect("campaign");
    let after_counts: Vec<i64> = nodes.iter().map(alive_connections).collect();
    let connected = nodes
        .iter()
        .zip(before_counts.iter().zip(&after_counts))
        .find(|(_, (b, a))| **a > **b)
        .map(|(n, _)| n.clone());
    let Some(connected) = connected else {
        panic!("cannot tell which node A's session uses: connections {before_counts:?} -> {after_counts:?}");
    };
    let b_store: Arc<dyn LeaseStore> = Arc::new(ZookeeperStore::connect(&url).await.expect("connect"));
    let b = Elector::builder(b_store, lease.as_str())
        .candidate_id("B")
        .ttl(TTL)
        .build()
        .expect("valid");
    checker.watch(&b);
    let b_task = run(b);
    tokio::time::sleep(TTL / 2).await;
    eprintln!(
        "A leads at term {} through node {} ({})",
        leader_a.term(),
        connected.n,
        mode(&connected)
    );
    let killed_at = Instant::now();
    kill(&connected);
    tokio::time::sleep(TTL * 2).await;
    let a_still = leader_a.ensure_valid(Duration::ZERO).is_ok();
    let seen = tokio::time::timeout(TTL, store.inspect(&lease)).await;
    let reconnected = matches!(seen, Ok(Ok(_)));
    let (who, term) = wait_for_leader(&checker, &lease, TTL * 3).await;
    eprintln!(
        "after killing node {}: A's client {} ; A {}; {who} leads at term {term}, {:.1}s after the kill",
        connected.n,
        if reconnected {
            "reconnected to another member"
        } else {
            "did NOT reconnect"
        },
        if a_still { "still leads" } else { "stepped down" },
        killed_at.elapsed().as_secs_f64()
    );
    assert!(
        reconnected,
        "A's store must reach the ensemble through another member: {seen:?}"
    );
    if let Err(report) = checker.check().await {
        panic!("killing the client's node: {report}");
    }
    drop(leader_a);
    b_task.abort();
    drop(restart);
}
