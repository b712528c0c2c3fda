//! What the Azure tests share: an account SAS signed for the Azurite emulator, the conformance
//! [`Backend`], and raw access to lease blobs for vandalism.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use leasehold_azure::{Auth, AzureBlobStore, AzureConfig};
use leasehold_conformance::{Backend, FaultProxy, Faults, Op};
use leasehold_core::config::Secret;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Error, Grant, LeaseName, LeaseStore, Observation, Renewed,
    Result, Term, Transition,
};
use sha2::Sha256;
use url::Url;

/// The container the tests use (lease names are random per scenario).
pub const CONTAINER: &str = "leasehold-tests";

/// How many operations other than renewals and releases one test store runs at once.
///
/// Azurite is one Node.js process. On this shared 2-core machine it serves 100 to 400 simple
/// requests a second, depending on what else runs; once it has more requests in hand than it
/// can serve, every client waits: with 64 in flight a renewal takes 100-300 ms, and the first
/// request on a new connection up to 5 s (`tests/azurite_rate.rs`). The other scenarios' stores
/// open a new connection for nearly every renewal (idle connections are dropped after 2 s,
/// before Azurite's 5 s keep-alive closes them), so the 1,000 campaigns of `thousand_leases`
/// must not flood the emulator: 8 in flight keep it busy without a long queue. Renewals keep the
/// default of 64 ([`leasehold_azure::DEFAULT_MAX_RENEWALS`]): they come at the leaders' pace, and
/// when the emulator is slow a small bound would make 1,000 leases fall behind.
pub const AZURITE_MAX_REQUESTS: usize = 8;

/// The TTL of `thousand_leases`: 1,000 leases renewed every TTL/3 are 3,000/TTL renewals a
/// second, 50 at 60 s, a small share of what Azurite serves, next to everything else the suite
/// runs at the same time.
pub const MANY_LEASES_TTL: Duration = Duration::from_secs(60);

/// The Azurite endpoint and its account key (from which the store signs its own SAS), from
/// `LEASEHOLD_AZURITE_*` (or the services env file), if the emulator answers.
pub fn azurite() -> Option<AzureConfig> {
    let url = leasehold_conformance::require_server("azurite", "LEASEHOLD_AZURITE_URL")?;
    let account = env("LEASEHOLD_AZURITE_ACCOUNT").unwrap_or_else(|| "devstoreaccount1".into());
    let key = env("LEASEHOLD_AZURITE_ACCOUNT_KEY").expect("LEASEHOLD_AZURITE_ACCOUNT_KEY is set with the URL");
    let mut config = AzureConfig::new(&account, CONTAINER).expect("valid names");
    config.endpoint = Url::parse(&format!("{}/", url.trim_end_matches('/'))).expect("LEASEHOLD_AZURITE_URL is a URL");
    config.auth = Auth::AccountKey(Secret::new(key));
    config.prefix = "t/".into();
    let number = |key: &str| std::env::var(key).ok().and_then(|n| n.parse().ok());
    config.max_requests = number("LEASEHOLD_AZURE_MAX_REQUESTS").unwrap_or(AZURITE_MAX_REQUESTS);
    config.max_renewals = number("LEASEHOLD_AZURE_MAX_RENEWALS").unwrap_or(config.max_renewals);
    Some(config)
}

fn env(key: &str) -> Option<String> {
    if let Ok(v) = std::env::var(key) {
        return Some(v);
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/services/env");
    let text = std::fs::read_to_string(root).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.trim().trim_start_matches("export ").split_once('=')?;
        (k == key).then(|| v.trim_matches(|c| c == '"' || c == '\'').to_string())
    })
}

