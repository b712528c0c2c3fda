//! Renewal announcements: the store's listener receives them only while an announcement stream
//! needs them, and a grant taken again on a new lock session (a relock) is announced like a
//! renewal.

use crate::common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault};
use leasehold_core::{AcquireRequest, Acquired, Announcements, CandidateId, Grant, LeaseName, LeaseStore, Renewed};
use leasehold_postgres::PostgresStore;

use common::{lease, lock_holder, server};

const TTL: Duration = Duration::from_secs(30);

async fn grant(store: &PostgresStore, lease: &LeaseName, who: &str) -> Grant {
    let request = AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(who).unwrap(),
        ttl: TTL,
        takeover: None,
    };
    match store.acquire(&request).await.unwrap() {
        Acquired::Granted(grant) => grant,
        held => panic!("granted: {held:?}"),
    }
}

/// Renews `grant` until `stream` shows the version a renewal answered (the stream's listener
/// connects and listens in the background); the last renewed grant.
async fn renew_until_announced(store: &PostgresStore, grant: &Grant, stream: &mut Announcements) -> Grant {
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(10), "no renewal was announced");
        let renewed = match store.renew(grant).await {
            Ok(Renewed::Renewed(renewed)) => renewed,
            Ok(lost) => panic!("renewed: {lost:?}"),
            // A session that was just reset answers once with an error.
            Err(_) => continue,
        };
        let deadline = Instant::now() + Duration::from_millis(200);
        while let Ok(Some(seen)) = tokio::time::timeout_at(deadline.into(), stream.next()).await {
            if seen.holder.as_ref().is_some_and(|h| h.version == renewed.token) {
                return renewed;
            }
        }
    }
}

/// Every renewal of the database comes on `leasehold_renewed`: a store listens to it only while
/// one of its announcement streams lives. With a change stream left (the listener runs on), no
/// renewal notification reaches the store once its last announcement stream is dropped; a new
/// stream gets them again. Before, the listener listened to renewals from its start to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_takes_renewals_only_while_an_announcement_stream_lives() {
    let Some(pg) = server() else { return };
    let counter = common::StatementCounter::start(pg.upstream()).await;
    let follower = PostgresStore::connect(&common::with_option(&pg.url_via(counter.addr()), "sslmode=disable"))
        .await
        .unwrap();
    let holder = PostgresStore::connect(&pg.url).await.unwrap();
    let (held, other) = (lease("renewals-held"), lease("renewals-other"));
    let grant = grant(&holder, &held, "holder").await;
    // Keeps the follower's listener running throughout.
    let _changes = follower
        .changes(&other, &CandidateId::new("follower").unwrap())
        .await
        .unwrap()
        .expect("changes");

    let mut stream = follower.announcements(&held).await.unwrap().expect("announcements");
    let grant = renew_until_announced(&holder, &grant, &mut stream).await;
    let before = counter.renewal_notifications();
    for _ in 0..3 {
        holder.renew(&grant).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        counter.renewal_notifications() >= before + 3,
        "renewals reach a store with an announcement stream"
    );

    drop(stream);
    // The UNLISTEN follows the stream's end at once; give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = counter.renewal_notifications();
    for _ in 0..5 {
        holder.renew(&grant).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        counter.renewal_notifications(),
        before,
        "renewal notifications reached a store without announcement streams"
    );

    let mut stream = follower.announcements(&held).await.unwrap().expect("announcements");
    renew_until_announced(&holder, &grant, &mut stream).await;
}

/// A grant whose lock session ended (its connections reset) takes its lock again at its next
/// renewal, on a new session (another backend holds the lock), and that relock is announced
/// like a renewal: a follower's stream shows the version the renewal answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relock_is_announced() {
    let Some(pg) = server() else { return };
    let (holder, faults) = pg.faulty_store().await.unwrap();
    let follower = PostgresStore::connect(&pg.url).await.unwrap();
    let held = lease("relocked");
    let grant = grant(&holder, &held, "holder").await;
    let mut stream = follower.announcements(&held).await.unwrap().expect("announcements");
    let grant = renew_until_announced(&holder, &grant, &mut stream).await;
    let mut raw = pg.raw().await;
    let key = holder.lock_key(&held);
    let before = lock_holder(&mut raw, key).await.expect("the lock is held");

    faults.set(Direction::Both, Fault::Reset);
    let freed = Instant::now();
    while lock_holder(&mut raw, key).await.is_some() {
        assert!(freed.elapsed() < Duration::from_secs(5), "the reset frees the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    faults.heal();

    // The first renewal that succeeds takes the lock again (a statement or two may fail on
    // the reset session first); no other renewal follows, so what the stream shows is the
    // relock's own announcement.
    let started = Instant::now();
    let relocked = loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the grant was never renewed"
        );
        match holder.renew(&grant).await {
            Ok(Renewed::Renewed(renewed)) => break renewed,
            Ok(lost) => panic!("renewed: {lost:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let seen = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let seen = stream.next().await.expect("the stream lives");
            if seen.holder.as_ref().is_some_and(|h| h.version == relocked.token) {
                return seen;
            }
        }
    })
    .await
    .expect("the relock is announced");
    let shown = seen.holder.expect("a holder");
    assert_eq!((shown.term, shown.ttl, shown.id.as_str()), (grant.term, TTL, "holder"));
    let after = lock_holder(&mut raw, key).await.expect("the lock is held again");
    assert_ne!(after, before, "the lock was taken again on a new session");
    assert_eq!(relocked.term, grant.term);
    let shown = holder.inspect(&held).await.unwrap().holder.expect("held");
    assert_eq!(shown.version, relocked.token);
    assert!(!shown.orphaned);
}
