//! [`S3Store`]: the [`LeaseStore`] on one bucket prefix of an S3-compatible object store.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, Announces, CandidateId, Capabilities, EndReason, Error, Expiry, Grant, LeaseName,
    LeaseStore, LimitStore, Notifications, Observation, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};

use crate::config::{DEFAULT_MAX_IN_FLIGHT, S3Config};
use crate::error::STORE;
use crate::objects::{self, If, Objects, Read};
use crate::record::{Record, TTL_RANGE};

/// How many lease objects `list` reads at once.
const LIST_READS: usize = 16;

/// A [`LeaseStore`] on one bucket prefix of an S3-compatible object store, shared by every
/// process that names it.
///
/// Each lease is one JSON object, `PREFIX/LEASE`, holding its holder, term, TTL, a random record
/// version that changes with every write, and its recent terms (see [`docs`](crate::docs) for
/// the layout). Shard records are objects of their own, `PREFIX/.leasehold-shards/NAME`. Every write is a `PutObject` on a condition: `If-None-Match: *` to create the
/// object, `If-Match: <ETag>` of the object as read to replace it. A release writes a tombstone
/// that keeps the term; the object is never deleted, so terms never go back.
///
/// The store has no clock a lease could use: a contender takes over a silent holder only after
/// it has seen the same record version unchanged for the holder's full TTL on its own monotonic
/// clock ([`Expiry::ObservedByContenders`]; the engine does the watching and passes
/// [`AcquireRequest::takeover`]). Wall-clock time is written for the audit trail only.
///
/// [`S3Store::connect`] refuses a store that answers conditional writes without honouring them
/// (see [`ConnectError::ConditionalWritesIgnored`](crate::ConnectError::ConditionalWritesIgnored)).
///
/// # Cancel safety
///
/// Every write is one conditional request, applied or not as a whole, and the engine settles an
/// unknown outcome by reading back. A dropped acquire may have been granted (the grant lapses
/// after its TTL unless renewed); a dropped renewal changes nothing or moves the version on; a
/// dropped release leaves the lease to be taken over once its version has been seen unchanged
/// for a TTL. An operation dropped while it waits for its turn is never sent.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_s3::S3Store;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = S3Store::connect(
///     "s3://leases/app?endpoint=http://127.0.0.1:27000&access_key_id=local&secret_access_key=local&create_bucket=true",
/// )
/// .await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(10)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct S3Store {
    requests: Arc<LimitStore<Objects>>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client holds the credentials: leave it out.
        let objects = self.requests.inner();
        f.debug_struct("S3Store")
            .field("bucket", &objects.bucket)
            .field("key_prefix", &objects.key_prefix)
            .field("timeout", &objects.timeout)
            .field("max_in_flight", &self.requests.max_in_flight())
            .finish_non_exhaustive()
    }
}

impl S3Store {
    /// Connects to the bucket and prefix named by an `s3://` URL (see [`S3Config`] for the forms
    /// and options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed URL; otherwise as [`S3Store::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        S3Store::from_config(S3Config::from_str(url)?).await
    }

    /// Builds a client for `config`, creates the bucket when it is missing and
    /// [`S3Config::create_bucket`] is set, and checks that the store honours conditional writes
    /// ([`S3Store::probe`]).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Refused`] with a [`ConnectError`](crate::ConnectError) source: the store does
    ///   not honour conditional writes, the bucket is missing, or no credentials or region are
    ///   configured; also when the service refuses the credentials (what to check is named);
    /// - a transient error when the store cannot be reached.
    pub async fn from_config(config: S3Config) -> Result<Self> {
        config.validate()?;
        let client = objects::build_client(&config).await?;
        let store = S3Store::with_objects(Objects::new(client, &config), config.max_in_flight);
        if config.create_bucket {
            store.requests.inner().create_bucket_if_missing().await?;
        }
        store.probe().await?;
        Ok(store)
    }

    /// A store on `bucket` and `prefix` using a client you configured yourself (credentials,
    /// region, endpoint, path style). Nothing is checked; call [`S3Store::probe`] before use.
    ///
    /// Configure the client without retries (`RetryConfig::disabled()`): the engine retries, and
    /// a client that retries on its own hides how long an attempt really took.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a bucket or prefix S3 would reject.
    pub fn from_client(client: Client, bucket: impl Into<String>, prefix: impl Into<String>) -> Result<Self> {
        let config = S3Config {
            prefix: prefix.into(),
            ..S3Config::new(bucket)
        };
        config.validate()?;
        Ok(S3Store::with_objects(
            Objects::new(client, &config),
            DEFAULT_MAX_IN_FLIGHT,
        ))
    }

    fn with_objects(objects: Objects, max_in_flight: usize) -> Self {
        S3Store {
            requests: Arc::new(LimitStore::new(objects, max_in_flight)),
        }
    }

    /// Checks that the store honours conditional writes, on two fresh probe objects
    /// (`PREFIX/.leasehold-probe-*`, deleted afterwards): a second create-if-absent of a key
    /// and a replace naming a stale ETag must be refused, and of 8 creates of one key sent at
    /// once exactly one may succeed. [`S3Store::connect`] runs it; 14 requests.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] with
    /// [`ConnectError::ConditionalWritesIgnored`](crate::ConnectError::ConditionalWritesIgnored)
    /// saying which probe the store got wrong, or
    /// [`ConnectError::BucketMissing`](crate::ConnectError::BucketMissing); the errors of a
    /// write otherwise.
    pub async fn probe(&self) -> Result<()> {
        self.requests.inner().probe().await
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.requests.inner().client
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.requests.inner().bucket
    }

    /// The key of a lease's object.
    pub fn key(&self, lease: &LeaseName) -> String {
        self.requests.inner().key(lease)
    }

    /// The key of a shard record's object: `PREFIX/.leasehold-shards/NAME`.
    pub fn shard_key(&self, name: &LeaseName) -> String {
        self.requests.inner().shard_key(name)
    }
}