/// An account SAS (blob service; service, container and object resources; read, add, create,
/// write, delete, list) valid for `valid_for`, signed with HMAC-SHA256 and the account key, by
/// hand (the store signs its own from `account_key`; tests use this one to sign with a wrong key
/// and to reach blobs behind the store's back).
pub fn account_sas(account: &str, key_base64: &str, valid_for: Duration) -> Secret {
    const VERSION: &str = "2021-08-06";
    let expiry = iso8601(SystemTime::now() + valid_for);
    let (permissions, services, resource_types) = ("racwdl", "b", "sco");
    // Account SAS string-to-sign for versions 2020-12-06 and later (the last field is the
    // encryption scope, empty here).
    let to_sign = [
        account,
        permissions,
        services,
        resource_types,
        "",
        &expiry,
        "",
        "https,http",
        VERSION,
        "",
        "",
    ]
    .join("\n");
    let key = STANDARD.decode(key_base64).expect("the account key is base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(to_sign.as_bytes());
    let signature = STANDARD.encode(mac.finalize().into_bytes());
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("sv", VERSION)
        .append_pair("ss", services)
        .append_pair("srt", resource_types)
        .append_pair("sp", permissions)
        .append_pair("se", &expiry)
        .append_pair("spr", "https,http")
        .append_pair("sig", &signature)
        .finish();
    Secret::new(query)
}

/// `2030-01-01T00:00:00Z` for a time, in UTC.
fn iso8601(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Azurite: every `connect` is a new `AzureBlobStore` (its own HTTP connections and cache).
pub struct AzureBackend {
    pub config: AzureConfig,
    /// The proxies of faulty clients live as long as the backend (one test).
    proxies: Mutex<Vec<FaultProxy>>,
}

impl AzureBackend {
    pub fn shared(config: AzureConfig) -> Arc<dyn Backend> {
        Arc::new(AzureBackend::with_config(config))
    }

    pub fn with_config(config: AzureConfig) -> AzureBackend {
        AzureBackend {
            config,
            proxies: Mutex::new(Vec::new()),
        }
    }

    pub fn upstream(&self) -> SocketAddr {
        let host = self.config.endpoint.host_str().expect("the endpoint has a host");
        let port = self
            .config
            .endpoint
            .port_or_known_default()
            .expect("the endpoint has a port");
        (host, port)
            .to_socket_addrs()
            .expect("the host resolves")
            .next()
            .expect("an address")
    }

    /// A store whose traffic goes through a new fault proxy.
    pub async fn faulty(&self) -> Result<(AzureBlobStore, Faults)> {
        let proxy = FaultProxy::start(self.upstream())
            .await
            .map_err(|e| Error::unreachable("azure", e))?;
        let mut config = self.config.clone();
        config
            .endpoint
            .set_port(Some(proxy.addr().port()))
            .expect("http endpoint");
        config
            .endpoint
            .set_host(Some(&proxy.addr().ip().to_string()))
            .expect("http endpoint");
        let faults = proxy.faults();
        self.proxies.lock().unwrap().push(proxy);
        Ok((AzureBlobStore::from_config(config).await?, faults))
    }

    pub async fn store(&self) -> AzureBlobStore {
        AzureBlobStore::from_config(self.config.clone()).await.expect("a store")
    }
}

#[async_trait]
impl Backend for AzureBackend {
    fn name(&self) -> &'static str {
        "azure"
    }

    async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
        let store = AzureBlobStore::from_config(self.config.clone()).await?;
        Ok(Arc::new(Timed { store }))
    }

    fn many_leases_ttl(&self) -> Option<Duration> {
        Some(MANY_LEASES_TTL)
    }

    async fn connect_faulty(&self) -> Result<(Arc<dyn LeaseStore>, Faults)> {
        let (store, faults) = self.faulty().await?;
        Ok((
            Arc::new(Counted {
                store,
                faults: faults.clone(),
            }),
            faults,
        ))
    }

    /// Writes garbage where the term belongs, as a foreign program using the same blob would,
    /// then breaks the blob lease. The garbage is written *under the holder's lease* (its id is in
    /// the record version), so that no candidate can take the lease between the break and the
    /// write; a holder that changed in between makes Azure refuse the write, and it is tried again.
    async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
        let store = self.store().await;
        let blob = store.blob_name(lease);
        let mut attempts = 0;
        loop {
            let seen = store.inspect(lease).await?;
            let lease_id = seen
                .holder
                .as_ref()
                .and_then(|h| h.version.split(';').next().map(str::to_string));
            let garbage = [("leasehold_term", "garbage"), ("vandal", "yes")];
            let written = raw_set_metadata(&self.config, &blob, &garbage, lease_id.as_deref()).await;
            attempts += 1;
            match written {
                Ok(()) => break,
                Err(_) if attempts < 10 => {
                    eprintln!("azure: corrupting {lease} was refused (the holder changed); again")
                }
                Err(e) => return Err(e),
            }
        }
        raw_break_lease(&self.config, &blob).await
    }
}

