//! Expiry events (`expiry_events=auto|off|enable`) against a real server
//! (`scripts/services up redis`): an abandoned lease's expiry wakes a waiting follower that makes
//! no requests while it waits; without them followers poll once per TTL; a server that refuses
//! `CONFIG` or the key-event channel falls back to polling.
//!
//! The tests that need expiry events turn them on with `expiry_events=enable` (a `CONFIG SET` on
//! the test server, which adds `Ex` to its `notify-keyspace-events`); none turns them off again,
//! so tests running at the same time never see them vanish.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RedisBackend, TTL, elector, grant, id, try_raw_cmd};
use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, Faults, FaultyStore, SafetyChecker, require_server};
use leasehold_core::{Change, LeaseName, LeaseStore, Notifications, random_u64};
use leasehold_redis::{ExpiryEvents, RedisConfig, RedisStore};

fn backend(mode: ExpiryEvents) -> Option<RedisBackend> {
    let url = require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.restart_guard = false;
    config.expiry_events = mode;
    Some(RedisBackend::with_config(config))
}

fn lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("expiry-{tag}-{:x}", random_u64())).unwrap()
}

async fn flags(backend: &RedisBackend) -> String {
    let value = try_raw_cmd(backend, &["CONFIG", "GET", "notify-keyspace-events"])
        .await
        .unwrap();
    let pairs: Vec<(String, String)> = redis::from_redis_value(value).unwrap();
    pairs[0].1.clone()
}

/// The expiry of an abandoned lease reaches a `changes` stream: after the server let the record
/// go (never before the TTL), and at most a second later. Five rounds; the delays are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_wakes_its_changes_stream() {
    let Some(backend) = backend(ExpiryEvents::Enable) else {
        return;
    };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::ReleaseAndExpiry);
    let flags = flags(&backend).await;
    assert!(
        flags.contains('E') && (flags.contains('x') || flags.contains('A')),
        "{flags:?}"
    );
    let holder = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let ttl = Duration::from_millis(300);
    let mut delays = Vec::new();
    for _ in 0..5 {
        let lease = lease("stream");
        let mut changes = store.changes(&lease, &id("watcher")).await.unwrap().unwrap();
        let granted = Instant::now();
        grant(&holder, &lease, "abandoned", ttl).await;
        let woken = tokio::time::timeout(ttl + Duration::from_secs(1), changes.next()).await;
        assert_eq!(
            woken,
            Ok(Some(Change::Changed)),
            "{lease}: no expiry event within a second of the TTL"
        );
        let after = granted.elapsed();
        assert!(after >= ttl, "{lease}: woken {after:?} after a grant of {ttl:?}");
        delays.push(after - ttl);
        // Nothing else wakes it: the record is gone, nobody releases.
        let quiet = tokio::time::timeout(Duration::from_millis(200), changes.next()).await;
        assert!(quiet.is_err(), "{lease}: a second wake-up {quiet:?}");
    }
    println!("expiry event after the TTL: {delays:?}");
}

/// What one idle follower does while a leader renews, and then when the leader is cut off.
struct Idle {
    /// The follower's store requests per second while the leader renews.
    idle_rate: f64,
    /// From the leader's crash to the follower's election.
    failover: Duration,
    /// The follower's store requests from the leader's crash to its election.
    requests_to_elect: u64,
}

