//! The [`LeaseStore`] on Azure Blob Storage: one blob per lease, a claim in its metadata, then a
//! blob lease. See the [design notes](crate::docs).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::{ClientOptions, Etag, RequestContent, RetryOptions, Transport};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientBreakLeaseOptions, BlobClientGetPropertiesOptions,
    BlobClientReleaseLeaseOptions, BlobClientRenewLeaseOptions, BlobClientSetMetadataOptions, BlobClientUploadOptions,
    BlobContainerClientListBlobsOptions, ListBlobsIncludeItem,
};
use azure_storage_blob::{BlobClient, BlobContainerClient, BlobContainerClientOptions};
use futures::TryStreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, Capabilities, EndReason, Error, Expiry, Grant, HolderInfo, LeaseName, LeaseStore,
    Notifications, Observation, Renewed, Result, Term, Transition,
};

use crate::config::{Auth, AzureConfig, TTL_RANGE};
use crate::error::Failure;
use crate::record::{Entry, Record, STORE, State, Token, lease_id, now_ms};

/// How often (in terms) a grant also looks for old history blobs that the per-grant deletion
/// missed.
const SWEEP_EVERY: u64 = 100;

/// The most history blobs one sweep deletes (a store upgraded from a version that kept every
/// term catches up over several sweeps).
const SWEEP_MAX_DELETES: usize = 1000;

/// A lease store on Azure Blob Storage (or the Azurite emulator).
///
/// Each lease is a blob `{prefix}{lease}` in one container; its metadata holds the holder and
/// the fencing term, and a blob lease (15 to 60 s, enforced by the service's clock) keeps
/// everyone else out. History is kept in small blobs `{prefix}{lease}.history/{term:020}`, for
/// the most recent [`history_limit`](AzureConfig::history_limit) terms.
///
/// Clones share the HTTP connections and the cache of record versions.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use leasehold_azure::AzureBlobStore;
/// use leasehold_core::Elector;
///
/// # async fn demo() -> leasehold_core::Result<()> {
/// let store = AzureBlobStore::connect("azblob://myaccount/leases?sv=2022-11-02&ss=b&srt=co&sp=rwdlac&se=2030-01-01T00%3A00%3A00Z&sig=...").await?;
/// let elector = Elector::builder(Arc::new(store), "invoice-scheduler")
///     .ttl(std::time::Duration::from_secs(15))
///     .build()?;
/// # let _ = elector; Ok(()) }
/// ```
#[derive(Clone)]
pub struct AzureBlobStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: AzureConfig,
    container: BlobContainerClient,
    secrets: Vec<String>,
    /// Turns for operations in flight (see [`AzureConfig::max_requests`]). An operation keeps its
    /// turn for all of its requests, so that one which started can finish before its deadline
    /// instead of queueing again for every step. Holders (renew, release) have turns of their
    /// own: a flood of campaigns must not make leaders miss their renewals.
    turns: tokio::sync::Semaphore,
    holder_turns: tokio::sync::Semaphore,
    /// The last state of each lease blob this client saw, so that an acquire can compare-and-set
    /// against it in one request.
    views: Mutex<HashMap<LeaseName, View>>,
}

impl std::fmt::Debug for AzureBlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureBlobStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// The lease blob as this client last saw it.
#[derive(Clone, Debug)]
struct View {
    /// `None`: no blob.
    etag: Option<String>,
    record: Option<Record>,
    /// Whether the blob lease is active (leased or breaking).
    leased: bool,
    /// The blob's lease state as reported (`available`, `expired`, `broken`, ...).
    lease_state: String,
    /// Seconds from the blob's Last-Modified to the server's Date of the reply that showed it.
    age_secs: Option<i64>,
}

impl View {
    fn absent() -> View {
        View {
            etag: None,
            record: None,
            leased: false,
            lease_state: String::new(),
            age_secs: None,
        }
    }

