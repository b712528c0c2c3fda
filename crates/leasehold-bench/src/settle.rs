//! Graceful handover as a follower lives it (`--only settle`). The handover measure settles the
//! successor 20 ms after it has seen the leader; a real follower has waited a random part of its
//! renew and poll cycles. Here the successor waits 0.5-1.5 s (uniform, drawn per sample) before
//! the leader resigns, with a TTL of 2 s; on etcd and ZooKeeper each sample of the library is
//! paired with one of the store's own recipe on the same server, interleaved, with its own random
//! wait: etcd-client's `Election` (server-side campaign/resign) and a client-side ZooKeeper lock
//! recipe (ephemeral sequential znodes, each candidate watching its predecessor, as Curator's
//! and kazoo's locks do). Every sample is timed from the leader's resign (or delete) being called
//! to the successor knowing it leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::LeaseStore;
use zookeeper_client as zk;

use crate::backends::ServiceEnv;
use crate::etcdctl::{Difference, election_once};
use crate::measures::handover_once;
use crate::plan::{Outcome, within};
use crate::{Stats, ms};

/// The heading of this runner's section of `benchmarks.md`.
pub(crate) const HEADING: &str = "## Graceful handover as a follower lives it";

/// The TTL of the library's electors.
const TTL: Duration = Duration::from_secs(2);

/// The stores that wake a waiting successor, with the env var of their URL.
const STORES: &[(&str, &str)] = &[
    ("postgres", "LEASEHOLD_POSTGRES_URL"),
    ("redis", "LEASEHOLD_REDIS_URL"),
    ("etcd", "LEASEHOLD_ETCD_URL"),
    ("zookeeper", "LEASEHOLD_ZOOKEEPER_URL"),
];

/// A random wait of 0.5-1.5 s.
fn settle() -> Duration {
    Duration::from_millis(500 + leasehold::random_u64() % 1000)
}