#[async_trait]
impl LeaseStore for S3Store {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        self.requests.capabilities()
    }

    fn can_break(&self) -> bool {
        self.requests.can_break()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.requests.acquire(request).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.requests.renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.requests.release(grant).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.requests.hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.requests.withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.requests.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.requests.history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.requests.list(prefix).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.requests.shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.requests.write_shard(name, expected, value).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.requests.break_lease(lease).await
    }
}

impl Objects {
    /// What a lease looks like now: a lease without an object is free at term 0.
    async fn observe(&self, lease: &LeaseName, operation: &'static str) -> Result<Observation> {
        Ok(match self.get(lease, operation).await? {
            Some(read) => read.record.observation(lease),
            None => Observation::free(lease.clone(), Term(0), None),
        })
    }

    /// Replaces the object read as `read` with `next` if nobody wrote it meanwhile: whether it
    /// was written. The store remembers what it wrote while `keep` (it holds the lease), and
    /// forgets the lease otherwise.
    async fn replace(
        &self,
        lease: &LeaseName,
        read: &Read,
        next: Record,
        keep: bool,
        operation: &'static str,
    ) -> Result<bool> {
        let written = self.put(lease, &next, If::Matches(&read.etag), operation).await?;
        let written = written.map(|etag| Read { record: next, etag });
        let replaced = written.is_some();
        self.remember(lease, written.filter(|_| keep));
        Ok(replaced)
    }
}

fn granted(request: &AcquireRequest, record: &Record) -> Acquired {
    Acquired::Granted(Grant {
        lease: request.lease.clone(),
        holder: request.candidate.clone(),
        term: record.term(),
        ttl: request.ttl,
        token: record.version().to_string(),
    })
}

