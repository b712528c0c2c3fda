//! The requests on the bucket: read a lease object, write it on a condition, list the keys, and
//! the probe that `connect` runs. Every other module builds on this one; it imports none of them
//! but the record and the errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::primitives::ByteStream;
use leasehold_core::{LeaseName, Result, random_u64};

use crate::config::S3Config;
use crate::error::{self, ConnectError, STORE};
use crate::record::Record;

/// How many writers the probe races on one key at `connect`.
const PROBE_RACERS: usize = 8;

/// The bucket, the key prefix and the client: what every request needs.
#[derive(Clone)]
pub(crate) struct Objects {
    pub(crate) client: Client,
    pub(crate) bucket: Arc<str>,
    /// Empty, or the prefix followed by `/`.
    pub(crate) key_prefix: Arc<str>,
    pub(crate) timeout: Duration,
    /// The object of each lease this store holds, as its last write left it: a renewal then
    /// replaces it on that ETag in one request, without reading it first.
    held: Arc<Mutex<HashMap<LeaseName, Read>>>,
    /// The shard records this store last read or wrote, by name: (ETag without quotes, value).
    /// A listing that shows a record with the same ETag (the MD5 of its body, which holds a
    /// random nonce) takes the value from here instead of reading the object again.
    pub(crate) shard_values: Arc<Mutex<HashMap<LeaseName, (String, String)>>>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the credentials: leave it out.
        f.debug_struct("Objects")
            .field("bucket", &self.bucket)
            .field("key_prefix", &self.key_prefix)
            .finish_non_exhaustive()
    }
}

/// The condition of a write.
#[derive(Clone, Copy, Debug)]
pub(crate) enum If<'a> {
    /// `If-None-Match: *`: only if there is no object.
    Absent,
    /// `If-Match: <etag>`: only if the object is still the one read with this ETag.
    Matches(&'a str),
}

/// A lease object as read: the record and the ETag its replacement must name.
#[derive(Clone, Debug)]
pub(crate) struct Read {
    pub(crate) record: Record,
    pub(crate) etag: String,
}