    fn last_term(&self) -> Term {
        self.record.as_ref().map(|r| r.term).unwrap_or_default()
    }

    /// A claim not yet turned into a blob lease still counts as held for its TTL (plus the two
    /// seconds the one-second resolution of the server's timestamps may hide), by the server's
    /// clock. A claim seen only from cache is treated as live.
    fn claim_live(&self) -> bool {
        match &self.record {
            Some(r) if r.state == State::Claimed && !self.leased => {
                self.age_secs.is_none_or(|age| age < claim_window_secs(r.ttl))
            }
            _ => false,
        }
    }

    /// The holder, if the blob is held.
    fn holder(&self) -> Option<&Record> {
        let record = self.record.as_ref()?;
        (self.leased || self.claim_live()).then_some(record)
    }

    fn previous_end(&self) -> Option<EndReason> {
        let record = self.record.as_ref()?;
        Some(match record.state {
            State::Broken => EndReason::Broken,
            State::Released => EndReason::Released,
            State::Claimed => EndReason::Expired,
            State::Leased => match self.lease_state.as_str() {
                "expired" => EndReason::Expired,
                "broken" => EndReason::Broken,
                _ => EndReason::Released,
            },
        })
    }

    fn observation(&self, lease: &LeaseName) -> Observation {
        match self.holder() {
            Some(r) => Observation {
                lease: lease.clone(),
                holder: Some(HolderInfo {
                    id: r.holder.clone(),
                    term: r.term,
                    ttl: r.ttl,
                    version: Token {
                        lease_id: lease_id(lease, &r.holder),
                        etag: self.etag.clone().unwrap_or_default(),
                        acquired_ms: r.acquired_ms,
                    }
                    .to_string(),
                    store_remaining: None,
                }),
                last_term: r.term,
                previous_end: None,
            },
            None => Observation::free(lease.clone(), self.last_term(), self.previous_end()),
        }
    }
}

fn claim_window_secs(ttl: Duration) -> i64 {
    i64::from(lease_seconds(ttl)) + 2
}

/// Azure takes whole seconds; rounding up keeps the promise that nobody else gets the lease
/// before `ttl` has passed.
fn lease_seconds(ttl: Duration) -> i32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

const ETAG: HeaderName = HeaderName::from_static("etag");
const DATE: HeaderName = HeaderName::from_static("date");
const LAST_MODIFIED: HeaderName = HeaderName::from_static("last-modified");
const LEASE_STATE: HeaderName = HeaderName::from_static("x-ms-lease-state");
const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");

