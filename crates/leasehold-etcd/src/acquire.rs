//! The acquire path below the trait method (`store.rs`): queueing the candidate's key and
//! reading who is first ([`Inner::enqueue`], answered as a [`Queued`]), the keys ahead that a
//! reservation's take deletes, the one-shot grant of a queued candidate that has become first
//! (with its resends), and the records of a turn, written by the request that confirms it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};
use futures::stream::{FuturesUnordered, StreamExt};
use leasehold_core::{AcquireRequest, Error, Grant, Result, Term};
use tokio::time::Instant;

use crate::error::{STORE, lease_gone, map};
use crate::record::{
    Keys, Snapshot, candidate_value, granted_value, kvs_of, revision, session_ttl_secs, started_value,
};
use crate::state::{Inner, Position};

/// When a one-shot grant's transaction is sent again while the grant of its lease is unanswered,
/// counted from the first copy (see `Inner::grant_in_one_shot`).
const ONE_SHOT_RESENDS: [Duration; 4] = [
    Duration::from_millis(10),
    Duration::from_millis(30),
    Duration::from_millis(80),
    Duration::from_millis(200),
];

/// How long after a one-shot grant began one of its copies may still apply: its private lease
/// (granted no earlier, for `ttl_secs`) has expired by then, with etcd's revocation lag and a
/// margin (the entry in `Inner::one_shots` is kept that long, also after the key was withdrawn).
fn one_shot_reach(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1).max(1) * 2 + 1)
}

/// Whether a one-shot grant's transaction that failed its compare found the key bound to that
/// very grant's lease: an earlier copy of it applied.
fn applied_before(resp: &TxnResponse, rev: i64, private: i64) -> bool {
    kvs_of(&resp.op_responses(), 0)
        .first()
        .is_some_and(|kv| kv.create_revision() == rev && kv.lease() == private)
}

