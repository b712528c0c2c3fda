//! What a run measures, and the helpers every measure shares: connecting, campaigning, timing
//! out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold::{Elector, Event, Leader, LeaseName, LeaseStore};
use tokio::sync::broadcast;

use crate::backends::Available;

pub(crate) type Outcome<T> = Result<T, String>;

/// How much of everything to do.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) smoke: bool,
    /// Run crash-failover leaders and the scale measures in child processes of this executable.
    pub(crate) child_processes: bool,
    pub(crate) latency_reps: usize,
    pub(crate) handover_reps: usize,
    pub(crate) failover_reps: usize,
    pub(crate) transition_candidates: Vec<usize>,
    pub(crate) transition_reps: usize,
    pub(crate) idle_followers: usize,
    pub(crate) scale_sizes: Vec<usize>,
    /// Shards of the 3-member group.
    pub(crate) group_shards: u32,
    /// Shard counts of the one-member cost measure.
    pub(crate) group_cost_shards: Vec<u32>,
    /// Members and shards of the group at scale (members in processes of their own).
    pub(crate) group_scale: (usize, u32),
    /// Measures to run (`--only`); empty: all.
    pub(crate) only: Vec<String>,
}

impl Plan {
    pub(crate) fn new(smoke: bool, child_processes: bool) -> Plan {
        if smoke {
            Plan {
                smoke,
                child_processes,
                latency_reps: 5,
                handover_reps: 2,
                failover_reps: 1,
                transition_candidates: vec![1, 2],
                transition_reps: 2,
                idle_followers: 2,
                scale_sizes: vec![10],
                group_shards: 16,
                group_cost_shards: vec![16],
                group_scale: (4, 200),
                only: Vec::new(),
            }
        } else {
            Plan {
                smoke,
                child_processes,
                latency_reps: 200,
                handover_reps: 20,
                failover_reps: 5,
                transition_candidates: vec![1, 10, 100],
                transition_reps: 5,
                idle_followers: 3,
                scale_sizes: vec![1_000, 10_000],
                group_shards: 64,
                group_cost_shards: vec![100, 1_000, 10_000],
                group_scale: (4, 10_000),
                only: Vec::new(),
            }
        }
    }

    /// Whether `measure` is to run (`--only`).
    pub(crate) fn wants(&self, measure: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|m| m == measure)
    }

    /// Repetitions of the graceful handover (also those of the etcd references).
    pub(crate) fn handover_reps(&self) -> usize {
        self.handover_reps
    }

    /// Long TTLs (Azure: 15 s) get fewer repetitions so that the full run stays under 15 minutes.
    pub(crate) fn reps(&self, n: usize, ttl: Duration) -> usize {
        if ttl >= Duration::from_secs(10) {
            n.div_ceil(4).max(2).min(n)
        } else {
            n
        }
    }
}

pub(crate) fn lease(run: u64, what: &str, i: usize) -> Outcome<LeaseName> {
    LeaseName::new(format!("bench-{run}-{what}-{i}")).map_err(|e| e.to_string())
}

pub(crate) fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str, ttl: Duration) -> Outcome<Elector> {
    elector_polling(store, lease, id, ttl, None)
}

/// [`elector`], polling every `retry_every` where given.
pub(crate) fn elector_polling(
    store: Arc<dyn LeaseStore>,
    lease: &LeaseName,
    id: &str,
    ttl: Duration,
    retry_every: Option<Duration>,
) -> Outcome<Elector> {
    let mut builder = Elector::builder(store, lease.as_str()).ttl(ttl).candidate_id(id);
    if let Some(every) = retry_every {
        builder = builder.retry_every(every);
    }
    builder.build().map_err(|e| e.to_string())
}

pub(crate) async fn connect(av: &Available) -> Outcome<Arc<dyn LeaseStore>> {
    match tokio::time::timeout(Duration::from_secs(20), av.connect()).await {
        Ok(r) => r.map_err(|e| format!("connect: {e}")),
        Err(_) => Err("connect: no answer in 20 s".into()),
    }
}

pub(crate) async fn connect_many(av: &Available, n: usize) -> Outcome<Vec<Arc<dyn LeaseStore>>> {
    let clients: Vec<Outcome<Arc<dyn LeaseStore>>> = futures::stream::iter(0..n)
        .map(|_| connect(av))
        .buffer_unordered(16)
        .collect()
        .await;
    clients.into_iter().collect()
}

pub(crate) async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> Outcome<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what}: nothing within {limit:?}"))
}

pub(crate) async fn campaign(e: &Elector, limit: Duration) -> Outcome<Leader> {
    within(limit, "campaign", e.campaign())
        .await?
        .map_err(|e| e.to_string())
}

/// The next Elected event's instant.
pub(crate) async fn elected(rx: &mut broadcast::Receiver<Event>) -> Option<Instant> {
    loop {
        match rx.recv().await {
            Ok(Event::Elected { at, .. }) => return Some(at),
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// Until the candidate has seen someone lead (its first acquire answered Held).
pub(crate) async fn sees_holder(rx: &mut broadcast::Receiver<Event>) {
    loop {
        match rx.recv().await {
            Ok(Event::LeaderChanged(Some(_))) | Err(broadcast::error::RecvError::Closed) => return,
            _ => {}
        }
    }
}