/// Leader A renews through a fault proxy; follower B (requests counted) waits `idle`, then A is
/// blackholed and B takes over. Checks that nobody ever leads twice.
async fn idle_follower(backend: &RedisBackend, idle: Duration) -> Idle {
    let lease = lease("idle");
    let checker = SafetyChecker::new();
    let (store_a, faults_a) = backend.faulty().await.unwrap();
    let a = elector(Arc::new(store_a), &lease, "A");
    let counts = Faults::new();
    let store_b = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let b = elector(
        Arc::new(FaultyStore::counting(Arc::new(store_b), counts.clone())),
        &lease,
        "B",
    );
    checker.watch(&a);
    checker.watch(&b);
    let leader_a = tokio::time::timeout(TTL * 3, a.campaign()).await.unwrap().unwrap();
    let b_task = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await.unwrap() }
    });
    // B subscribes and finds A holding the lease.
    tokio::time::sleep(TTL / 2).await;
    assert!(counts.counts().acquire >= 1, "B has not asked: {:?}", counts.counts());
    counts.reset_counts();
    let started = Instant::now();
    tokio::time::sleep(idle).await;
    let during = counts.counts();
    let idle_rate = during.total() as f64 / started.elapsed().as_secs_f64();
    println!(
        "{}: B while A renews for {idle:?}: {during:?}",
        backend.config.expiry_events
    );

    counts.reset_counts();
    let crashed = Instant::now();
    faults_a.set(Direction::Both, Fault::Blackhole);
    let leader_b = tokio::time::timeout(TTL * 5, b_task)
        .await
        .expect("B takes over within 5 TTLs")
        .unwrap();
    let failover = leader_b.elected_at() - crashed;
    let requests_to_elect = counts.counts().total();
    assert!(
        leader_b.elected_at() >= leader_a.valid_until(),
        "B elected before A's valid_until"
    );
    assert!(leader_b.term() > leader_a.term());
    leader_b.resign().await;
    drop(leader_a);
    checker.check().await.unwrap();
    Idle {
        idle_rate,
        failover,
        requests_to_elect,
    }
}

/// With `expiry_events=off` the store reports `Release` whatever the server sends, and an idle
/// follower reads the lease once per TTL (when the renewing holder's `PTTL` would run out); the
/// crashed leader is still replaced within a TTL and a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_expiry_events_an_idle_follower_polls_once_per_ttl() {
    let Some(backend) = backend(ExpiryEvents::Off) else {
        return;
    };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::Release);
    let idle = idle_follower(&backend, TTL * 5).await;
    println!(
        "polling: idle follower {:.2} requests/s; failover {:?} with {} request(s)",
        idle.idle_rate, idle.failover, idle.requests_to_elect
    );
    // About one per TTL (PTTL after a renewal is 2/3 to 1 TTL).
    assert!(
        (0.6..=2.0).contains(&(idle.idle_rate * TTL.as_secs_f64())),
        "{:.2} requests/s",
        idle.idle_rate
    );
    assert!(idle.failover <= TTL + Duration::from_secs(1), "{:?}", idle.failover);

    // Releases are still announced, and an expiry is not (no key-event subscription).
    let lease = lease("off");
    let mut changes = store.changes(&lease, &id("watcher")).await.unwrap().unwrap();
    grant(&store, &lease, "a", Duration::from_millis(100)).await;
    let quiet = tokio::time::timeout(Duration::from_millis(600), changes.next()).await;
    assert!(quiet.is_err(), "an expiry woke a store with expiry_events=off");
    let g = grant(&store, &lease, "b", TTL).await;
    // The takeover of an expired lease is announced naming its holder, which wakes nobody (a
    // follower that polled at the old holder's PTTL has seen it; another would only read it).
    let quiet = tokio::time::timeout(Duration::from_millis(300), changes.next()).await;
    assert!(quiet.is_err(), "a takeover woke a follower");
    store.release(&g).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert_eq!(woken, Ok(Some(Change::Changed)), "a release is announced");
}

/// `auto` uses the events when the server already sends them (here: turned on by an `enable`
/// store first), and a lazy store learns it when it opens its pub/sub connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_uses_expiry_events_the_server_sends() {
    let Some(enable) = backend(ExpiryEvents::Enable) else {
        return;
    };
    RedisStore::from_config(enable.config.clone()).await.unwrap();
    let mut config = enable.config.clone();
    config.expiry_events = ExpiryEvents::Auto;
    let store = RedisStore::from_config(config.clone()).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::ReleaseAndExpiry);

    let lazy = RedisStore::lazy(config).unwrap();
    assert_eq!(
        lazy.capabilities().notifications,
        Notifications::Release,
        "not asked yet"
    );
    let lease = lease("lazy");
    let mut changes = lazy.changes(&lease, &id("watcher")).await.unwrap().unwrap();
    assert_eq!(lazy.capabilities().notifications, Notifications::ReleaseAndExpiry);
    grant(&store, &lease, "a", Duration::from_millis(100)).await;
    let woken = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert_eq!(woken, Ok(Some(Change::Changed)), "the lazy store hears the expiry");
}

