//! How long a silent holder's named lock outlives it: the lock session's `wait_timeout` is the
//! TTL rounded up to whole seconds, so the server ends the session (and frees the lock) that long
//! after its last statement. Measured with the holder's connection blackholed (no FIN, no RST:
//! a host gone, a partition) and reset (a killed process), through the suite's fault proxy.

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore, random_u64};
use leasehold_mysql::MysqlStore;

/// The time from the fault until another store sees the holder's lock free (the row orphaned).
async fn lock_freed_after(fault: Fault, ttl: Duration) -> Option<Duration> {
    let url = leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL")?;
    let mut parsed = url::Url::parse(&url).unwrap();
    let upstream = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap_or(3306))
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    parsed.set_port(Some(proxy.addr().port())).unwrap();
    let holder = MysqlStore::connect(parsed.as_str()).await.unwrap();
    let observer = MysqlStore::connect(&url).await.unwrap();
    let lease = LeaseName::new(format!("session-end-{:x}", random_u64())).unwrap();
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new("holder").unwrap(),
        ttl,
        takeover: None,
    };
    let Ok(Acquired::Granted(grant)) = holder.acquire(&request).await else {
        panic!("a fresh lease is granted")
    };
    let renewed = Instant::now();
    holder.renew(&grant).await.unwrap();
    proxy.faults().set(Direction::Both, fault);
    let faulted = Instant::now();
    loop {
        let seen = observer.inspect(&lease).await.unwrap();
        let holder = seen.holder.expect("nobody took the lease over");
        if holder.orphaned {
            let freed = faulted.elapsed();
            println!(
                "{fault:?}, ttl {ttl:?}: lock free {freed:.2?} after the fault, {:.2?} after the last renewal was sent",
                renewed.elapsed()
            );
            return Some(freed);
        }
        assert!(faulted.elapsed() < ttl * 3, "the lock outlived its holder by 3 TTLs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_silent_holders_lock_ends_within_its_ttl_rounded_up() {
    for ttl in [Duration::from_secs(2), Duration::from_millis(1500)] {
        let Some(freed) = lock_freed_after(Fault::Blackhole, ttl).await else {
            return;
        };
        let bound = Duration::from_secs(ttl.as_millis().div_ceil(1000) as u64) + Duration::from_millis(500);
        assert!(freed <= bound, "{freed:?} > {bound:?}");
    }
}

#[tokio::test]
async fn a_reset_holders_lock_ends_at_once() {
    let Some(freed) = lock_freed_after(Fault::Reset, Duration::from_secs(2)).await else {
        return;
    };
    assert!(freed <= Duration::from_millis(500), "{freed:?}");
}

/// A grant nobody renews while the session serves the store's other leases (an elector dropped
/// without releasing) has its lock given back a TTL after its last renewal: the session's
/// `wait_timeout` cannot end it, since the other leases' renewals keep the session busy.
#[tokio::test]
async fn an_abandoned_grant_loses_its_lock_while_the_session_lives() {
    let Some(url) = leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL") else {
        return;
    };
    let store = MysqlStore::connect(&url).await.unwrap();
    let observer = MysqlStore::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(1);
    let base = format!("abandoned-{:x}", random_u64());
    let grant = |name: &str| {
        let store = &store;
        let request = AcquireRequest {
            lease: LeaseName::new(format!("{base}-{name}")).unwrap(),
            candidate: CandidateId::new("holder").unwrap(),
            ttl,
            takeover: None,
        };
        async move {
            match store.acquire(&request).await.unwrap() {
                Acquired::Granted(grant) => grant,
                other => panic!("a fresh lease is granted, got {other:?}"),
            }
        }
    };
    let abandoned = grant("abandoned").await;
    let mut kept = grant("kept").await;
    let started = Instant::now();
    let freed = loop {
        tokio::time::sleep(ttl / 4).await;
        kept = match store.renew(&kept).await.unwrap() {
            leasehold_core::Renewed::Renewed(grant) => grant,
            other => panic!("the kept lease is renewed, got {other:?}"),
        };
        let seen = observer.inspect(&abandoned.lease).await.unwrap();
        if seen.holder.as_ref().is_some_and(|h| h.orphaned) {
            break started.elapsed();
        }
        assert!(started.elapsed() < ttl * 4, "the abandoned grant's lock is still held");
    };
    println!("abandoned grant (ttl {ttl:?}): lock given back {freed:.2?} after its last renewal");
    assert!(freed >= ttl, "given back before its TTL: {freed:?}");
    let still = observer.inspect(&kept.lease).await.unwrap();
    assert!(
        still.holder.is_some_and(|h| !h.orphaned),
        "the kept lease keeps its lock"
    );
}
