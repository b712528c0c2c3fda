//! Notifications: releases and breaks, grant announcements, renewal announcements.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_core::{LeaseName, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;

use super::{acquire, candidate, granted};
use crate::common::{self, server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_breaks_are_notified() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("notify");
    let (holder, waiter) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    let mut changes = waiter
        .changes(&lease, &candidate("b"))
        .await
        .unwrap()
        .expect("a stream");
    let mut mine = holder
        .changes(&lease, &candidate("a"))
        .await
        .unwrap()
        .expect("a stream");
    let mut other = waiter
        .changes(&common::lease("other"), &candidate("b"))
        .await
        .unwrap()
        .unwrap();
    // Both listeners connect in the background, and other tests' listeners on the same server
    // cannot be told from ours (a count of `LISTEN` sessions was met by them, and our release
    // went unheard): the lease is released, and taken again, until a release is notified.
    let mut grant = grant;
    let started = Instant::now();
    loop {
        holder.release(&grant).await.unwrap();
        if let Ok(next) = tokio::time::timeout(Duration::from_millis(250), changes.next()).await {
            next.expect("the stream lives");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no release was notified within 10 s"
        );
        grant = granted(acquire(&holder, &lease, "a", ttl).await);
    }
    eprintln!("release notified after {:?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let own = futures::FutureExt::now_or_never(mine.next());
    assert!(own.is_none(), "a candidate is not told of its own release");
    // A release of an earlier round heard late is not the break's notification.
    while let Some(Some(_)) = futures::FutureExt::now_or_never(changes.next()) {}
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    waiter.break_lease(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), changes.next())
        .await
        .expect("a break is notified")
        .expect("the stream lives");
    let _ = holder.renew(&grant).await;
    // Another lease's stream heard nothing.
    assert!(futures::FutureExt::now_or_never(other.next()).is_none());
}

/// Every grant is announced to the announcement streams of other stores as `inspect` shows it
/// right after the grant, and wakes no change stream: not this version's, nor an older
/// version's listener on the `leasehold` channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_announced_and_wake_no_change_stream() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(5);
    let lease = common::lease("announce");
    let (holder, follower) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let mut changes = follower
        .changes(&lease, &candidate("b"))
        .await
        .unwrap()
        .expect("a stream");
    let mut announced = follower.announcements(&lease).await.unwrap().expect("announcements");
    let mut other = follower.announcements(&common::lease("other")).await.unwrap().unwrap();
    // An older version's listener: it listens on `leasehold` only.
    let mut old = sqlx::postgres::PgListener::connect(&pg.url).await.unwrap();
    old.listen("leasehold").await.unwrap();
    // The follower's listener connects in the background: the holder is granted again (a new
    // term each time, by the holder itself, which notifies no change) until one is announced.
    let started = Instant::now();
    let mut first = None;
    while first.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no grant was ever announced"
        );
        granted(acquire(&holder, &lease, "a", ttl).await);
        first = tokio::time::timeout(Duration::from_millis(100), announced.next())
            .await
            .ok()
            .map(|seen| seen.expect("the stream lives"));
    }
    let grant = granted(acquire(&holder, &lease, "a", ttl).await);
    let seen = tokio::time::timeout(Duration::from_secs(2), announced.next())
        .await
        .expect("a grant is announced")
        .expect("the stream lives");
    let inspected = holder.inspect(&lease).await.unwrap();
    let shown = seen.holder.clone().expect("a holder");
    assert_eq!(shown.id, candidate("a"));
    assert_eq!(shown.term, grant.term);
    assert_eq!(shown.ttl, ttl);
    assert_eq!(shown.version, grant.token);
    assert_eq!(shown.store_remaining, Some(ttl));
    assert!(!shown.orphaned && !shown.reserved);
    assert_eq!(seen.last_term, grant.term);
    assert_eq!(seen.lease, lease);
    let inspected_holder = inspected.holder.expect("held");
    assert_eq!(
        (
            &inspected_holder.id,
            inspected_holder.term,
            inspected_holder.ttl,
            &inspected_holder.version
        ),
        (&shown.id, shown.term, shown.ttl, &shown.version),
        "what inspect shows"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        futures::FutureExt::now_or_never(changes.next()).is_none(),
        "a grant wakes no change stream"
    );
    assert!(
        futures::FutureExt::now_or_never(other.next()).is_none(),
        "another lease's grant"
    );
    loop {
        match tokio::time::timeout(Duration::from_millis(100), old.try_recv()).await {
            Err(_) => break,
            Ok(notification) => {
                let notification = notification.unwrap().expect("the old listener lives");
                assert!(
                    !notification.payload().contains(lease.as_str()),
                    "an older version's listener was told of a grant: {:?}",
                    notification.payload()
                );
            }
        }
    }
    holder.release(&grant).await.unwrap();
}