impl Objects {
    /// The client for `config`, without checking anything.
    pub(crate) fn new(client: Client, config: &S3Config) -> Objects {
        let key_prefix = if config.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", config.prefix)
        };
        Objects {
            client,
            bucket: config.bucket.as_str().into(),
            key_prefix: key_prefix.into(),
            timeout: config.timeout,
            held: Arc::default(),
            shard_values: Arc::default(),
        }
    }

    /// The object of `lease` as this store last wrote it while holding it at version `token`.
    pub(crate) fn written(&self, lease: &LeaseName, token: &str) -> Option<Read> {
        let held = self.held.lock().expect("held lock poisoned");
        held.get(lease).filter(|read| read.record.version() == token).cloned()
    }

    /// Remembers the object of a lease this store holds (`Some`), or forgets it.
    pub(crate) fn remember(&self, lease: &LeaseName, read: Option<Read>) {
        let mut held = self.held.lock().expect("held lock poisoned");
        match read {
            Some(read) => held.insert(lease.clone(), read),
            None => held.remove(lease),
        };
    }

    /// The key of a lease's object.
    pub(crate) fn key(&self, lease: &LeaseName) -> String {
        format!("{}{}", self.key_prefix, lease.as_str())
    }

    /// Reads a lease object: `None` when there is none.
    pub(crate) async fn get(&self, lease: &LeaseName, operation: &'static str) -> Result<Option<Read>> {
        let Some((etag, bytes)) = self.get_bytes(lease, &self.key(lease), operation).await? else {
            return Ok(None);
        };
        let record = Record::decode(lease, &bytes)?;
        Ok(Some(Read { record, etag }))
    }

    /// Reads the object at `key` (of the lease or shard record `name`): its ETag and body, `None`
    /// when there is none.
    pub(crate) async fn get_bytes(
        &self,
        name: &LeaseName,
        key: &str,
        operation: &'static str,
    ) -> Result<Option<(String, Vec<u8>)>> {
        let got = self
            .client
            .get_object()
            .bucket(self.bucket.as_ref())
            .key(key)
            .send()
            .await;
        let out = match got {
            Ok(out) => out,
            Err(e) if error::is_not_found(&e) && !error::is_missing_bucket(&e) => return Ok(None),
            Err(e) => return Err(error::map(e, operation, self.timeout)),
        };
        let etag = out.e_tag().map(str::to_string).ok_or_else(|| {
            leasehold_core::Error::store(STORE, format!("{operation}: the object of {name} came without an ETag"))
        })?;
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| leasehold_core::Error::unreachable(STORE, format!("{operation}: reading the object: {e}")))?
            .into_bytes();
        Ok(Some((etag, bytes.to_vec())))
    }

    /// Writes `record` as the lease's object if `condition` holds: the new ETag, or `None` when
    /// it did not (412, or 404 on `If-Match`: a lost race).
    pub(crate) async fn put(
        &self,
        lease: &LeaseName,
        record: &Record,
        condition: If<'_>,
        operation: &'static str,
    ) -> Result<Option<String>> {
        self.put_bytes(&self.key(lease), record.encode(), condition, operation)
            .await
    }

    /// Writes `body` at `key` if `condition` holds: the new ETag (empty if the store sent
    /// none), or `None` when it did not (412, or 404 on `If-Match`).
    pub(crate) async fn put_bytes(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: If<'_>,
        operation: &'static str,
    ) -> Result<Option<String>> {
        let mut put = self
            .client
            .put_object()
            .bucket(self.bucket.as_ref())
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(body));
        put = match condition {
            If::Absent => put.if_none_match("*"),
            If::Matches(etag) => put.if_match(etag),
        };
        match put.send().await {
            Ok(out) => Ok(Some(out.e_tag().unwrap_or_default().to_string())),
            Err(e) if error::is_lost_race(&e, matches!(condition, If::Matches(_))) => Ok(None),
            Err(e) => Err(error::map(e, operation, self.timeout)),
        }
    }

    /// The names of the leases whose objects are directly under the prefix and start with
    /// `prefix`, every page; keys that are no lease name (the probe's, deeper prefixes such as
    /// the shard records') are skipped.
    pub(crate) async fn list_names(&self, prefix: &str) -> Result<Vec<LeaseName>> {
        let listed = self.list_objects(&self.key_prefix, prefix, "list").await?;
        Ok(listed.into_iter().map(|(name, _)| name).collect())
    }

    /// The objects directly under `folder` (a key prefix ending in `/`, or empty) whose name
    /// there starts with `prefix` and is a lease name, with their ETags, sorted by name: one
    /// `ListObjectsV2` per 1,000 keys (`delimiter=/`, so deeper prefixes are not listed).
    pub(crate) async fn list_objects(
        &self,
        folder: &str,
        prefix: &str,
        operation: &'static str,
    ) -> Result<Vec<(LeaseName, String)>> {
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(self.bucket.as_ref())
                .prefix(format!("{folder}{prefix}"))
                .delimiter("/")
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| error::map(e, operation, self.timeout))?;
            for object in out.contents() {
                let name = object
                    .key()
                    .and_then(|key| key.strip_prefix(folder))
                    .and_then(|name| LeaseName::new(name).ok());
                if let Some(name) = name {
                    found.push((name, object.e_tag().unwrap_or_default().to_string()));
                }
            }
            match out.next_continuation_token() {
                Some(next) if out.is_truncated() == Some(true) => token = Some(next.to_string()),
                _ => break,
            }
        }
        found.sort();
        Ok(found)
    }

    /// Creates the bucket when it is missing (an existing one is left as it is).
    pub(crate) async fn create_bucket_if_missing(&self) -> Result<()> {
        match self.client.create_bucket().bucket(self.bucket.as_ref()).send().await {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()) =>
            {
                Ok(())
            }
            Err(e) => Err(error::map(e, "create_bucket", self.timeout)),
        }
    }

    /// Checks that the store honours conditional writes, on two fresh keys that no lease name
    /// can have (a lease name never starts with `.`): a create-if-absent succeeds and a second
    /// one is refused; a replace naming the current ETag succeeds and one naming a stale ETag
    /// is refused; of [`PROBE_RACERS`] creates of one key sent at once, exactly one succeeds.
    /// The probe objects are deleted afterwards (a failed delete is only logged).
    pub(crate) async fn probe(&self) -> Result<()> {
        let key = format!("{}.leasehold-probe-{:016x}", self.key_prefix, random_u64());
        let raced = format!("{key}-race");
        let checked = self.probe_sequence(&key).await;
        let checked = match checked {
            Ok(()) => self.probe_race(&raced).await,
            Err(e) => Err(e),
        };
        for key in [&key, &raced] {
            if let Err(e) = self
                .client
                .delete_object()
                .bucket(self.bucket.as_ref())
                .key(key)
                .send()
                .await
            {
                tracing::debug!(key, error = %error::Described::new("delete_object", &e), "probe object left behind");
            }
        }
        checked
    }

    async fn probe_sequence(&self, key: &str) -> Result<()> {
        let ignored = |what: &str| Err(ConnectError::ConditionalWritesIgnored { what: what.to_string() }.refused());
        let Some(first) = self.probe_put(key, 1, If::Absent).await? else {
            return ignored("a create-if-absent (If-None-Match: *) of a new key was refused");
        };
        if self.probe_put(key, 2, If::Absent).await?.is_some() {
            return ignored("a second create-if-absent (If-None-Match: *) of the same key succeeded");
        }
        if first.is_empty() {
            return ignored("a write answered without an ETag");
        }
        let Some(second) = self.probe_put(key, 3, If::Matches(&first)).await? else {
            return ignored("a replace naming the current ETag (If-Match) was refused");
        };
        if second == first {
            return ignored("a replace with other content kept the ETag");
        }
        if self.probe_put(key, 4, If::Matches(&first)).await?.is_some() {
            return ignored("a replace naming a stale ETag (If-Match) succeeded");
        }
        Ok(())
    }

    async fn probe_race(&self, key: &str) -> Result<()> {
        let racers = (0..PROBE_RACERS).map(|i| self.probe_put(key, 10 + i, If::Absent));
        let mut won = 0;
        for answer in futures::future::join_all(racers).await {
            match answer {
                Ok(Some(_)) => won += 1,
                Ok(None) => {}
                // A 409 ConditionalRequestConflict is a refusal too, as far as the race goes.
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
        }
        if won != 1 {
            return Err(ConnectError::ConditionalWritesIgnored {
                what: format!(
                    "{won} of {PROBE_RACERS} concurrent create-if-absent writes of one key succeeded \
                     (a check-then-write without a lock)"
                ),
            }
            .refused());
        }
        Ok(())
    }

    /// One probe write: the new ETag, or `None` when refused (a missing bucket is reported as
    /// such).
    async fn probe_put(&self, key: &str, n: usize, condition: If<'_>) -> Result<Option<String>> {
        let body = format!("leasehold conditional-write probe {n}\n").into_bytes();
        match self.put_bytes(key, body, condition, "connect").await {
            Err(leasehold_core::Error::Refused { reason, .. }) if reason.contains("NoSuchBucket") => {
                Err(ConnectError::BucketMissing {
                    bucket: self.bucket.to_string(),
                }
                .refused())
            }
            other => other,
        }
    }
}

