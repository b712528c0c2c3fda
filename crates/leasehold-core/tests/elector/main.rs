//! Tests of the tokio driver ([`Elector`], [`Leader`], [`Event`]) on [`MemoryStore`], under
//! paused time: every timing assertion is exact and the whole file runs in well under a second.
//!
//! Timing unless a test says otherwise: TTL 10 s, renew every 3 s (tokio's timers have 1 ms
//! resolution, so the default `ttl / 3` would land on the next millisecond), retry every 2 s
//! without jitter, drift 1% (a grant is believed for 9.9 s after its request was sent), step-down
//! margin 1 s.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, DeposedReason, Elector, ElectorBuilder, EndReason, Error, Event, Grant,
    Leader, LeaderInfo, LeaseName, LeaseStore, MemoryStore, RunError, Term,
};
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep, timeout};

mod config;
mod deposition;
mod leadership;

const TTL: Duration = Duration::from_secs(10);
/// Longer than anything a test waits for; a test that waits this long has failed.
const PATIENCE: Duration = Duration::from_secs(600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `ttl * (1 - drift)` with the default drift of 1%.
fn believed() -> Duration {
    TTL.mul_f64(1.0 - 0.01)
}

fn renew_every() -> Duration {
    ms(3_000)
}

/// Both kinds of memory store: one with a clock, one where contenders observe expiry.
fn stores() -> [(&'static str, MemoryStore); 2] {
    [
        ("server-clock", MemoryStore::new()),
        ("observed-expiry", MemoryStore::observed_expiry()),
    ]
}

fn builder(store: &MemoryStore, id: &str) -> ElectorBuilder {
    Elector::builder(Arc::new(store.clone()), "jobs")
        .candidate_id(id)
        .ttl(TTL)
        .renew_every(renew_every())
        .jitter(0.0)
}

fn lease() -> LeaseName {
    LeaseName::new("jobs").unwrap()
}

fn now() -> Instant {
    Instant::now()
}

fn tokio_instant(at: std::time::Instant) -> Instant {
    Instant::from_std(at)
}

/// Waits for the first event that `pick` accepts, and returns it with when it arrived.
async fn wait_for<T>(
    events: &mut broadcast::Receiver<Event>,
    mut pick: impl FnMut(&Event) -> Option<T>,
) -> (T, Instant) {
    let found = timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.expect("event stream");
            if let Some(found) = pick(&event) {
                return found;
            }
        }
    })
    .await
    .expect("the event did not come");
    (found, now())
}

async fn elected(events: &mut broadcast::Receiver<Event>) -> (Term, Instant, Instant) {
    let ((term, at, valid_until), arrived) = wait_for(events, |e| match e {
        Event::Elected { term, at, valid_until } => Some((*term, tokio_instant(*at), tokio_instant(*valid_until))),
        _ => None,
    })
    .await;
    assert_eq!(at, arrived);
    (term, at, valid_until)
}

#[derive(Debug, PartialEq)]
struct Deposed {
    term: Term,
    reason: DeposedReason,
    believed_until: Instant,
    work_stopped_after: Option<Duration>,
    aborted: bool,
}

async fn deposed(events: &mut broadcast::Receiver<Event>) -> (Deposed, Instant) {
    wait_for(events, |e| match e {
        Event::Deposed {
            term,
            reason,
            believed_until,
            work_stopped_after,
            aborted,
        } => Some(Deposed {
            term: *term,
            reason: reason.clone(),
            believed_until: tokio_instant(*believed_until),
            work_stopped_after: *work_stopped_after,
            aborted: *aborted,
        }),
        _ => None,
    })
    .await
}

/// Events received so far that `pick` accepts, without waiting.
fn drain<T>(events: &mut broadcast::Receiver<Event>, mut pick: impl FnMut(&Event) -> Option<T>) -> Vec<T> {
    let mut found = Vec::new();
    while let Ok(event) = events.try_recv() {
        found.extend(pick(&event));
    }
    found
}

/// A holder that takes the lease directly from the store and never renews (a crashed process).
async fn crashed_holder(store: &MemoryStore) -> Grant {
    let request = AcquireRequest {
        lease: lease(),
        candidate: CandidateId::new("crashed").unwrap(),
        ttl: TTL,
        takeover: None,
    };
    match store.acquire(&request).await.unwrap() {
        Acquired::Granted(grant) => grant,
        held => panic!("expected a grant, got {held:?}"),
    }
}
