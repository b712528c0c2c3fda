//! Sessions: one ZooKeeper session per TTL (the session timeout *is* the TTL), opened on first
//! use and replaced after it expires; and the range of session timeouts the ensemble grants,
//! probed once per process and ensemble.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use leasehold_core::{Error, LeaseName, Result};
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;
use crate::error::{STORE, map_connect};
use crate::state::{Inner, lock};

/// The session timeout asked for when probing the smallest one the server grants. The client
/// must complete its handshake within the session timeout asked for: 1 s leaves a busy
/// machine time for it (with no second try), and no ZooKeeper session shorter than that
/// survives a garbage-collection pause of its server anyway.
const PROBE_MIN: Duration = Duration::from_secs(1);
/// The session timeout asked for when probing the largest one the server grants.
const PROBE_MAX: Duration = Duration::from_secs(24 * 3600);

/// How long a failed connect looks at each host to say why.
const PROBE_LOOK: Duration = Duration::from_secs(5);

/// The smallest and largest session timeout each ensemble grants, probed once per process.
fn probed_ranges() -> &'static Mutex<HashMap<String, RangeInclusive<Duration>>> {
    static RANGES: OnceLock<Mutex<HashMap<String, RangeInclusive<Duration>>>> = OnceLock::new();
    RANGES.get_or_init(Mutex::default)
}

/// The session timeouts the ensemble grants: the TTLs a store accepts. Probed with two short
/// sessions, once per process and ensemble (concurrent connects share the probe).
pub(crate) async fn ttl_range(config: &ZookeeperConfig) -> Result<RangeInclusive<Duration>> {
    let key = config.connect_string();
    static PROBING: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    let _probing = PROBING.get_or_init(tokio::sync::Mutex::default).lock().await;
    if let Some(range) = lock(probed_ranges()).get(&key).cloned() {
        return Ok(range);
    }
    let low = open_session(config, PROBE_MIN).await?;
    let high = open_session(config, PROBE_MAX).await?;
    let range = low.session_timeout()..=high.session_timeout();
    debug!(?range, "probed the session timeouts the ensemble grants");
    lock(probed_ranges()).insert(key, range.clone());
    Ok(range)
}

async fn open_session(config: &ZookeeperConfig, timeout: Duration) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(timeout)
        .with_fail_eagerly();
    if timeout * 2 / 5 > PROBE_LOOK {
        // The client gives each host 2/5 of the session timeout to answer: hours for the long
        // probe, on a host that holds the connection open without answering.
        connector = connector.with_connection_timeout(PROBE_LOOK);
    }
    for (scheme, credential) in config.auth() {
        connector = connector.with_auth(scheme, credential.expose().as_bytes());
    }
    match connector.connect(&config.connect_string()).await {
        Ok(client) => Ok(client),
        Err(e) => Err(map_connect(e, config, timeout.min(PROBE_LOOK)).await),
    }
}

impl Inner {
    /// The live session for `ttl`, opened (or reopened after expiry) on demand.
    pub(crate) async fn session(&self, ttl: Duration) -> Result<zk::Client> {
        let slot = lock(&self.sessions).entry(ttl.as_millis() as u64).or_default().clone();
        let mut slot = slot.lock().await;
        if let Some(client) = self.live(&mut slot) {
            return Ok(client);
        }
        let client = open_session(&self.config, ttl).await?;
        if client.session_timeout() != ttl {
            let min = *self.ttl_range.start();
            let max = *self.ttl_range.end();
            return Err(Error::InvalidTtl {
                store: STORE,
                ttl,
                min,
                max,
            });
        }
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The live session for `ttl` if there is one, without opening one.
    pub(crate) async fn existing_session(&self, ttl: Duration) -> Option<zk::Client> {
        let slot = lock(&self.sessions).get(&(ttl.as_millis() as u64)).cloned()?;
        let mut slot = slot.lock().await;
        self.live(&mut slot)
    }

    /// The client in a session slot, if its session is not over; an ended one is reaped.
    pub(crate) fn live(&self, slot: &mut Option<zk::Client>) -> Option<zk::Client> {
        let client = slot.as_ref()?;
        if client.state().is_terminated() {
            self.session_ended(client);
            *slot = None;
            return None;
        }
        Some(client.clone())
    }

    /// Every live session of this store, without opening one.
    pub(crate) async fn live_sessions(&self) -> Vec<zk::Client> {
        let slots: Vec<_> = lock(&self.sessions).values().cloned().collect();
        let mut live = Vec::with_capacity(slots.len());
        for slot in slots {
            live.extend(self.live(&mut *slot.lock().await));
        }
        live
    }

    /// Any live session, for reads; opens one when there is none.
    pub(crate) async fn reader(&self) -> Result<zk::Client> {
        let slots: Vec<_> = lock(&self.sessions).values().cloned().collect();
        for slot in slots {
            if let Some(client) = self.live(&mut *slot.lock().await) {
                return Ok(client);
            }
        }
        let ttl = Duration::from_secs(10).clamp(*self.ttl_range.start(), *self.ttl_range.end());
        self.session(ttl).await
    }

    /// Forgets the znodes of an expired session: they are gone, or will be within a session
    /// timeout, and must never be adopted.
    pub(crate) fn session_ended(&self, client: &zk::Client) {
        let id = client.session_id().0;
        let mut dead = Vec::new();
        for ((lease, _), candidate) in lock(&self.candidates).iter_mut() {
            if candidate.node.as_ref().is_some_and(|n| n.session == id) {
                let node = candidate.node.take().expect("checked");
                dead.push(self.candidate_path(lease, &node.name));
                candidate.changed.send_modify(|n| *n += 1);
            }
        }
        lock(&self.leader_watches).retain(|(session, _), _| *session != id);
        warn!(session = %client.session_id(), nodes = dead.len(), "ZooKeeper session expired; opening a new one");
        lock(&self.dead).extend(dead);
    }

    pub(crate) fn is_dead(&self, lease: &LeaseName, name: &str) -> bool {
        lock(&self.dead).contains(&self.candidate_path(lease, name))
    }
}