/// `auto` follows what the server sends: checked whenever the server's setting did not change
/// while the store connected (an `enable` test running at the same time may turn it on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_follows_the_servers_setting() {
    let Some(backend) = backend(ExpiryEvents::Auto) else {
        return;
    };
    let before = flags(&backend).await;
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    let after = flags(&backend).await;
    let on = |f: &str| f.contains('E') && (f.contains('x') || f.contains('A'));
    if on(&before) != on(&after) {
        println!("notify-keyspace-events changed from {before:?} to {after:?} meanwhile; nothing to check");
        return;
    }
    let expected = if on(&before) {
        Notifications::ReleaseAndExpiry
    } else {
        Notifications::Release
    };
    println!("notify-keyspace-events {before:?}: {expected:?}");
    assert_eq!(store.capabilities().notifications, expected, "{before:?}");
    assert_eq!(before, after, "auto changed the server's setting");
}

/// An ACL user for one test, deleted at the end.
struct AclUser<'b> {
    backend: &'b RedisBackend,
    name: String,
}

impl<'b> AclUser<'b> {
    async fn create(backend: &'b RedisBackend, rules: &[&str]) -> (AclUser<'b>, RedisConfig) {
        let name = format!("leasehold-test-{:x}", random_u64());
        let password = format!("pw-{:x}", random_u64());
        let mut args = vec!["ACL", "SETUSER", &name, "reset", "on"];
        let pass = format!(">{password}");
        args.push(&pass);
        args.extend_from_slice(rules);
        try_raw_cmd(backend, &args).await.unwrap();
        let mut config = backend.config.clone();
        config.username = Some(name.clone());
        config.password = Some(password.into());
        (AclUser { backend, name }, config)
    }

    async fn delete(self) {
        try_raw_cmd(self.backend, &["ACL", "DELUSER", &self.name])
            .await
            .unwrap();
    }
}

/// A user who may not run `CONFIG` (as on managed services) connects with `auto` and with
/// `enable`: no error, the store polls (`Release`), and it works. A user who may not subscribe to
/// the key-event channel falls back the same way, with release notifications intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_config_or_channel_falls_back_to_polling() {
    let Some(backend) = backend(ExpiryEvents::Enable) else {
        return;
    };
    let prefix_keys = format!("~{}*", backend.config.prefix);
    let prefix_channels = format!("&{}*", backend.config.prefix);
    // Server up long enough? The restart guard is off in these tests anyway.
    let (no_config, config) = AclUser::create(&backend, &["~*", "&*", "+@all", "-config"]).await;
    for mode in [ExpiryEvents::Auto, ExpiryEvents::Enable] {
        let mut config = config.clone();
        config.expiry_events = mode;
        let store = RedisStore::from_config(config).await.unwrap();
        assert_eq!(store.capabilities().notifications, Notifications::Release, "{mode}");
        let lease = lease("noconfig");
        let g = grant(&store, &lease, "a", TTL).await;
        store.release(&g).await.unwrap();
        assert!(
            !format!("{store:?}").contains(config_password(&store)),
            "the password shows"
        );
    }
    no_config.delete().await;

    // CONFIG allowed, but only the prefix's channels: SUBSCRIBE __keyevent@0__:expired is refused.
    let (no_channel, config) = AclUser::create(&backend, &[&prefix_keys, &prefix_channels, "+@all"]).await;
    let store = RedisStore::from_config(config).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::Release);
    let lease = lease("nochannel");
    let mut changes = store.changes(&lease, &id("watcher")).await.unwrap().unwrap();
    let g = grant(&store, &lease, "a", TTL).await;
    store.release(&g).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert_eq!(woken, Ok(Some(Change::Changed)), "releases are still announced");
    no_channel.delete().await;
}

