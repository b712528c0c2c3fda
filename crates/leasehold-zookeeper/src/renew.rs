//! Renewals: one grant (`sync` and a read of its znode), or many at once (`sync` and one
//! multi-read per session, whatever the number of grants).
//!
//! A grant is still held while its znode exists with the grant's term as `czxid`, the grant's
//! candidate in its record, and the grant's session as its ephemeral owner: the server deletes
//! the znode when the session expires, an operator's break and a handover delete it too. The
//! `sync` sent first is the round trip that proves the session alive after the renewal began
//! (the server then keeps it, and the znode, for a full session timeout from then), and brings
//! the server the reads go to up to date with the ensemble's leader: the reads that follow it
//! on the same session are served after it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use leasehold_core::{Error, Grant, Operation, Renewed, Result};
use zookeeper_client as zk;

use crate::error::{Failed, STORE, disconnected, during, map};
use crate::reads::{Got, READ_BYTES, Read, read_many};
use crate::record::CandidateRecord;
use crate::state::{Inner, OwnNode};

/// Whether a read znode is the grant's, on `session`.
fn is_ours(grant: &Grant, record: &CandidateRecord, stat: &zk::Stat, session: i64) -> bool {
    record.candidate == grant.holder && stat.czxid as u64 == grant.term.0 && stat.ephemeral_owner == session
}

/// Why a grant's session cannot renew it now.
#[derive(Clone, Copy)]
enum NotConnected {
    /// The session has expired: the server has deleted (or is deleting) its znodes.
    Expired,
    /// The session is not connected right now.
    State(zk::SessionState),
}

impl NotConnected {
    fn error(self) -> Error {
        match self {
            NotConnected::Expired => Error::unreachable(
                STORE,
                "the session of this grant has expired (the server has deleted its znode)",
            ),
            NotConnected::State(state) => disconnected(state),
        }
    }
}

/// The session grants of this TTL were made on, connected now (as `renew` requires).
async fn connected(inner: &Inner, ttl: Duration) -> std::result::Result<zk::Client, NotConnected> {
    let Some(client) = inner.existing_session(ttl).await else {
        return Err(NotConnected::Expired);
    };
    let state = client.state();
    if state != zk::SessionState::SyncConnected {
        return Err(NotConnected::State(state));
    }
    Ok(client)
}

impl Inner {
    pub(crate) async fn try_renew(&self, grant: &Grant) -> Result<Renewed> {
        let client = connected(self, grant.ttl).await.map_err(NotConnected::error)?;
        let path = self.candidate_path(&grant.lease, &grant.token);
        // A turn's confirmation writes the term's records first (see `turn`); then both
        // requests leave, in order; the read is served after the sync.
        self.write_records_due(&client, &grant.lease, &grant.holder, &grant.token, grant.term)
            .await?;
        let (synced, read) = tokio::join!(
            client.sync(&path),
            self.read_candidate(&client, &grant.lease, &grant.token)
        );
        synced.map_err(map)?;
        let ours = read?.is_some_and(|(record, stat)| is_ours(grant, &record, &stat, client.session_id().0));
        self.verdict(grant, &client, ours).await
    }

    /// What `renew` answers once it knows whether the grant's znode is still ours.
    async fn verdict(&self, grant: &Grant, client: &zk::Client, ours: bool) -> Result<Renewed> {
        if !ours {
            return Ok(Renewed::Lost(self.observe(client, &grant.lease).await?));
        }
        if self
            .own(&grant.lease, &grant.holder)
            .is_none_or(|n| n.name != grant.token || !n.granted)
        {
            let node = OwnNode {
                name: grant.token.clone(),
                czxid: grant.term.0 as i64,
                session: client.session_id().0,
                client: client.clone(),
                ahead: Vec::new(),
                granted: true,
                // Adopted by a read-back that showed it: its entry may not exist yet (a waiting
                // head holds the lease before it), and writing it is a no-op when it does.
                records_due: true,
            };
            self.set_own(&grant.lease, &grant.holder, Some(node));
        }
        Ok(Renewed::Renewed(grant.clone()))
    }

    /// Renews many grants: per session (one per TTL), one `sync` and one multi-read of every
    /// grant's znode (more than one when they would not fit in one request), all sent at once;
    /// a grant found lost is then observed as `renew` does. Each answer, also each error, is
    /// the one `renew` of that grant gives.
    pub(crate) async fn try_renew_many(&self, grants: &[Grant]) -> Vec<Result<Renewed>> {
        let mut by_ttl: BTreeMap<Duration, Vec<usize>> = BTreeMap::new();
        for (i, grant) in grants.iter().enumerate() {
            by_ttl.entry(grant.ttl).or_default().push(i);
        }
        let sessions = join_all(by_ttl.into_iter().map(|(ttl, indices)| async move {
            let answers = self.renew_on_session(grants, ttl, &indices).await;
            indices.into_iter().zip(answers).collect::<Vec<_>>()
        }))
        .await;
        let mut answers: Vec<Option<Result<Renewed>>> = grants.iter().map(|_| None).collect();
        for (i, answer) in sessions.into_iter().flatten() {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .zip(grants)
            .map(|(answer, grant)| {
                answer
                    .unwrap_or_else(|| Err(Error::engine("a grant of the batch got no answer")))
                    .map_err(|e| during(e, Operation::Renew, &format_args!("lease {}", grant.lease)))
            })
            .collect()
    }

    /// The answers for `grants[i]` for each `i` of `indices`, all of one TTL (one session), in
    /// that order.
    async fn renew_on_session(&self, grants: &[Grant], ttl: Duration, indices: &[usize]) -> Vec<Result<Renewed>> {
        let client = match connected(self, ttl).await {
            Ok(client) => client,
            Err(not) => return indices.iter().map(|_| Err(not.error())).collect(),
        };
        let reads: Vec<Read> = indices
            .iter()
            .map(|&i| Read::Data(self.candidate_path(&grants[i].lease, &grants[i].token)))
            .collect();
        let Some(Read::Data(first)) = reads.first() else {
            return Vec::new();
        };
        // Turns' confirmations write their terms' records first (see `turn`): a grant whose
        // records could not be written answers that error.
        let records = join_all(indices.iter().map(|&i| {
            let grant = &grants[i];
            self.write_records_due(&client, &grant.lease, &grant.holder, &grant.token, grant.term)
        }))
        .await;
        // The sync leaves first, then the reads: they are served after it.
        let (synced, read) = tokio::join!(client.sync(first), read_many(&client, &reads, READ_BYTES));
        let session = client.session_id().0;
        // Whether each grant is still ours, or the error its renewal fails with.
        let found: Vec<Result<bool>> = indices
            .iter()
            .zip(read)
            .zip(records)
            .map(|((&i, read), records)| {
                let grant = &grants[i];
                records?;
                synced.clone().map_err(map)?;
                match read.map_err(map)? {
                    Got::Data(data, stat) => CandidateRecord::decode(&data)
                        .map(|record| is_ours(grant, &record, &stat, session))
                        .map_err(|detail| {
                            Error::corrupt(
                                STORE,
                                &grant.lease,
                                format!("candidate znode {}: {detail}", grant.token),
                            )
                        }),
                    Got::NoNode => Ok(false),
                    Got::Children(_) => Err(Error::store(
                        STORE,
                        Failed::new("ZooKeeper answered a read of a candidate znode with a listing"),
                    )),
                }
            })
            .collect();
        // Those found lost are observed, all at once, as renew does.
        join_all(indices.iter().zip(found).map(|(&i, found)| {
            let client = &client;
            async move { self.verdict(&grants[i], client, found?).await }
        }))
        .await
    }
}