impl AzureBlobStore {
    /// Connects to the store named by an `azblob://` (or SAS `https://`) URL; see
    /// [`AzureConfig::from_url`]. No request is made: the container is created on first use if
    /// it is missing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the SAS redacted).
    pub async fn connect(url: &str) -> Result<AzureBlobStore> {
        AzureBlobStore::connect_with(AzureConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration (e.g. an [`Auth::Credential`] built in code).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when the endpoint cannot carry a container, or a token credential is
    /// used over plain http.
    pub async fn connect_with(config: AzureConfig) -> Result<AzureBlobStore> {
        let url = config.container_url()?;
        let credential = match &config.auth {
            Auth::Credential(credential) => Some(credential.clone()),
            _ => None,
        };
        // Idle connections are dropped after 2 s: servers close theirs (Node, so Azurite, after
        // 5 s), and a renewal every ttl/3 would otherwise race the close and fail for nothing.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(2))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::store(STORE, format!("cannot build the HTTP client: {e}")))?;
        // Timing belongs to the engine: no retries inside the client.
        let options = BlobContainerClientOptions {
            client_options: ClientOptions {
                retry: RetryOptions::none(),
                transport: Some(Transport::new(Arc::new(http))),
                ..ClientOptions::default()
            },
            ..BlobContainerClientOptions::default()
        };
        let secrets = config.secrets();
        let container = BlobContainerClient::new(url, credential, Some(options)).map_err(|e| Error::InvalidUrl {
            url: config.endpoint.to_string(),
            reason: crate::config::scrub(&e.to_string(), &secrets),
        })?;
        let turns = tokio::sync::Semaphore::new(config.max_requests.max(1));
        let holder_turns = tokio::sync::Semaphore::new(config.max_renewals.max(1));
        let inner = Inner {
            config,
            container,
            secrets,
            turns,
            holder_turns,
            views: Mutex::default(),
        };
        Ok(AzureBlobStore { inner: Arc::new(inner) })
    }

    /// The configuration (its `Debug` hides the SAS).
    pub fn config(&self) -> &AzureConfig {
        &self.inner.config
    }

    /// The name of the blob that holds `lease`.
    pub fn blob_name(&self, lease: &LeaseName) -> String {
        format!("{}{}", self.inner.config.prefix, lease)
    }

    fn history_prefix(&self, lease: &LeaseName) -> String {
        format!("{}.history/", self.blob_name(lease))
    }

    fn blob(&self, lease: &LeaseName) -> BlobClient {
        self.inner.container.blob_client(&self.blob_name(lease))
    }

    /// Runs one request under the request timeout, sorting its failure.
    async fn call<T>(
        &self,
        operation: &'static str,
        request: impl Future<Output = azure_core::Result<T>>,
    ) -> std::result::Result<T, Failure> {
        let after = self.inner.config.request_timeout;
        match tokio::time::timeout(after, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(Failure::from_sdk(operation, &e, &self.inner.secrets)),
            Err(_) => Err(Failure::Other(Error::Timeout {
                store: STORE,
                operation,
                after,
            })),
        }
    }

    /// Waits for a turn to run an operation (for at most the request timeout).
    async fn turn(&self, holder: bool, operation: &'static str) -> Result<tokio::sync::SemaphorePermit<'_>> {
        let turns = if holder {
            &self.inner.holder_turns
        } else {
            &self.inner.turns
        };
        let after = self.inner.config.request_timeout;
        match tokio::time::timeout(after, turns.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(Error::store(STORE, "the store's request turns were closed")),
            Err(_) => Err(Error::Timeout {
                store: STORE,
                operation,
                after,
            }),
        }
    }

    fn remember(&self, lease: &LeaseName, view: &View) {
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
    async fn read(&self, lease: &LeaseName) -> Result<View> {
        let options = BlobClientGetPropertiesOptions::default();
        let view = match self
            .call("get_properties", self.blob(lease).get_properties(Some(options)))
            .await
        {
            Ok(reply) => view_of(lease, reply.headers())?,
            Err(Failure::NotFound(_)) => View::absent(),
            Err(failure) => return Err(failure.into_error()),
        };
        self.remember(lease, &view);
        Ok(view)
    }

    /// Writes `record` if the blob is still as `view` saw it: the compare-and-set of a claim.
    /// Answers the new ETag, or `None` when the blob changed (a lost race).
    async fn claim(
        &self,
        lease: &LeaseName,
        view: &View,
        record: &Record,
        own: Option<&str>,
    ) -> Result<Option<String>> {
        let blob = self.blob(lease);
        let Some(etag) = &view.etag else {
            return self.create(lease, record).await;
        };
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(etag.clone())),
            lease_id: own.map(str::to_string),
            ..Default::default()
        };
        match self
            .call("set_metadata", blob.set_metadata(&record.encode(), Some(options)))
            .await
        {
            Ok(reply) => Ok(Some(etag_of(lease, reply.headers())?)),
            Err(Failure::Conflict(_) | Failure::NotFound(_)) => Ok(None),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// Creates the lease blob with `record` in it, if it does not exist yet (and the container,
    /// if that is missing).
    async fn create(&self, lease: &LeaseName, record: &Record) -> Result<Option<String>> {
        for _ in 0..2 {
            let options = BlobClientUploadOptions {
                metadata: Some(record.encode()),
                ..Default::default()
            }
            .if_not_exists();
            let blob = self.blob(lease);
            let upload = blob.upload(RequestContent::from(Vec::new()), Some(options));
            match self.call("upload", upload).await {
                Ok(reply) => {
                    let etag = reply
                        .etag
                        .ok_or_else(|| Error::store(STORE, "upload answered without an ETag"))?;
                    return Ok(Some(etag.to_string()));
                }
                Err(Failure::Conflict(_)) => return Ok(None),
                Err(Failure::NotFound(_)) => self.create_container().await?,
                Err(failure) => return Err(failure.into_error()),
            }
        }
        Ok(None)
    }

    async fn create_container(&self) -> Result<()> {
        match self.call("create_container", self.inner.container.create(None)).await {
            Ok(_) | Err(Failure::Conflict(_)) => Ok(()),
            Err(failure) => Err(failure.into_error()),
        }
    }

    /// Takes the blob lease for `id` if the blob still carries the claim `etag`.
    async fn take_lease(
        &self,
        lease: &LeaseName,
        id: &str,
        ttl: Duration,
        etag: &str,
    ) -> std::result::Result<(), Failure> {
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(id.to_string()),
            if_match: Some(Etag::from(etag.to_string())),
            ..Default::default()
        };
        self.call(
            "acquire_lease",
            self.blob(lease).acquire_lease(lease_seconds(ttl), Some(options)),
        )
        .await
        .map(drop)
    }

    /// Marks the claim as leased, under the lease: answers the new ETag.
    async fn confirm(
        &self,
        lease: &LeaseName,
        record: &Record,
        id: &str,
        etag: &str,
    ) -> std::result::Result<String, Failure> {
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(etag.to_string())),
            lease_id: Some(id.to_string()),
            ..Default::default()
        };
        let reply = self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&record.encode(), Some(options)),
            )
            .await?;
        etag_of(lease, reply.headers()).map_err(Failure::Other)
    }

    /// Turns a claim into a held blob lease: lease, then mark the record `leased`.
    /// `Ok(None)` when someone else changed the blob first.
    async fn lease_claim(&self, lease: &LeaseName, record: &Record, etag: &str) -> Result<Option<Grant>> {
        let id = lease_id(lease, &record.holder);
        match self.take_lease(lease, &id, record.ttl, etag).await {
            Ok(()) => {}
            Err(Failure::Conflict(_) | Failure::NotFound(_)) => return Ok(None),
            Err(Failure::Other(e)) => return Err(e),
        }
        let leased = Record {
            state: State::Leased,
            ..record.clone()
        };
        let etag = match self.confirm(lease, &leased, &id, etag).await {
            Ok(etag) => etag,
            Err(Failure::Conflict(_) | Failure::NotFound(_)) => return Ok(None),
            Err(Failure::Other(e)) => return Err(e),
        };
        self.remember(
            lease,
            &View {
                etag: Some(etag.clone()),
                record: Some(leased.clone()),
                leased: true,
                lease_state: "leased".into(),
                age_secs: None,
            },
        );
        let entry = Entry {
            holder: leased.holder.clone(),
            acquired_ms: leased.acquired_ms,
            end: None,
        };
        futures::join!(
            self.write_history(lease, leased.term, &entry),
            self.prune_history(lease, leased.term)
        );
        Ok(Some(Grant {
            lease: lease.clone(),
            holder: leased.holder.clone(),
            term: leased.term,
            ttl: leased.ttl,
            token: Token {
                lease_id: id,
                etag,
                acquired_ms: leased.acquired_ms,
            }
            .to_string(),
        }))
    }

    /// Writes one history blob. The trail is an audit record: a failed write is logged, never a
    /// reason to give up a lease.
    async fn write_history(&self, lease: &LeaseName, term: Term, entry: &Entry) {
        let name = format!("{}{:020}", self.history_prefix(lease), term.0);
        let options = BlobClientUploadOptions {
            metadata: Some(entry.encode()),
            ..Default::default()
        };
        let blob = self.inner.container.blob_client(&name);
        let upload = blob.upload(RequestContent::from(Vec::new()), Some(options));
        if let Err(failure) = self.call("upload history", upload).await {
            let error = failure.into_error();
            tracing::warn!(lease = %lease, term = %term, %error, "cannot write the history of a term");
        }
    }

    /// Keeps the history of `lease` to the most recent `history_limit` terms now that `term` is
    /// granted: deletes the blob of the term that just fell out (at the same time as the new
    /// term's blob is written, so a grant takes no longer) and, every [`SWEEP_EVERY`] terms, in
    /// a task of its own, any older blob left behind (a term skipped by a claim that lost its
    /// race leaves the blob `history_limit` terms before it; a store upgraded from a version that
    /// kept all). Best effort, like every history write.
    async fn prune_history(&self, lease: &LeaseName, term: Term) {
        let limit = u64::from(self.inner.config.history_limit);
        let Some(oldest_kept) = term.0.checked_sub(limit).filter(|_| limit > 0).map(|t| t + 1) else {
            return;
        };
        self.delete_history(lease, oldest_kept - 1).await;
        if term.0.is_multiple_of(SWEEP_EVERY) {
            let store = self.clone();
            let lease = lease.clone();
            tokio::spawn(async move { store.sweep_history(&lease, oldest_kept).await });
        }
    }

    /// Deletes the history blobs of `lease` below `oldest_kept`, at most [`SWEEP_MAX_DELETES`].
    async fn sweep_history(&self, lease: &LeaseName, oldest_kept: u64) {
        let prefix = self.history_prefix(lease);
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.clone()),
            ..Default::default()
        };
        let mut stale = Vec::new();
        let mut pages = match self.inner.container.list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => {
                let error = Failure::from_sdk("list_blobs", &e, &self.inner.secrets).into_error();
                tracing::warn!(%lease, %error, "cannot list the history to prune it");
                return;
            }
        };
        while stale.len() < SWEEP_MAX_DELETES {
            let page = match self.call("list_blobs", pages.try_next()).await {
                Ok(Some(page)) => page.into_model().ok(),
                Ok(None) | Err(Failure::NotFound(_)) => break,
                Err(failure) => {
                    let error = failure.into_error();
                    tracing::warn!(%lease, %error, "cannot list the history to prune it");
                    return;
                }
            };
            let Some(page) = page else { break };
            let terms = page.blob_items.into_iter().filter_map(|item| {
                let name = item.name?;
                name.strip_prefix(&prefix)?.parse::<u64>().ok()
            });
            let before = stale.len();
            stale.extend(terms.filter(|t| *t < oldest_kept));
            // Names come in order: a page past the window ends the search.
            if stale.len() == before {
                break;
            }
        }
        stale.truncate(SWEEP_MAX_DELETES);
        for term in stale {
            self.delete_history(lease, term).await;
        }
    }

    /// Deletes the history blob of one term (gone already is fine).
    async fn delete_history(&self, lease: &LeaseName, term: u64) {
        let blob = self
            .inner
            .container
            .blob_client(&format!("{}{term:020}", self.history_prefix(lease)));
        match self.call("delete history", blob.delete(None)).await {
            Ok(_) | Err(Failure::NotFound(_)) => {}
            Err(failure) => {
                let error = failure.into_error();
                tracing::warn!(%lease, term, %error, "cannot delete an old history blob");
            }
        }
    }

    /// Breaks the blob lease of `lease` at once (an operator's tool, also
    /// [`LeaseStore::break_lease`]): the holder's next renewal answers `Lost`, and the next grant
    /// has a higher term. Answers the broken term, or `None` when nobody held the lease.
    ///
    /// # Errors
    ///
    /// A transient error when the service cannot be reached; [`Error::CorruptRecord`].
    pub async fn break_blob_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let _turn = self.turn(false, "break_lease").await?;
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
                Ok(_) | Err(Failure::Conflict(_)) => {}
                Err(failure) => return Err(failure.into_error()),
            }
        }
        // A new ETag, so that neither the old holder's renewals nor its claim can succeed again.
        let broken = Record {
            state: State::Broken,
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
            Ok(_) | Err(Failure::Conflict(_)) => {}
            Err(failure) => return Err(failure.into_error()),
        }
        let entry = Entry {
            holder: record.holder.clone(),
            acquired_ms: record.acquired_ms,
            end: Some((now_ms(), EndReason::Broken)),
        };
        self.write_history(lease, record.term, &entry).await;
        self.read(lease).await?;
        Ok(Some(record.term))
    }
}