/// Overwrites the metadata of a blob, bypassing the store: under `lease_id` if the blob is
/// leased.
pub async fn raw_set_metadata(
    config: &AzureConfig,
    blob: &str,
    pairs: &[(&str, &str)],
    lease_id: Option<&str>,
) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let metadata = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let options = azure_storage_blob::models::BlobClientSetMetadataOptions {
        lease_id: lease_id.map(str::to_string),
        ..Default::default()
    };
    container
        .blob_client(blob)
        .set_metadata(&metadata, Some(options))
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

/// Breaks the blob lease at once, if there is one, bypassing the store.
pub async fn raw_break_lease(config: &AzureConfig, blob: &str) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let options = azure_storage_blob::models::BlobClientBreakLeaseOptions {
        break_period: Some(0),
        ..Default::default()
    };
    match container.blob_client(blob).break_lease(Some(options)).await {
        Ok(_) => Ok(()),
        // 409: no lease to break.
        Err(e) if e.http_status().is_some_and(|s| u16::from(s) == 409) => Ok(()),
        Err(e) => Err(Error::store("azure", e.to_string())),
    }
}

fn container_url(config: &AzureConfig) -> Url {
    let mut url = config.endpoint.clone();
    url.path_segments_mut().unwrap().pop_if_empty().push(&config.container);
    match &config.auth {
        Auth::Sas(sas) => url.set_query(Some(sas.expose())),
        Auth::AccountKey(key) => {
            let sas = account_sas(&config.account, key.expose(), Duration::from_secs(3600));
            url.set_query(Some(sas.expose()));
        }
        _ => {}
    }
    url
}

/// Deletes a container and every blob in it (the conformance suite's own container, at its end,
/// so that the in-memory emulator, whose lookups scan every blob of the account, stays small).
pub async fn delete_container(config: &AzureConfig) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    container
        .delete(None)
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

/// The names of the blobs under `prefix`, bypassing the store.
pub async fn raw_list(config: &AzureConfig, prefix: &str) -> Result<Vec<String>> {
    use futures::TryStreamExt;
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let options = azure_storage_blob::models::BlobContainerClientListBlobsOptions {
        prefix: Some(prefix.to_string()),
        ..Default::default()
    };
    let mut pages = container
        .list_blobs(Some(options))
        .map_err(|e| Error::store("azure", e.to_string()))?
        .into_pages();
    let mut names = Vec::new();
    while let Some(page) = pages
        .try_next()
        .await
        .map_err(|e| Error::store("azure", e.to_string()))?
    {
        let page = page.into_model().map_err(|e| Error::store("azure", e.to_string()))?;
        names.extend(page.blob_items.into_iter().filter_map(|item| item.name));
    }
    Ok(names)
}