/// The SDK client for `config`: static credentials from the URL or the standard AWS chain, no
/// retries (the engine retries), the configured timeout on every request, checksums only where
/// the operation requires them (S3-compatible servers differ in the checksum headers they
/// know).
pub(crate) async fn build_client(config: &S3Config) -> Result<Client> {
    let static_credentials = config.credentials.as_ref().map(|c| {
        Credentials::new(
            c.access_key_id.expose(),
            c.secret_access_key.expose(),
            c.session_token.as_ref().map(|t| t.expose().to_string()),
            None,
            "leasehold-url",
        )
    });
    #[cfg(feature = "aws-config")]
    let mut builder = {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(credentials) = static_credentials {
            loader = loader.credentials_provider(credentials);
        }
        let shared = loader.load().await;
        if shared.region().is_none() {
            return Err(ConnectError::NoRegion.refused());
        }
        aws_sdk_s3::config::Builder::from(&shared)
    };
    #[cfg(not(feature = "aws-config"))]
    let mut builder = {
        let credentials = static_credentials.ok_or_else(|| ConnectError::NoCredentials.refused())?;
        let region = config.region.clone().ok_or_else(|| ConnectError::NoRegion.refused())?;
        aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
    };
    if let Some(endpoint) = &config.endpoint {
        builder = builder.endpoint_url(endpoint);
    }
    let builder = builder
        .force_path_style(config.path_style)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.timeout)
                .operation_attempt_timeout(config.timeout)
                .operation_timeout(config.timeout)
                .build(),
        )
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
    Ok(Client::from_conf(builder.build()))
}
