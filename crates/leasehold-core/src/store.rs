//! The contract every backend implements.

use std::fmt::Debug;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::{Error, Result};
use crate::shard_record::{ShardRecord, ShardWrite};
use crate::types::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Grant, LeaseName, Observation, Renewed, Term, Transition,
};

/// What a change stream ([`LeaseStore::changes`]) says to a waiting candidate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Change {
    /// Something the candidate waits for may have changed: the lease was released or taken over
    /// (or, for FIFO stores, the candidate's predecessor left). It may be said spuriously; the
    /// engine then simply asks the store again.
    Changed,
    /// The store learnt by waiting that the candidate is first and holds the lease: its
    /// predecessor left and nothing can come before it (etcd's predecessor released while first,
    /// ZooKeeper's predecessor node deleted while second in line). The engine takes the grant
    /// through its ordinary grant path, believes it from [`Turn::valid_from`], and confirms it
    /// with its own next request (a renewal) at once; it never asks the store for what the store
    /// already told it.
    YourTurn(Turn),
}

/// A grant a store made by waiting ([`Change::YourTurn`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Turn {
    /// The grant, as an `acquire` would answer it (the TTL asked for, the term, the token).
    pub grant: Grant,
    /// The instant of this process from which the store promises the grant for its TTL: the
    /// send of the last request the promise rests on (etcd: the candidate's session's last
    /// confirmed keepalive; ZooKeeper: the session's last heartbeat sent), never later. The
    /// engine believes the grant until `valid_from + ttl * (1 - drift)`, and does not take it
    /// when that leaves less than its step-down margin.
    pub valid_from: std::time::Instant,
}

/// A stream of [`Change`]s for one waiting candidate. A stream that ends or errors makes the
/// engine fall back to polling.
pub type Changes = BoxStream<'static, Change>;

/// The change stream of a store that only notifies: each `()` of `stream` is a
/// [`Change::Changed`].
pub fn notifications(stream: impl futures::Stream<Item = ()> + Send + 'static) -> Changes {
    use futures::StreamExt;
    stream.map(|()| Change::Changed).boxed()
}

/// New holders of one lease as the store announces them
/// ([`LeaseStore::announcements`]), each as [`LeaseStore::inspect`] would show it right after
/// the grant. A stream that ends makes the engine ask for a new one the next time it follows.
pub type Announcements = BoxStream<'static, Observation>;

