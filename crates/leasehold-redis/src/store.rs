//! [`RedisStore`]: the [`LeaseStore`] on one Redis server.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use leasehold_core::{
    AcquireRequest, Acquired, Announcements, CandidateId, Capabilities, Changes, Error, Expiry, Grant, LeaseName,
    LeaseStore, Notifications, Observation, RecordVersion, Renewed, Result, ShardWrite, Term, Transition,
};

use redis::Value;

use crate::changes::Hub;
use crate::config::{LeaseKeys, RedisConfig};
use crate::conn::{Commands, Reply};
use crate::error::{self, RedisStoreError, STORE};
use crate::record::{
    Answer, LIST_BATCH, LIST_IN_FLIGHT, SCAN_COUNT, TTL_RANGE, answer, bulk, glob_escape, lease_of_key, transitions,
};
use crate::scripts::{
    ACQUIRE_SCRIPT, BREAK_SCRIPT, HAND_OVER_SCRIPT, HELLO_SCRIPT, HISTORY_SCRIPT, INSPECT_MANY_SCRIPT, INSPECT_SCRIPT,
    RELEASE_SCRIPT, RENEW_SCRIPT, SCAN_SCRIPT, WITHDRAW_SCRIPT,
};

/// A [`LeaseStore`] on one Redis server (5.0 or later).
///
/// Each lease is a hash that expires (`PEXPIRE`) holding the holder, its fencing term, its TTL
/// and a record version; a persistent hash keeps the last term and how it ended; a stream keeps
/// the history. Every operation is one Lua script, so each compare-and-set is atomic on the
/// server, and the server's clock expires a silent holder ([`Expiry::ServerClock`]). Followers
/// queue behind the holder (a sorted set per lease, joined by an acquire answered `Held`): a
/// release or break wakes the longest waiter still listening on its own pub/sub channel, a
/// handover its successor, not every follower (see the [crate docs](crate::docs), "Who is
/// woken"). When the server sends
/// expired key-events (see [`ExpiryEvents`](crate::ExpiryEvents)), the expiry of an abandoned
/// lease wakes its followers too ([`Notifications::ReleaseAndExpiry`]: idle followers make no
/// requests); otherwise ([`Notifications::Release`]) followers sleep until the holder's `PTTL`
/// runs out.
///
/// Clones share one command connection (a `ConnectionManager`, which reconnects) and one pub/sub
/// connection. See the [crate docs](crate::docs) for the keys, the term method and what a single
/// Redis does and does not guarantee.
///
/// # Cancel safety
///
/// Every operation is one script the server runs atomically: a dropped call either ran whole on
/// the server or not at all (its outcome is then unknown, as after a timeout). A call dropped
/// before its reply came retires the command connection, so that its late reply cannot be
/// paired with another request; the next request opens a new one. Nothing is spawned per
/// request: the engine runs each call to completion in a task of its own.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_redis::RedisStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379/0?prefix=myapp:").await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(5)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    commands: Commands,
    hub: Hub,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server a `redis://` or `rediss://` URL names, e.g.
    /// `redis://:password@127.0.0.1:6379/0?prefix=myapp:` (see [`RedisConfig`] for the forms and
    /// options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed URL or option (the password never shows);
    /// [`Error::UnsupportedScheme`] for `rediss://` without the `tls` feature; otherwise as
    /// [`RedisStore::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        RedisStore::from_config(RedisConfig::from_str(url)?).await
    }

    /// Connects to the server `config` describes and checks that it can run leasehold's scripts.
    ///
    /// Unless [`RedisConfig::expiry_events`] is [`ExpiryEvents::Off`](crate::ExpiryEvents::Off),
    /// it then asks the server whether it sends expired key-events (for `Enable`, turns them on)
    /// and, if so, opens the pub/sub connection subscribed to them; the answer decides
    /// [`LeaseStore::capabilities`]. Nothing of that makes `connect` fail: without expiry
    /// events, followers poll.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Unreachable`] or [`Error::Timeout`] when the server does not answer within
    ///   [`RedisConfig::timeout`];
    /// - [`Error::Refused`] for a wrong user name or password, missing ACL permissions or a
    ///   server that answers in another protocol;
    /// - [`Error::Store`] when it refuses otherwise (scripting disabled) or is older than Redis 5.0 ([`RedisStoreError::UnsupportedServer`]).
    pub async fn from_config(config: RedisConfig) -> Result<Self> {
        let store = RedisStore::lazy(config)?;
        let reply = store
            .inner
            .commands
            .eval("connect", &HELLO_SCRIPT, &[], Vec::new())
            .await
            .map_err(|e| error::map_connect(e, &format!("{}:{}", store.inner.config.host, store.inner.config.port)))?;
        let version = reply.text(1)?;
        let major: Option<u32> = version.split('.').next().and_then(|m| m.parse().ok());
        if major.is_some_and(|major| major < 5) {
            return Err(Error::store(
                STORE,
                RedisStoreError::UnsupportedServer {
                    version: version.to_string(),
                },
            ));
        }
        store.inner.hub.start().await;
        Ok(store)
    }

    /// A store for the server `config` describes that connects on its first request. Must be
    /// called inside a tokio runtime.
    ///
    /// It learns whether the server sends expiry events only when it first opens its pub/sub
    /// connection (the first [`LeaseStore::changes`] call): electors built before that see
    /// [`Notifications::Release`] and poll.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a field out of range.
    pub fn lazy(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let client = client(&config)?;
        let commands = Commands::new(client.clone(), config.timeout)?;
        let hub = Hub::new(client, config.timeout, config.expiry_events, config.db, &config.prefix);
        Ok(RedisStore {
            inner: Arc::new(Inner { config, commands, hub }),
        })
    }

    /// The configuration the store was made with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    fn keys(&self, lease: &LeaseName) -> LeaseKeys {
        self.inner.config.keys(lease)
    }

    /// One script of `renew_many`: at most [`RENEW_BATCH`] grants.
    async fn renew_batch(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let mut keys = Vec::with_capacity(grants.len() * 3);
        let mut args = Vec::with_capacity(grants.len() * 3);
        let mut versions = Vec::with_capacity(grants.len());
        for grant in grants {
            let LeaseKeys {
                lease, state, history, ..
            } = self.keys(&grant.lease);
            keys.extend([lease, state, history]);
            let version = String::from(RecordVersion::random());
            args.extend([
                grant.holder.as_str().to_string(),
                grant.term.0.to_string(),
                version.clone(),
            ]);
            versions.push(version);
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = self.inner.commands.eval("renew", &RENEW_SCRIPT, &keys, args).await?;
        if reply.status()? != "renewed_each" || reply.values.len() != grants.len() + 1 {
            return Err(error::unexpected("renew", format!("{:?}", reply.values)));
        }
        let answers = grants.iter().zip(versions).zip(&reply.values[1..]);
        Ok(answers
            .map(|((grant, version), value)| {
                let Value::Array(values) = value else {
                    return Err(error::unexpected("renew", format!("{value:?}")));
                };
                let one = Reply {
                    operation: "renew",
                    values: values.clone(),
                };
                match answer(&grant.lease, &one)? {
                    Answer::Renewed => Ok(Renewed::Renewed(Grant {
                        token: version,
                        ..grant.clone()
                    })),
                    Answer::Seen(observation) => Ok(Renewed::Lost(observation)),
                    _ => Err(error::unexpected("renew", format!("{values:?}"))),
                }
            })
            .collect())
    }

    /// What the store holds for each of `leases`, in one script, as `inspect` answers it.
    async fn inspect_many(&self, leases: &[LeaseName]) -> Result<Vec<Observation>> {
        let mut keys = Vec::with_capacity(leases.len() * 3);
        for lease in leases {
            let LeaseKeys {
                lease, state, history, ..
            } = self.keys(lease);
            keys.extend([lease, state, history]);
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = self
            .inner
            .commands
            .eval("list", &INSPECT_MANY_SCRIPT, &keys, Vec::new())
            .await?;
        if reply.status()? != "seen_each" || reply.values.len() != leases.len() + 1 {
            return Err(error::unexpected("list", format!("{:?}", reply.values)));
        }
        leases
            .iter()
            .zip(&reply.values[1..])
            .map(|(lease, value)| {
                let Value::Array(values) = value else {
                    return Err(error::unexpected("list", format!("{value:?}")));
                };
                let one = Reply {
                    operation: "list",
                    values: values.clone(),
                };
                match answer(lease, &one)? {
                    Answer::Seen(observation) => Ok(observation),
                    _ => Err(error::unexpected("list", format!("{values:?}"))),
                }
            })
            .collect()
    }

    /// `MAXLEN ~` of the history stream: two entries per term (grant and end); `0` keeps all.
    fn maxlen(&self) -> String {
        (u64::from(self.inner.config.history_limit) * 2).to_string()
    }

    async fn eval(
        &self,
        operation: &'static str,
        script: &'static redis::Script,
        keys: &LeaseKeys,
        args: Vec<String>,
    ) -> Result<Reply> {
        let keys = [keys.lease.as_str(), keys.state.as_str(), keys.history.as_str()];
        self.inner.commands.eval(operation, script, &keys, args).await
    }

    /// [`eval`](Self::eval) of a script that also queues or wakes waiters (the lease's queue and
    /// woken keys after the three).
    async fn eval_queued(
        &self,
        operation: &'static str,
        script: &'static redis::Script,
        keys: &LeaseKeys,
        args: Vec<String>,
    ) -> Result<Reply> {
        let keys = [
            keys.lease.as_str(),
            keys.state.as_str(),
            keys.history.as_str(),
            keys.queue.as_str(),
            keys.woken.as_str(),
        ];
        self.inner.commands.eval(operation, script, &keys, args).await
    }
}

/// The client: with a private CA or a client certificate when the URL names them.
fn client(config: &RedisConfig) -> Result<redis::Client> {
    // The redis client builds its rustls config from the process's default crypto provider,
    // which rustls cannot pick by itself when the binary links two (the AWS SDK brings
    // aws-lc-rs): seen as a panic on the first `rediss://` request of the `leasehold` CLI.
    // Install ring (this crate's) unless the program chose one.
    #[cfg(feature = "tls")]
    if config.tls && rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    #[cfg(feature = "tls")]
    if config.tls && (config.ca.is_some() || config.cert.is_some()) {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| Error::InvalidUrl {
                url: config.redacted_url(),
                reason: format!("cannot read the {what} file {}: {}", path.display(), e.kind()),
            })
        };
        let root_cert = config.ca.as_deref().map(|ca| read("ca", ca)).transpose()?;
        let client_tls = match &config.cert {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read("cert", cert)?,
                client_key: read("key", key)?,
            }),
            None => None,
        };
        let certificates = redis::TlsCertificates { client_tls, root_cert };
        return redis::Client::build_with_tls(connection_info(config), certificates)
            .map_err(|e| error::map(e, "connect"));
    }
    redis::Client::open(connection_info(config)).map_err(|e| error::map(e, "connect"))
}