/// Keeps the `limit` entries with the highest terms, in term order.
fn keep_newest<T>(entries: &mut Vec<(Term, T)>, limit: usize) {
    entries.sort_by_key(|(term, _)| *term);
    let skip = entries.len().saturating_sub(limit);
    entries.drain(..skip);
}

fn header<'h>(headers: &'h Headers, name: &HeaderName) -> Option<&'h str> {
    headers.get_optional_str(name)
}

fn etag_of(lease: &LeaseName, headers: &Headers) -> Result<String> {
    header(headers, &ETAG)
        .map(str::to_string)
        .ok_or_else(|| Error::store(STORE, format!("the reply for lease {lease} has no ETag")))
}

fn view_of(lease: &LeaseName, headers: &Headers) -> Result<View> {
    let etag = etag_of(lease, headers)?;
    let length: u64 = header(headers, &CONTENT_LENGTH)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if length > 0 {
        return Err(Error::corrupt(
            STORE,
            lease,
            format!("the lease blob has {length} bytes of content: not a leasehold lease blob"),
        ));
    }
    let metadata: HashMap<String, String> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().to_ascii_lowercase();
            key.strip_prefix("x-ms-meta-")
                .map(|k| (k.to_string(), value.as_str().to_string()))
        })
        .collect();
    let record = Record::decode(lease, &metadata)?;
    let lease_state = header(headers, &LEASE_STATE)
        .unwrap_or("available")
        .to_ascii_lowercase();
    let parse = |name: &HeaderName| header(headers, name).and_then(|v| azure_core::time::parse_rfc7231(v).ok());
    let age_secs = match (parse(&DATE), parse(&LAST_MODIFIED)) {
        (Some(date), Some(modified)) => Some((date - modified).whole_seconds()),
        _ => None,
    };
    Ok(View {
        etag: Some(etag),
        record,
        leased: matches!(lease_state.as_str(), "leased" | "breaking"),
        lease_state,
        age_secs: age_secs.or(Some(0)),
    })
}