impl Inner {
    /// Grants a queued candidate that has become first in one transaction, needing no answer
    /// to any earlier request: so that it works even when replies are lost (the engine then
    /// settles the outcome by reading back).
    ///
    /// The promise needs the key to live a TTL from a moment after the request began. Instead of
    /// a confirmed keepalive of the shared session, the transaction binds the key to a fresh etcd
    /// lease, granted (with an id chosen here) as this request begins: if the transaction
    /// applies, that lease exists, and it was granted after this request began.
    ///
    /// etcd does not apply two requests in the order they were sent: the transaction often
    /// arrives before its lease exists and fails ("lease not found"; measured here in 35-58% of
    /// single tries). So it is sent again: once the lease grant is confirmed (then it finds the
    /// lease), and, while the grant's answer has not come (replies may be lost), a few times in
    /// the first fraction of a second without waiting for any answer. Each copy is the same
    /// compare-and-set on the key's place and the term's history key, so at most one applies;
    /// a copy that finds the key already bound to this request's lease knows an earlier copy
    /// applied. `None`: not first, or the fresh lease could not be granted; the caller takes
    /// the ordinary path.
    pub(crate) async fn grant_in_one_shot(
        self: &Arc<Self>,
        keys: &Keys,
        own: &str,
        request: &AcquireRequest,
        position: Position,
    ) -> Result<Option<Grant>> {
        let inner = self;
        let private = i64::try_from(leasehold_core::random_u64() >> 2).unwrap_or(1).max(1);
        inner.private.lock().expect("private lock").insert(private);
        let ttl_secs = position.ttl_secs;
        let begun = Instant::now();
        // A copy of this transaction may apply at any later moment (copies left unanswered,
        // or a dropped call), rebinding the key to the fresh lease: a grant on release of this
        // key counts from no later than now (see `Inner::one_shot_began`).
        inner
            .one_shots
            .lock()
            .expect("one-shots lock")
            .entry(own.to_string())
            .and_modify(|(p, at)| {
                if p.rev != position.rev || begun.saturating_duration_since(*at) >= one_shot_reach(p.ttl_secs) {
                    (*p, *at) = (position, begun);
                }
            })
            .or_insert((position, begun));
        // Spawned: the lease must be granted even if this call is dropped with copies of the
        // transaction under way.
        let mut lease_grant = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let mut client = inner.client();
                let options = etcd_client::LeaseGrantOptions::new().with_id(private);
                let limit = inner.config.timeout;
                inner
                    .call_shared("lease grant", limit, async move {
                        client.lease_grant(ttl_secs, Some(options)).await
                    })
                    .await
            })
        };
        let rev = position.rev;
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.to_string(), CompareOp::Equal, rev),
                // Every candidate key was created at or after ours: we are first.
                Compare::create_revision(keys.candidates(), CompareOp::Greater, rev - 1).with_prefix(),
                Compare::create_revision(keys.started(rev), CompareOp::Equal, 0),
                // A handed-over lease goes to its successor only (see `acquire`).
                Compare::create_revision(keys.reserved(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    own.to_string(),
                    candidate_value(request.ttl),
                    Some(PutOptions::new().with_lease(private)),
                ),
                TxnOp::put(keys.started(rev), started_value(&request.candidate), None),
                TxnOp::put(
                    keys.granted(),
                    granted_value(rev, request.ttl, &request.candidate),
                    None,
                ),
            ])
            .or_else([TxnOp::get(own.to_string(), None)]);
        let send = || {
            let mut client = inner.kv();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        };
        let mut answers = FuturesUnordered::new();
        answers.push(send());
        let mut resends = ONE_SHOT_RESENDS.iter().map(|after| begun + *after);
        let mut next_resend = resends.next();
        // `None` while the lease grant is unanswered; then whether etcd confirmed it.
        let mut lease: Option<bool> = None;
        // A copy answered that the lease was not there (yet).
        let mut not_yet = false;
        // A copy was sent after etcd confirmed the lease: it finds the lease unless it is gone.
        let mut sent_after_grant = false;
        let granted = loop {
            tokio::select! {
                Some(answer) = answers.next() => match answer {
                    Ok(resp) => break resp.succeeded() || applied_before(&resp, rev, private),
                    Err(e) if lease_gone(&e) => {
                        not_yet = true;
                        if lease == Some(true) && !sent_after_grant {
                            sent_after_grant = true;
                            answers.push(send());
                        } else if lease.is_some() && answers.is_empty() {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Err(map(&e, "acquire (grant)", &inner.endpoints)),
                },
                joined = &mut lease_grant, if lease.is_none() => {
                    let confirmed = matches!(joined, Ok(Ok(Some(_))));
                    lease = Some(confirmed);
                    next_resend = None;
                    if confirmed && (not_yet || answers.is_empty()) {
                        sent_after_grant = true;
                        answers.push(send());
                    } else if answers.is_empty() {
                        return Ok(None);
                    }
                },
                () = tokio::time::sleep_until(next_resend.unwrap_or(begun)), if next_resend.is_some() => {
                    answers.push(send());
                    next_resend = resends.next();
                },
                else => return Ok(None),
            }
        };
        if !granted {
            return Ok(None);
        }
        let position = Position {
            lease: private,
            granted: true,
            ..position
        };
        inner.publish(own, Some(position));
        Ok(Some(Grant {
            lease: request.lease.clone(),
            holder: request.candidate.clone(),
            term: Term(u64::try_from(rev).unwrap_or(0)),
            ttl: request.ttl,
            token: rev.to_string(),
        }))
    }

    /// Takes the candidate's place in the queue (a key already there stays, with its place) and
    /// reads who is first, in one transaction. A session that etcd no longer knows is replaced
    /// by a new one.
    pub(crate) async fn enqueue(&self, keys: &Keys, own: &str, request: &AcquireRequest) -> Result<Queued> {
        let retired_before = self.retired(own);
        let ttl_secs = session_ttl_secs(request.ttl);
        let mut session = self.session(ttl_secs).await?;
        let queue = |session: i64| {
            let [a, b, c, d] = Snapshot::reads(keys);
            let put = TxnOp::put(
                own.to_string(),
                candidate_value(request.ttl),
                Some(PutOptions::new().with_lease(session)),
            );
            Txn::new()
                .when([Compare::create_revision(own.to_string(), CompareOp::Equal, 0)])
                .and_then([put, a, b, c, d])
                .or_else({
                    let [a, b, c, d] = Snapshot::reads(keys);
                    [TxnOp::get(own.to_string(), None), a, b, c, d]
                })
        };
        let resp = match self.txn_unless_lease_gone("acquire", queue(session)).await? {
            Some(resp) => resp,
            None => {
                // The session expired (the process was cut off for a TTL): a new one.
                self.forget_session(ttl_secs, session).await;
                session = self.session(ttl_secs).await?;
                self.txn("acquire", queue(session)).await?
            }
        };
        let ops = resp.op_responses();
        let snapshot = Snapshot::parse(keys, &ops, 1)?;
        let (rev, lease) = if resp.succeeded() {
            (revision(&resp), session)
        } else {
            let kv = kvs_of(&ops, 0)
                .first()
                .ok_or_else(|| Error::corrupt(STORE, &request.lease, "own key vanished inside a transaction"))?;
            let me = keys.parse_candidate(kv)?;
            (me.rev, me.lease)
        };
        let private = self.private.lock().expect("private lock").contains(&lease);
        Ok(Queued {
            session,
            snapshot,
            rev,
            lease,
            private,
            retired: rev <= retired_before,
        })
    }

    /// The candidate keys queued ahead of revision `rev`, with their create_revisions. A
    /// successor taking a reservation deletes them in its grant, so that no key created before
    /// its term is ever granted after it (terms keep increasing); their candidates find their
    /// place gone and queue again, behind it. Keys ahead only ever leave (new keys queue
    /// behind), so the take compares each one still there.
    pub(crate) async fn keys_ahead(&self, keys: &Keys, rev: i64) -> Result<Vec<(String, i64)>> {
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_keys_only();
        let resp = self
            .get("acquire (keys ahead)", keys.candidates(), Some(options))
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.create_revision()))
            .collect())
    }

    /// When a one-shot grant of `own` at `position` began, if one may still apply: a copy left
    /// unanswered may bind the key to its own lease, granted after that one-shot began, at any
    /// later moment (also once a release has made the key first): a turn of that key counts from
    /// no later than this.
    pub(crate) fn one_shot_began(&self, own: &str, position: Position) -> Option<Instant> {
        let one_shots = self.one_shots.lock().expect("one-shots lock");
        one_shots
            .get(own)
            .filter(|(p, began)| p.rev == position.rev && began.elapsed() < one_shot_reach(p.ttl_secs))
            .map(|(_, began)| *began)
    }

    /// Writes the records of the turn of `own` at `term` (its history entry and its
    /// announcement), if they are due: one transaction, only while the key is still the one
    /// granted and no other request wrote them. A key gone meanwhile leaves nothing due (the
    /// request that follows finds it gone).
    pub(crate) async fn write_records_due(&self, keys: &Keys, own: &str, term: Term) -> Result<()> {
        let due = self.place(own, |p| p.records_due.clone());
        let Some(due) = due.filter(|d| u64::try_from(d.rev).ok() == Some(term.0)) else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.to_string(), CompareOp::Equal, due.rev),
                Compare::create_revision(keys.started(due.rev), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(keys.started(due.rev), started_value(&due.holder), None),
                TxnOp::put(keys.granted(), granted_value(due.rev, due.ttl, &due.holder), None),
            ]);
        self.txn("renew (records)", txn).await?;
        self.place(own, |p| p.records_due.take_if(|d| d.rev == due.rev));
        Ok(())
    }
}