/// The announcements a `watch` channel carries: each holder the sender sets after the receiver
/// last looked (`None` values are skipped; one that falls behind sees the latest). The stream ends
/// when the sender is dropped. For stores that keep the last announcement of a lease in one.
pub fn watched_announcements(rx: tokio::sync::watch::Receiver<Option<Observation>>) -> Announcements {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let seen = rx.borrow_and_update().clone();
            if let Some(seen) = seen {
                return Some((seen, rx));
            }
        }
    }))
}

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
/// A store that learns by waiting that a candidate's turn has come (a FIFO queue whose
/// predecessor left) says so on the candidate's change stream ([`Change::YourTurn`]), with the
/// instant its promise counts from: the engine's own next request confirms it.
///
/// # Compare-and-set
///
/// Every write is conditional: `acquire` only takes a free lease, or replaces the exact record
/// version named in [`AcquireRequest::takeover`]; `renew` and `release` only touch the record of
/// the grant's own term. A lost race is an answer ([`Acquired::Held`], [`Renewed::Lost`]), not
/// an error.
///
/// # Cancel safety
///
/// The engine never drops a store future half-way: it polls each call to completion (in a task
/// of its own once it stops waiting for the reply), or at most `max(ttl, request_timeout)` after
/// it was sent (by then every grant the call could carry has expired by the engine's own
/// count). A store therefore needs no "finish anyway" machinery of its own for the engine's
/// sake.
///
/// Other callers (operator tools, tests, a caller's own `select!`) may still drop a future at
/// any `.await`. A dropped request then counts as a transient failure: it may or may not have
/// been applied, and the caller settles it as the engine does, by reading back. A store must
/// stay usable after such a drop (no connection left in a transaction, no lock or queue slot
/// held); each method below says what a drop may leave behind.
///
/// # Wrapping a store
///
/// A store around a store (limits, metrics, faults) implements this trait by forwarding;
/// [`async_trait`](crate::async_trait) is re-exported, so no import of your own is needed.
/// Forward [`can_break`](LeaseStore::can_break) together with
/// [`break_lease`](LeaseStore::break_lease), or neither: the defaults say "unsupported", so a
/// wrapper that leaves both out never claims a power it does not pass on.
///
/// ```
/// use leasehold_core::{
///     async_trait, AcquireRequest, Acquired, Capabilities, Grant, LeaseName, LeaseStore, MemoryStore,
///     Observation, Renewed, Result, Transition,
/// };
///
/// /// Logs every acquire; breaking leases is not passed on.
/// #[derive(Debug)]
/// struct Logged<S>(S);
///
/// #[async_trait]
/// impl<S: LeaseStore> LeaseStore for Logged<S> {
///     fn name(&self) -> &'static str { self.0.name() }
///     fn capabilities(&self) -> Capabilities { self.0.capabilities() }
///     async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
///         println!("{} asks for {}", request.candidate, request.lease);
///         self.0.acquire(request).await
///     }
///     async fn renew(&self, grant: &Grant) -> Result<Renewed> { self.0.renew(grant).await }
///     async fn release(&self, grant: &Grant) -> Result<()> { self.0.release(grant).await }
///     async fn inspect(&self, lease: &LeaseName) -> Result<Observation> { self.0.inspect(lease).await }
///     async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
///         self.0.history(lease, limit).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let store = Logged(MemoryStore::new());
/// assert!(MemoryStore::new().can_break());
/// assert!(!store.can_break()); // break_lease is not forwarded, and it says so
/// assert!(store.break_lease(&"jobs".parse()?).await.is_err());
/// # Ok(()) }
/// ```
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
    /// `request.candidate` itself. Every grant, also a repeated one to the same candidate, has a
    /// term greater than every earlier grant of the lease.
    ///
    /// The holder's own acquire keeps the lease for it: it is granted again (or answered with
    /// the holder's grant), never let go to the candidates waiting behind it. The engine asks
    /// again once that leadership has ended for it, but an acquire it gave up on may still
    /// reach the store while it leads on a newer grant; a store that then let the lease go
    /// would make two leaders (the model check's `an_acquire_that_frees_the_callers_own_grant_is_caught`,
    /// the conformance scenario `acquire_by_the_holder_keeps_the_lease`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL outside [`Capabilities::ttl`]; a transient error when the
    /// outcome is unknown; [`Error::CorruptRecord`] for a record leasehold cannot read.
    ///
    /// # Cancel safety
    ///
    /// A dropped acquire may have been granted: the grant then lapses after its TTL unless
    /// renewed, and the candidate's next acquire replaces it with a higher term. On FIFO stores
    /// it may leave the candidate's place in the queue until [`withdraw`](LeaseStore::withdraw).
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired>;

    /// Extends a grant by its TTL, if the store still records it as the holder at that term.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown; [`Error::CorruptRecord`].
    ///
    /// # Cancel safety
    ///
    /// A dropped renewal may or may not have extended the grant; the holder counts its lease
    /// from its last confirmed renewal, so either way it only loses time, never safety.
    async fn renew(&self, grant: &Grant) -> Result<Renewed>;

    /// Renews several grants at once, in as few requests as the store allows (one statement,
    /// script, transaction or keepalive where it can), answering each in order as
    /// [`renew`](LeaseStore::renew) would. The default renews each on its own, all at once.
    /// [`RenewBatcher`](crate::RenewBatcher) gathers the renewals of many electors into calls of
    /// this.
    ///
    /// # Errors
    ///
    /// The outer error when no grant's outcome is known (the request failed as a whole); an
    /// inner one for a grant whose renewal failed on its own.
    ///
    /// # Cancel safety
    ///
    /// As [`renew`](LeaseStore::renew), for each grant.
    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        Ok(futures::future::join_all(grants.iter().map(|grant| self.renew(grant))).await)
    }

    /// Frees the lease at once for the next candidate, if it is still held by this grant.
    /// Releasing a grant that is no longer held is not an error.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown; [`Error::CorruptRecord`].
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have freed the lease; if not, it expires after its TTL.
    async fn release(&self, grant: &Grant) -> Result<()>;

    /// Ends `grant` and reserves the lease for `to` (a planned handover), if the store still
    /// records this grant; otherwise does nothing, like [`release`](LeaseStore::release).
    ///
    /// Until the reservation ends, the lease shows `to` as its holder with
    /// [`HolderInfo::reserved`](crate::HolderInfo::reserved) set and the handed-over term, only
    /// an acquire by `to` is granted (with a term higher than `grant`'s), and everyone else is
    /// told [`Acquired::Held`]. A reservation nobody takes ends like a holder that stopped renewing:
    /// after `grant.ttl`, by the store's clock or session, or by a contender that saw its record
    /// version unchanged for that long ([`AcquireRequest::takeover`]). The history records the
    /// handed-over term as ended with [`EndReason::HandedOver`](crate::EndReason::HandedOver).
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown; [`Error::CorruptRecord`];
    /// [`Error::Unsupported`] where the store cannot reserve (the default): the engine then
    /// releases the lease to everyone.
    ///
    /// # Cancel safety
    ///
    /// A dropped handover may or may not have ended the grant; if not, it expires after its TTL.
    async fn hand_over(&self, _grant: &Grant, _to: &CandidateId) -> Result<()> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "hand_over",
        })
    }

    /// Withdraws a candidate that stopped campaigning without being granted (FIFO stores remove
    /// its place in the queue). The default does nothing.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown.
    ///
    /// # Cancel safety
    ///
    /// A dropped withdrawal may leave the candidate queued until its session or entry expires.
    async fn withdraw(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<()> {
        Ok(())
    }

    /// Reads the current holder and term of a lease.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`].
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation>;

    /// The most recent `limit` terms of a lease, oldest first.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`].
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>>;

    /// Every lease of this store (its table, namespace or container) whose name starts with
    /// `prefix`, in name order, as [`inspect`](LeaseStore::inspect) would show each: holder, term,
    /// TTL and, where the store has a clock, its remaining time; a free lease with its last term.
    /// An empty prefix lists every lease. Leases the store keeps no record of are not listed.
    ///
    /// The listing is not one snapshot on every store: each entry is as current as an
    /// `inspect` of that lease made during the call.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`] naming the first lease leasehold cannot read;
    /// [`Error::Unsupported`] where the store cannot list (the default).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    async fn list(&self, _prefix: &str) -> Result<Vec<Observation>> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "list",
        })
    }

    /// The candidates campaigning for `lease` as the store keeps them (Curator's
    /// `getParticipants`): every candidate with a place in the store's queue, in the order the
    /// store would grant the lease to them, the holder first while it holds. A candidate appears
    /// once its first acquire was answered and leaves when it withdraws, is granted and releases,
    /// or its session (etcd, ZooKeeper) or subscription (Redis) ends. An empty list: nobody
    /// campaigns (or the lease was never asked for).
    ///
    /// Only stores that keep something per campaigning candidate can answer; where a follower
    /// only polls (SQLite, Postgres, MySQL, DynamoDB, Azure, S3) nothing records it, and the
    /// answer is [`Error::Unsupported`] (the default), never a guess.
    /// [`HandOverRequest`](crate::HandOverRequest) uses this to check that a successor is
    /// campaigning.
    ///
    /// The listing is not one snapshot on every store: a candidate that joins or leaves during
    /// the call may or may not be in it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] with operation `"candidates"` where the store keeps no candidates
    /// (the default); a transient error; [`Error::CorruptRecord`] for a queue entry leasehold
    /// cannot read.
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    async fn candidates(&self, _lease: &LeaseName) -> Result<Vec<CandidateId>> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "candidates",
        })
    }

    /// A stream of [`Change`]s for `candidate` campaigning for `lease`: notifications, and for a
    /// store that learns by waiting that the candidate is first, its turn
    /// ([`Change::YourTurn`]). Stores without notification return `Ok(None)` (the default) and
    /// candidates poll.
    ///
    /// # Errors
    ///
    /// A transient error; the engine then polls.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (or the stream) ends the subscription; nothing else changes.
    async fn changes(&self, _lease: &LeaseName, _candidate: &CandidateId) -> Result<Option<Changes>> {
        Ok(None)
    }

    /// New holders of `lease` as the store announces them, each as
    /// [`inspect`](LeaseStore::inspect) would show it right after the grant, with no read per
    /// follower: a follower learns of a new leader from the announcement, also where the store
    /// wakes only the next candidate in line (a FIFO queue) and the others would otherwise not
    /// read the lease again until it is free. Stores that do not announce return `Ok(None)`
    /// (the default).
    ///
    /// The engine subscribes while its candidate follows. Announcements inform
    /// [`Elector::observe`](crate::Elector::observe) and
    /// [`Event::LeaderChanged`](crate::Event::LeaderChanged), only with a higher term than the
    /// one last seen. A store whose announcements also cover every renewal says so
    /// ([`Announces::GrantsAndRenewals`](crate::Announces::GrantsAndRenewals)): each renewal is
    /// then announced too, as `inspect` would show it right after (same holder and term, the new
    /// record version), no earlier than the write, and an idle follower takes each announced
    /// version as a sighting, as if a read had shown it when the announcement arrived, instead of
    /// polling for it. Announcements never decide an election by themselves: a takeover still
    /// names the record version it replaces, which the store checks, so a lost, late or
    /// reordered announcement costs freshness or one refused request, never safety.
    ///
    /// A store that learns how a term ended (a release or break message, a hand-over) may
    /// announce that too, as `inspect` would show it then: the lease free with its
    /// [`previous_end`](crate::Observation::previous_end), or reserved for the hand-over's
    /// successor. The engine takes these only to tell a hand-over from a failover in its
    /// metrics (`leasehold_handover_seconds`, `leasehold_failover_seconds`): a change
    /// notification alone does not say which it was.
    ///
    /// # Errors
    ///
    /// A transient error; the engine asks again the next time it sees another holder.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (or the stream) ends the subscription; nothing else changes.
    async fn announcements(&self, _lease: &LeaseName) -> Result<Option<Announcements>> {
        Ok(None)
    }

    /// The shard records whose name starts with `prefix`, in name order (see [`ShardRecord`]: a
    /// lease group's members own shards through them). An empty prefix lists every one.
    ///
    /// The listing is not one snapshot on every store: each record is as current as a read of
    /// it made during the call.
    ///
    /// # Errors
    ///
    /// A transient error; [`Error::CorruptRecord`] for a record the store cannot read;
    /// [`Error::Unsupported`] where the store keeps no shard records (the default).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    async fn shard_records(&self, _prefix: &str) -> Result<Vec<ShardRecord>> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "shard_records",
        })
    }

    /// Writes `value` to the shard record `name` in one conditional write, if the store's
    /// record of `name` has version `expected` (`None`: if the store has no record of `name`).
    /// Otherwise it writes nothing and answers [`ShardWrite::Conflict`] with what it holds.
    ///
    /// Of writes racing with the same `expected`, at most one is answered
    /// [`ShardWrite::Written`]; a written record has a version it never had before. The value is
    /// kept as it is (a store that cannot keep some character as it is encodes it): the engine
    /// writes only values [`check_shard_value`](crate::check_shard_value) accepts. Shard records
    /// have no TTL and are never deleted by the store: a lease group's engine decides from the
    /// member leases they name when one may be replaced.
    ///
    /// # Errors
    ///
    /// A transient error when the outcome is unknown (the engine reads the record back);
    /// [`Error::CorruptRecord`] for a record the store cannot read; [`Error::Unsupported`] where
    /// the store keeps no shard records (the default).
    ///
    /// # Cancel safety
    ///
    /// A dropped write may or may not have been applied: the engine reads the record back.
    async fn write_shard(&self, _name: &LeaseName, _expected: Option<&str>, _value: &str) -> Result<ShardWrite> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "write_shard",
        })
    }

    /// Whether [`break_lease`](LeaseStore::break_lease) works. The default is `false`, like the
    /// default `break_lease`: a store that implements one implements both, and a wrapper forwards
    /// both or neither.
    fn can_break(&self) -> bool {
        false
    }

    /// Forces the current holder out (an operator's tool). Returns the term that was broken, or
    /// `None` if the lease was free.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the backend cannot break leases (the default).
    ///
    /// # Cancel safety
    ///
    /// A dropped break may or may not have ended the holder's term.
    async fn break_lease(&self, _lease: &LeaseName) -> Result<Option<Term>> {
        Err(Error::Unsupported {
            store: self.name(),
            operation: "break_lease",
        })
    }
}

