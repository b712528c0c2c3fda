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
    /// [`LeaseStore::renew_many`] calls (one per call, however many grants it renews).
    pub renew_many: u64,
    /// [`LeaseStore::release`] calls.
    pub release: u64,
    /// [`LeaseStore::hand_over`] calls.
    pub hand_over: u64,
    /// [`LeaseStore::withdraw`] calls.
    pub withdraw: u64,
    /// [`LeaseStore::inspect`] calls.
    pub inspect: u64,
    /// [`LeaseStore::history`] calls.
    pub history: u64,
    /// [`LeaseStore::list`] calls.
    pub list: u64,
    /// [`LeaseStore::candidates`] calls.
    pub candidates: u64,
    /// [`LeaseStore::changes`] calls.
    pub changes: u64,
    /// [`LeaseStore::break_lease`] calls.
    pub break_lease: u64,
    /// [`LeaseStore::shard_records`] calls.
    pub shard_records: u64,
    /// [`LeaseStore::write_shard`] calls.
    pub write_shard: u64,
    /// Calls (of any kind) that answered an error, injected faults included.
    pub failed: u64,
}

impl RequestCounts {
    /// All requests together: every [`LeaseStore`] request a [`FaultyStore`] forwards, of every
    /// kind (`failed` is a subset, not added).
    pub fn total(&self) -> u64 {
        self.per_operation().iter().map(|(_, n)| n).sum()
    }

    /// The count of each kind of request, in [`Operation::ALL`] order (an operation added to the
    /// store contract does not compile here until it is counted).
    pub fn per_operation(&self) -> [(Operation, u64); Operation::ALL.len()] {
        [
            (Operation::Acquire, self.acquire),
            (Operation::Renew, self.renew),
            (Operation::RenewMany, self.renew_many),
            (Operation::Release, self.release),
            (Operation::HandOver, self.hand_over),
            (Operation::Withdraw, self.withdraw),
            (Operation::Inspect, self.inspect),
            (Operation::History, self.history),
            (Operation::List, self.list),
            (Operation::Candidates, self.candidates),
            (Operation::Changes, self.changes),
            (Operation::BreakLease, self.break_lease),
            (Operation::ShardRecords, self.shard_records),
            (Operation::WriteShard, self.write_shard),
        ]
    }

    /// `self - earlier`, per kind (saturating at zero).
    ///
    /// ```
    /// use leasehold_conformance::RequestCounts;
    ///
    /// let earlier = RequestCounts { renew_many: 2, ..RequestCounts::default() };
    /// let later = RequestCounts { renew_many: 5, hand_over: 1, ..RequestCounts::default() };
    /// let since = later.since(&earlier);
    /// assert_eq!((since.renew_many, since.hand_over, since.total()), (3, 1, 4));
    /// ```
    #[must_use]
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        self.zip(earlier, u64::saturating_sub)
    }

    /// `self + other`, per kind.
    #[must_use]
    pub fn plus(&self, other: &RequestCounts) -> RequestCounts {
        self.zip(other, u64::saturating_add)
    }

    fn zip(&self, other: &RequestCounts, f: impl Fn(u64, u64) -> u64) -> RequestCounts {
        RequestCounts {
            acquire: f(self.acquire, other.acquire),
            renew: f(self.renew, other.renew),
            renew_many: f(self.renew_many, other.renew_many),
            release: f(self.release, other.release),
            hand_over: f(self.hand_over, other.hand_over),
            withdraw: f(self.withdraw, other.withdraw),
            inspect: f(self.inspect, other.inspect),
            history: f(self.history, other.history),
            list: f(self.list, other.list),
            candidates: f(self.candidates, other.candidates),
            changes: f(self.changes, other.changes),
            break_lease: f(self.break_lease, other.break_lease),
            shard_records: f(self.shard_records, other.shard_records),
            write_shard: f(self.write_shard, other.write_shard),
            failed: f(self.failed, other.failed),
        }
    }
}

impl From<Counts> for RequestCounts {
    fn from(counts: Counts) -> Self {
        let n = |operation| counts.get(operation);
        RequestCounts {
            acquire: n(Operation::Acquire),
            renew: n(Operation::Renew),
            renew_many: n(Operation::RenewMany),
            release: n(Operation::Release),
            hand_over: n(Operation::HandOver),
            withdraw: n(Operation::Withdraw),
            inspect: n(Operation::Inspect),
            history: n(Operation::History),
            list: n(Operation::List),
            candidates: n(Operation::Candidates),
            changes: n(Operation::Changes),
            break_lease: n(Operation::BreakLease),
            shard_records: n(Operation::ShardRecords),
            write_shard: n(Operation::WriteShard),
            failed: counts.failed,
        }
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (operation, n)) in self.per_operation().into_iter().enumerate() {
            write!(f, "{}{operation} {n}", if i == 0 { "" } else { " " })?;
        }
        write!(f, " (failed {})", self.failed)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_of_the_store_contract_counts_in_the_total() {
        for operation in Operation::ALL {
            let mut counts = Counts::default();
            counts.started[operation as usize] = 2;
            let seen = RequestCounts::from(counts);
            assert_eq!(seen.total(), 2, "{operation}: {seen}");
            assert!(seen.per_operation().contains(&(operation, 2)), "{operation}: {seen}");
            assert!(seen.to_string().contains(&format!("{operation} 2")), "{seen}");
            assert_eq!(seen.since(&seen).total(), 0);
            assert_eq!(seen.plus(&seen).total(), 4);
        }
    }
}
