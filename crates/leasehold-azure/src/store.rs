//! The [`LeaseStore`] on Azure Blob Storage: one blob per lease, a claim in its metadata, then a
//! blob lease. See the [design notes](crate::docs).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::{ClientOptions, Etag, RetryOptions, Transport};
use azure_storage_blob::models::{
    BlobClientBreakLeaseOptions, BlobClientGetPropertiesOptions, BlobClientReleaseLeaseOptions,
    BlobClientRenewLeaseOptions, BlobClientSetMetadataOptions,
};
use azure_storage_blob::{BlobClient, BlobContainerClient, BlobContainerClientOptions};
use leasehold_core::{
    AcquireRequest, Acquired, Admitted, CandidateId, Capabilities, EndReason, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, Operation, Renewed, RequestLimit, Result, ShardRecord, ShardWrite, Term,
    Transition,
};

use crate::config::{Auth, AzureConfig, TTL_RANGE};
use crate::error::{self, AzureError, Refusal, STORE};
use crate::record::{Entry, Record, State, Token, View, lease_id, reserved_lease_id, view_of};
use crate::sas::{AccountKey, SignWithKey};

const REQUEST_ID: azure_core::http::headers::HeaderName =
    azure_core::http::headers::HeaderName::from_static("x-ms-request-id");

/// A lease store on Azure Blob Storage (or the Azurite emulator).
///
/// Each lease is a blob `{prefix}{lease}` in one container; its metadata holds the holder and
/// the fencing term, and a blob lease (15 to 60 s, enforced by the service's clock) keeps
/// everyone else out. History is kept in small blobs `{prefix}{lease}.history/{term:020}`, for
/// the most recent [`history_limit`](AzureConfig::history_limit) terms. Shard records are empty
/// blobs `{prefix}.leasehold-shards/{name}`, their value in metadata (see the design notes).
///
/// Clones share the HTTP connections and the cache of record versions.
///
/// # Cancel safety
///
/// Every operation is a sequence of conditional requests, each of which is applied or not as a
/// whole, and every step can be recognised by reading the blob back (the claim names the
/// candidate; the blob lease id is derived from the candidate). A dropped acquire may leave a
/// claim that counts as held for its TTL, or a blob lease that expires after its TTL; the
/// engine's read-back adopts it, [`LeaseStore::withdraw`] withdraws it, or it goes stale. A
/// dropped release leaves the lease to expire. A dropped history write leaves the term's end
/// to be inferred (expired when the next term began).
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use leasehold_azure::AzureBlobStore;
/// use leasehold_core::Elector;
///
/// # async fn demo() -> leasehold_core::Result<()> {
/// // The account key (%-escaped); the store signs an account SAS for every request itself.
/// let store = AzureBlobStore::connect("azblob://myaccount/leases?account_key=c2VjcmV0LWtleQ%3D%3D").await?;
/// let elector = Elector::builder(Arc::new(store), "invoice-scheduler")
///     .ttl(std::time::Duration::from_secs(15))
///     .build()?;
/// # let _ = elector; Ok(()) }
/// ```
#[derive(Clone)]
pub struct AzureBlobStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AzureBlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The SDK client is left out: it is not `Debug`.
        f.debug_struct("AzureBlobStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: AzureConfig,
    container: BlobContainerClient,
    /// Slots for operations in flight: [`AzureConfig::max_requests`] for any operation plus
    /// [`AzureConfig::max_renewals`] kept for renewals and releases, so that a flood of
    /// campaigns never makes a leader's renewal wait. An operation keeps its slot for all of its
    /// requests, so that one which started can finish before its deadline instead of queueing
    /// again for every step.
    limit: RequestLimit,
    /// The last state of each lease blob this client saw, so that an acquire can compare-and-set
    /// against it in one request.
    views: Mutex<HashMap<LeaseName, View>>,
}