#[async_trait]
impl LeaseStore for AzureBlobStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ServerClock,
            notifications: Notifications::None,
            fifo: false,
            can_break: true,
        }
    }

    /// Claims the lease in the blob's metadata (a compare-and-set on the ETag last seen), takes
    /// the blob lease under that claim, then marks the record leased.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let _turn = self.turn(false, "acquire").await?;
        let (lease, me) = (&request.lease, &request.candidate);
        // The first request is the claim itself whenever this client has seen the blob, so that
        // a claim whose reply is lost is still on record; a lease this client has never seen is
        // first tried as a new blob. Another's claim is read first: it must not be overwritten
        // while it may count as held.
        let (mut view, mut fresh) = match self.remembered(lease) {
            Some(view)
                if !view
                    .record
                    .as_ref()
                    .is_some_and(|r| r.state == State::Claimed && r.holder != *me) =>
            {
                (view, false)
            }
            Some(_) => (self.read(lease).await?, true),
            None => (View::absent(), false),
        };
        for _ in 0..2 {
            if fresh && view.holder().is_some_and(|r| r.holder != *me) {
                return Ok(Acquired::Held(view.observation(lease)));
            }
            // Metadata anyone can write: a term of u64::MAX is bad data, not a panic or a wrap.
            let term = view.last_term().0.checked_add(1).ok_or_else(|| {
                Error::corrupt(
                    STORE,
                    lease,
                    format!("the lease blob holds term {}, which no term can follow", u64::MAX),
                )
            })?;
            let record = Record {
                holder: me.clone(),
                term: Term(term),
                ttl: request.ttl,
                acquired_ms: now_ms(),
                state: State::Claimed,
            };
            let mine = view.leased && view.record.as_ref().is_some_and(|r| r.holder == *me);
            let own = mine.then(|| lease_id(lease, me));
            if let Some(etag) = self.claim(lease, &view, &record, own.as_deref()).await? {
                return match self.lease_claim(lease, &record, &etag).await? {
                    Some(grant) => Ok(Acquired::Granted(grant)),
                    None => Ok(Acquired::Held(self.read(lease).await?.observation(lease))),
                };
            }
            view = self.read(lease).await?;
            fresh = true;
        }
        Ok(Acquired::Held(view.observation(lease)))
    }

    /// Renews the blob lease if the blob still carries the grant's ETag; a grant adopted from a
    /// claim whose reply was lost is turned into a blob lease here.
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let lease = &grant.lease;
        let token = Token::parse(lease, &grant.token)?;
        let _turn = self.turn(true, "renew").await?;
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
            Err(Failure::Conflict(_) | Failure::NotFound(_)) => {}
            Err(Failure::Other(e)) => return Err(e),
        }
        let view = self.read(lease).await?;
        let pending = view.claim_live()
            && view.etag.as_deref() == Some(token.etag.as_str())
            && view
                .record
                .as_ref()
                .is_some_and(|r| r.holder == grant.holder && r.term == grant.term);
        if pending {
            let record = view.record.clone().expect("checked");
            if let Some(renewed) = self.lease_claim(lease, &record, &token.etag).await? {
                return Ok(Renewed::Renewed(renewed));
            }
            return Ok(Renewed::Lost(self.read(lease).await?.observation(lease)));
        }
        Ok(Renewed::Lost(view.observation(lease)))
    }

    /// Releases the blob lease (the record is left as it is, so that the ETag others last saw
    /// stays valid for their next claim) and records the end of the term in its history blob.
    async fn release(&self, grant: &Grant) -> Result<()> {
        let lease = &grant.lease;
        let token = Token::parse(lease, &grant.token)?;
        let _turn = self.turn(true, "release").await?;
        let options = BlobClientReleaseLeaseOptions {
            if_match: Some(Etag::from(token.etag.clone())),
            ..Default::default()
        };
        match self
            .call(
                "release_lease",
                self.blob(lease).release_lease(token.lease_id.clone(), Some(options)),
            )
            .await
        {
            Ok(_) => {
                if let Some(mut view) = self.remembered(lease)
                    && view.etag.as_deref() == Some(token.etag.as_str())
                {
                    view.leased = false;
                    view.lease_state = "available".into();
                    self.remember(lease, &view);
                }
                let entry = Entry {
                    holder: grant.holder.clone(),
                    acquired_ms: token.acquired_ms,
                    end: Some((now_ms(), EndReason::Released)),
                };
                self.write_history(lease, grant.term, &entry).await;
                Ok(())
            }
            Err(Failure::Conflict(_) | Failure::NotFound(_)) => {
                // Not leased by us: perhaps a claim that never became a lease. Withdraw it, if it
                // is still exactly ours, so that nobody waits for it to go stale.
                let record = Record {
                    holder: grant.holder.clone(),
                    term: grant.term,
                    ttl: grant.ttl,
                    acquired_ms: token.acquired_ms,
                    state: State::Released,
                };
                let options = BlobClientSetMetadataOptions {
                    if_match: Some(Etag::from(token.etag)),
                    ..Default::default()
                };
                match self
                    .call(
                        "set_metadata",
                        self.blob(lease).set_metadata(&record.encode(), Some(options)),
                    )
                    .await
                {
                    Ok(_) | Err(Failure::Conflict(_) | Failure::NotFound(_)) => Ok(()),
                    Err(Failure::Other(e)) => Err(e),
                }
            }
            Err(Failure::Other(e)) => Err(e),
        }
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let _turn = self.turn(false, "inspect").await?;
        Ok(self.read(lease).await?.observation(lease))
    }

    /// Lists the history blobs of the lease with their metadata (one request per 5,000 terms;
    /// `history_limit` keeps them to one) and decodes only the newest `limit`, then completes the
    /// latest term from the lease blob. Memory is bounded by `limit`, not by the terms listed.
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let _turn = self.turn(false, "history").await?;
        let prefix = self.history_prefix(lease);
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.clone()),
            include: Some(vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        };
        let mut newest: Vec<(Term, HashMap<String, String>)> = Vec::new();
        let mut pages = match self.inner.container.list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => return Err(Failure::from_sdk("list_blobs", &e, &self.inner.secrets).into_error()),
        };
        loop {
            let page = match self.call("list_blobs", pages.try_next()).await {
                Ok(Some(page)) => page,
                Ok(None) | Err(Failure::NotFound(_)) => break,
                Err(failure) => return Err(failure.into_error()),
            };
            let page = page
                .into_model()
                .map_err(|e| Failure::from_sdk("list_blobs", &e, &self.inner.secrets).into_error())?;
            for item in page.blob_items {
                let Some(name) = item.name else { continue };
                let Some(term) = name.strip_prefix(&prefix).and_then(|t| t.parse::<u64>().ok()) else {
                    return Err(Error::corrupt(
                        STORE,
                        lease,
                        format!("unexpected history blob {name:?}"),
                    ));
                };
                newest.push((Term(term), item.metadata.and_then(|m| m.values).unwrap_or_default()));
            }
            if newest.len() > limit.saturating_mul(2) {
                keep_newest(&mut newest, limit);
            }
        }
        keep_newest(&mut newest, limit);
        let mut entries = newest
            .into_iter()
            .map(|(term, metadata)| Ok((term, Entry::decode(lease, &metadata)?)))
            .collect::<Result<Vec<(Term, Entry)>>>()?;
        let view = self.read(lease).await?;
        if let Some(record) = &view.record {
            let granted = matches!(record.state, State::Leased | State::Broken) || view.holder().is_some();
            if granted && entries.last().is_none_or(|(term, _)| *term < record.term) {
                let entry = Entry {
                    holder: record.holder.clone(),
                    acquired_ms: record.acquired_ms,
                    end: None,
                };
                entries.push((record.term, entry));
            }
        }
        // Ends nobody recorded: a term followed by another expired (or was taken over); the
        // latest one ended the way the lease blob says, if it is no longer held.
        let next_start: Vec<Option<u64>> = (0..entries.len())
            .map(|i| entries.get(i + 1).map(|(_, e)| e.acquired_ms))
            .collect();
        let held_term = view.holder().map(|r| r.term);
        for ((term, entry), next) in entries.iter_mut().zip(next_start) {
            if entry.end.is_some() {
                continue;
            }
            entry.end = match next {
                Some(at) => Some((at, EndReason::Expired)),
                None if held_term == Some(*term) => None,
                None => view
                    .previous_end()
                    .map(|reason| (now_ms().max(entry.acquired_ms), reason)),
            };
        }
        let skip = entries.len().saturating_sub(limit);
        Ok(entries[skip..]
            .iter()
            .map(|(term, entry)| entry.transition(*term))
            .collect())
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.break_blob_lease(lease).await
    }
}
