//! The [`LeaseStore`] over ZooKeeper: a FIFO queue of ephemeral sequential znodes per lease.

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, EndReason, Error, Expiry, Grant,
    LeaseName, LeaseStore, Notifications, Observation, Operation, Renewed, Result, ShardRecord, ShardWrite, Term,
    Transition, random_u64,
};
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::error::{Failed, STORE, during, map};
use crate::queue::Ending;
use crate::state::Inner;

/// A lease store on a ZooKeeper ensemble.
///
/// Each lease is a znode `{chroot}/{lease}` with two children: `candidates/`, where every
/// campaigning candidate holds an ephemeral sequential znode (the lowest sequence leads, as in
/// Curator's `LeaderLatch`), and `history/`, one persistent znode per term. The term of a grant is
/// the leader znode's `czxid`, which only grows, also across restarts of the ensemble. Shard
/// records are persistent znodes apart from the leases, `{chroot}/.shards/{name}`.
///
/// A store keeps one ZooKeeper session per distinct TTL (the session timeout *is* the TTL: the
/// server deletes a silent holder's znode when its session expires). Sessions are opened on first
/// use and replaced after they expire. See the [crate docs](crate) for the whole design.
///
/// # Cancel safety
///
/// The engine runs every call to completion (or a TTL). A caller that drops one half-way leaves
/// no half-written lease: a grant, an end of term and a handover are each one `multi`
/// transaction. A dropped `acquire` may leave the candidate's znode queued (the next `acquire`
/// of the candidate reuses it, its `withdraw` deletes it) or a grant nobody heard of (a
/// read-back adopts it; the candidate's next `acquire` ends it and queues a new znode). History
/// tidying after a grant runs in a task of its own and is best effort.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_zookeeper::ZookeeperStore;
///
/// # async fn demo() -> leasehold_core::Result<()> {
/// let store = Arc::new(ZookeeperStore::connect("zk://127.0.0.1:2181/myapp").await?);
/// let elector = Elector::builder(store, "invoice-scheduler").ttl(Duration::from_secs(6)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZookeeperStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for ZookeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperStore")
            .field("config", &self.inner.config)
            .field("ttl_range", &self.inner.ttl_range)
            .finish_non_exhaustive()
    }
}

