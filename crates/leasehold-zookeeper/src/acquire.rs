//! The acquire path below the trait method (`store.rs`): the fast one-request grant of a
//! queued candidate, queueing (and queueing again), the stale znodes of lost replies, the head
//! of the queue, a reserved lease's take or takeover, and the answer to a grant transaction.

use std::sync::Arc;

use leasehold_core::{AcquireRequest, Acquired, Error, Grant, Result, Term};
use zookeeper_client as zk;

use crate::error::{Failed, STORE};
use crate::queue::{Ahead, GrantOutcome};
use crate::record::{ReservationRecord, holder_observation};
use crate::state::{Inner, OwnNode};

/// The longest queue ahead of a candidate for which `acquire` first tries the one-request grant.
const FAST_GRANT_MAX_AHEAD: usize = 8;

/// The operations, each one pass of requests: an answer or an error, never a retry (the engine
/// retries, reading back first). Errors are named by operation in the
/// [`LeaseStore`](leasehold_core::LeaseStore) impl.
impl Inner {
    /// The acquire of `request`, its TTL checked by the caller.
    pub(crate) async fn try_acquire(self: &Arc<Self>, request: &AcquireRequest) -> Result<Acquired> {
        let (lease, candidate, ttl) = (&request.lease, &request.candidate, request.ttl);
        let ops = self.ops(lease, candidate);
        let _serial = ops.lock().await;
        let client = self.session(ttl).await?;
        let session = client.session_id().0;
        let prefix = self.prefix(candidate);
        let mut own = self.own(lease, candidate).filter(|n| n.session == session);
        if let Some(node) = own
            .as_ref()
            .filter(|n| !n.granted && n.ahead.len() <= FAST_GRANT_MAX_AHEAD)
        {
            // One request that is applied even when its reply is lost: grant if every znode
            // that was ahead of ours is gone.
            if let GrantOutcome::Granted = self.grant(&client, lease, node, candidate, 0).await? {
                return Ok(self.granted(lease, candidate, node.clone(), ttl, &client, false).await);
            }
        }
        if let Some(node) = own.take_if(|n| n.granted) {
            // A new term needs a new znode. A garbage record is an error before anything
            // changes, as everywhere.
            if self.read_candidate(&client, lease, &node.name).await?.is_some() {
                self.retire_granted(request, &node.name, node.czxid).await?;
            }
            self.set_own(lease, candidate, None);
        }
        // Take a place in the queue first: that request is applied even if its reply is lost,
        // so a release can hand the lease over to us.
        let own = match own {
            Some(own) => own,
            None => {
                let (own, created) = self.enqueue(&client, lease, candidate, ttl, &prefix).await?;
                if created {
                    // A new lease, with our znode alone in its queue: grant at once.
                    if let GrantOutcome::Granted = self.grant(&client, lease, &own, candidate, 0).await? {
                        return Ok(self.granted(lease, candidate, own, ttl, &client, true).await);
                    }
                }
                own
            }
        };
        let mut queue = self.queue(&client, lease).await?.unwrap_or_default();
        // Other znodes of ours: requests whose replies were lost. One of them may even have been
        // adopted by a read-back; none may be granted again. One that was granted is handed over
        // to this candidate itself (the lease stays ours, reserved); the others are deleted.
        // Either way the rest of this listing stays valid without them.
        let stale: Vec<String> = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && c.name != own.name && !self.is_dead(lease, &c.name))
            .map(|c| c.name.clone())
            .collect();
        for name in &stale {
            let Some((_, stat)) = self.read_candidate(&client, lease, name).await? else {
                continue;
            };
            if self
                .read_history(&client, lease, Term(stat.czxid as u64))
                .await?
                .is_some()
            {
                // Granted: a read-back may have adopted it. Handed over to this candidate (its
                // znode deleted, the lease reserved for us): this acquire takes it below.
                self.retire_granted(request, name, stat.czxid).await?;
            } else {
                self.delete_own(&client, lease, name).await?;
            }
        }
        queue.retain(|c| !stale.contains(&c.name));
        let (own, queue, position) = match queue.iter().position(|c| c.name == own.name) {
            Some(position) => (own, queue, position),
            None => {
                // Our znode was deleted by someone else (broken by an operator): queue again.
                // The new znode sorts after every listed one, so its place needs a new listing.
                self.set_own(lease, candidate, None);
                let (own, _) = self.enqueue(&client, lease, candidate, ttl, &prefix).await?;
                let queue = self.queue(&client, lease).await?.unwrap_or_default();
                let Some(position) = queue.iter().position(|c| c.name == own.name) else {
                    self.set_own(lease, candidate, None);
                    return Err(deleted_meanwhile(&own.name));
                };
                (own, queue, position)
            }
        };
        // The head: the first of the znodes up to ours that still exists (a garbage record is an
        // error, whoever's it is); and whether the lease is reserved for a handover's successor.
        let (head, reservation) = tokio::join!(
            self.head(&client, lease, &queue[..=position]),
            self.read_reservation(&client, lease)
        );
        let Some((first, record, stat)) = head? else {
            self.set_own(lease, candidate, None);
            return Err(deleted_meanwhile(&own.name));
        };
        if let Some(reservation) = reservation? {
            let ahead = queue[first..position].iter().map(|c| c.name.clone()).collect();
            let own = OwnNode { ahead, ..own };
            return self
                .acquire_reserved(request, &client, own, first == position, stat.version, &reservation)
                .await;
        }
        if first < position {
            let ahead = queue[first..position].iter().map(|c| c.name.clone()).collect();
            self.set_own(lease, candidate, Some(OwnNode { ahead, ..own }));
            return Ok(Acquired::Held(holder_observation(
                lease,
                &queue[first].name,
                &record,
                &stat,
            )));
        }
        // Every znode listed ahead of ours was read as gone, and none queued later sorts ahead:
        // ours heads the queue. The grant checks that it is unchanged.
        let own = OwnNode {
            ahead: Vec::new(),
            ..own
        };
        let outcome = self.grant(&client, lease, &own, candidate, stat.version).await?;
        self.answer(request, &client, own, outcome).await
    }

    /// Ends the term of a granted znode of the candidate's own that its acquire will not use.
    /// The engine asks again once that leadership ended for it, but this may also be an acquire
    /// it gave up on, still running, while it leads on that znode: the lease must stay this
    /// candidate's (`LeaseStore::acquire`), whereas deleting the znode would give it to the next
    /// in the queue. So the term is handed over to the candidate itself, and its acquire takes
    /// the reservation with a new term; nobody else can take it meanwhile.
    /// The caller has read the znode (a garbage record is an error before anything changes).
    async fn retire_granted(&self, request: &AcquireRequest, name: &str, czxid: i64) -> Result<()> {
        let grant = Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(czxid as u64),
            ttl: request.ttl,
            token: name.to_string(),
        };
        self.try_hand_over(&grant, &request.candidate).await
    }

    /// An acquire of a reserved lease (`own.ahead`: the znodes still queued ahead of ours;
    /// `head`: ours heads the queue, at data version `version`). The successor takes it, going
    /// before them; the head of the queue takes it over when the contender names the
    /// reservation's version (it saw it unchanged for its TTL); anyone else is told who it is
    /// reserved for.
    async fn acquire_reserved(
        self: &Arc<Self>,
        request: &AcquireRequest,
        client: &zk::Client,
        own: OwnNode,
        head: bool,
        version: i32,
        reservation: &ReservationRecord,
    ) -> Result<Acquired> {
        let (lease, candidate) = (&request.lease, &request.candidate);
        if reservation.to == *candidate {
            let outcome = self
                .take_reservation(client, lease, &own, candidate, reservation)
                .await?;
            return self.answer(request, client, own, outcome).await;
        }
        if head && request.takeover.as_deref() == Some(reservation.version().as_str()) {
            let own = OwnNode {
                ahead: Vec::new(),
                ..own
            };
            let outcome = self
                .grant_with(
                    client,
                    lease,
                    &own,
                    candidate,
                    version,
                    Some(reservation),
                    Ahead::MustBeGone,
                )
                .await?;
            return self.answer(request, client, own, outcome).await;
        }
        self.set_own(lease, candidate, Some(own));
        Ok(Acquired::Held(reservation.observation(lease)))
    }

    /// The answer to an acquire whose grant transaction went as `outcome`.
    async fn answer(
        self: &Arc<Self>,
        request: &AcquireRequest,
        client: &zk::Client,
        own: OwnNode,
        outcome: GrantOutcome,
    ) -> Result<Acquired> {
        let (lease, candidate) = (&request.lease, &request.candidate);
        match outcome {
            GrantOutcome::Granted => Ok(self.granted(lease, candidate, own, request.ttl, client, false).await),
            GrantOutcome::Reserved => {
                // Reserved since it was read, or no longer the reservation read. If our own
                // earlier acquire ended it (its reply was lost), our znode holds the lease now.
                let seen = self.observe(client, lease).await?;
                if seen
                    .holder
                    .as_ref()
                    .is_some_and(|h| h.version == own.name && !h.reserved)
                {
                    // Shown as holder without its history entry (first and waiting: see
                    // `turn`), its records are due: `observe` marked them so.
                    let records_due = self
                        .own(lease, candidate)
                        .is_some_and(|n| n.name == own.name && n.records_due);
                    let own = OwnNode { records_due, ..own };
                    return Ok(self.granted(lease, candidate, own, request.ttl, client, false).await);
                }
                self.set_own(lease, candidate, Some(own));
                Ok(Acquired::Held(seen))
            }
            // grant_with makes the directory and grants again: never answered.
            GrantOutcome::NoLeaderDir => Err(Error::store(
                STORE,
                Failed::new(format!("lease {lease} has no leader/ znode")),
            )),
            GrantOutcome::NotFirst | GrantOutcome::Gone | GrantOutcome::AheadLeft(_) => {
                self.set_own(lease, candidate, None);
                Err(deleted_meanwhile(&own.name))
            }
        }
    }
}

/// Our queued znode was deleted by someone else during an acquire (an operator's
/// `break_lease`): nothing was granted; the next acquire queues again.
fn deleted_meanwhile(name: &str) -> Error {
    Error::store(
        STORE,
        Failed::new(format!(
            "this candidate's znode {name} was deleted by someone else meanwhile (a break_lease?); nothing was granted"
        )),
    )
}