/// One store's samples: the library's, and its recipe's where it has one.
struct Row {
    store: &'static str,
    ours: Outcome<Vec<Duration>>,
    theirs: Option<(&'static str, Outcome<Vec<Duration>>)>,
}

/// Runs `reps` samples per store (and per recipe) on the stores among `selected` that are
/// running, and returns the Markdown section.
pub(crate) async fn measure(env: &ServiceEnv, selected: &[&str], reps: usize, run: u64) -> String {
    let mut rows = Vec::new();
    for &(store, var) in STORES.iter().filter(|(s, _)| selected.contains(s)) {
        let Some(url) = env.get(var) else {
            rows.push(Row {
                store,
                ours: Err(format!("not running (no {var})")),
                theirs: None,
            });
            continue;
        };
        eprintln!("== settle: {store}");
        rows.push(store_row(store, &url, reps, run).await);
    }
    render(&rows, reps)
}

async fn store_row(store: &'static str, url: &str, reps: usize, run: u64) -> Row {
    let recipe = match store {
        "etcd" => Some("etcd-client `Election`"),
        "zookeeper" => Some("ZooKeeper lock recipe"),
        _ => None,
    };
    match samples(store, url, reps, run).await {
        Ok((ours, theirs)) => Row {
            store,
            ours: Ok(ours),
            theirs: recipe.map(|r| (r, Ok(theirs))),
        },
        Err(e) => Row {
            store,
            ours: Err(e.clone()),
            theirs: recipe.map(|r| (r, Err(e))),
        },
    }
}

/// The library's samples and, interleaved, the recipe's (empty without one).
async fn samples(store: &str, url: &str, reps: usize, run: u64) -> Outcome<(Vec<Duration>, Vec<Duration>)> {
    let mut clients: Vec<Arc<dyn LeaseStore>> = Vec::new();
    for _ in 0..2 {
        clients.push(leasehold::connect(url).await.map_err(|e| e.to_string())?);
    }
    let mut etcd = match store {
        "etcd" => Some((
            crate::floor::etcd_client(url).await?,
            crate::floor::etcd_client(url).await?,
        )),
        _ => None,
    };
    let zookeeper = match store {
        "zookeeper" => Some((zk_client(url).await?, zk_client(url).await?)),
        _ => None,
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let lease = crate::plan::lease(run, "settle", i)?;
        let (_, called) = handover_once(&clients, &lease, TTL, settle()).await?;
        ours.push(called);
        if let Some((a, b)) = etcd.as_mut() {
            let name = format!("bench-settle-election-{run}-{i}");
            theirs.push(election_once(a, b, name, settle()).await?.1);
        }
        if let Some((a, b)) = &zookeeper {
            theirs.push(zk_recipe_once(a, b, &format!("/bench-settle-{run}-{i}")).await?);
        }
    }
    Ok((ours, theirs))
}

async fn zk_client(url: &str) -> Outcome<zk::Client> {
    let hosts = crate::floor::zk_hosts(url);
    within(
        Duration::from_secs(10),
        "zookeeper connect",
        zk::Client::connect(&hosts),
    )
    .await?
    .map_err(|e| format!("zookeeper connect: {e}"))
}

/// One handover of a client-side ZooKeeper lock recipe: A and B each create an ephemeral
/// sequential znode under `dir`; B lists the children and watches its predecessor, and on its
/// deletion lists again and leads when its znode is first. From A's delete being called to B
/// knowing it leads.
async fn zk_recipe_once(a: &zk::Client, b: &zk::Client, dir: &str) -> Outcome<Duration> {
    let e = |what: &'static str| move |err: zk::Error| format!("zookeeper {what}: {err}");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    a.create(dir, b"", &persistent).await.map_err(e("create dir"))?;
    let prefix = format!("{dir}/lock-");
    let (_, seq_a) = a.create(&prefix, b"a", &ephemeral).await.map_err(e("create A"))?;
    let (_, seq_b) = b.create(&prefix, b"b", &ephemeral).await.map_err(e("create B"))?;
    let (own_a, own_b) = (format!("lock-{seq_a}"), format!("lock-{seq_b}"));
    let (b, waiting_dir, own) = (b.clone(), dir.to_string(), own_b.clone());
    let waiting = tokio::spawn(async move {
        loop {
            let mut children = b.list_children(&waiting_dir).await?;
            children.sort();
            let Some(at) = children.iter().position(|c| *c == own) else {
                return Err(zk::Error::NoNode);
            };
            if at == 0 {
                return Ok(Instant::now());
            }
            let predecessor = format!("{waiting_dir}/{}", children[at - 1]);
            let (stat, watcher) = b.check_and_watch_stat(&predecessor).await?;
            if stat.is_some() {
                watcher.changed().await;
            }
        }
    });
    tokio::time::sleep(settle()).await;
    if waiting.is_finished() {
        return Err("the recipe's B led while A held the lock".into());
    }
    let called = Instant::now();
    a.delete(&format!("{dir}/{own_a}"), None).await.map_err(e("delete A"))?;
    let led = within(Duration::from_secs(10), "the recipe's B leading", waiting)
        .await?
        .map_err(|e| e.to_string())?
        .map_err(e("B"))?;
    let _ = a.delete(&format!("{dir}/{own_b}"), None).await;
    let _ = a.delete(dir, None).await;
    Ok(led.saturating_duration_since(called))
}

fn render(rows: &[Row], reps: usize) -> String {
    let mut out = format!(
        "{HEADING}\n\nGraceful handover with the successor waiting a random 0.5-1.5 s (uniform, per \
         sample) after it has seen the leader, before the leader resigns: where a real follower \
         is in its renew and poll cycles when the leader leaves. TTL {} s; {reps} samples per \
         row, the library's and the store's own recipe's interleaved on the same server (the \
         recipe's `Election` leases: 10 s, never kept alive here). From the leader's resign (or \
         delete) called to the successor knowing it leads. Run: `cargo run -p leasehold-bench \
         -- --only settle --backends postgres,redis,etcd,zookeeper --docs-dir \
         docs`.\n\n| store | leasehold p50 (p99, max) | the store's own recipe p50 (p99, max) | \
         paired difference (leasehold minus recipe) |\n|---|---|---|---|\n",
        TTL.as_secs()
    );
    let cell = |samples: &Outcome<Vec<Duration>>| match samples {
        Ok(v) => Stats::of(v).map_or("no samples".to_string(), |s| {
            format!("{} ({}, {}; n = {})", ms(s.p50), ms(s.p99), ms(s.max), s.n)
        }),
        Err(e) => format!("failed: {e}"),
    };
    for row in rows {
        let (recipe, difference) = match (&row.theirs, &row.ours) {
            (Some((name, theirs)), Ok(ours)) => (
                format!("{name}: {}", cell(theirs)),
                theirs
                    .as_ref()
                    .ok()
                    .and_then(|t| Difference::of(ours, t))
                    .map_or(String::new(), |d| d.to_string()),
            ),
            (Some((name, theirs)), Err(_)) => (format!("{name}: {}", cell(theirs)), String::new()),
            (None, _) => ("none".to_string(), String::new()),
        };
        out.push_str(&format!(
            "| {} | {} | {recipe} | {difference} |\n",
            row.store,
            cell(&row.ours)
        ));
    }
    out
}
