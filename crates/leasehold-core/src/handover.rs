//! Asking the holder of a lease, from any instance, to hand it over to a named candidate: what
//! `leasehold handover LEASE --to ID` does, as a library call.
//!
//! The request goes through the store, on the lease [`LeaseName::hand_over_requests`]
//! (`LEASE.handover`): the requester campaigns for it as the successor and holds it, renewed by
//! an [`Elector`] like any lease (so on session stores too). A leader that watches requests
//! ([`ElectorBuilder::hand_over_requests`](crate::ElectorBuilder::hand_over_requests), off by
//! default; `leasehold run` turns it on) reads it once per renewal, steps down, and once its work
//! has returned hands the lease to the successor ([`LeaseStore::hand_over`]). The requester
//! watches the lease until the successor holds it at a higher term, and gives the request back
//! however it ends.

use std::sync::Arc;
use std::time::Duration;

// tokio's clock, so that a request runs under `tokio::time::pause` as the engine does.
use tokio::time::Instant;

mod error;

pub use error::HandOverError;

use crate::elector::{Elector, Event, Leader};
use crate::error::Error;
use crate::store::LeaseStore;
use crate::time::Human;
use crate::types::{CandidateId, HolderInfo, LeaseName, Observation, Term};

/// How often the lease is looked at while waiting for the successor: well under any store's
/// notification or poll interval, so the time measured is the successor's, not ours.
const POLL: Duration = Duration::from_millis(25);
/// The shortest wait for the request lease (a store's round trips, a first campaign).
const CAMPAIGN_AT_LEAST: Duration = Duration::from_secs(2);

/// A request to the holder of a lease to hand it over to `to`, from any instance.
///
/// [`send`](HandOverRequest::send) asks and waits until `to` leads; [`ask`](HandOverRequest::ask)
/// and [`PendingHandOver::wait`] split it, for a caller that waits in a `select!`.
///
/// Before asking, the request checks that `to` is campaigning where the store can list its
/// candidates ([`LeaseStore::candidates`]: etcd, ZooKeeper, Redis), and fails with
/// [`HandOverError::NotCampaigning`] when it is not listed within one TTL of the holder (a typo
/// in `to` would otherwise leave the lease reserved for nobody for a TTL; the wait lets a
/// candidate that has just lost the lease queue again). Where the store keeps no list, it cannot check, and says
/// so: [`TargetCheck::StoreCannotList`], also named in the error when `to` does not take the lease.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{Elector, HandOverRequest, LeaseStore, MemoryStore, TargetCheck};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
/// let elector = |id: &str| {
///     Elector::builder(store.clone(), "jobs").candidate_id(id).hand_over_requests(true).build()
/// };
/// let (a, b) = (elector("a")?, elector("b")?);
/// let first = a.campaign().await?;
/// let term = first.term();
/// // A's work: it stops when its leadership ends (here: when it is asked to hand over).
/// tokio::spawn(async move { first.cancelled().await });
/// let b = tokio::spawn(async move { b.campaign().await });
/// tokio::time::sleep(Duration::from_millis(50)).await; // b is campaigning
///
/// let done = HandOverRequest::new(store.clone(), "jobs".parse()?, "b".parse()?).send().await?;
/// assert!(done.term > term);
/// assert_eq!(done.target, TargetCheck::Campaigning); // the memory store lists its candidates
/// assert_eq!(b.await??.term(), done.term);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct HandOverRequest {
    store: Arc<dyn LeaseStore>,
    lease: LeaseName,
    to: CandidateId,
    within: Option<Duration>,
    check: bool,
}

/// Whether the successor was seen campaigning before the request was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetCheck {
    /// The store lists it among the lease's candidates ([`LeaseStore::candidates`]).
    Campaigning,
    /// The store keeps no list of candidates: not checked.
    StoreCannotList,
    /// The check was turned off ([`HandOverRequest::unchecked`]).
    Skipped,
}

/// A hand-over that ended with the successor leading.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HandedOver {
    /// The successor's term.
    pub term: Term,
    /// The holder the request was made to; `None` when the successor led already.
    pub previous: Option<HolderInfo>,
    /// From the request being made to the successor holding the lease (zero when it led already).
    pub took: Duration,
    /// Whether the successor was seen campaigning first.
    pub target: TargetCheck,
}

/// Where a request stands once it was made ([`HandOverRequest::ask`]).
#[derive(Debug)]
pub enum Asked {
    /// The successor holds the lease already: nothing to hand over.
    AlreadyLeading(HolderInfo),
    /// Asked (or the lease was already being handed to the successor): wait for it.
    Pending(PendingHandOver),
}