/// Expiry events that vanish after the store reported them (here: the user loses the key-event
/// channel, which also makes the server close the pub/sub connection): the next `changes` answers
/// `None`, so that an elector that counted on them polls, and the store reports `Release`. When
/// they come back, the next pub/sub connection finds them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_events_that_vanish_make_followers_poll() {
    let Some(backend) = backend(ExpiryEvents::Enable) else {
        return;
    };
    let keys = format!("~{}*", backend.config.prefix);
    let channels = format!("&{}*", backend.config.prefix);
    let keyevent = format!("&__keyevent@{}__:expired", backend.config.db);
    let (user, config) = AclUser::create(&backend, &[&keys, &channels, &keyevent, "+@all"]).await;
    let store = RedisStore::from_config(config).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::ReleaseAndExpiry);
    let lease = lease("vanish");
    let mut changes = store.changes(&lease, &id("watcher")).await.unwrap().unwrap();

    try_raw_cmd(&backend, &["ACL", "SETUSER", &user.name, "resetchannels", &channels])
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
    assert_eq!(
        end,
        Ok(None),
        "the pub/sub connection closes with the channel permission"
    );
    assert!(store.changes(&lease, &id("watcher")).await.unwrap().is_none());
    assert_eq!(store.capabilities().notifications, Notifications::Release);

    // Back: a connection opened from now on finds them again (the one without them stays until
    // it breaks; here the server closes it).
    try_raw_cmd(&backend, &["ACL", "SETUSER", &user.name, &keyevent])
        .await
        .unwrap();
    try_raw_cmd(&backend, &["CLIENT", "KILL", "USER", &user.name])
        .await
        .unwrap();
    // The command connection went too: its next request fails (transient), the one after
    // reconnects.
    let _ = store.inspect(&lease).await;
    let mut changes = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    while changes.is_none() && Instant::now() < deadline {
        match store.changes(&lease, &id("watcher")).await {
            Ok(Some(stream)) => changes = Some(stream),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut changes = changes.expect("a new connection with expiry events");
    assert_eq!(store.capabilities().notifications, Notifications::ReleaseAndExpiry);
    grant(&store, &lease, "a", Duration::from_millis(100)).await;
    let woken = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert_eq!(woken, Ok(Some(Change::Changed)), "the expiry is heard again");
    user.delete().await;
}

fn config_password(store: &RedisStore) -> &str {
    store.config().password.as_ref().unwrap().expose()
}

/// Measurement (`--ignored`): how late the expiry event of a lease comes when the database holds
/// many other keys with a TTL (Redis deletes expired keys by scanning the keys with a TTL a few
/// at a time, `hz` times a second). Prints the delays for 0, 1000 and 10000 other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn expiry_event_delay_with_many_volatile_keys() {
    let Some(backend) = backend(ExpiryEvents::Enable) else {
        return;
    };
    let store = RedisStore::from_config(backend.config.clone()).await.unwrap();
    assert_eq!(store.capabilities().notifications, Notifications::ReleaseAndExpiry);
    let filler = format!("{}filler-{:x}:", backend.config.prefix, random_u64());
    let mut raw = backend.raw().await;
    let mut made = 0;
    for others in [0, 1000, 10_000] {
        while made < others {
            let mut pipe = redis::pipe();
            for i in made..(made + 1000).min(others) {
                pipe.cmd("SET")
                    .arg(format!("{filler}{i}"))
                    .arg("x")
                    .arg("PX")
                    .arg(600_000)
                    .ignore();
            }
            pipe.query_async::<()>(&mut raw).await.unwrap();
            made = (made + 1000).min(others);
        }
        let ttl = Duration::from_millis(200);
        let mut delays = Vec::new();
        for _ in 0..if others > 1000 { 3 } else { 10 } {
            let lease = lease("delay");
            let mut changes = store.changes(&lease, &id("watcher")).await.unwrap().unwrap();
            let granted = Instant::now();
            grant(&store, &lease, "abandoned", ttl).await;
            let woken = tokio::time::timeout(ttl + Duration::from_secs(120), changes.next()).await;
            assert_eq!(woken, Ok(Some(Change::Changed)));
            delays.push((granted.elapsed() - ttl).as_millis());
        }
        delays.sort();
        let hz = try_raw_cmd(&backend, &["CONFIG", "GET", "hz"]).await.unwrap();
        println!("{others} other keys with a TTL ({hz:?}): expiry event {delays:?} ms after the TTL");
    }
    let mut pipe = redis::pipe();
    for i in 0..made {
        pipe.cmd("DEL").arg(format!("{filler}{i}")).ignore();
    }
    pipe.query_async::<()>(&mut raw).await.unwrap();
}
