//! Fault switches shared by the in-process [`FaultyStore`] and the TCP
//! [`FaultProxy`](crate::FaultProxy), and the request counts of the faulty stores.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

#[cfg(doc)]
use leasehold_core::{CountingStore, LeaseStore};
use leasehold_core::{Operation, RequestCounts as Counts};
use tokio::sync::watch;

use crate::faulty::Counted;
#[cfg(doc)]
use crate::faulty::FaultyStore;

/// What happens to the traffic of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Traffic flows normally.
    #[default]
    Pass,
    /// Traffic arrives this much later (order is kept).
    Delay(Duration),
    /// Traffic is silently dropped; connections stay open (a partition).
    Blackhole,
    /// Connections are broken abruptly (a TCP reset).
    Reset,
}

/// A direction of traffic between a client and its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to store: a faulted request is never applied.
    Request,
    /// Store to client: a faulted reply is lost *after* the request was applied.
    Reply,
    /// Both directions.
    Both,
}

/// The faults currently in force, one per direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultState {
    /// Client to store.
    pub request: Fault,
    /// Store to client.
    pub reply: Fault,
}

impl FaultState {
    /// The fault of one direction ([`Direction::Both`] answers the request direction).
    pub fn get(&self, direction: Direction) -> Fault {
        match direction {
            Direction::Request | Direction::Both => self.request,
            Direction::Reply => self.reply,
        }
    }
}

/// How many requests of each kind reached a store through a [`FaultyStore`] (attempted, faulted
/// or not), by name: a snapshot of the [`CountingStore`] counters of every [`FaultyStore`] of one
/// [`Faults`] (see [`Faults::counts`]). It counts nothing itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestCounts {
    /// [`LeaseStore::acquire`] calls.
    pub acquire: u64,
    /// [`LeaseStore::renew`] calls.
    pub renew: u64,
    /// [`LeaseStore::release`] calls.
    pub release: u64,
    /// [`LeaseStore::withdraw`] calls.
    pub withdraw: u64,
    /// [`LeaseStore::inspect`] calls.
    pub inspect: u64,
    /// [`LeaseStore::history`] calls.
    pub history: u64,
    /// [`LeaseStore::list`] calls.
    pub list: u64,
    /// [`LeaseStore::changes`] calls.
    pub changes: u64,
    /// [`LeaseStore::break_lease`] calls.
    pub break_lease: u64,
    /// Calls (of any kind) that answered an error, injected faults included.
    pub failed: u64,
}

impl RequestCounts {
    /// All requests together.
    pub fn total(&self) -> u64 {
        self.acquire
            + self.renew
            + self.release
            + self.withdraw
            + self.inspect
            + self.history
            + self.list
            + self.changes
            + self.break_lease
    }
}

impl From<Counts> for RequestCounts {
    fn from(counts: Counts) -> Self {
        let n = |operation| counts.get(operation);
        RequestCounts {
            acquire: n(Operation::Acquire),
            renew: n(Operation::Renew),
            release: n(Operation::Release),
            withdraw: n(Operation::Withdraw),
            inspect: n(Operation::Inspect),
            history: n(Operation::History),
            list: n(Operation::List),
            changes: n(Operation::Changes),
            break_lease: n(Operation::BreakLease),
            failed: counts.failed,
        }
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "acquire {} renew {} release {} withdraw {} inspect {} history {} list {} changes {} break {} (failed {})",
            self.acquire,
            self.renew,
            self.release,
            self.withdraw,
            self.inspect,
            self.history,
            self.list,
            self.changes,
            self.break_lease,
            self.failed
        )
    }
}