/// A request made and not yet settled: [`wait`](PendingHandOver::wait) for the successor, then
/// [`finish`](PendingHandOver::finish) to give the request back.
#[derive(Debug)]
pub struct PendingHandOver {
    store: Arc<dyn LeaseStore>,
    lease: LeaseName,
    to: CandidateId,
    from: HolderInfo,
    /// The request lease held, `None` when the lease was reserved for `to` already.
    request: Option<Leader>,
    target: TargetCheck,
    within: Duration,
    deadline: Instant,
    asked: Instant,
}

impl HandOverRequest {
    /// A request to the holder of `lease` to hand it over to `to`.
    pub fn new(store: Arc<dyn LeaseStore>, lease: LeaseName, to: CandidateId) -> Self {
        HandOverRequest {
            store,
            lease,
            to,
            within: None,
            check: true,
        }
    }

    /// How long to wait for `to` to lead. Default: 3 x the holder's TTL.
    pub fn within(mut self, within: Duration) -> Self {
        self.within = Some(within);
        self
    }

    /// Do not check that `to` is campaigning ([`TargetCheck::Skipped`]).
    pub fn unchecked(mut self) -> Self {
        self.check = false;
        self
    }

    /// Whether `to` is among the lease's candidates, as far as the store can tell.
    ///
    /// # Errors
    ///
    /// [`HandOverError::NotCampaigning`] when the store lists the candidates and `to` is not one;
    /// [`HandOverError::Store`] when the listing fails.
    pub async fn check_target(&self) -> Result<TargetCheck, HandOverError> {
        if !self.check {
            return Ok(TargetCheck::Skipped);
        }
        match self.store.candidates(&self.lease).await {
            Ok(listed) if listed.contains(&self.to) => Ok(TargetCheck::Campaigning),
            Ok(campaigning) => Err(HandOverError::NotCampaigning {
                lease: self.lease.clone(),
                to: self.to.clone(),
                campaigning,
            }),
            Err(Error::Unsupported { .. }) => Ok(TargetCheck::StoreCannotList),
            Err(source) => Err(HandOverError::Store {
                context: format!("cannot list the candidates of lease {}", self.lease),
                source,
            }),
        }
    }

    /// [`check_target`](Self::check_target) until `to` is listed, for up to `grace`: a candidate
    /// that has just lost the lease (to a hand-over, say) is listed again only once its next
    /// campaign's first acquire was answered.
    async fn wait_for_target(&self, grace: Duration) -> Result<TargetCheck, HandOverError> {
        let until = Instant::now() + grace;
        loop {
            match self.check_target().await {
                Err(HandOverError::NotCampaigning { .. }) if Instant::now() < until => {
                    tokio::time::sleep(POLL).await;
                }
                checked => return checked,
            }
        }
    }

    /// Makes the request: reads the holder, checks the successor (waiting up to the holder's TTL
    /// for it to be listed), takes the request lease.
    ///
    /// # Errors
    ///
    /// [`HandOverError::NobodyHolds`], [`HandOverError::NotCampaigning`],
    /// [`HandOverError::ReservedForAnother`], [`HandOverError::InProgress`],
    /// [`HandOverError::RequestNotGranted`], [`HandOverError::NameTooLong`], or a store error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the request's campaign (and gives back a request granted
    /// meanwhile).
    pub async fn ask(self) -> Result<Asked, HandOverError> {
        let lease = &self.lease;
        let requests = lease
            .hand_over_requests()
            .map_err(|_| HandOverError::NameTooLong { lease: lease.clone() })?;
        let started = Instant::now();
        let seen = self.store.inspect(lease).await.map_err(|source| HandOverError::Store {
            context: format!("cannot read lease {lease}"),
            source,
        })?;
        let Some(holder) = seen.holder else {
            return Err(HandOverError::NobodyHolds {
                lease: lease.clone(),
                to: self.to.clone(),
            });
        };
        if holder.id == self.to && !holder.reserved {
            return Ok(Asked::AlreadyLeading(holder));
        }
        // Already handed over (by the leader itself, or an earlier request): to `to`, only wait;
        // to someone else, that hand-over is in progress.
        if holder.reserved && holder.id != self.to {
            return Err(HandOverError::ReservedForAnother {
                lease: lease.clone(),
                to: self.to.clone(),
                other: holder.id,
                term: holder.term,
            });
        }
        let within = self.within.unwrap_or(holder.ttl.saturating_mul(3));
        let target = self.wait_for_target(holder.ttl.min(within)).await?;
        let request = if holder.reserved {
            None
        } else {
            let caps = self.store.capabilities();
            let ttl = holder.ttl.clamp(*caps.ttl.start(), *caps.ttl.end());
            Some(self.take_request(&requests, ttl).await?)
        };
        Ok(Asked::Pending(PendingHandOver {
            store: self.store,
            lease: self.lease,
            to: self.to,
            from: holder,
            request,
            target,
            within,
            deadline: started + within,
            asked: Instant::now(),
        }))
    }

