//! How a leader's handles reach the election's driver: commands in the order asked, the end of
//! the work when the last clone is dropped, and a handle outliving its driver. On
//! [`MemoryStore`], under paused time.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{DeposedReason, Elector, Event, LeaseName, LeaseStore, MemoryStore};
use tokio::sync::broadcast;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(10);
/// Longer than anything a test waits for; a test that waits this long has failed.
const PATIENCE: Duration = Duration::from_secs(600);

fn elector(store: &MemoryStore, id: &str) -> Elector {
    Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id(id)
        .ttl(TTL)
        .jitter(0.0)
        .build()
        .expect("valid")
}

async fn deposed(events: &mut broadcast::Receiver<Event>) -> DeposedReason {
    timeout(PATIENCE, async {
        loop {
            if let Event::Deposed { reason, .. } = events.recv().await.expect("event stream") {
                return reason;
            }
        }
    })
    .await
    .expect("no Deposed event")
}

async fn holder(store: &MemoryStore) -> Option<String> {
    let lease = LeaseName::new("jobs").expect("valid");
    let observation = store.inspect(&lease).await.expect("inspect");
    observation.holder.map(|h| h.id.to_string())
}

/// A handle that asks to step down and is then dropped is seen stepping down for the reason it
/// gave, not as work that finished.
#[tokio::test(start_paused = true)]
async fn a_step_down_asked_before_the_handle_is_dropped_comes_first() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let mut events = a.events();
    let leader = a.campaign().await.expect("elected");
    assert!(leader.ensure_valid(TTL * 2).is_err(), "10 s left is less than 20 s");
    drop(leader);
    let reason = deposed(&mut events).await;
    assert!(
        matches!(reason, DeposedReason::TooLittleTime { .. }),
        "stepped down as {reason:?}"
    );
}

/// The work ends when the last clone of its handle goes, not the first.
#[tokio::test(start_paused = true)]
async fn the_lease_is_released_when_the_last_clone_of_the_handle_is_dropped() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let mut events = a.events();
    let leader = a.campaign().await.expect("elected");
    let clone = leader.clone();
    drop(leader);
    tokio::time::sleep(TTL / 2).await;
    assert!(a.is_leader(), "one clone still holds the leadership");
    assert_eq!(holder(&store).await.as_deref(), Some("a"));
    drop(clone);
    assert_eq!(deposed(&mut events).await, DeposedReason::WorkFinished);
    assert_eq!(holder(&store).await, None, "released");
}

/// A handle whose leadership has ended (its driver is gone) still resigns: at once, without
/// waiting for a driver that will never answer.
#[tokio::test(start_paused = true)]
async fn resign_returns_when_the_driver_has_already_ended() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let mut events = a.events();
    let leader = a.campaign().await.expect("elected");
    let keep = leader.clone();
    assert!(leader.ensure_valid(TTL * 2).is_err());
    deposed(&mut events).await;
    // The driver has stepped down and ended; `keep` outlived it.
    tokio::time::sleep(TTL).await;
    timeout(Duration::from_secs(1), keep.resign())
        .await
        .expect("resign on a handle whose driver ended returned");
    timeout(Duration::from_secs(1), leader.resign())
        .await
        .expect("resign returned");
}

/// A resign on one clone of the handle while another clone is alive ends the leadership at once
/// but releases only when the last clone goes: the other clone's work may still run, and the
/// next candidate must not be elected under it.
#[tokio::test(start_paused = true)]
async fn a_resign_while_another_clone_is_alive_releases_when_the_last_goes() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let mut events = a.events();
    let leader = a.campaign().await.expect("elected");
    let clone = leader.clone();
    timeout(PATIENCE, leader.resign())
        .await
        .expect("a resign with another clone alive returns");
    timeout(PATIENCE, clone.cancelled())
        .await
        .expect("the other clone's work is cancelled");
    tokio::time::sleep(TTL / 4).await;
    assert!(clone.ensure_valid(Duration::ZERO).is_err(), "no longer leader");
    assert_eq!(
        holder(&store).await.as_deref(),
        Some("a"),
        "released while a clone's work may still run"
    );
    drop(clone);
    assert_eq!(deposed(&mut events).await, DeposedReason::Resigned);
    assert_eq!(holder(&store).await, None, "released once the last clone went");
}

/// A resign on the last clone (the others dropped) releases at once, as with a single handle.
#[tokio::test(start_paused = true)]
async fn a_resign_on_the_last_clone_releases_at_once() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let leader = a.campaign().await.expect("elected");
    drop(leader.clone());
    timeout(Duration::from_secs(1), leader.resign())
        .await
        .expect("resign returned");
    assert_eq!(holder(&store).await, None, "released");
}

/// The same for a hand-over: with another clone alive, the lease is handed over only once the
/// last clone goes.
#[tokio::test(start_paused = true)]
async fn a_hand_over_while_another_clone_is_alive_waits_for_the_last() {
    let store = MemoryStore::new();
    let a = elector(&store, "a");
    let mut events = a.events();
    let leader = a.campaign().await.expect("elected");
    let clone = leader.clone();
    let to = "b".parse().expect("valid");
    timeout(PATIENCE, leader.hand_over(&to))
        .await
        .expect("a hand-over with another clone alive returns");
    timeout(PATIENCE, clone.cancelled())
        .await
        .expect("the other clone's work is cancelled");
    tokio::time::sleep(TTL / 4).await;
    let lease = LeaseName::new("jobs").expect("valid");
    let observation = store.inspect(&lease).await.expect("inspect");
    let h = observation.holder.expect("still held");
    assert!(
        h.id.as_str() == "a" && !h.reserved,
        "handed over while a clone's work may still run: {h:?}"
    );
    drop(clone);
    assert_eq!(deposed(&mut events).await, DeposedReason::HandedOver { to: to.clone() });
    let observation = store.inspect(&lease).await.expect("inspect");
    let h = observation.holder.expect("reserved");
    assert!(
        h.id == to && h.reserved,
        "reserved for b once the last clone went: {h:?}"
    );
}
