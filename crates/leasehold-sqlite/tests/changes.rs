//! Change notifications through the file system: what wakes a follower's `changes()` stream and
//! what does not, across store instances on one file and across processes.
//!
//! The bounds here are far below any poll interval used (followers poll every 30 s), so a
//! wake-up can only have come from the stream; they are generous for a loaded 2-core machine.
//! How fast the wake-up is gets measured by `leasehold-bench` (graceful handover).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{
    AcquireRequest, Acquired, Announces, CandidateId, Changes, Elector, Grant, LeaseName, LeaseStore, Notifications,
    Renewed,
};
use leasehold_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(60);
/// Far longer than any wake-up takes, far shorter than a follower's poll interval.
const WAKE: Duration = Duration::from_secs(5);
/// How long a stream is given to show a wake-up that must not come.
const QUIET: Duration = Duration::from_millis(500);
const WORKER_ENV: &str = "LEASEHOLD_SQLITE_CHANGES_WORKER";

fn lease() -> LeaseName {
    "jobs".parse().unwrap()
}

fn id(name: &str) -> CandidateId {
    name.parse().unwrap()
}

async fn grant(store: &SqliteStore, candidate: &str) -> Grant {
    let request = AcquireRequest {
        lease: lease(),
        candidate: id(candidate),
        ttl: TTL,
        takeover: None,
    };
    match store.acquire(&request).await.unwrap() {
        Acquired::Granted(grant) => grant,
        Acquired::Held(o) => panic!("{candidate} expected a grant, saw {o:?}"),
    }
}

async fn subscribe(store: &SqliteStore, candidate: &str) -> Changes {
    store
        .changes(&lease(), &id(candidate))
        .await
        .unwrap()
        .expect("the store watches its file")
}

async fn woken(changes: &mut Changes, what: &str) {
    match tokio::time::timeout(WAKE, changes.next()).await {
        Ok(Some(_)) => {}
        Ok(None) => panic!("{what}: the stream ended"),
        Err(_) => panic!("{what}: no wake-up within {WAKE:?}"),
    }
}

async fn not_woken(changes: &mut Changes, what: &str) {
    if let Ok(item) = tokio::time::timeout(QUIET, changes.next()).await {
        panic!("{what}: woken ({item:?}) although the lease did not change hands");
    }
}

async fn next(announced: &mut leasehold_core::Announcements) -> leasehold_core::Observation {
    match tokio::time::timeout(WAKE, announced.next()).await {
        Ok(Some(o)) => o,
        Ok(None) => panic!("the announcement stream ended"),
        Err(_) => panic!("nothing announced within {WAKE:?}"),
    }
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path).await.unwrap()
}

#[tokio::test]
async fn declares_release_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("leases.db")).await;
    assert_eq!(store.capabilities().notifications, Notifications::Release);
}

/// A release, a hand-over to the follower and a break made through one store wake a follower
/// subscribed through another store on the same file; renewals and grants wake nobody (they are
/// announced).
#[tokio::test]
async fn changes_of_hands_by_another_store_wake_the_follower() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (leader, follower) = (open(&path).await, open(&path).await);
    let a = grant(&leader, "a").await;
    let mut changes = subscribe(&follower, "b").await;

    let mut renewed = a.clone();
    for _ in 0..5 {
        renewed = match leader.renew(&renewed).await.unwrap() {
            Renewed::Renewed(grant) => grant,
            Renewed::Lost(o) => panic!("renewal lost: {o:?}"),
        };
    }
    not_woken(&mut changes, "renewals").await;

    leader.release(&renewed).await.unwrap();
    woken(&mut changes, "release").await;

    let c = grant(&leader, "c").await;
    not_woken(&mut changes, "a grant to another candidate (announced, wakes nobody)").await;

    leader.hand_over(&c, &id("b")).await.unwrap();
    woken(&mut changes, "hand-over to the follower").await;

    let refused = AcquireRequest {
        lease: lease(),
        candidate: id("a"),
        ttl: TTL,
        takeover: None,
    };
    assert!(matches!(leader.acquire(&refused).await.unwrap(), Acquired::Held(_)));
    not_woken(&mut changes, "a refused acquire").await;

    leader.break_lease(&lease()).await.unwrap();
    woken(&mut changes, "break").await;
}