    /// Asks, waits until the successor leads, and gives the request back.
    ///
    /// # Errors
    ///
    /// As [`ask`](HandOverRequest::ask) and [`PendingHandOver::wait`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives the request back by dropping its [`Leader`] (released in the
    /// background); a holder that already acted on it still hands the lease over.
    pub async fn send(self) -> Result<HandedOver, HandOverError> {
        match self.ask().await? {
            Asked::AlreadyLeading(holder) => Ok(HandedOver {
                term: holder.term,
                previous: None,
                took: Duration::ZERO,
                target: TargetCheck::Campaigning,
            }),
            Asked::Pending(pending) => {
                let outcome = pending.wait().await;
                let (from, target, took) = (pending.from.clone(), pending.target, pending.asked.elapsed());
                pending.finish().await;
                outcome.map(|term| HandedOver {
                    term,
                    previous: Some(from),
                    took,
                    target,
                })
            }
        }
    }

    /// Takes the request lease as `to`: a campaign with a timeout. Someone else's request there
    /// is another hand-over in progress.
    async fn take_request(&self, requests: &LeaseName, ttl: Duration) -> Result<Leader, HandOverError> {
        let (lease, to) = (&self.lease, &self.to);
        let store_error = |what: String| {
            move |source| HandOverError::Store {
                context: format!("cannot ask for a handover of lease {lease}: {what}"),
                source,
            }
        };
        let in_progress = |other: HolderInfo| HandOverError::InProgress {
            lease: lease.clone(),
            to: to.clone(),
            other: other.id,
            term: other.term,
            ttl: other.ttl,
        };
        let before = self
            .store
            .inspect(requests)
            .await
            .map_err(store_error(format!("cannot read {requests}")))?;
        if let Some(other) = before.holder {
            return Err(in_progress(other));
        }
        let elector = Elector::builder(self.store.clone(), requests.as_str())
            .ttl(ttl)
            .candidate_id(to.as_str())
            .build()
            .map_err(store_error(format!("invalid settings for {requests}")))?;
        let limit = ttl.max(CAMPAIGN_AT_LEAST);
        // The engine retries every store error; a refusal (no write privilege, bad credentials)
        // will not go away by retrying, so it ends the request at once.
        let refused = refusal(elector.events());
        let campaign = async {
            tokio::select! {
                elected = elector.campaign() => elected,
                refused = refused => Err(refused),
            }
        };
        match tokio::time::timeout(limit, campaign).await {
            Ok(Ok(leader)) => Ok(leader),
            Ok(Err(e)) => Err(store_error(format!("campaigning for {requests}"))(e)),
            Err(_) => match self.store.inspect(requests).await {
                Ok(Observation {
                    holder: Some(other), ..
                }) => Err(in_progress(other)),
                Ok(_) => Err(HandOverError::RequestNotGranted {
                    lease: lease.clone(),
                    within: limit,
                }),
                Err(e) => Err(store_error(format!(
                    "{requests} was not granted within {}",
                    Human(limit)
                ))(e)),
            },
        }
    }
}

