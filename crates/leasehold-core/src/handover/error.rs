//! Why a hand-over request failed.

use std::time::Duration;

use super::TargetCheck;
use crate::error::Error;
use crate::time::Human;
use crate::types::{CandidateId, LeaseName, Term};

/// Why a hand-over request failed. Each `Display` is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandOverError {
    /// The lease's name leaves no room for the request lease `LEASE.handover`.
    #[error(
        "cannot hand over lease {lease}: its name is too long for the request lease {lease}.handover (lease names \
         have at most {} characters)",
        crate::types::MAX_LEASE_NAME_LEN
    )]
    NameTooLong {
        /// The lease.
        lease: LeaseName,
    },
    /// Nobody holds the lease: the successor takes it by campaigning.
    #[error("cannot hand over lease {lease}: nobody holds it ({to} takes it by campaigning)")]
    NobodyHolds {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
    },
    /// The store lists the lease's candidates, and the successor was not among them for a whole
    /// TTL of the holder (a candidate that campaigns is listed within a round trip or two).
    #[error(
        "cannot hand over lease {lease} to {to}: {to} is not campaigning for it ({}); start it first, or check the id",
        campaigning_text(campaigning)
    )]
    NotCampaigning {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// The candidates the store lists, in its queue order.
        campaigning: Vec<CandidateId>,
    },
    /// The lease is being handed over to someone else.
    #[error(
        "cannot hand over lease {lease} to {to}: it is being handed over to {other} (term {term} ended; reserved for \
         {other} until it takes the lease or the reservation's TTL passes)"
    )]
    ReservedForAnother {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// The candidate it is reserved for.
        other: CandidateId,
        /// The handed-over term.
        term: Term,
    },
    /// Someone else's request is on the request lease.
    #[error(
        "cannot hand over lease {lease} to {to}: another handover, to {other}, is in progress ({lease}.handover is \
         held at term {term}; a request whose requester died lapses after its TTL, {})",
        Human(*ttl)
    )]
    InProgress {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// The successor the other request names.
        other: CandidateId,
        /// The other request's term.
        term: Term,
        /// The other request's TTL.
        ttl: Duration,
    },
    /// The request lease was not granted in time (and nobody else holds it).
    #[error("cannot ask for a handover of lease {lease}: {lease}.handover was not granted within {}", Human(*within))]
    RequestNotGranted {
        /// The lease.
        lease: LeaseName,
        /// How long the request waited.
        within: Duration,
    },
    /// The requester lost the request lease before the holder acted on it.
    #[error(
        "lost the handover request {lease}.handover{why} before {holder} stepped down from lease {lease}; nothing \
         was handed over"
    )]
    RequestLost {
        /// The lease.
        lease: LeaseName,
        /// The holder that was asked.
        holder: CandidateId,
        /// Why, with a leading `": "`, or empty.
        why: String,
    },
    /// The holder did not act on the request in time: it does not watch requests.
    #[error(
        "{holder} still leads lease {lease} at term {term} after {}: it did not act on the request in \
         {lease}.handover (a leader watches it once per renewal: `leasehold run` does, and an Elector built with \
         hand_over_requests(true))",
        Human(*within)
    )]
    Ignored {
        /// The lease.
        lease: LeaseName,
        /// The holder.
        holder: CandidateId,
        /// Its term.
        term: Term,
        /// How long the request waited.
        within: Duration,
    },
    /// The successor did not take the lease in time.
    #[error(
        "{to} did not take lease {lease} within {}; the lease opens to everyone{}{}",
        Human(*within),
        reservation_ttl.map(|ttl| format!(" once the reservation's TTL ({}) has passed", Human(ttl))).unwrap_or_default(),
        if *target == TargetCheck::StoreCannotList {
            format!(" (the store keeps no list of candidates, so whether {to} campaigns was not checked)")
        } else {
            String::new()
        }
    )]
    NotTaken {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// How long the request waited.
        within: Duration,
        /// The reservation's TTL, when the lease was last seen reserved for `to`.
        reservation_ttl: Option<Duration>,
        /// Whether `to` was seen campaigning first.
        target: TargetCheck,
    },
    /// The successor did not take the lease in time, and the last look at it failed.
    #[error("{to} did not take lease {lease} within {}; the last look at it failed: {source}", Human(*within))]
    LastLookFailed {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// How long the request waited.
        within: Duration,
        /// The failed read.
        #[source]
        source: Error,
    },
    /// Another candidate took the lease.
    #[error("{holder} took lease {lease} at term {term}, not {to}")]
    TakenByAnother {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// Who took it.
        holder: CandidateId,
        /// At which term.
        term: Term,
    },
    /// The old holder leads again.
    #[error("{holder} leads lease {lease} again at term {term}: {to} did not take it")]
    TakenBack {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// The old holder.
        holder: CandidateId,
        /// Its new term.
        term: Term,
    },
    /// The lease was handed to someone else meanwhile.
    #[error("lease {lease} was handed over to {other} (term {term} ended), not to {to}")]
    HandedToAnother {
        /// The lease.
        lease: LeaseName,
        /// The successor asked for.
        to: CandidateId,
        /// The candidate it was handed to.
        other: CandidateId,
        /// The handed-over term.
        term: Term,
    },
    /// A store operation failed; `context` says which.
    #[error("{context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The store's error.
        #[source]
        source: Error,
    },
}

fn campaigning_text(campaigning: &[CandidateId]) -> String {
    if campaigning.is_empty() {
        return "the store lists no candidates".into();
    }
    let names: Vec<&str> = campaigning.iter().map(CandidateId::as_str).collect();
    format!("the store lists {}", names.join(", "))
}