/// Every grant and renewal made through one store is announced, with its new record version,
/// to a follower of another store on the same file (`Announces::GrantsAndRenewals`: what lets an
/// idle follower make no requests); a release and a refused acquire announce nothing.
#[tokio::test]
async fn grants_and_renewals_are_announced_to_another_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (leader, follower) = (open(&path).await, open(&path).await);
    assert_eq!(follower.capabilities().announces, Announces::GrantsAndRenewals);
    let mut announced = follower
        .announcements(&lease())
        .await
        .unwrap()
        .expect("the store watches its file");

    let mut held = grant(&leader, "a").await;
    let seen = next(&mut announced).await;
    let holder = seen.holder.expect("a grant names its holder");
    assert_eq!(
        (holder.id.as_str(), holder.term, holder.version.as_str()),
        ("a", held.term, held.token.as_str())
    );

    for round in 0..3 {
        held = match leader.renew(&held).await.unwrap() {
            Renewed::Renewed(grant) => grant,
            Renewed::Lost(o) => panic!("renewal lost: {o:?}"),
        };
        let seen = next(&mut announced).await;
        let holder = seen.holder.expect("a renewal names its holder");
        assert_eq!(
            (holder.id.as_str(), holder.term, holder.version.as_str()),
            ("a", held.term, held.token.as_str()),
            "renewal {round}"
        );
    }
    let refused = AcquireRequest {
        lease: lease(),
        candidate: id("b"),
        ttl: TTL,
        takeover: None,
    };
    assert!(matches!(leader.acquire(&refused).await.unwrap(), Acquired::Held(_)));
    leader.release(&held).await.unwrap();
    if let Ok(item) = tokio::time::timeout(QUIET, announced.next()).await {
        panic!("announced {item:?} after a refused acquire and a release");
    }
}

/// A candidate is not woken by its own grant or release, nor when another takes the lease (it is
/// announced); a change to another lease wakes nobody.
#[tokio::test]
async fn own_changes_and_other_leases_do_not_wake() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (mine, theirs) = (open(&path).await, open(&path).await);
    let mut changes = subscribe(&mine, "a").await;

    let a = grant(&mine, "a").await;
    not_woken(&mut changes, "its own grant").await;
    mine.release(&a).await.unwrap();
    not_woken(&mut changes, "its own release").await;

    let other = AcquireRequest {
        lease: "other".parse().unwrap(),
        candidate: id("b"),
        ttl: TTL,
        takeover: None,
    };
    assert!(matches!(theirs.acquire(&other).await.unwrap(), Acquired::Granted(_)));
    not_woken(&mut changes, "another lease's grant").await;

    grant(&theirs, "b").await;
    not_woken(&mut changes, "another candidate's grant (announced)").await;
}

/// A release wakes one follower: the one waiting longest, whatever store or process it is in
/// (`leasehold_waiters`); a follower that left the queue is skipped.
#[tokio::test]
async fn a_release_wakes_only_the_longest_waiting_follower() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let leader = open(&path).await;
    let stores = [open(&path).await, open(&path).await, open(&path).await];
    let a = grant(&leader, "a").await;
    let mut b = subscribe(&stores[1], "b").await;
    let mut c = subscribe(&stores[0], "c").await;
    let mut d = subscribe(&stores[2], "d").await;

    leader.release(&a).await.unwrap();
    woken(&mut b, "the longest waiter, on a release").await;
    not_woken(&mut c, "the second waiter").await;
    not_woken(&mut d, "the third waiter").await;

    // b takes the lease and leaves the queue; its release wakes c alone.
    let b_grant = grant(&stores[1], "b").await;
    drop(b);
    // Any signal lets b's store see the dropped stream and take b out of the queue.
    let b_grant = match stores[1].renew(&b_grant).await.unwrap() {
        Renewed::Renewed(grant) => grant,
        Renewed::Lost(o) => panic!("renewal lost: {o:?}"),
    };
    tokio::time::sleep(QUIET).await;
    stores[1].release(&b_grant).await.unwrap();
    woken(&mut c, "the next waiter, on the next release").await;
    not_woken(&mut d, "the last waiter").await;
}

/// Dropping a stream ends its subscription; the store's other subscribers keep theirs.
#[tokio::test]
async fn a_dropped_stream_leaves_the_others_subscribed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let (leader, follower) = (open(&path).await, open(&path).await);
    let a = grant(&leader, "a").await;
    let dropped = subscribe(&follower, "b").await;
    let mut kept = subscribe(&follower, "c").await;
    drop(dropped);
    leader.release(&a).await.unwrap();
    woken(&mut kept, "release").await;
    // And a new subscription after everyone left still works.
    drop(kept);
    grant(&leader, "a").await;
    let mut again = subscribe(&follower, "b").await;
    leader.break_lease(&lease()).await.unwrap();
    woken(&mut again, "break after resubscribing").await;
}

