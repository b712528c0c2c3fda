//! What the Redis tests share: clients and raw access to the server, and the
//! services script that can restart it.

#![allow(dead_code, unreachable_pub)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::{FaultProxy, Faults};
use leasehold_core::{AcquireRequest, CandidateId, Elector, Error, Grant, LeaseName, LeaseStore, Result};
use leasehold_redis::{ExpiryEvents, RedisConfig, RedisStore};

/// The server named by `LEASEHOLD_REDIS_URL`: every `connect` is a new `RedisStore`.
pub struct RedisBackend {
    pub config: RedisConfig,
    /// The proxies of faulty clients live as long as the backend (one test).
    proxies: Mutex<Vec<FaultProxy>>,
}

impl RedisBackend {
    pub fn with_config(config: RedisConfig) -> RedisBackend {
        RedisBackend {
            config,
            proxies: Mutex::new(Vec::new()),
        }
    }

    pub fn upstream(&self) -> SocketAddr {
        (self.config.host.as_str(), self.config.port)
            .to_socket_addrs()
            .expect("the redis host resolves")
            .next()
            .expect("the redis host has an address")
    }

    /// A store whose traffic goes through a new fault proxy.
    pub async fn faulty(&self) -> Result<(RedisStore, Faults)> {
        let proxy = FaultProxy::start(self.upstream())
            .await
            .map_err(|e| Error::unreachable("redis", e))?;
        let mut config = self.config.clone();
        config.host = proxy.addr().ip().to_string();
        config.port = proxy.addr().port();
        let faults = proxy.faults();
        self.proxies.lock().unwrap().push(proxy);
        Ok((RedisStore::from_config(config).await?, faults))
    }

    /// A plain connection for vandalism and inspection.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        let mut info = redis::RedisConnectionInfo::default().set_db(i64::from(self.config.db));
        if let Some(password) = &self.config.password {
            info = info.set_password(password.expose());
        }
        if let Some(user) = &self.config.username {
            info = info.set_username(user);
        }
        let addr = redis::ConnectionAddr::Tcp(self.config.host.clone(), self.config.port);
        let info = redis::IntoConnectionInfo::into_connection_info(addr)
            .unwrap()
            .set_redis_settings(info);
        redis::Client::open(info)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("a raw redis connection")
    }
}

/// The configuration of the test server: the URL with a prefix of its own, so that the tests'
/// keys are easy to find (and delete) on a shared server, and with expiry events turned on
/// (`expiry_events=enable`: the server started by `scripts/services` may not send them, and a
/// restart forgets a `CONFIG SET`), so that every test runs the same way whatever the server's
/// setting was.
pub fn config(url: &str) -> RedisConfig {
    let mut config = RedisConfig::from_url(url).expect("LEASEHOLD_REDIS_URL is a redis URL");
    config.prefix = "leasehold-test:".into();
    config.expiry_events = ExpiryEvents::Enable;
    config
}

/// The test server without the restart guard: `restart` tests the guard, and may have
/// restarted the server just before the other tests run.
pub fn unguarded() -> Option<RedisBackend> {
    let url = leasehold_conformance::require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = config(&url);
    config.restart_guard = false;
    Some(RedisBackend::with_config(config))
}

/// The services script and the URL it started Redis on, if the server is the one it manages
/// (only then may a test restart it).
pub fn services() -> Option<(PathBuf, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let env = std::fs::read_to_string(root.join("target/services/env")).ok()?;
    let value = |key: &str| {
        env.lines().find_map(|line| {
            let (k, v) = line.trim().trim_start_matches("export ").split_once('=')?;
            (k == key).then(|| v.trim_matches(|c| c == '"' || c == '\'').to_string())
        })
    };
    let url = value("LEASEHOLD_REDIS_URL")?;
    if std::env::var("LEASEHOLD_REDIS_URL").is_ok_and(|set| set != url) {
        return None; // someone else's server
    }
    let script = value("LEASEHOLD_SERVICES_SCRIPT").map_or_else(|| root.join("scripts/services"), PathBuf::from);
    Some((script, url))
}

/// The TTL of the store tests.
pub const TTL: Duration = Duration::from_secs(1);

pub fn id(name: &str) -> CandidateId {
    CandidateId::new(name).unwrap()
}

pub fn request(lease: &LeaseName, who: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: id(who),
        ttl,
        takeover: None,
    }
}

/// Acquires `lease` for `who`, which must be granted.
pub async fn grant(store: &RedisStore, lease: &LeaseName, who: &str, ttl: Duration) -> Grant {
    leasehold_conformance::must_grant(store, lease.as_str(), who, ttl).await
}

/// An elector with the conformance suite's timings.
pub fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, who: &str) -> Elector {
    Elector::builder(store, lease.as_str())
        .candidate_id(who)
        .ttl(TTL)
        .renew_every(TTL / 3)
        .retry_every(TTL / 5)
        .jitter(0.2)
        .drift(0.01)
        .step_down_margin(TTL / 4)
        .request_timeout(TTL / 4)
        .build()
        .unwrap()
}

/// Runs one raw command (`args[0]` and its arguments) on a connection of its own.
pub async fn try_raw_cmd(backend: &RedisBackend, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut raw = backend.raw().await;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut raw).await
}

/// [`try_raw_cmd`], panicking with the command on an error.
pub async fn raw_cmd(backend: &RedisBackend, args: &[&str]) -> redis::Value {
    try_raw_cmd(backend, args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Scripts (`EVALSHA`, `EVAL`) the server has run, from `INFO commandstats`: a server-wide
/// count, so other clients' scripts are in it too.
pub async fn scripts_run(backend: &RedisBackend) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut backend.raw().await)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split_once("calls=")?.1.split(',').next()?.parse::<u64>().ok())
        .sum()
}