/// The first refusal among an elector's store troubles (its one line; the client's error stays
/// with the event). Never, when the elector ends without one.
async fn refusal(mut events: tokio::sync::broadcast::Receiver<Event>) -> Error {
    loop {
        match events.recv().await {
            Ok(Event::StoreTrouble { error }) => {
                if let Error::Refused {
                    store,
                    operation,
                    reason,
                    ..
                } = &*error
                {
                    return Error::Refused {
                        store,
                        operation,
                        reason: reason.clone(),
                        source: None,
                    };
                }
            }
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Where the lease stands while the successor has not taken it.
#[derive(Debug)]
enum Progress {
    /// The successor holds a term above the one the request started from.
    Done(Term),
    /// Still on the way: the holder has not stepped down, or the lease is reserved or free.
    Waiting,
    /// Someone else took it, or it was handed to someone else.
    Failed(HandOverError),
}

impl PendingHandOver {
    /// The holder the request was made to.
    pub fn from(&self) -> &HolderInfo {
        &self.from
    }

    /// Whether the successor was seen campaigning first.
    pub fn target(&self) -> TargetCheck {
        self.target
    }

    /// Whether a request lease is held (false when the lease was reserved for the successor
    /// already, and the request only waits).
    pub fn holds_request(&self) -> bool {
        self.request.is_some()
    }

    /// Looks at the lease every 25 ms until the successor holds it at a higher term; the term.
    ///
    /// # Errors
    ///
    /// [`HandOverError::TakenByAnother`], [`HandOverError::TakenBack`],
    /// [`HandOverError::HandedToAnother`], [`HandOverError::RequestLost`], or, once `within` has
    /// passed, [`HandOverError::Ignored`], [`HandOverError::NotTaken`] or
    /// [`HandOverError::LastLookFailed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads. The request stays held until [`finish`](Self::finish).
    pub async fn wait(&self) -> Result<Term, HandOverError> {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Observation> = None;
        let mut last_error: Option<Error> = None;
        // Once the holder has been seen stepping down, the request has served its purpose.
        let mut acted = false;
        loop {
            let lost = async {
                match &self.request {
                    Some(leader) if !acted => leader.cancelled().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = lost => return Err(self.request_lost()),
                () = tokio::time::sleep_until(self.deadline) => {
                    return Err(self.timed_out(last.as_ref(), last_error));
                }
            }
            let read = tokio::time::timeout_at(self.deadline, self.store.inspect(&self.lease)).await;
            let Ok(read) = read else {
                return Err(self.timed_out(last.as_ref(), last_error));
            };
            match read {
                Ok(now) => {
                    last_error = None;
                    match self.progress(&now) {
                        Progress::Done(term) => return Ok(term),
                        Progress::Failed(e) => return Err(e),
                        Progress::Waiting => {}
                    }
                    acted |= !self.still_the_first_term(&now);
                    last = Some(now);
                }
                Err(e) => last_error = Some(e),
            }
        }
    }

    /// Gives the request back, within a bound: a store that does not answer must not keep the
    /// caller waiting (the request then lapses after its TTL). A leader that campaigns again must
    /// not find it and hand over once more.
    pub async fn finish(self) {
        if let Some(request) = self.request {
            let bound = request.remaining().max(CAMPAIGN_AT_LEAST);
            let _ = tokio::time::timeout(bound, request.resign()).await;
        }
    }

    fn still_the_first_term(&self, now: &Observation) -> bool {
        now.holder
            .as_ref()
            .is_some_and(|h| h.id == self.from.id && h.term == self.from.term && !h.reserved)
    }

    /// Judges one look at the lease.
    fn progress(&self, now: &Observation) -> Progress {
        let (lease, to) = (self.lease.clone(), self.to.clone());
        let Some(h) = &now.holder else {
            return Progress::Waiting; // released (a store that cannot reserve): `to` campaigns
        };
        if h.reserved {
            return if h.id == self.to {
                Progress::Waiting
            } else {
                Progress::Failed(HandOverError::HandedToAnother {
                    lease,
                    to,
                    other: h.id.clone(),
                    term: h.term,
                })
            };
        }
        if h.term <= self.from.term {
            return Progress::Waiting;
        }
        let (holder, term) = (h.id.clone(), h.term);
        if h.id == self.to {
            Progress::Done(h.term)
        } else if h.id == self.from.id {
            Progress::Failed(HandOverError::TakenBack {
                lease,
                to,
                holder,
                term,
            })
        } else {
            Progress::Failed(HandOverError::TakenByAnother {
                lease,
                to,
                holder,
                term,
            })
        }
    }

    fn timed_out(&self, last: Option<&Observation>, error: Option<Error>) -> HandOverError {
        let (lease, to, within) = (self.lease.clone(), self.to.clone(), self.within);
        if let Some(source) = error {
            return HandOverError::LastLookFailed {
                lease,
                to,
                within,
                source,
            };
        }
        match last.and_then(|o| o.holder.as_ref()) {
            Some(h) if h.id == self.from.id && h.term == self.from.term && !h.reserved => HandOverError::Ignored {
                lease,
                holder: h.id.clone(),
                term: h.term,
                within,
            },
            holder => HandOverError::NotTaken {
                lease,
                to,
                within,
                reservation_ttl: holder.filter(|h| h.reserved).map(|h| h.ttl),
                target: self.target,
            },
        }
    }

    fn request_lost(&self) -> HandOverError {
        let why = match self.request.as_ref().map(|r| r.ensure_valid(Duration::ZERO)) {
            Some(Err(Error::NotLeader { reason, .. })) => {
                format!(": {}", reason.strip_prefix("deposed: ").unwrap_or(&reason))
            }
            _ => String::new(),
        };
        HandOverError::RequestLost {
            lease: self.lease.clone(),
            holder: self.from.id.clone(),
            why,
        }
    }
}

#[cfg(test)]
mod tests;
