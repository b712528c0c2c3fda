//! A store's own expiry floor: how long after a client's last keepalive the store itself ends a
//! session or key, with no leasehold code involved. It is the physical floor of crash failover
//! on stores with server-side expiry (etcd, ZooKeeper, Redis).
//!
//! - etcd: an etcd lease of TTL 2 s granted with etcd-client, a key put on it, one keepalive
//!   (`LeaseKeepAlive`), then nothing: from the keepalive's send to the watch's delete event
//!   (another client).
//! - ZooKeeper: a session of 2 s timeout (through a loopback TCP relay of this process) with an
//!   ephemeral node; once the client sent one more packet (a read, after the random pause) the
//!   relay stops forwarding and closes both sides: from that packet's forwarding to the deletion
//!   watch (another client).
//! - Redis: `PEXPIRE key 2000`: from its send to the `expired` keyspace event (another client).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use zookeeper_client as zk;

use crate::Stats;
use crate::backends::Available;
use crate::plan::{Outcome, within};

/// The TTL (session timeout) of the floor measures.
pub(crate) const FLOOR_TTL: Duration = Duration::from_secs(2);

/// One store's expiry floor.
#[derive(Clone, Debug)]
pub(crate) struct Floor {
    /// What was timed, for the report.
    pub(crate) what: &'static str,
    /// The TTL or session timeout the store granted.
    pub(crate) ttl: Duration,
    pub(crate) stats: Stats,
}

impl Floor {
    /// p50 as a multiple of the TTL.
    pub(crate) fn p50_ttl(&self) -> f64 {
        self.stats.p50.as_secs_f64() / self.ttl.as_secs_f64().max(1e-9)
    }
    /// max as a multiple of the TTL.
    pub(crate) fn max_ttl(&self) -> f64 {
        self.stats.max.as_secs_f64() / self.ttl.as_secs_f64().max(1e-9)
    }
}

/// The expiry floor of backend `name`, or why there is none.
pub(crate) async fn measure(name: &str, av: &Available, smoke: bool) -> Outcome<Floor> {
    let reps = if smoke { 1 } else { 5 };
    let url = av.url().unwrap_or_default();
    let run = leasehold::random_u64() % 1_000_000;
    match name {
        "etcd" => etcd(url, run, reps).await,
        "zookeeper" => zookeeper(url, run, reps).await,
        "redis" => redis_floor(url, run, reps).await,
        _ => Err("n/a (no expiry floor measure for this store)".into()),
    }
}

/// A random pause of up to 500 ms before each timed keepalive, so that the samples do not keep
/// one phase against the store's own expiry timer (etcd checks for expired leases every 500 ms,
/// ZooKeeper expires sessions in buckets of `tickTime`, Redis samples keys 10 times a second).
async fn jitter() {
    tokio::time::sleep(Duration::from_millis(leasehold::random_u64() % 500)).await;
}