/// Closing the store ends its streams (the engine then polls, and fails as the store does) and
/// refuses new subscriptions.
#[tokio::test]
async fn closing_the_store_ends_its_streams() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("leases.db")).await;
    let mut changes = subscribe(&store, "b").await;
    store.close().await;
    assert_eq!(
        tokio::time::timeout(WAKE, changes.next())
            .await
            .expect("the stream ends"),
        None
    );
    let err = store.changes(&lease(), &id("b")).await.err().expect("closed");
    assert!(err.is_transient(), "{err:?}");
}

/// When the directory cannot be watched, `changes` answers `None` (the engine polls) rather than
/// failing the campaign.
#[tokio::test]
async fn an_unwatchable_directory_falls_back_to_polling() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let store = open(&dir.path().join("sub/leases.db")).await;
    // The open file stays usable; its directory's name is gone.
    std::fs::rename(dir.path().join("sub"), dir.path().join("moved")).unwrap();
    let changes = store.changes(&lease(), &id("b")).await.unwrap();
    assert!(changes.is_none(), "expected None for a directory that no longer exists");
}

/// A follower elector whose polls are 30 s apart takes over within seconds of the leader's
/// resignation in another store: woken by the notification, not by a poll.
#[tokio::test]
async fn elector_follower_takes_over_on_notification() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let elector = |store: SqliteStore, who: &str| {
        Elector::builder(Arc::new(store), "jobs")
            .ttl(TTL)
            .retry_every(TTL / 2)
            .jitter(0.0)
            .candidate_id(who)
            .build()
            .unwrap()
    };
    let a = elector(open(&path).await, "a");
    let b = elector(open(&path).await, "b");
    let leader = a.campaign().await.unwrap();
    let mut seen = b.observe();
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::timeout(WAKE, seen.wait_for(|l| l.as_ref().is_some_and(|l| l.holder == id("a"))))
        .await
        .expect("b sees a lead")
        .unwrap();
    leader.resign().await;
    let b = tokio::time::timeout(WAKE, follower)
        .await
        .expect("b elected on the notification, long before its next poll")
        .unwrap()
        .unwrap();
    assert_eq!(b.holder(), &id("b"));
    b.resign().await;
}

/// A candidate process (only when started by `follower_in_another_process_takes_over`): leads
/// the lease, prints `leading`, resigns when a line arrives on stdin, prints `resigned`.
#[test]
fn worker() {
    let Ok(db) = std::env::var(WORKER_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = open(Path::new(&db)).await;
        let elector = Elector::builder(Arc::new(store), "jobs")
            .ttl(TTL)
            .candidate_id("other-process")
            .build()
            .unwrap();
        let leader = elector.campaign().await.unwrap();
        println!("leading");
        let mut line = String::new();
        tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line))
            .await
            .unwrap()
            .unwrap();
        leader.resign().await;
        println!("resigned");
    });
}

/// The leader runs in another process: its resignation wakes this process's follower (polling
/// every 30 s) within seconds.
#[tokio::test]
async fn follower_in_another_process_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let follower = Elector::builder(Arc::new(open(&path).await), "jobs")
        .ttl(TTL)
        .retry_every(TTL / 2)
        .jitter(0.0)
        .candidate_id("b")
        .build()
        .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["changes::worker", "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER_ENV, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut expect = async |wanted: &str| loop {
        match tokio::time::timeout(Duration::from_secs(30), lines.recv()).await {
            // libtest may have begun the line with `test worker ... `.
            Ok(Some(line)) if line.ends_with(wanted) => return,
            Ok(Some(_)) => {}
            other => panic!("the worker did not say {wanted:?}: {other:?}"),
        }
    };
    expect("leading").await;

    let mut seen = follower.observe();
    let campaign = tokio::spawn(async move { follower.campaign().await });
    tokio::time::timeout(
        WAKE,
        seen.wait_for(|l| l.as_ref().is_some_and(|l| l.holder == id("other-process"))),
    )
    .await
    .expect("the follower sees the other process lead")
    .unwrap();
    stdin.write_all(b"resign\n").unwrap();
    stdin.flush().unwrap();
    expect("resigned").await;
    let leader = tokio::time::timeout(WAKE, campaign)
        .await
        .expect("elected on the notification, long before the next poll")
        .unwrap()
        .unwrap();
    assert_eq!(leader.holder(), &id("b"));
    leader.resign().await;
    drop(stdin);
    child.wait().unwrap();
}