/// A shared store is a store: `Arc<dyn LeaseStore>` (or an `Arc` of any store) can be wrapped
/// by a store that takes its inner store by value, such as
/// [`CountingStore`](crate::CountingStore) or [`LimitStore`](crate::LimitStore). Every method,
/// [`can_break`](LeaseStore::can_break) and the defaulted ones included, is forwarded.
///
/// ```
/// use std::sync::Arc;
/// use leasehold_core::{CountingStore, LeaseStore, MemoryStore, Operation};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let shared: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
/// let counted = CountingStore::new(shared);
/// assert!(counted.can_break());
/// counted.list("jobs").await?;
/// assert_eq!(counted.counts().get(Operation::List), 1);
/// # Ok(()) }
/// ```
#[async_trait]
impl<T: LeaseStore + ?Sized> LeaseStore for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        (**self).acquire(request).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        (**self).renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        (**self).release(grant).await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        (**self).renew_many(grants).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        (**self).hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        (**self).withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        (**self).inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        (**self).history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        (**self).list(prefix).await
    }

    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        (**self).candidates(lease).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        (**self).changes(lease, candidate).await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        (**self).announcements(lease).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        (**self).shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        (**self).write_shard(name, expected, value).await
    }

    fn can_break(&self) -> bool {
        (**self).can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        (**self).break_lease(lease).await
    }
}