/// `etcd://h1:p1,h2:p2/...` as etcd-client endpoints (`http://h1:p1`, ...).
pub(crate) fn etcd_endpoints(url: &str) -> Vec<String> {
    url.trim_start_matches("etcd://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| format!("http://{e}"))
        .collect()
}

pub(crate) async fn etcd_client(url: &str) -> Outcome<etcd_client::Client> {
    let endpoints = etcd_endpoints(url);
    within(
        Duration::from_secs(10),
        "etcd connect",
        etcd_client::Client::connect(endpoints, None),
    )
    .await?
    .map_err(|e| format!("etcd connect: {e}"))
}

async fn etcd(url: &str, run: u64, reps: usize) -> Outcome<Floor> {
    let mut owner = etcd_client(url).await?;
    let mut watcher = etcd_client(url).await?;
    let mut samples = Vec::new();
    let mut granted = FLOOR_TTL;
    let e = |what: &'static str| move |err: etcd_client::Error| format!("etcd {what}: {err}");
    for i in 0..reps {
        let key = format!("leasehold-bench/floor-{run}-{i}");
        let lease = owner
            .lease_grant(FLOOR_TTL.as_secs() as i64, None)
            .await
            .map_err(e("lease grant"))?;
        granted = Duration::from_secs(lease.ttl().max(0) as u64);
        owner
            .put(
                key.as_str(),
                "x",
                Some(etcd_client::PutOptions::new().with_lease(lease.id())),
            )
            .await
            .map_err(e("put"))?;
        let mut stream = watcher.watch(key.as_str(), None).await.map_err(e("watch"))?;
        // The first message confirms the watch.
        within(Duration::from_secs(5), "watch created", stream.message())
            .await?
            .map_err(e("watch"))?;
        jitter().await;
        let sent = Instant::now();
        // etcd-client sends the first keepalive and waits for its answer before returning.
        let (keeper, answers) = owner.lease_keep_alive(lease.id()).await.map_err(e("keepalive"))?;
        drop(keeper);
        drop(answers);
        let deleted = within(FLOOR_TTL * 5, "delete event", async {
            while let Ok(Some(r)) = stream.message().await {
                if r.events()
                    .iter()
                    .any(|ev| ev.event_type() == etcd_client::EventType::Delete)
                {
                    return Some(Instant::now());
                }
            }
            None
        })
        .await?
        .ok_or("the watch ended")?;
        samples.push(deleted - sent);
    }
    Ok(Floor {
        what: "etcd lease, one keepalive, then none: keepalive sent -> watch's delete event",
        ttl: granted,
        stats: Stats::of(&samples).ok_or("no samples")?,
    })
}

/// A loopback TCP relay to `target` that records when it last forwarded bytes from its client,
/// and can be cut (both sides closed, no new connections).
struct Relay {
    addr: String,
    last_up: Arc<Mutex<Option<Instant>>>,
    ups: Arc<Notify>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: String) -> Outcome<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("relay: {e}"))?.to_string();
        let last_up = Arc::new(Mutex::new(None));
        let ups = Arc::new(Notify::new());
        let tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (l, u, t) = (last_up.clone(), ups.clone(), tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (l, u) = (l.clone(), u.clone());
                let up = tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        *l.lock().expect("relay lock") = Some(Instant::now());
                        u.notify_waiters();
                    }
                });
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                t.lock().expect("relay lock").extend([up, down]);
            }
        });
        Ok(Relay {
            addr,
            last_up,
            ups,
            tasks,
            accept,
        })
    }

    /// Waits for the client's next packet, then cuts the relay at once; returns when that
    /// packet was forwarded.
    async fn cut_after_next_packet(&self, limit: Duration) -> Outcome<Instant> {
        let before = *self.last_up.lock().expect("relay lock");
        within(limit, "the client's next packet", async {
            loop {
                let notified = self.ups.notified();
                if *self.last_up.lock().expect("relay lock") != before {
                    break;
                }
                notified.await;
            }
        })
        .await?;
        self.cut();
        (*self.last_up.lock().expect("relay lock")).ok_or_else(|| "no packet".into())
    }

    fn cut(&self) {
        self.accept.abort();
        for t in self.tasks.lock().expect("relay lock").drain(..) {
            t.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The `host:port,...` list of a `zk://` or `zookeeper://` URL.
pub(crate) fn zk_hosts(url: &str) -> String {
    url.trim_start_matches("zk://")
        .trim_start_matches("zookeeper://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_string()
}

async fn zookeeper(url: &str, run: u64, reps: usize) -> Outcome<Floor> {
    let hosts = zk_hosts(url);
    let first = hosts.split(',').next().unwrap_or_default().to_string();
    let e = |what: &'static str| move |err: zk::Error| format!("zookeeper {what}: {err}");
    let watcher = within(
        Duration::from_secs(10),
        "zookeeper connect",
        zk::Client::connect(&hosts),
    )
    .await?
    .map_err(e("connect"))?;
    let mut samples = Vec::new();
    let mut granted = FLOOR_TTL;
    for i in 0..reps {
        let relay = Relay::start(first.clone()).await?;
        let owner = within(
            Duration::from_secs(10),
            "zookeeper connect",
            zk::Client::connector()
                .with_session_timeout(FLOOR_TTL)
                .connect(&relay.addr),
        )
        .await?
        .map_err(e("connect"))?;
        granted = owner.session_timeout();
        let path = format!("/leasehold-bench-floor-{run}-{i}");
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        owner.create(&path, b"x", &options).await.map_err(e("create"))?;
        let (stat, deleted) = watcher.check_and_watch_stat(&path).await.map_err(e("watch"))?;
        if stat.is_none() {
            return Err("the ephemeral node vanished before the measure".into());
        }
        jitter().await;
        // The client's last packet is a read sent now, after the random pause (not its next
        // ping: pings keep the phase of the session's start, and the session starts right after
        // the previous sample's expiry, which is on one of the server's ticks): forward it, then
        // nothing more. Its reply is lost with the connection.
        let probe = async {
            let _ = tokio::time::timeout(granted, owner.check_stat(&path)).await;
        };
        let (sent, ()) = tokio::join!(relay.cut_after_next_packet(granted), probe);
        let sent = sent?;
        let event = within(granted * 5, "deletion watch", deleted.changed()).await?;
        let at = Instant::now();
        if event.event_type != zk::EventType::NodeDeleted {
            return Err(format!("unexpected watch event {:?}", event.event_type));
        }
        samples.push(at - sent);
        drop(owner);
        drop(relay);
    }
    Ok(Floor {
        what: "ZooKeeper session, its last packet (a read at a random instant) forwarded, then cut: read sent -> deletion watch",
        ttl: granted,
        stats: Stats::of(&samples).ok_or("no samples")?,
    })
}

async fn redis_floor(url: &str, run: u64, reps: usize) -> Outcome<Floor> {
    let plain = url.split('?').next().unwrap_or_default();
    let db: u32 = plain
        .trim_start_matches("redis://")
        .split_once('/')
        .and_then(|(_, db)| db.parse().ok())
        .unwrap_or(0);
    let e = |what: &'static str| move |err: redis::RedisError| format!("redis {what}: {err}");
    let client = redis::Client::open(plain).map_err(e("url"))?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(e("connect"))?;
    let flags: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(&mut conn)
        .await
        .map_err(e("CONFIG GET"))?;
    let flags = flags.get(1).cloned().unwrap_or_default();
    if !(flags.contains('x') && (flags.contains('E') || flags.contains('A'))) {
        return Err(format!(
            "the server's notify-keyspace-events is {flags:?}, without expired key-events (Ex)"
        ));
    }
    let mut pubsub = client.get_async_pubsub().await.map_err(e("pubsub"))?;
    pubsub
        .subscribe(format!("__keyevent@{db}__:expired"))
        .await
        .map_err(e("subscribe"))?;
    let mut messages = pubsub.on_message();
    let mut samples = Vec::new();
    for i in 0..reps {
        let key = format!("leasehold-bench:floor:{run}:{i}");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn)
            .await
            .map_err(e("SET"))?;
        jitter().await;
        let sent = Instant::now();
        let set: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(FLOOR_TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await
            .map_err(e("PEXPIRE"))?;
        if set != 1 {
            return Err("PEXPIRE did not set the expiry".into());
        }
        let at = within(FLOOR_TTL * 5, "expired event", async {
            while let Some(msg) = messages.next().await {
                if msg.get_payload::<String>().is_ok_and(|k| k == key) {
                    return Some(Instant::now());
                }
            }
            None
        })
        .await?
        .ok_or("the subscription ended")?;
        samples.push(at - sent);
    }
    Ok(Floor {
        what: "Redis key, PEXPIRE sent -> its expired keyspace event",
        ttl: FLOOR_TTL,
        stats: Stats::of(&samples).ok_or("no samples")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_endpoints_of_a_store_url() {
        assert_eq!(etcd_endpoints("etcd://127.0.0.1:2379"), ["http://127.0.0.1:2379"]);
        assert_eq!(
            etcd_endpoints("etcd://a:1,b:2/prefix?x=y"),
            ["http://a:1", "http://b:2"]
        );
    }
}
