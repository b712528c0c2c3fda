//! The state a store's parts share, at the bottom of the crate: [`Inner`] (what every clone of
//! an `EtcdStore` holds: the connection, the sessions, where each candidate key of this process
//! stands, the one-shot grants and the watched leases)
//! and the types it owns, with the bookkeeping of the places (published to change streams,
//! retired as deleted, taken as a turn). It imports none of the modules that use it; their
//! operations on it are `impl Inner` blocks of their own.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use leasehold_core::{CandidateId, Error, Grant, LeaseName, Observation, Result, Term};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::error::STORE;
use crate::record::{Keys, Snapshot};

/// Where a candidate's key stands, as its last `acquire` saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// The key's create_revision.
    pub(crate) rev: i64,
    /// The session (etcd lease) the key is bound to.
    pub(crate) lease: i64,
    /// The session's TTL in seconds.
    pub(crate) ttl_secs: i64,
    /// Whether it was granted (first in the queue).
    pub(crate) granted: bool,
}

/// An etcd lease held by this store.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) id: i64,
    /// When the last keepalive (or the grant) that etcd confirmed was *sent*: the lease lives at
    /// least its TTL from a moment after this.
    pub(crate) confirmed: Instant,
    /// The keys bound to the lease, read after a keepalive sent at the given instant.
    pub(crate) keys: Option<(Instant, Arc<HashSet<Vec<u8>>>)>,
}

/// The shared watch of one lease: subscribers take receivers of its sender.
pub(crate) struct Announcer {
    pub(crate) sender: watch::Sender<Option<Observation>>,
    /// The term named by the latest release marker the watch saw (`record::released_value`):
    /// that term's key was first in the queue, with no reservation, when its holder released it.
    pub(crate) released: watch::Sender<Option<i64>>,
    /// Which watch this is (a lease watched again after one ended has a new one).
    pub(crate) id: u64,
}

/// Where one candidate key of this process stands (see `Inner::positions`).
pub(crate) struct Place {
    /// Its place, as the store's last answer for it saw it; read by its change stream.
    pub(crate) position: watch::Sender<Option<Position>>,
    /// The greatest create_revision of the key this store has begun to delete (a release,
    /// hand-over, withdrawal or a requeue's clear): a place at or below it is never published
    /// again (see [`Inner::retire`]).
    pub(crate) retired: i64,
    /// The TTL its candidate's latest acquire asked for (a turn grants it).
    pub(crate) asked: Duration,
    /// A turn its change stream gave (see `changes`) whose records (the term's history entry and
    /// announcement) are still to be written: by the engine's confirmation, its next renewal
    /// (or a release or hand-over sent first).
    pub(crate) records_due: Option<RecordsDue>,
}

/// The records of a term granted by a turn, written by the term's first renewal.
#[derive(Clone, Debug)]
pub(crate) struct RecordsDue {
    pub(crate) rev: i64,
    pub(crate) ttl: Duration,
    pub(crate) holder: CandidateId,
}

/// What every clone of an `EtcdStore` shares, and its change streams and announcement watches
/// hold (weakly, for the watches).
pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    /// The endpoints as errors name them: `h1:2379,h2:2379`.
    pub(crate) endpoints: String,
    pub(crate) client: Client,
    /// One session per etcd lease TTL (whole seconds).
    pub(crate) sessions: Mutex<HashMap<i64, Arc<AsyncMutex<Option<Session>>>>>,
    /// The current session id per TTL, readable without waiting for a keepalive in flight.
    pub(crate) current: Mutex<HashMap<i64, i64>>,
    /// Where each candidate key of this process stands, for its change stream.
    pub(crate) positions: Mutex<HashMap<String, Place>>,
    /// etcd leases granted for one grant each (see `Inner::grant_in_one_shot`).
    pub(crate) private: Mutex<HashSet<i64>>,
    /// Per candidate key: the position of its latest one-shot grant, and when the first one for
    /// that position began (a turn of that key counts from no later, see
    /// `Inner::one_shot_began`).
    pub(crate) one_shots: Mutex<HashMap<String, (Position, Instant)>>,
    /// One watch per followed lease, shared by its followers in this store (see `announce`).
    pub(crate) announcers: Mutex<HashMap<LeaseName, Announcer>>,
}