/// Every renewal is announced to other stores' announcement streams as `inspect` shows it right
/// after (same holder and term, the new version, the full TTL), `renew` and `renew_many` alike;
/// a `renew_many` of 40 grants sends its records in a few notifications, each under Postgres's
/// 8000-byte payload limit, not one per lease. Without the renewal's announcement the streams
/// see nothing after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_announced_in_few_notifications() {
    let Some(pg) = server() else { return };
    let ttl = Duration::from_secs(30);
    let run = leasehold_core::random_u64() & 0xffff_ffff;
    // Long names and holder ids: about 420 bytes per record, 40 records do not fit one payload.
    let who = "h".repeat(250);
    let leases: Vec<LeaseName> = (0..40)
        .map(|i| LeaseName::new(format!("renewed-{run:08x}-{i:02}-{}", "x".repeat(100))).unwrap())
        .collect();
    let (holder, follower) = (
        PostgresStore::connect(&pg.url).await.unwrap(),
        PostgresStore::connect(&pg.url).await.unwrap(),
    );
    let mut grants = Vec::new();
    for lease in &leases {
        grants.push(granted(acquire(&holder, lease, &who, ttl).await));
    }
    let mut streams = Vec::new();
    for lease in &leases {
        streams.push(follower.announcements(lease).await.unwrap().expect("announcements"));
    }
    let mut raw = sqlx::postgres::PgListener::connect(&pg.url).await.unwrap();
    raw.listen("leasehold_renewed").await.unwrap();
    // The follower's listener connects in the background: renew the first grant until one
    // renewal is announced.
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no renewal was ever announced"
        );
        let Renewed::Renewed(renewed) = holder.renew(&grants[0]).await.unwrap() else {
            panic!("renewed")
        };
        if let Ok(seen) = tokio::time::timeout(Duration::from_millis(100), streams[0].next()).await {
            let shown = seen.expect("the stream lives").holder.expect("a holder");
            if shown.version == renewed.token {
                assert_eq!((shown.term, shown.ttl), (grants[0].term, ttl));
                break;
            }
        }
    }
    while tokio::time::timeout(Duration::from_millis(100), raw.try_recv())
        .await
        .is_ok()
    {}

    let answers = holder.renew_many(&grants).await.unwrap();
    let mut versions = std::collections::HashSet::new();
    for ((answer, stream), grant) in answers.into_iter().zip(&mut streams).zip(&grants) {
        let Ok(Renewed::Renewed(renewed)) = answer else {
            panic!("renewed: {answer:?}")
        };
        versions.insert(renewed.token.clone());
        let seen = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                let seen = stream.next().await.expect("the stream lives");
                if seen.holder.as_ref().is_some_and(|h| h.version == renewed.token) {
                    return seen;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the renewal of {} is announced", grant.lease));
        let shown = seen.holder.clone().expect("a holder");
        let inspected = holder.inspect(&grant.lease).await.unwrap().holder.expect("held");
        assert_eq!(seen.lease, grant.lease);
        assert_eq!(seen.last_term, grant.term);
        assert_eq!((&shown.id, shown.term, shown.ttl), (&grant.holder, grant.term, ttl));
        assert_eq!(shown.store_remaining, Some(ttl));
        assert!(!shown.orphaned && !shown.reserved);
        assert_eq!(
            (&inspected.id, inspected.term, inspected.ttl, &inspected.version),
            (&shown.id, shown.term, shown.ttl, &shown.version),
            "what inspect shows"
        );
    }
    let mut notifications = 0;
    let mut records = 0;
    while let Ok(notification) = tokio::time::timeout(Duration::from_millis(200), raw.try_recv()).await {
        let notification = notification.unwrap().expect("the raw listener lives");
        assert!(
            notification.payload().len() < 8000,
            "{} bytes",
            notification.payload().len()
        );
        // Only the records of this `renew_many` (a record is `<schema>/<lease>\n<term>\n<ttl_ms>\n
        // <version>\n<holder>`): the channel is the server's, shared with the tests beside this
        // one, and the single renewals above may still be on their way (a 100 ms quiet spell
        // was not enough under load: 41 records were counted once).
        let ours = notification
            .payload()
            .split("\n\n")
            .filter(|record| record.split('\n').nth(3).is_some_and(|v| versions.contains(v)))
            .count();
        if ours > 0 {
            notifications += 1;
            records += ours;
        }
    }
    assert_eq!(records, 40, "one record per renewed lease");
    assert!(
        (2..=4).contains(&notifications),
        "{notifications} notifications for 40 records"
    );
}
