//! The contract every backend implements.

use std::fmt::Debug;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::{Error, Result};
use crate::types::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Grant, LeaseName, Observation, Renewed, Term, Transition,
};

/// A stream that yields whenever something a candidate waits for may have changed: the lease was
/// released or taken over (or, for FIFO stores, the candidate's predecessor left). It may yield
/// spuriously; the engine then simply asks the store again. A stream that ends or errors makes
/// the engine fall back to polling.
pub type Changes = BoxStream<'static, ()>;

/// A lease store: one implementation per backend, usable as `Arc<dyn LeaseStore>`.
///
/// A store translates operations; it never sleeps, retries in a loop or decides how long a grant
/// may be believed: timing lives in the engine ([`Elector`](crate::Elector)).
///
/// # The promise behind every grant
///
/// When `acquire` answers [`Acquired::Granted`] or `renew` answers [`Renewed::Renewed`], the store
/// promises that nobody else can be granted the lease before `ttl` has elapsed, counted from some
/// moment *after the request was sent* (on the store's clock, the holder's session, or, for
/// [`Expiry::ObservedByContenders`](crate::Expiry::ObservedByContenders), the contender's clock
/// after it first sees the new record version). The engine builds its conservative deadline on
/// that promise.
///
/// # Compare-and-set
///
/// Every write is conditional: `acquire` only takes a free lease, or replaces the exact record
/// version named in [`AcquireRequest::takeover`]; `renew` and `release` only touch the record of
/// the grant's own term. A lost race is an answer ([`Acquired::Held`], [`Renewed::Lost`]), not
/// an error.
#[async_trait]
pub trait LeaseStore: Debug + Send + Sync + 'static {
    /// A short name of the backend for errors and metrics, e.g. `"sqlite"`.
    fn name(&self) -> &'static str;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// Tries to take the lease for `request.candidate`.
    ///
    /// Takes a free lease; replaces a held one only when `request.takeover` names its current
    /// record version (observed-expiry stores), the store itself has expired it, or the holder is
    /// `request.candidate` itself (its earlier leadership has ended). Every grant, also a repeated
    /// one to the same candidate, has a term greater than every earlier grant of the lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL outside [`Capabilities::ttl`]; a transient error when the
    /// outcome is unknown; [`Error::CorruptRecord`] for a record leasehold cannot read.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired>;

    /// Extends a grant by its TTL, if the store still records it as the holder at that term.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown; [`Error::CorruptRecord`].
    async fn renew(&self, grant: &Grant) -> Result<Renewed>;

    /// Frees the lease at once for the next candidate, if it is still held by this grant.
    /// Releasing a grant that is no longer held is not an error.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown; [`Error::CorruptRecord`].
    async fn release(&self, grant: &Grant) -> Result<()>;

    /// Withdraws a candidate that stopped campaigning without being granted (FIFO stores remove
    /// its place in the queue). The default does nothing.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown.
    async fn withdraw(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<()> {
        Ok(())
    }

    /// Reads the current holder and term of a lease.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`].
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation>;

    /// The most recent `limit` terms of a lease, oldest first.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`].
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>>;

    /// A stream of change notifications for `candidate` campaigning for `lease`.
    /// Stores without notification return `Ok(None)` (the default) and candidates poll.
    ///
    /// # Errors
    ///
    /// A transient error; the engine then polls.
    async fn changes(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(None)
    }

    /// Forces the current holder out (an operator's tool). Returns the term that was broken, or
    /// `None` if the lease was free.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the backend cannot break leases.
    async fn break_lease(&self, _lease: &LeaseName) -> Result<Option<Term>> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "break_lease",
        })
    }
}