impl Inner {
    /// Runs `f` on the place of `own` (made, with nothing published, on first use).
    pub(crate) fn place<T>(&self, own: &str, f: impl FnOnce(&mut Place) -> T) -> T {
        let mut positions = self.positions.lock().expect("positions lock");
        if let Some(place) = positions.get_mut(own) {
            return f(place); // the common case: no key copied
        }
        let place = positions.entry(own.to_string()).or_insert_with(|| Place {
            position: watch::channel(None).0,
            retired: 0,
            asked: Duration::ZERO,
            records_due: None,
        });
        f(place)
    }

    pub(crate) fn position(&self, own: &str) -> watch::Sender<Option<Position>> {
        self.place(own, |place| place.position.clone())
    }

    /// Tells the candidate's change stream where its key stands. A place the store has begun
    /// to delete is published as none (see [`Inner::retire`]).
    pub(crate) fn publish(&self, own: &str, position: Option<Position>) {
        self.place(own, |place| {
            let position = position.filter(|p| p.rev > place.retired);
            place.position.send_if_modified(|p| {
                let changed = *p != position;
                *p = position;
                changed
            });
        });
    }

    /// The key `own` created at `rev` is about to be deleted by this store: its place is no
    /// longer published, from now on. An operation still under way that read the key before
    /// (a late acquire, a renewal) would otherwise publish it again once the deletion is
    /// done, and its change stream would wait in a place that no longer exists: on that
    /// place's predecessor's release it would be granted on release (no request) a deleted
    /// key's term, beside the candidate truly next (two leaders; review test
    /// `review_release.rs`). A key of this store found at or below it is stale (`enqueue`).
    pub(crate) fn retire(&self, own: &str, rev: i64) {
        self.place(own, |place| {
            place.retired = place.retired.max(rev);
            if place.position.borrow().is_some_and(|p| p.rev <= rev) {
                place.position.send_replace(None);
            }
        });
    }

    /// The greatest create_revision of `own` this store has begun to delete (0: none).
    pub(crate) fn retired(&self, own: &str) -> i64 {
        let positions = self.positions.lock().expect("positions lock");
        positions.get(own).map_or(0, |place| place.retired)
    }

    /// The change stream of `own` found its key first at `position` by waiting (its
    /// predecessor released while first): the grant of that turn, its place published as
    /// granted, and its records due. `None` when the store has begun to delete the key.
    pub(crate) fn take_turn(&self, keys: &Keys, own: &str, holder: &CandidateId, position: Position) -> Option<Grant> {
        self.place(own, |place| {
            if position.rev <= place.retired || *place.position.borrow() != Some(position) {
                return None;
            }
            let rev = position.rev;
            place.records_due = Some(RecordsDue {
                rev,
                ttl: place.asked,
                holder: holder.clone(),
            });
            place.position.send_replace(Some(Position {
                granted: true,
                ..position
            }));
            Some(Grant {
                lease: keys.lease.clone(),
                holder: holder.clone(),
                term: Term(u64::try_from(rev).unwrap_or(0)),
                ttl: place.asked,
                token: rev.to_string(),
            })
        })
    }

    /// `snapshot` as this store may show it: an error (transient) when its holder is a key this
    /// store has begun to delete (see [`Inner::retire`]). A deletion that failed leaves such a
    /// key in place until the engine sends it again; shown as holder, the engine's
    /// read-back could adopt its term (an acquire of the same candidate whose answer was lost)
    /// and lead on a key that the resent deletion then deletes under it (review finding).
    pub(crate) fn unretired(&self, keys: &Keys, lease: &LeaseName, snapshot: Snapshot) -> Result<Snapshot> {
        let Some(holder) = snapshot.holder() else {
            return Ok(snapshot);
        };
        if self.retired(&keys.candidate(&holder.id)) >= holder.rev {
            return Err(Error::unreachable(
                STORE,
                format!(
                    "the holder of {lease} (term {}) is a key this store is deleting (a release, hand-over or withdrawal that failed is sent again): look again",
                    holder.rev
                ),
            ));
        }
        Ok(snapshot)
    }
}