impl AzureBlobStore {
    /// Connects to the store named by an `azblob://` (or SAS `https://`) URL (see
    /// [`AzureConfig`] for the forms and options), as [`AzureBlobStore::from_config`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with every secret redacted); otherwise as
    /// [`AzureBlobStore::from_config`].
    pub async fn connect(url: &str) -> Result<AzureBlobStore> {
        AzureBlobStore::from_config(AzureConfig::from_url(url)?).await
    }

    /// Connects with a configuration (e.g. an [`Auth::Credential`] built in code) and checks the
    /// credential with one request (the properties of a blob leasehold never writes), so that a
    /// wrong SAS or key fails here, with a message saying what to check, rather than at the
    /// first campaign. The container is created on first use if it is missing.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for an endpoint that cannot carry a container or an account key
    ///   that is not base64;
    /// - a definite error naming the credential when the service refuses it (HTTP 401/403), or
    ///   when the endpoint does not answer as a blob service;
    /// - a transient error when the endpoint cannot be reached within
    ///   [`AzureConfig::timeout`].
    pub async fn from_config(config: AzureConfig) -> Result<AzureBlobStore> {
        let url = config.container_url()?;
        let credential = match &config.auth {
            Auth::Credential(credential) => Some(credential.clone()),
            _ => None,
        };
        // Idle connections are dropped after 2 s: servers close theirs (Node, so Azurite, after
        // 5 s), and a renewal every ttl/3 would otherwise race the close and fail for nothing.
        let mut http = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(2))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = &config.ca {
            http = http.tls_certs_only(crate::config::private_ca(ca)?);
        }
        let http = http
            .build()
            .map_err(|e| Error::store(STORE, format!("cannot build the HTTP client: {e}")))?;
        let mut client_options = ClientOptions {
            // Timing belongs to the engine: no retries inside the client.
            retry: RetryOptions::none(),
            transport: Some(Transport::new(Arc::new(http))),
            ..ClientOptions::default()
        };
        if let Auth::AccountKey(key) = &config.auth {
            let key = AccountKey::new(&config.account, key).map_err(|why| Error::InvalidConfig {
                field: "account_key",
                value: "***".into(),
                allowed: why,
            })?;
            client_options.per_call_policies.push(Arc::new(SignWithKey(key)));
        }
        let options = BlobContainerClientOptions {
            client_options,
            ..BlobContainerClientOptions::default()
        };
        let container = BlobContainerClient::new(url, credential, Some(options)).map_err(|e| Error::InvalidConfig {
            field: "endpoint",
            value: error::without_urls(config.endpoint.as_str()),
            allowed: error::without_urls(&e.to_string()),
        })?;
        let inner = Inner {
            limit: RequestLimit::new(config.max_requests.max(1) + config.max_renewals.max(1))
                .reserve_urgent(config.max_renewals.max(1)),
            config,
            container,
            views: Mutex::default(),
        };
        let store = AzureBlobStore { inner: Arc::new(inner) };
        store.check_credential().await?;
        Ok(store)
    }

    /// One cheap authenticated request: the properties of a blob leasehold never writes. Found
    /// or not found (of the blob or of the container), the credential works. An answer without
    /// Azure's request id, or a connection that broke after the request was sent, means that
    /// something else than a blob service listens at the endpoint.
    async fn check_credential(&self) -> Result<()> {
        let blob = self
            .inner
            .container
            .blob_client(&format!("{}.leasehold-connect-check", self.inner.config.prefix));
        let after = self.inner.config.timeout;
        let answered = match tokio::time::timeout(after, blob.get_properties(None)).await {
            Err(_) => {
                return Err(Error::Timeout {
                    store: STORE,
                    operation: "connect",
                    after,
                });
            }
            Ok(answered) => answered,
        };
        let headers = match &answered {
            Ok(reply) => Some(reply.headers().clone()),
            Err(e) => match e.kind() {
                azure_core::error::ErrorKind::HttpResponse { raw_response, .. } => {
                    raw_response.as_ref().map(|raw| raw.headers().clone())
                }
                _ => None,
            },
        };
        let azure = headers.is_some_and(|h| h.get_optional_str(&REQUEST_ID).is_some());
        let refusal = match answered {
            Ok(_) if azure => return Ok(()),
            Ok(_) => None,
            Err(e) => Some((self.refusal("connect", &e), error::broke_after_sending(&e))),
        };
        match refusal {
            Some((Refusal::NotFound(_), _)) if azure => Ok(()),
            Some((Refusal::Failed(e), false)) if e.is_transient() || e.is_permanent() => Err(e),
            Some((Refusal::Failed(Error::Unreachable { source, .. }), true)) => {
                let what = source
                    .downcast_ref::<AzureError>()
                    .map_or_else(|| source.to_string(), |e| e.message.clone());
                Err(Error::refused_because(
                    STORE,
                    "connect",
                    format!(
                        "{} answered, but not as an Azure blob service ({what}): check the endpoint and its port",
                        error::without_urls(self.inner.config.endpoint.as_str()),
                    ),
                    source,
                ))
            }
            Some((Refusal::Failed(e), _)) => Err(e),
            _ => Err(Error::refused(
                STORE,
                "connect",
                format!(
                    "{} answered without Azure's x-ms-request-id: not an Azure blob service, check the endpoint",
                    error::without_urls(self.inner.config.endpoint.as_str()),
                ),
            )),
        }
    }

    /// The configuration (its `Debug` hides the secrets).
    pub fn config(&self) -> &AzureConfig {
        &self.inner.config
    }

    /// The name of the blob that holds `lease`.
    pub fn blob_name(&self, lease: &LeaseName) -> String {
        format!("{}{}", self.inner.config.prefix, lease)
    }

    pub(crate) fn container(&self) -> &BlobContainerClient {
        &self.inner.container
    }

    pub(crate) fn blob(&self, lease: &LeaseName) -> BlobClient {
        self.inner.container.blob_client(&self.blob_name(lease))
    }

    pub(crate) fn refusal(&self, operation: &'static str, error: &azure_core::Error) -> Refusal {
        Refusal::from_sdk(operation, error, &self.inner.config.endpoint)
    }

    /// Runs one request, sorting its failure.
    pub(crate) async fn call<T>(
        &self,
        operation: &'static str,
        request: impl Future<Output = azure_core::Result<T>>,
    ) -> std::result::Result<T, Refusal> {
        request.await.map_err(|e| self.refusal(operation, &e))
    }

    /// Waits for a slot to run an operation (renewals and releases first, and on slots of
    /// their own); the slot is held until the returned guard is dropped.
    async fn turn(&self, operation: Operation) -> Admitted {
        self.inner.limit.admit(operation).await
    }

    pub(crate) fn remember(&self, lease: &LeaseName, view: &View) {
        self.inner
            .views
            .lock()
            .expect("views lock")
            .insert(lease.clone(), view.clone());
    }

    fn remembered(&self, lease: &LeaseName) -> Option<View> {
        self.inner.views.lock().expect("views lock").get(lease).cloned()
    }

    /// Reads the lease blob's properties and record.
    pub(crate) async fn read(&self, lease: &LeaseName) -> Result<View> {
        let options = BlobClientGetPropertiesOptions::default();
        let view = match self
            .call("get_properties", self.blob(lease).get_properties(Some(options)))
            .await
        {
            Ok(reply) => view_of(lease, reply.headers())?,
            Err(Refusal::NotFound(_)) => View::absent(),
            Err(refusal) => return Err(refusal.into_error()),
        };
        self.remember(lease, &view);
        Ok(view)
    }

    /// Breaks the blob lease of `lease` at once (an operator's tool, also
    /// [`LeaseStore::break_lease`]): the holder's next renewal answers `Lost`, and the next grant
    /// has a higher term. Answers the broken term, or `None` when nobody held the lease.
    ///
    /// # Errors
    ///
    /// A transient error when the service cannot be reached; [`Error::CorruptRecord`].
    pub async fn break_blob_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let _turn = self.turn(Operation::BreakLease).await;
        let view = self.read(lease).await?;
        let Some(record) = view.holder().cloned() else {
            return Ok(None);
        };
        if view.leased {
            let options = BlobClientBreakLeaseOptions {
                break_period: Some(0),
                ..Default::default()
            };
            match self
                .call("break_lease", self.blob(lease).break_lease(Some(options)))
                .await
            {
                Ok(_) | Err(Refusal::Conflict(_)) => {}
                Err(refusal) => return Err(refusal.into_error()),
            }
        }
        // A new ETag, so that neither the old holder's renewals nor its claim can succeed again.
        let broken = Record {
            state: State::Broken,
            reserved: false,
            ..record.clone()
        };
        let options = BlobClientSetMetadataOptions {
            if_match: view.etag.clone().map(Etag::from),
            ..Default::default()
        };
        match self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&broken.encode(), Some(options)),
            )
            .await
        {
            Ok(_) | Err(Refusal::Conflict(_)) => {}
            Err(refusal) => return Err(refusal.into_error()),
        }
        // A reservation's term (its previous holder's) already ended, handed over.
        if !record.reserved {
            self.end_history(lease, record.term, Entry::of(&record), EndReason::Broken)
                .await;
        }
        self.read(lease).await?;
        Ok(Some(record.term))
    }

    /// Withdraws `record` (a claim of ours that never became a blob lease) if the blob still
    /// carries `etag`, and records the end of its term. `false` when the blob changed.
    async fn withdraw_claim(&self, lease: &LeaseName, record: &Record, etag: &str) -> Result<bool> {
        let withdrawn = Record {
            state: State::Released,
            ..record.clone()
        };
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(etag.to_string())),
            ..Default::default()
        };
        match self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&withdrawn.encode(), Some(options)),
            )
            .await
        {
            Ok(_) => {}
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => return Ok(false),
            Err(Refusal::Failed(e)) => return Err(e),
        }
        // The engine may have believed the claim (adopted on read-back): its term is history.
        self.end_history(lease, record.term, Entry::of(record), EndReason::Released)
            .await;
        Ok(true)
    }

    /// Releases the blob lease of `holder` (whose id is derived from the candidate) if the blob
    /// still carries `etag`, and records the end of the term. `false` when it is not ours (any
    /// more).
    async fn release_blob_lease(&self, lease: &LeaseName, record: &Record, etag: &str) -> Result<bool> {
        let options = BlobClientReleaseLeaseOptions {
            if_match: Some(Etag::from(etag.to_string())),
            ..Default::default()
        };
        let id = lease_id(lease, &record.holder);
        match self
            .call("release_lease", self.blob(lease).release_lease(id, Some(options)))
            .await
        {
            Ok(_) => {}
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => return Ok(false),
            Err(Refusal::Failed(e)) => return Err(e),
        }
        if let Some(mut view) = self.remembered(lease)
            && view.etag.as_deref() == Some(etag)
        {
            view.leased = false;
            view.lease_state = "available".into();
            self.remember(lease, &view);
        }
        self.end_history(lease, record.term, Entry::of(record), EndReason::Released)
            .await;
        Ok(true)
    }
}