/// A cloneable switchboard of faults, per direction, changed at runtime by a test and honoured by
/// a [`FaultyStore`] or a [`FaultProxy`](crate::FaultProxy).
///
/// It also shows the requests its [`FaultyStore`]s see, as counted by the core's
/// [`CountingStore`] in each of them ([`Faults::counts`]; a proxy sees bytes, not requests, and
/// counts nothing).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_conformance::{Direction, Fault, Faults};
///
/// let faults = Faults::new();
/// faults.set(Direction::Both, Fault::Blackhole);
/// faults.set(Direction::Reply, Fault::Delay(Duration::from_millis(50)));
/// assert_eq!(faults.get(Direction::Request), Fault::Blackhole);
/// faults.heal();
/// assert_eq!(faults.get(Direction::Reply), Fault::Pass);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<FaultsInner>,
}

#[derive(Debug, Default)]
struct FaultsInner {
    state: watch::Sender<FaultState>,
    counters: Mutex<Counters>,
}

/// The counters of the [`FaultyStore`]s of one [`Faults`].
#[derive(Debug, Default)]
struct Counters {
    /// The stores alive.
    live: Vec<Weak<Counted>>,
    /// What the dropped stores had counted.
    retired: Counts,
    /// What [`Faults::reset_counts`] saw last.
    baseline: Counts,
}

impl Counters {
    /// Every request counted so far, by the stores alive and those dropped.
    fn sum(&self) -> Counts {
        self.live
            .iter()
            .filter_map(Weak::upgrade)
            .fold(self.retired, |sum, store| add(&sum, &store.counts()))
    }
}

fn add(a: &Counts, b: &Counts) -> Counts {
    Counts {
        started: std::array::from_fn(|i| a.started[i] + b.started[i]),
        failed: a.failed + b.failed,
    }
}

impl Faults {
    /// A switchboard with every direction passing.
    pub fn new() -> Self {
        Faults::default()
    }

    /// Sets the fault of `direction` (both, for [`Direction::Both`]).
    pub fn set(&self, direction: Direction, fault: Fault) {
        self.inner.state.send_modify(|state| match direction {
            Direction::Request => state.request = fault,
            Direction::Reply => state.reply = fault,
            Direction::Both => {
                *state = FaultState {
                    request: fault,
                    reply: fault,
                }
            }
        });
    }

    /// Lets all traffic pass again.
    pub fn heal(&self) {
        self.set(Direction::Both, Fault::Pass);
    }

    /// The fault of `direction` now ([`Direction::Both`] answers the request direction).
    pub fn get(&self, direction: Direction) -> Fault {
        self.state().get(direction)
    }

    /// The faults now.
    pub fn state(&self) -> FaultState {
        *self.inner.state.borrow()
    }

    /// A receiver that sees every change of the faults.
    pub fn subscribe(&self) -> watch::Receiver<FaultState> {
        self.inner.state.subscribe()
    }

    /// Completes once the fault of `direction` is no longer `fault`.
    pub async fn lifted(&self, direction: Direction, fault: Fault) {
        let mut rx = self.subscribe();
        // The sender lives in `self`, so waiting cannot fail.
        let _ = rx.wait_for(|state| state.get(direction) != fault).await;
    }

    /// How many requests of each kind the [`FaultyStore`]s of these faults (alive or dropped)
    /// have made since they were made or since [`Faults::reset_counts`].
    pub fn counts(&self) -> RequestCounts {
        let counters = self.counters();
        counters.sum().since(&counters.baseline).into()
    }

    /// Starts the counts from zero again.
    pub fn reset_counts(&self) {
        let mut counters = self.counters();
        counters.baseline = counters.sum();
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        // Nothing panics while holding the lock; a poisoned lock still holds consistent counts.
        self.inner.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shows the requests of `store` in [`Faults::counts`].
    pub(crate) fn attach(&self, store: &Arc<Counted>) {
        let mut counters = self.counters();
        counters.live.retain(|live| live.strong_count() > 0);
        counters.live.push(Arc::downgrade(store));
    }

    /// Keeps what `store`, about to be dropped, has counted.
    pub(crate) fn retire(&self, store: &Arc<Counted>) {
        let mut counters = self.counters();
        counters.retired = add(&counters.retired, &store.counts());
        counters
            .live
            .retain(|live| !std::ptr::eq(live.as_ptr(), Arc::as_ptr(store)));
    }
}