/// The operations of [`LeaseStore`], as errors, metrics and [`CountingStore`](crate::CountingStore)
/// name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Operation {
    /// [`LeaseStore::acquire`].
    Acquire,
    /// [`LeaseStore::renew`].
    Renew,
    /// [`LeaseStore::renew_many`] (one call, however many grants).
    RenewMany,
    /// [`LeaseStore::release`].
    Release,
    /// [`LeaseStore::hand_over`].
    HandOver,
    /// [`LeaseStore::withdraw`].
    Withdraw,
    /// [`LeaseStore::inspect`].
    Inspect,
    /// [`LeaseStore::history`].
    History,
    /// [`LeaseStore::list`].
    List,
    /// [`LeaseStore::candidates`].
    Candidates,
    /// [`LeaseStore::changes`] and [`LeaseStore::announcements`] (subscriptions).
    Changes,
    /// [`LeaseStore::break_lease`].
    BreakLease,
    /// [`LeaseStore::shard_records`].
    ShardRecords,
    /// [`LeaseStore::write_shard`].
    WriteShard,
}

impl Operation {
    /// Every operation, in declaration order.
    pub const ALL: [Operation; 14] = [
        Operation::Acquire,
        Operation::Renew,
        Operation::RenewMany,
        Operation::Release,
        Operation::HandOver,
        Operation::Withdraw,
        Operation::Inspect,
        Operation::History,
        Operation::List,
        Operation::Candidates,
        Operation::Changes,
        Operation::BreakLease,
        Operation::ShardRecords,
        Operation::WriteShard,
    ];

    /// The method's name, e.g. `"break_lease"`.
    ///
    /// ```
    /// use leasehold_core::Operation;
    ///
    /// assert_eq!(Operation::BreakLease.as_str(), "break_lease");
    /// assert_eq!(Operation::Renew.to_string(), "renew");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Renew => "renew",
            Operation::RenewMany => "renew_many",
            Operation::Release => "release",
            Operation::HandOver => "hand_over",
            Operation::Withdraw => "withdraw",
            Operation::Inspect => "inspect",
            Operation::History => "history",
            Operation::List => "list",
            Operation::Candidates => "candidates",
            Operation::Changes => "changes",
            Operation::BreakLease => "break_lease",
            Operation::ShardRecords => "shard_records",
            Operation::WriteShard => "write_shard",
        }
    }

    /// Whether the operation keeps a leader's lease alive or hands it on (renew, release,
    /// hand_over): what [`LimitStore`](crate::LimitStore) admits first.
    #[must_use]
    pub fn is_urgent(self) -> bool {
        matches!(
            self,
            Operation::Renew | Operation::RenewMany | Operation::Release | Operation::HandOver
        )
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