#[async_trait]
impl LeaseStore for AzureBlobStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn can_break(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ServerClock,
            notifications: Notifications::None,
            announces: leasehold_core::Announces::None,
            fifo: false,
        }
    }

    /// Claims the lease in the blob's metadata (a compare-and-set on the ETag last seen), takes
    /// the blob lease under that claim, then marks the record leased.
    ///
    /// The first request is the claim itself whenever this client has seen the blob, so that a
    /// claim whose reply is lost is still on record; a lease this client has never seen is first
    /// tried as a new blob. When that claim is refused (the blob changed since), the blob is read
    /// and, if it is free, claimed once more against what was read.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let _turn = self.turn(Operation::Acquire).await;
        let lease = &request.lease;
        // Another's claim is read first: it must not be overwritten while it may count as held.
        let cached = self.remembered(lease);
        let foreign_claim = |view: &View| {
            view.record
                .as_ref()
                .is_some_and(|r| r.state == State::Claimed && r.holder != request.candidate)
        };
        let view = match cached {
            Some(view) if !foreign_claim(&view) => view,
            Some(_) => {
                // Only a blob lease is enforced by Azure; a live claim is kept by this check.
                let view = self.read(lease).await?;
                if view.holder().is_some_and(|r| r.holder != request.candidate) {
                    return Ok(Acquired::Held(view.observation(lease)));
                }
                view
            }
            None => View::absent(),
        };
        if let Some(acquired) = self.try_claim(request, &view).await? {
            return Ok(acquired);
        }
        let view = self.read(lease).await?;
        if view.holder().is_some_and(|r| r.holder != request.candidate) {
            return Ok(Acquired::Held(view.observation(lease)));
        }
        match self.try_claim(request, &view).await? {
            Some(acquired) => Ok(acquired),
            None => Ok(Acquired::Held(self.read(lease).await?.observation(lease))),
        }
    }

    /// Renews the blob lease if the blob still carries the grant's ETag; a grant adopted from a
    /// claim whose reply was lost is turned into a blob lease here.
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let lease = &grant.lease;
        let token = Token::parse(lease, &grant.token)?;
        let _turn = self.turn(Operation::Renew).await;
        let options = BlobClientRenewLeaseOptions {
            if_match: Some(Etag::from(token.etag.clone())),
            ..Default::default()
        };
        match self
            .call(
                "renew_lease",
                self.blob(lease).renew_lease(token.lease_id.clone(), Some(options)),
            )
            .await
        {
            Ok(_) => return Ok(Renewed::Renewed(grant.clone())),
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => {}
            Err(Refusal::Failed(e)) => return Err(e),
        }
        let view = self.read(lease).await?;
        let pending = view.claim_live()
            && view.etag.as_deref() == Some(token.etag.as_str())
            && view
                .record
                .as_ref()
                .is_some_and(|r| r.holder == grant.holder && r.term == grant.term);
        if let (true, Some(record)) = (pending, view.record.as_ref()) {
            if let Some(renewed) = self.lease_claim(lease, record, &token.etag).await? {
                return Ok(Renewed::Renewed(renewed));
            }
            return Ok(Renewed::Lost(self.read(lease).await?.observation(lease)));
        }
        Ok(Renewed::Lost(view.observation(lease)))
    }

    /// Releases the blob lease (the record is left as it is, so that the ETag others last saw
    /// stays valid for their next claim) and records the end of the term in its history blob. A
    /// claim that never became a blob lease is withdrawn, so that nobody waits for it to go
    /// stale.
    async fn release(&self, grant: &Grant) -> Result<()> {
        let lease = &grant.lease;
        let token = Token::parse(lease, &grant.token)?;
        let _turn = self.turn(Operation::Release).await;
        let record = Record {
            holder: grant.holder.clone(),
            term: grant.term,
            ttl: grant.ttl,
            acquired_ms: token.acquired_ms,
            state: State::Claimed,
            reserved: false,
        };
        if !self.release_blob_lease(lease, &record, &token.etag).await? {
            self.withdraw_claim(lease, &record, &token.etag).await?;
        }
        Ok(())
    }

    /// Moves the grant's blob lease to the successor's reservation id (Change Lease, on the
    /// grant's ETag), renews it for a full lease duration, and writes the record reserved for
    /// `to` at the grant's term under it; then records the term as handed over. Only `to`'s
    /// acquire turns the reservation into a lease of its own id; for everyone else the blob is
    /// leased until the reservation expires on the server, a lease duration after the handover.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let lease = &grant.lease;
        let token = Token::parse(lease, &grant.token)?;
        let _turn = self.turn(Operation::HandOver).await;
        let reserved_id = reserved_lease_id(lease, to);
        let changed = self
            .change_lease(lease, &token.lease_id, &reserved_id, &token.etag)
            .await;
        let renewed = match changed {
            Ok(()) => {
                let options = BlobClientRenewLeaseOptions {
                    if_match: Some(Etag::from(token.etag.clone())),
                    ..Default::default()
                };
                self.call(
                    "renew_lease",
                    self.blob(lease).renew_lease(reserved_id.clone(), Some(options)),
                )
                .await
                .map(drop)
            }
            Err(refusal) => Err(refusal),
        };
        match renewed {
            Ok(()) => {}
            // Not the grant's any more: nothing to hand over (but a record that cannot be read
            // is still an error).
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => {
                self.read(lease).await?;
                return Ok(());
            }
            Err(Refusal::Failed(e)) => return Err(e),
        }
        let record = Record {
            holder: to.clone(),
            term: grant.term,
            ttl: grant.ttl,
            acquired_ms: token.acquired_ms,
            state: State::Leased,
            reserved: true,
        };
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(token.etag.clone())),
            lease_id: Some(reserved_id),
            ..Default::default()
        };
        match self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&record.encode(), Some(options)),
            )
            .await
        {
            Ok(reply) => {
                let etag = crate::record::etag_of(lease, reply.headers())?;
                self.remember(
                    lease,
                    &View {
                        etag: Some(etag),
                        record: Some(record),
                        leased: true,
                        lease_state: "leased".into(),
                        age_secs: None,
                    },
                );
            }
            // The blob lease is the reservation's already, so the grant has ended: the lease
            // opens to everyone when that expires.
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => {
                self.read(lease).await?;
                return Ok(());
            }
            Err(Refusal::Failed(e)) => return Err(e),
        }
        let entry = Entry {
            holder: grant.holder.clone(),
            acquired_ms: token.acquired_ms,
            end: None,
        };
        self.end_history(lease, grant.term, entry, EndReason::HandedOver).await;
        Ok(())
    }

    /// Gives up what the store holds for `candidate` without the engine knowing: a claim or blob
    /// lease of an acquire whose answer never arrived. Its term is recorded as released, so the
    /// history has no open term once the lease is free.
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let _turn = self.turn(Operation::Withdraw).await;
        let view = self.read(lease).await?;
        let (Some(record), Some(etag)) = (view.holder().cloned(), view.etag.clone()) else {
            return Ok(());
        };
        if record.holder != *candidate {
            return Ok(());
        }
        if record.reserved {
            // Handed over to a candidate that gave up: free at once; the record still says
            // the term ended handed over.
            let options = BlobClientReleaseLeaseOptions {
                if_match: Some(Etag::from(etag)),
                ..Default::default()
            };
            let id = reserved_lease_id(lease, candidate);
            return match self
                .call("release_lease", self.blob(lease).release_lease(id, Some(options)))
                .await
            {
                Ok(_) | Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => Ok(()),
                Err(Refusal::Failed(e)) => Err(e),
            };
        }
        if view.leased {
            self.release_blob_lease(lease, &record, &etag).await?;
        } else {
            self.withdraw_claim(lease, &record, &etag).await?;
        }
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let _turn = self.turn(Operation::Inspect).await;
        Ok(self.read(lease).await?.observation(lease))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let _turn = self.turn(Operation::History).await;
        self.read_history(lease, limit).await
    }

    /// List Blobs under the prefix with their metadata, every page (history blobs skipped).
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let _turn = self.turn(Operation::List).await;
        self.list_leases(prefix).await
    }

    /// `List Blobs` with metadata under `{prefix}.leasehold-shards/{prefix}`, every page (5,000
    /// records each: 2 requests for 10,000 records).
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let _turn = self.turn(Operation::ShardRecords).await;
        self.list_shards(prefix).await
    }

    /// One conditional request: `Put Blob` of the record's empty blob (the value in its
    /// metadata) on `If-None-Match: *`, or `Set Blob Metadata` on `If-Match` of the expected
    /// ETag; refused, one `Get Blob Properties` of the record.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let _turn = self.turn(Operation::WriteShard).await;
        self.put_shard(name, expected, value).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.break_blob_lease(lease).await
    }
}