fn connection_info(config: &RedisConfig) -> redis::ConnectionInfo {
    use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
    let addr = if config.tls {
        ConnectionAddr::TcpTls {
            host: config.host.clone(),
            port: config.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(config.host.clone(), config.port)
    };
    let mut redis = RedisConnectionInfo::default().set_db(i64::from(config.db));
    if let Some(user) = &config.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &config.password {
        redis = redis.set_password(password.expose());
    }
    let info: ConnectionInfo = addr
        .into_connection_info()
        .expect("an address is a valid connection info");
    info.set_redis_settings(redis)
}

/// Grants renewed by one script of [`LeaseStore::renew_many`] at most. A script blocks the server
/// while it runs (about a dozen commands per grant, some 20 µs): 250 grants keep that to a few
/// milliseconds; more grants go in several scripts, sent together.
pub const RENEW_BATCH: usize = 250;

/// The answers of the scripts of one `renew_many` (each with the number of grants it carried),
/// in order: the first error when every script failed, else one answer per grant, the grants of
/// a failed script each with its error.
fn gather(batches: Vec<(usize, Result<Vec<Result<Renewed>>>)>) -> Result<Vec<Result<Renewed>>> {
    if batches.iter().all(|(_, answers)| answers.is_err()) {
        if let Some((_, Err(error))) = batches.into_iter().next() {
            return Err(error);
        }
        return Ok(Vec::new());
    }
    let mut all = Vec::new();
    for (grants, answers) in batches {
        match answers {
            Ok(answers) => all.extend(answers),
            Err(error) => all.extend((0..grants).map(|_| Err(error::for_each_grant(&error)))),
        }
    }
    Ok(all)
}

/// Milliseconds, rounded up, as Redis wants them.
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

fn capabilities(notifications: Notifications) -> Capabilities {
    Capabilities {
        ttl: TTL_RANGE,
        expiry: Expiry::ServerClock,
        notifications,
        announces: leasehold_core::Announces::Grants,
        fifo: true,
    }
}

#[async_trait]
impl LeaseStore for RedisStore {
    fn name(&self) -> &'static str {
        STORE
    }

    /// [`Notifications::ReleaseAndExpiry`] when the server sends expiry events and the store
    /// uses them (see [`ExpiryEvents`](crate::ExpiryEvents)), as found at `connect` (or, for a
    /// [`lazy`](RedisStore::lazy) store, when it first opened its pub/sub connection);
    /// [`Notifications::Release`] otherwise.
    fn capabilities(&self) -> Capabilities {
        capabilities(if self.inner.hub.expiry_events() {
            Notifications::ReleaseAndExpiry
        } else {
            Notifications::Release
        })
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        // Not `self.capabilities()`: that one marks expiry events as relied upon.
        capabilities(Notifications::Release).check_ttl(STORE, request.ttl)?;
        let lease = &request.lease;
        let keys = self.keys(lease);
        let version = String::from(RecordVersion::random());
        let args = vec![
            request.candidate.as_str().to_string(),
            millis(request.ttl).to_string(),
            version.clone(),
            self.maxlen(),
            if self.inner.config.restart_guard { "1" } else { "0" }.to_string(),
            keys.channel.clone(),
            keys.waiters.clone(),
        ];
        let reply = self.eval_queued("acquire", &ACQUIRE_SCRIPT, &keys, args).await?;
        match answer(lease, &reply)? {
            Answer::Granted(term) => Ok(Acquired::Granted(Grant {
                lease: lease.clone(),
                holder: request.candidate.clone(),
                term,
                ttl: request.ttl,
                token: version,
            })),
            Answer::Seen(observation) if observation.holder.is_some() => Ok(Acquired::Held(observation)),
            _ => Err(error::unexpected("acquire", format!("{:?}", reply.values))),
        }
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let mut answers = self.renew_many(std::slice::from_ref(grant)).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(error::unexpected("renew", "no answer for the grant")))
    }

    /// One script per [`RENEW_BATCH`] grants (the scripts sent together on the one connection):
    /// a member holding many leases renews them all with a request or a few per renew interval.
    /// Each grant is renewed (with a new record version) if its record still names it, exactly
    /// as [`renew`](LeaseStore::renew) does (which is this with one grant); the answers are in
    /// the order of `grants`.
    ///
    /// The grants share one server: a Redis Cluster would refuse a script whose keys lie in
    /// several slots (leasehold supports one server).
    ///
    /// # Errors
    ///
    /// The outer error when every script failed as a whole (timeout, connection, refusal): the
    /// outcome of every grant is then unknown, as after a timeout. Per grant, that error for the
    /// grants of a script that failed while others were answered, and [`Error::CorruptRecord`]
    /// for a record leasehold cannot read (that grant's keys are left alone).
    ///
    /// # Cancel safety
    ///
    /// Each script runs whole on the server or not at all, as for [`renew`](LeaseStore::renew).
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let batches = grants
            .chunks(RENEW_BATCH)
            .map(|batch| async move { (batch.len(), self.renew_batch(batch).await) });
        gather(futures::future::join_all(batches).await)
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let keys = self.keys(&grant.lease);
        let args = vec![
            grant.holder.as_str().to_string(),
            grant.term.0.to_string(),
            self.maxlen(),
            keys.channel.clone(),
            keys.waiters.clone(),
        ];
        let reply = self.eval_queued("release", &RELEASE_SCRIPT, &keys, args).await?;
        match answer(&grant.lease, &reply)? {
            Answer::Done => Ok(()),
            _ => Err(error::unexpected("release", format!("{:?}", reply.values))),
        }
    }

    /// One script: if the record still names the grant, its term ends `handed_over` and the
    /// record names `to` at the same term with `reserved` set, a new version and the grant's
    /// TTL on the server's clock (`PEXPIRE`); the lease's channel announces it, as a release,
    /// so `to` wakes at once.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let keys = self.keys(&grant.lease);
        let args = vec![
            grant.holder.as_str().to_string(),
            grant.term.0.to_string(),
            to.as_str().to_string(),
            String::from(RecordVersion::random()),
            self.maxlen(),
            keys.channel.clone(),
            keys.waiters.clone(),
        ];
        let reply = self.eval_queued("hand_over", &HAND_OVER_SCRIPT, &keys, args).await?;
        match answer(&grant.lease, &reply)? {
            Answer::Done => Ok(()),
            _ => Err(error::unexpected("hand_over", format!("{:?}", reply.values))),
        }
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let keys = self.keys(lease);
        let reply = self.eval("inspect", &INSPECT_SCRIPT, &keys, Vec::new()).await?;
        match answer(lease, &reply)? {
            Answer::Seen(observation) => Ok(observation),
            _ => Err(error::unexpected("inspect", format!("{:?}", reply.values))),
        }
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        crate::candidates::queued(
            &self.inner.commands,
            &self.keys(lease),
            lease,
            self.inspect(lease).await?,
        )
        .await
    }

    /// `SCAN` (one script per step of 1,000 keys) for the lease and state keys of
    /// names that start with `prefix` (glob characters escaped), then one script inspecting
    /// each 250 leases, sent together on the one connection (pipelined). Keys under the store's prefix that
    /// are not a lease's (another program's, history streams) are not listed.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let config = &self.inner.config;
        // `lease:{name}` and `state:{name}` (the state outlives each grant: a free lease).
        let pattern = format!(
            "{}[ls][et]a[st]e:{{{}*",
            glob_escape(&config.prefix),
            glob_escape(prefix)
        );
        let mut names = std::collections::BTreeSet::new();
        let mut cursor = "0".to_string();
        loop {
            let args = vec![cursor.clone(), pattern.clone(), SCAN_COUNT.to_string()];
            let reply = self.inner.commands.eval("list", &SCAN_SCRIPT, &[], args).await?;
            if reply.status()? != "scan" {
                return Err(error::unexpected("list", format!("{:?}", reply.values)));
            }
            for key in reply.array(2)? {
                if let Some(lease) = lease_of_key(config, bulk("list", key)?, prefix) {
                    names.insert(lease);
                }
            }
            cursor = reply.text(1)?.to_string();
            if cursor == "0" {
                break;
            }
        }
        let names: Vec<LeaseName> = names.into_iter().collect();
        let chunks: Vec<Vec<LeaseName>> = names.chunks(LIST_BATCH).map(<[LeaseName]>::to_vec).collect();
        let batches: Vec<Vec<Observation>> = futures::stream::iter(chunks)
            .map(|leases| async move { self.inspect_many(&leases).await })
            .buffered(LIST_IN_FLIGHT)
            .try_collect()
            .await?;
        let observations = batches.into_iter().flatten();
        // A lease whose keys went away since the scan: the store keeps no record of it.
        Ok(observations
            .filter(|o| o.holder.is_some() || o.last_term > Term(0))
            .collect())
    }

    /// One script per 2,500 records of the sorted set of names (4 for 10,000), see `shards.rs`.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<leasehold_core::ShardRecord>> {
        crate::shards::records(&self.inner.commands, &self.inner.config, prefix).await
    }

    /// One script: the version compared, the record and its name written (`shards.rs`).
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        crate::shards::write(&self.inner.commands, &self.inner.config, name, expected, value).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        if limit == 0 {
            // Still refuse to report on a lease whose record cannot be read.
            self.inspect(lease).await?;
            return Ok(Vec::new());
        }
        let keys = self.keys(lease);
        // Each term has at most two entries (its grant and its end).
        let count = limit.saturating_mul(2).saturating_add(2).min(i64::MAX as usize);
        let reply = self
            .eval("history", &HISTORY_SCRIPT, &keys, vec![count.to_string()])
            .await?;
        match answer(lease, &reply)? {
            Answer::History { open, entries } => transitions(lease, open, &entries, limit),
            _ => Err(error::unexpected("history", format!("{:?}", reply.values))),
        }
    }

    /// Takes `candidate` out of the lease's queue; if a release had woken it and it did not take
    /// the lease, the next waiter is woken in its stead (one script).
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let keys = self.keys(lease);
        let args = vec![
            candidate.as_str().to_string(),
            keys.channel.clone(),
            keys.waiters.clone(),
        ];
        let reply = self.eval_queued("withdraw", &WITHDRAW_SCRIPT, &keys, args).await?;
        match answer(lease, &reply)? {
            Answer::Done => Ok(()),
            _ => Err(error::unexpected("withdraw", format!("{:?}", reply.values))),
        }
    }

    /// Yields when `candidate` is the waiter a release, break or withdrawal woke (its own
    /// channel), when the lease became free with no waiter listening, or (with expiry events)
    /// when the lease record or an untaken wake-up expired: the lease's channel. Messages that
    /// name someone else (who was woken, who took the lease) wake nobody.
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let keys = self.keys(lease);
        let waiter = keys.waiter_channel(candidate);
        self.inner.hub.changes(keys.channel, waiter).await
    }

    /// Every grant, from the acquire script's `granted <term> <ttl_ms> <version> <holder>` on
    /// the lease's channel (which wakes no follower): followers that were not woken learn of the
    /// new leader without a request.
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let channel = self.keys(lease).channel;
        self.inner.hub.announcements(lease.clone(), channel).await
    }

    /// `true`: [`break_lease`](LeaseStore::break_lease) works.
    fn can_break(&self) -> bool {
        true
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let keys = self.keys(lease);
        let reply = self
            .eval_queued(
                "break_lease",
                &BREAK_SCRIPT,
                &keys,
                vec![self.maxlen(), keys.channel.clone(), keys.waiters.clone()],
            )
            .await?;
        match answer(lease, &reply)? {
            Answer::Broken(term) => Ok(term),
            _ => Err(error::unexpected("break_lease", format!("{:?}", reply.values))),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lease: &str) -> Grant {
        Grant {
            lease: LeaseName::new(lease).unwrap(),
            holder: CandidateId::new("member").unwrap(),
            term: Term(3),
            ttl: Duration::from_secs(1),
            token: "v".into(),
        }
    }

    fn timeout() -> Error {
        Error::Timeout {
            store: STORE,
            operation: "renew",
            after: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_failed_script_fails_its_own_grants_unless_all_failed() {
        let answered = vec![Ok(Renewed::Renewed(grant("a"))), Ok(Renewed::Renewed(grant("b")))];
        let answers = gather(vec![(2, Ok(answered)), (3, Err(timeout()))]).unwrap();
        assert_eq!(answers.len(), 5);
        assert!(matches!(&answers[1], Ok(Renewed::Renewed(g)) if g.lease.as_str() == "b"));
        for answer in &answers[2..] {
            assert!(matches!(answer, Err(Error::Timeout { .. })), "{answer:?}");
        }
        let refused = Error::refused(STORE, "renew", "NOPERM");
        assert!(matches!(
            gather(vec![(1, Err(refused)), (1, Err(timeout()))]),
            Err(Error::Refused { .. })
        ));
        assert!(gather(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(millis(Duration::from_millis(10)), 10);
        assert_eq!(millis(Duration::from_micros(10_001)), 11);
        assert_eq!(millis(Duration::from_secs(24 * 3600)), 86_400_000);
    }
}