/// Writes an empty blob with `metadata`, bypassing the store.
pub async fn raw_upload(config: &AzureConfig, blob: &str, metadata: &[(&str, &str)]) -> Result<()> {
    let container = azure_storage_blob::BlobContainerClient::new(container_url(config), None, None)
        .map_err(|e| Error::store("azure", e.to_string()))?;
    let options = azure_storage_blob::models::BlobClientUploadOptions {
        metadata: Some(metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    container
        .blob_client(blob)
        .upload(azure_core::http::RequestContent::from(Vec::new()), Some(options))
        .await
        .map(drop)
        .map_err(|e| Error::store("azure", e.to_string()))
}

/// Renewals seen by the stores of [`Backend::connect`] (not the faulty ones, whose delays are
/// injected): how many, how many took longer than a second, and the slowest (waiting for a turn
/// included).
#[derive(Clone, Copy, Debug, Default)]
pub struct RenewStats {
    pub count: u64,
    pub over_1s: u64,
    pub slowest: Duration,
}

impl RenewStats {
    const NONE: RenewStats = RenewStats {
        count: 0,
        over_1s: 0,
        slowest: Duration::ZERO,
    };

    fn record(&mut self, took: Duration) {
        self.count += 1;
        self.over_1s += u64::from(took > Duration::from_secs(1));
        self.slowest = self.slowest.max(took);
    }
}

impl std::fmt::Display for RenewStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} renewals, {} slower than 1 s, the slowest {:.3}s",
            self.count,
            self.over_1s,
            self.slowest.as_secs_f64()
        )
    }
}

/// (the 1,000 leases of `thousand_leases`, every other lease)
static RENEW_STATS: Mutex<(RenewStats, RenewStats)> = Mutex::new((RenewStats::NONE, RenewStats::NONE));

/// Renewals of `thousand_leases`' leases, and of all the others.
pub fn renew_stats() -> (RenewStats, RenewStats) {
    *RENEW_STATS.lock().unwrap()
}

/// A store that times its renewals into [`renew_stats`].
#[derive(Debug)]
pub struct Timed {
    pub store: AzureBlobStore,
}

#[async_trait]
impl LeaseStore for Timed {
    fn name(&self) -> &'static str {
        self.store.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.store.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let sent = std::time::Instant::now();
        let answer = self.store.renew(grant).await;
        let took = sent.elapsed();
        let mut stats = RENEW_STATS.lock().unwrap();
        if grant.lease.as_str().contains("thousand_leases") {
            stats.0.record(took);
        } else {
            stats.1.record(took);
        }
        answer
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.store.release(grant).await
    }
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.store.withdraw(lease, candidate).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.store.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.store.history(lease, limit).await
    }
    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.store.break_lease(lease).await
    }
}

/// A store behind a fault proxy that also counts its requests in the proxy's [`Faults`] (a proxy
/// sees bytes, not requests, and some scenarios read the counts).
///
/// An acquire is counted when its answer arrives, not when it starts: `lost_reply_resolved_by_
/// read_back` waits for "C's first acquire (answered Held)" by this count and then blackholes the
/// replies. A first acquire on a lease this client has never seen must read the blob before it
/// can claim it; if that reply fell into the blackhole, no later acquire could be applied while
/// it lasts. Every other operation is counted when it starts.
#[derive(Debug)]
pub struct Counted {
    pub store: AzureBlobStore,
    pub faults: Faults,
}

#[async_trait]
impl LeaseStore for Counted {
    fn name(&self) -> &'static str {
        self.store.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let answer = self.store.acquire(request).await;
        self.faults.record_request(Op::Acquire);
        answer
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.faults.record_request(Op::Renew);
        self.store.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.faults.record_request(Op::Release);
        self.store.release(grant).await
    }
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.faults.record_request(Op::Withdraw);
        self.store.withdraw(lease, candidate).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.faults.record_request(Op::Inspect);
        self.store.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.faults.record_request(Op::History);
        self.store.history(lease, limit).await
    }
    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.faults.record_request(Op::BreakLease);
        self.store.break_lease(lease).await
    }
}