impl ZookeeperStore {
    /// Connects to the ensemble named by a `zk://` URL (see [`ZookeeperConfig`]).
    ///
    /// Probes (once per process and ensemble) the session timeouts the server grants, which
    /// become [`Capabilities::ttl`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a bad URL (an unknown option is named); [`Error::Unreachable`]
    /// when no server opens a session, saying for each host whether it does not resolve,
    /// refused the connection or did not answer; [`Error::Refused`] when ZooKeeper refuses the
    /// credentials or a host answers another protocol.
    pub async fn connect(url: &str) -> Result<ZookeeperStore> {
        ZookeeperStore::from_config(ZookeeperConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration. See [`ZookeeperStore::connect`].
    ///
    /// # Errors
    ///
    /// As [`ZookeeperStore::connect`].
    pub async fn from_config(config: ZookeeperConfig) -> Result<ZookeeperStore> {
        let ttl_range = crate::session::ttl_range(&config).await?;
        Ok(ZookeeperStore {
            inner: Arc::new(Inner {
                config,
                ttl_range,
                nonce: random_u64(),
                sessions: Mutex::default(),
                candidates: Mutex::default(),
                dead: Mutex::default(),
                leader_watches: Mutex::default(),
            }),
        })
    }

    /// The configuration (its `Debug` and `Display` redact passwords).
    pub fn config(&self) -> &ZookeeperConfig {
        &self.inner.config
    }

    /// The session timeouts the ensemble grants: the TTLs this store accepts.
    pub fn ttl_range(&self) -> RangeInclusive<Duration> {
        self.inner.ttl_range.clone()
    }
}

#[async_trait]
impl LeaseStore for ZookeeperStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: self.inner.ttl_range.clone(),
            expiry: Expiry::ServerSession,
            notifications: Notifications::ReleaseAndExpiry,
            announces: leasehold_core::Announces::Grants,
            fifo: true,
        }
    }

    fn can_break(&self) -> bool {
        true
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let acquired = async {
            self.capabilities().check_ttl(STORE, request.ttl)?;
            self.inner.try_acquire(request).await
        };
        acquired
            .await
            .map_err(|e| during(e, Operation::Acquire, &format_args!("lease {}", request.lease)))
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.inner
            .try_renew(grant)
            .await
            .map_err(|e| during(e, Operation::Renew, &format_args!("lease {}", grant.lease)))
    }

    /// One `sync` and one multi-read per session (one session per TTL) for all the grants,
    /// in chunks that fit ZooKeeper's request size; each answer as [`renew`](LeaseStore::renew)
    /// of that grant gives it (a failed request fails each of its grants, as renew would).
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        Ok(self.inner.try_renew_many(grants).await)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        // On an error the engine sends the release again.
        self.inner
            .try_release(grant)
            .await
            .map_err(|e| during(e, Operation::Release, &format_args!("lease {}", grant.lease)))
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.inner
            .try_hand_over(grant, to)
            .await
            .map_err(|e| during(e, Operation::HandOver, &format_args!("lease {}", grant.lease)))
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.inner
            .try_withdraw(lease, candidate)
            .await
            .map_err(|e| during(e, Operation::Withdraw, &format_args!("lease {lease}")))
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let inspected = async {
            let client = self.inner.reader().await?;
            self.inner.observe(&client, lease).await
        };
        inspected
            .await
            .map_err(|e| during(e, Operation::Inspect, &format_args!("lease {lease}")))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.try_history(lease, limit)
            .await
            .map_err(|e| during(e, Operation::History, &format_args!("lease {lease}")))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.inner
            .list(prefix)
            .await
            .map_err(|e| during(e, Operation::List, &format_args!("the leases starting with {prefix:?}")))
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        self.inner
            .queued_candidates(lease)
            .await
            .map_err(|e| during(e, Operation::Candidates, &format_args!("lease {lease}")))
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(Some(crate::changes::changes(self.inner.clone(), lease, candidate)))
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        self.inner.announced(lease).await.map(Some)
    }

    /// `getChildren` of `{chroot}/.shards`, then `getData` of every record whose name starts
    /// with `prefix`, in multi-reads sent together (see the [crate docs](crate::docs), "Shard
    /// records").
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.inner.shard_records(prefix).await.map_err(|e| {
            during(
                e,
                Operation::ShardRecords,
                &format_args!("the shard records starting with {prefix:?}"),
            )
        })
    }

    /// One `create` (no record expected) or one `setData` at the expected data version; a
    /// refused one is answered with one `getData`.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.inner
            .write_shard(name, expected, value)
            .await
            .map_err(|e| during(e, Operation::WriteShard, &format_args!("shard record {name}")))
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.try_break_lease(lease)
            .await
            .map_err(|e| during(e, Operation::BreakLease, &format_args!("lease {lease}")))
    }
}

impl ZookeeperStore {
    async fn try_history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let inner = &self.inner;
        let client = inner.reader().await?;
        let terms = inner.history_terms(&client, lease).await?;
        let recent = &terms[terms.len().saturating_sub(limit)..];
        let records = join_all(recent.iter().map(|term| inner.read_history(&client, lease, *term))).await;
        let mut out = Vec::with_capacity(recent.len());
        for (term, record) in recent.iter().zip(records) {
            if let Some(record) = record? {
                out.push(record.transition(*term));
            }
        }
        Ok(out)
    }

    async fn try_break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let inner = &self.inner;
        let client = inner.reader().await?;
        if let Some(reservation) = inner.read_reservation(&client, lease).await? {
            // Break the reservation: the lease opens to the queue (the handed-over term ended).
            let mut writer = client.new_multi_writer();
            let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
            add(writer.add_set_data(&inner.lease_dir(lease), &[], Some(reservation.generation)))?;
            add(writer.add_delete(&inner.reserved_path(lease), None))?;
            return match writer.commit().await {
                Ok(_) => Ok(Some(reservation.term)),
                Err(zk::MultiWriteError::OperationFailed { .. }) => Err(Error::store(
                    STORE,
                    Failed::new(format!(
                        "the reservation of term {} ended while being broken, so nothing was broken; look at the lease again",
                        reservation.term
                    )),
                )),
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(map(source)),
            };
        }
        let queue = inner.queue(&client, lease).await?.unwrap_or_default();
        let Some((first, record, stat)) = inner.head(&client, lease, &queue).await? else {
            return Ok(None);
        };
        let term = Term(stat.czxid as u64);
        let ending = Ending {
            node: &queue[first].name,
            version: stat.version,
            term,
            holder: &record.candidate,
        };
        if inner.end_term(&client, lease, &ending, EndReason::Broken).await? {
            return Ok(Some(term));
        }
        // The holder's znode went between the read and the break: its term ended by itself
        // (released, expired, or broken by another operator), and the lease may have passed on.
        Err(Error::store(
            STORE,
            Failed::new(format!(
                "the holder (term {term}) left while being broken, so nothing was broken; look at the lease again"
            )),
        ))
    }
}
