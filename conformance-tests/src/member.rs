//! [`SoleMember`]: one member of a lease group leading every shard, for backends' cost
//! measurements.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{Error, LeaseGroup, LeaseStore, Result, ShardLeader};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The only member of a group (`member`), whose shard tasks wait until cancelled.
#[derive(Debug)]
pub struct SoleMember {
    /// The member's group.
    pub group: LeaseGroup,
    stop: CancellationToken,
    running: JoinHandle<Result<()>>,
}

impl SoleMember {
    /// Joins group `name` of `shards` shards on `store` and waits until the member leads every
    /// shard; prints how long that took.
    ///
    /// # Panics
    ///
    /// When the group cannot be built, or not every shard is led within `bound`.
    pub async fn lead_every_shard(
        store: Arc<dyn LeaseStore>,
        name: &str,
        shards: u32,
        ttl: Duration,
        bound: Duration,
    ) -> SoleMember {
        let group = LeaseGroup::builder(store, name, shards)
            .member_id("member")
            .ttl(ttl)
            .build()
            .unwrap_or_else(|e| panic!("group {name}: {e}"));
        let stop = CancellationToken::new();
        let running = tokio::spawn({
            let (group, stop) = (group.clone(), stop.clone());
            async move {
                let task = |shard: ShardLeader| async move {
                    shard.cancelled().await;
                    Ok::<(), Error>(())
                };
                group.run_until(task, stop.cancelled_owned()).await
            }
        });
        let started = Instant::now();
        while group.owned().len() < shards as usize {
            assert!(
                started.elapsed() < bound,
                "only {} of {shards} shards led after {:?}",
                group.owned().len(),
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("{shards} shards led after {:.1?}", started.elapsed());
        SoleMember { group, stop, running }
    }

    /// Leaves the group and waits until every shard task has returned.
    ///
    /// # Panics
    ///
    /// When the group's run failed.
    pub async fn leave(self) {
        self.stop.cancel();
        self.running
            .await
            .expect("the member's task")
            .unwrap_or_else(|e| panic!("the member's run: {e}"));
    }
}