/// The candidate's key after [`Inner::enqueue`], and what the read beside it showed.
pub(crate) struct Queued {
    /// The session of the request's TTL.
    pub(crate) session: i64,
    pub(crate) snapshot: Snapshot,
    /// The key's create_revision: its place in the queue.
    pub(crate) rev: i64,
    /// The etcd lease the key is bound to.
    pub(crate) lease: i64,
    /// Whether that lease is one of a one-shot grant.
    pub(crate) private: bool,
    /// Whether this store had begun to delete the key before the acquire began (see
    /// `Inner::retire`): a deletion that failed or whose outcome is unknown, its key still there.
    pub(crate) retired: bool,
}

impl Queued {
    /// A key that may be granted: bound to this store's session (or a one-shot lease of it) and
    /// not granted before. A key of another session is an earlier incarnation of this
    /// candidate (its leadership has ended) or another process using the same id; a key
    /// granted before means that leadership ended (the engine asks again only then). Either
    /// must go, and the candidate queue afresh with a new term.
    pub(crate) fn is_stale(&self) -> bool {
        let foreign = self.lease != self.session && !self.private;
        foreign || self.retired || self.granted_before()
    }

    pub(crate) fn granted_before(&self) -> bool {
        self.snapshot.started.as_ref().is_some_and(|s| s.term == self.rev)
    }

    pub(crate) fn position(&self, ttl_secs: i64, granted: bool) -> Position {
        Position {
            rev: self.rev,
            lease: self.lease,
            ttl_secs,
            granted,
        }
    }
}