#[async_trait]
impl LeaseStore for Objects {
    fn name(&self) -> &'static str {
        STORE
    }

    fn can_break(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ObservedByContenders,
            notifications: Notifications::None,
            announces: Announces::None,
            fifo: false,
        }
    }

    /// A read, then one conditional write: a create-if-absent for a lease without an object, a
    /// replace on the ETag read otherwise (a free lease, the candidate's own, or a takeover of
    /// the version named). A lost race is `Held` as the object is then.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let lease = &request.lease;
        let now = SystemTime::now();
        let written = match self.get(lease, "acquire").await? {
            None => {
                let first = Record::first(lease, &request.candidate, request.ttl, now);
                let written = self.put(lease, &first, If::Absent, "acquire").await?;
                written.map(|etag| {
                    self.remember(
                        lease,
                        Some(Read {
                            record: first.clone(),
                            etag,
                        }),
                    );
                    first
                })
            }
            Some(read) => {
                let grantable = match read.record.holder_info(lease)? {
                    None => true,
                    // Ours from an earlier campaign that the engine does not believe (or reserved
                    // for us by a handover): a new term.
                    Some(holder) if holder.id == request.candidate => true,
                    Some(holder) => request.takeover.as_deref() == Some(holder.version.as_str()),
                };
                if !grantable {
                    return Ok(Acquired::Held(read.record.observation(lease)));
                }
                let next = read.record.clone().granted(&request.candidate, request.ttl, now);
                self.replace(lease, &read, next.clone(), true, "acquire")
                    .await?
                    .then_some(next)
            }
        };
        match written {
            Some(record) => Ok(granted(request, &record)),
            None => Ok(Acquired::Held(self.observe(lease, "acquire").await?)),
        }
    }

    /// A replace with a new version on the ETag of the store's own last write (one request), or
    /// of a read when the store has none, if the object names the grant's holder at its term
    /// (not merely reserved for it). When the object changed meanwhile but still names the
    /// grant, this renewal made nothing sure: a transient error, which the engine settles by
    /// reading back (an earlier renewal whose answer was lost may have moved the version on).
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let lease = &grant.lease;
        let read = match self.written(lease, &grant.token) {
            Some(read) => read,
            None => match self.get(lease, "renew").await? {
                Some(read) => read,
                None => return Ok(Renewed::Lost(Observation::free(lease.clone(), Term(0), None))),
            },
        };
        if !read.record.is_held_by(&grant.holder, grant.term) {
            self.remember(lease, None);
            return Ok(Renewed::Lost(read.record.observation(lease)));
        }
        let next = read.record.clone().renewed();
        let token = next.version().to_string();
        if self.replace(lease, &read, next, true, "renew").await? {
            return Ok(Renewed::Renewed(Grant { token, ..grant.clone() }));
        }
        match self.get(lease, "renew").await? {
            Some(now) if now.record.is_held_by(&grant.holder, grant.term) => {
                let version = now.record.version().to_string();
                self.remember(lease, Some(now));
                Err(Error::unreachable(
                    STORE,
                    format!(
                        "renew: the object of {lease} changed under the renewal but still names term {} \
                         (version {version}); read it back",
                        grant.term
                    ),
                ))
            }
            Some(now) => Ok(Renewed::Lost(now.record.observation(lease))),
            None => Ok(Renewed::Lost(Observation::free(lease.clone(), Term(0), None))),
        }
    }

    /// A tombstone that keeps the term, written on the ETag read if the object still names the
    /// grant; otherwise nothing (a lost race too).
    async fn release(&self, grant: &Grant) -> Result<()> {
        let lease = &grant.lease;
        self.remember(lease, None);
        if let Some(read) = self.get(lease, "release").await?
            && read.record.is_held_by(&grant.holder, grant.term)
        {
            let next = read.record.clone().ended(EndReason::Released, SystemTime::now());
            self.replace(lease, &read, next, false, "release").await?;
        }
        Ok(())
    }

    /// The object, if it still names the grant, is replaced by one reserved for `to` at the same
    /// term, which ends handed over, with a new version; `to`'s acquire then takes it with a new
    /// term, anyone else's is `Held` until it has seen the version unchanged for the TTL.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.capabilities().check_ttl(STORE, grant.ttl)?;
        let lease = &grant.lease;
        self.remember(lease, None);
        if let Some(read) = self.get(lease, "hand_over").await?
            && read.record.is_held_by(&grant.holder, grant.term)
        {
            let next = read.record.clone().handed_over(to, grant.ttl, SystemTime::now());
            self.replace(lease, &read, next, false, "hand_over").await?;
        }
        Ok(())
    }

    /// Ends a term the object gives to `candidate` although its engine holds no grant (an
    /// acquire whose answer never arrived), or a reservation for it: released, so the lease is
    /// free at once rather than after a contender has watched its version for a TTL.
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        if let Some(read) = self.get(lease, "withdraw").await?
            && read.record.holder_id() == Some(candidate.as_str())
        {
            let next = read.record.clone().ended(EndReason::Released, SystemTime::now());
            self.replace(lease, &read, next, false, "withdraw").await?;
        }
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.observe(lease, "inspect").await
    }

    /// The terms kept in the object (the last [`MAX_TERMS`](crate::MAX_TERMS)).
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let Some(read) = self.get(lease, "history").await? else {
            return Ok(Vec::new());
        };
        let mut terms = read.record.transitions();
        let skip = terms.len().saturating_sub(limit);
        terms.drain(..skip);
        Ok(terms)
    }

    /// One `ListObjectsV2` per 1,000 keys under the prefix that start with `prefix` (not
    /// descending into deeper prefixes), then a read of each object, 16 at a time.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let names = self.list_names(prefix).await?;
        let reads = futures::stream::iter(names)
            .map(|lease| async move {
                let read = self.get(&lease, "list").await?;
                Ok::<_, Error>(read.map(|read| read.record.observation(&lease)))
            })
            .buffered(LIST_READS)
            .collect::<Vec<_>>()
            .await;
        let mut found = Vec::new();
        for read in reads {
            // An object deleted since the listing is no lease.
            found.extend(read?);
        }
        Ok(found)
    }

    /// `ListObjectsV2` per 1,000 records under `PREFIX/.leasehold-shards/`, then a `GetObject` of
    /// each record not already known at the ETag listed, 32 at a time.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.list_shards(prefix).await
    }

    /// One `PutObject` (value and a fresh nonce) on `If-None-Match: *` or `If-Match`; refused,
    /// one `GetObject` of the record.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.put_shard(name, expected, value).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let Some(read) = self.get(lease, "break_lease").await? else {
            return Ok(None);
        };
        if read.record.holder_id().is_none() {
            return Ok(None);
        }
        let term = read.record.term();
        let next = read.record.clone().ended(EndReason::Broken, SystemTime::now());
        if self.replace(lease, &read, next, false, "break_lease").await? {
            return Ok(Some(term));
        }
        let now = self.observe(lease, "break_lease").await?;
        Err(Error::store(
            STORE,
            format!(
                "break_lease of {lease}: the lease changed (now term {}) while term {term} was being broken; break it again",
                now.last_term
            ),
        ))
    }
}
