//! A lease group: `cargo run --example shards`.
//!
//! Three members share 12 shards of one group over one SQLite file in a temp dir. Each member
//! runs a task per shard it owns; the task prints the shard's fencing term. The example waits
//! until the shards are balanced (4 each), stops one member gracefully, waits until the other
//! two own 6 each, prints what `LeaseGroup::status` shows, and exits 0 only if all of that
//! happened. See docs/groups.md.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{LeaseGroup, ShardLeader};
use tokio::sync::oneshot;

const SHARDS: u32 = 12;
const TTL: Duration = Duration::from_secs(2);

/// Which member runs which shard now, as the tasks report it.
type Running = Arc<Mutex<BTreeMap<u32, String>>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    let running: Running = Arc::default();
    let started = Instant::now();

    let mut members = Vec::new();
    for id in ["worker-a", "worker-b", "worker-c"] {
        members.push(member(&url, id, running.clone()).await?);
    }
    wait_for(&running, &[4, 4, 4], started).await?;

    println!(
        "{:>6.2}s  stopping worker-c gracefully",
        started.elapsed().as_secs_f64()
    );
    let (stop, handle) = members.pop().expect("three members");
    let _ = stop.send(());
    handle.await??;
    wait_for(&running, &[6, 6], started).await?;

    let store = leasehold::connect(&url).await?;
    let status = LeaseGroup::status(store.as_ref(), "orders").await?;
    for shard in &status.shards {
        if let Some((owner, term)) = shard.owner() {
            println!("shard {:>2}: {owner} (term {term})", shard.shard);
        }
    }
    for (stop, handle) in members {
        let _ = stop.send(());
        handle.await??;
    }
    println!("{:>6.2}s  done", started.elapsed().as_secs_f64());
    Ok(())
}

type Member = (oneshot::Sender<()>, tokio::task::JoinHandle<leasehold::Result<()>>);

/// Starts member `id`: its task per owned shard records itself in `running` while it runs.
async fn member(url: &str, id: &str, running: Running) -> leasehold::Result<Member> {
    let store = leasehold::connect(url).await?;
    let group = LeaseGroup::builder(store, "orders", SHARDS)
        .member_id(id)
        .ttl(TTL)
        .build()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let handle = tokio::spawn(async move {
        group
            .run_until(
                move |shard: ShardLeader| {
                    let running = running.clone();
                    async move {
                        let me = shard.holder().to_string();
                        shard.ensure_valid(Duration::from_millis(200))?;
                        println!("shard {:>2}: {me} leads with term {}", shard.shard(), shard.term());
                        running.lock().expect("lock").insert(shard.shard(), me);
                        shard.cancelled().await;
                        running.lock().expect("lock").remove(&shard.shard());
                        Ok::<(), leasehold::Error>(())
                    }
                },
                shutdown,
            )
            .await
    });
    Ok((stop, handle))
}

/// Waits until the members run `counts` shards each (any order), at most 10 TTLs.
async fn wait_for(running: &Running, counts: &[usize], started: Instant) -> Result<(), String> {
    let deadline = Instant::now() + TTL * 10;
    loop {
        let mut per_member: BTreeMap<String, usize> = BTreeMap::new();
        for member in running.lock().expect("lock").values() {
            *per_member.entry(member.clone()).or_default() += 1;
        }
        let mut now: Vec<usize> = per_member.values().copied().collect();
        now.sort_unstable();
        if now == counts {
            println!("{:>6.2}s  balanced: {per_member:?}", started.elapsed().as_secs_f64());
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not balanced to {counts:?} within 10 TTLs: {per_member:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
