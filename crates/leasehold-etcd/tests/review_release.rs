//! Review of the turn on a predecessor's release (the change stream's `Change::YourTurn`): it
//! makes no request, so it trusts the candidate's position as the store last published it. Here a
//! `withdraw` of the candidate and an `acquire` of the same candidate (as the engine runs them
//! when it gave up on a slow acquire and then stops: the acquire runs on, late) interleave so
//! that the withdraw deletes the key after the acquire read it: the acquire publishes the key's
//! place again after the withdraw cleared it, and the key is gone. The change stream then looks
//! for that key's predecessor, sees the holder's release marker, and gives the turn of a key that
//! no longer exists, while the candidate that was queued behind it is
//! granted too. Found by review (session 13); fixed by `Inner::retire`: a place the store has
//! begun to delete is never published again, and a key found at or below it is stale.

use std::time::Duration;

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault};
use leasehold_core::{Acquired, CandidateId, LeaseStore};
use leasehold_etcd::EtcdStore;

use crate::common;

const TTL: Duration = Duration::from_secs(10);
const DELAY: Duration = Duration::from_millis(300);

#[tokio::test]
async fn a_withdraw_racing_a_late_acquire_does_not_grant_a_deleted_key_on_release() {
    let Some(common::HolderAndQueued {
        address,
        prefix,
        proxy,
        a,
        b,
        lease,
        grant_a,
    }) = common::holder_and_queued("leasehold-review-release", TTL).await
    else {
        return;
    };
    // `w` queued behind `b`, on a store of its own.
    let w = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("w connects");
    assert!(matches!(
        w.acquire(&common::request(&lease, "w", TTL)).await.expect("w queues"),
        Acquired::Held(_)
    ));
    let mut raw = etcd_client::Client::connect([address.as_str()], None)
        .await
        .expect("raw client");
    let b_key = format!("{prefix}/jobs/c/b");
    let b_rev = raw.get(b_key.clone(), None).await.expect("get").kvs()[0].create_revision();

    // b's change stream, polled by a task of its own, as the engine's driver polls it.
    let mut changes = b
        .changes(&lease, &CandidateId::new("b").expect("id"))
        .await
        .expect("changes")
        .expect("a stream");
    let (woke, mut woken) = tokio::sync::mpsc::unbounded_channel();
    let stream = tokio::spawn(async move {
        while changes.next().await.is_some() {
            let _ = woke.send(());
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Slow replies to b: a withdraw of b, and an acquire of b (the engine's late one).
    proxy.faults().set(Direction::Reply, Fault::Delay(DELAY));
    let withdraw = {
        let b = b.clone();
        let lease = lease.clone();
        tokio::spawn(async move { b.withdraw(&lease, &CandidateId::new("b").expect("id")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let late = {
        let b = b.clone();
        let lease = lease.clone();
        tokio::spawn(async move { b.acquire(&common::request(&lease, "b", TTL)).await })
    };
    withdraw.await.expect("task").expect("withdraw");
    // Not granted (the engine ignores any other late answer once stopping); with the fix, an
    // error: the key was being deleted by this store while the acquire read it.
    let late = late.await.expect("task");
    assert!(!matches!(late, Ok(Acquired::Granted(_))), "{late:?}");
    proxy.faults().heal();
    assert!(
        raw.get(b_key.clone(), None).await.expect("get").kvs().is_empty(),
        "b's key is withdrawn"
    );
    // b's stream looks again for its (stale) place, and watches a's key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while woken.try_recv().is_ok() {}

    a.release(&grant_a).await.expect("a releases");
    // Before the fix, b's stream (watching a's key from its stale place) is woken by the
    // release; with it, b's stream has no place and waits for one. Either way b then asks.
    let _ = tokio::time::timeout(Duration::from_secs(1), woken.recv()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let for_b = b.acquire(&common::request(&lease, "b", TTL)).await.expect("b acquires");
    let for_w = w.acquire(&common::request(&lease, "w", TTL)).await.expect("w acquires");
    let seen = a.inspect(&lease).await.expect("inspect");
    let b_key_now = raw.get(b_key.clone(), None).await.expect("get");
    stream.abort();
    let _ = raw
        .delete(
            format!("{prefix}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await;
    let both = matches!((&for_b, &for_w), (Acquired::Granted(_), Acquired::Granted(_)));
    assert!(
        !both,
        "two leaders at once: b {for_b:?} (its key at revision {b_rev} withdrawn; now {:?}) and w {for_w:?}; inspect shows {seen:?}",
        b_key_now.kvs().first().map(etcd_client::KeyValue::create_revision)
    );
}
