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
use std::ops::Range;
use std::time::Duration;

use futures::future::join_all;
use leasehold_core::{Error, Grant, Operation, Renewed, Result};
use zookeeper_client as zk;

use crate::error::{Failed, STORE, disconnected, during, zk_error};
use crate::record::CandidateRecord;
use crate::store::{Inner, OwnNode, ZookeeperStore};

/// The most bytes one multi-read of a batch renewal may cost, by [`read_cost`]: ZooKeeper
/// refuses a request (and its client a reply) larger than `jute.maxbuffer`, 1 MiB less a little
/// by default. Half of that leaves room for servers configured lower and for records larger
/// than leasehold writes.
const READ_BYTES: usize = 512 * 1024;

/// An upper bound of the bytes one grant's read adds to a multi-read's request and to its
/// reply: the path (request), the candidate record and the stat (reply), and their headers.
fn read_cost(path: &str, grant: &Grant) -> usize {
    path.len() + grant.holder.as_str().len() + 192
}

/// Consecutive ranges of items, together covering all of them in order, each costing at most
/// `budget` (an item that costs more alone is a range of its own).
fn chunks(costs: impl IntoIterator<Item = usize>, budget: usize) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut spent, mut end) = (0, 0, 0);
    for (k, cost) in costs.into_iter().enumerate() {
        if k > start && spent + cost > budget {
            chunks.push(start..k);
            (start, spent) = (k, 0);
        }
        spent += cost;
        end = k + 1;
    }
    if end > start {
        chunks.push(start..end);
    }
    chunks
}

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

impl ZookeeperStore {
    pub(crate) async fn try_renew(&self, grant: &Grant) -> Result<Renewed> {
        let inner = &self.inner;
        let client = connected(inner, grant.ttl).await.map_err(NotConnected::error)?;
        let path = inner.candidate_path(&grant.lease, &grant.token);
        // Both requests leave now, in order; the read is served after the sync.
        let (synced, read) = tokio::join!(
            client.sync(&path),
            inner.read_candidate(&client, &grant.lease, &grant.token)
        );
        synced.map_err(zk_error)?;
        let ours = read?.is_some_and(|(record, stat)| is_ours(grant, &record, &stat, client.session_id().0));
        self.verdict(grant, &client, ours).await
    }

    /// What `renew` answers once it knows whether the grant's znode is still ours.
    async fn verdict(&self, grant: &Grant, client: &zk::Client, ours: bool) -> Result<Renewed> {
        let inner = &self.inner;
        if !ours {
            return Ok(Renewed::Lost(inner.observe(client, &grant.lease).await?));
        }
        if inner
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
            };
            inner.set_own(&grant.lease, &grant.holder, Some(node));
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
        let inner = &self.inner;
        let client = match connected(inner, ttl).await {
            Ok(client) => client,
            Err(not) => return indices.iter().map(|_| Err(not.error())).collect(),
        };
        let paths: Vec<String> = indices
            .iter()
            .map(|&i| inner.candidate_path(&grants[i].lease, &grants[i].token))
            .collect();
        let costs = paths.iter().zip(indices).map(|(path, &i)| read_cost(path, &grants[i]));
        let chunks = chunks(costs, READ_BYTES);
        // Every request leaves now, the sync first: the reads are served after it.
        let synced = client.sync(&paths[0]);
        let reads = chunks.iter().map(|chunk| {
            let mut reader = client.new_multi_reader();
            let added: std::result::Result<(), zk::Error> = paths[chunk.clone()]
                .iter()
                .try_for_each(|path| reader.add_get_data(path));
            let sent = added.map(|()| reader.commit());
            async move {
                match sent {
                    Ok(reply) => reply.await,
                    Err(e) => Err(e),
                }
            }
        });
        let (synced, read) = tokio::join!(synced, join_all(reads));
        let session = client.session_id().0;
        // Whether each grant is still ours, or the error its renewal fails with.
        let mut found: Vec<Result<bool>> = Vec::with_capacity(indices.len());
        for (chunk, read) in chunks.iter().zip(read) {
            let results = match (&synced, read) {
                (Err(e), _) => {
                    found.extend(chunk.clone().map(|_| Err(zk_error(e.clone()))));
                    continue;
                }
                (Ok(()), Err(e)) => {
                    found.extend(chunk.clone().map(|_| Err(zk_error(e.clone()))));
                    continue;
                }
                (Ok(()), Ok(results)) if results.len() == chunk.len() => results,
                (Ok(()), Ok(results)) => {
                    let text = format!(
                        "ZooKeeper answered a multi-read of {} znodes with {} results",
                        chunk.len(),
                        results.len()
                    );
                    found.extend(
                        chunk
                            .clone()
                            .map(|_| Err(Error::store(STORE, Failed::new(text.clone())))),
                    );
                    continue;
                }
            };
            for (k, result) in chunk.clone().zip(results) {
                let grant = &grants[indices[k]];
                found.push(match result {
                    zk::MultiReadResult::Data { data, stat } => CandidateRecord::decode(&data)
                        .map(|record| is_ours(grant, &record, &stat, session))
                        .map_err(|detail| {
                            Error::corrupt(
                                STORE,
                                &grant.lease,
                                format!("candidate znode {}: {detail}", grant.token),
                            )
                        }),
                    zk::MultiReadResult::Error { err: zk::Error::NoNode } => Ok(false),
                    zk::MultiReadResult::Error { err } => Err(zk_error(err)),
                    _ => Err(Error::store(
                        STORE,
                        Failed::new("ZooKeeper answered a read of a candidate znode with something else"),
                    )),
                });
            }
        }
        // Those found lost are observed, all at once, as renew does.
        join_all(indices.iter().zip(found).map(|(&i, found)| {
            let client = &client;
            async move { self.verdict(&grants[i], client, found?).await }
        }))
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_every_item_once_in_order_within_the_budget() {
        assert!(chunks([], 10).is_empty());
        assert_eq!(chunks([3, 3, 3], 10), vec![0..3]);
        assert_eq!(chunks([4, 4, 4, 4, 4], 10), vec![0..2, 2..4, 4..5]);
        // An item over the budget goes alone; the budget is never exceeded otherwise.
        assert_eq!(chunks([2, 25, 2, 2], 10), vec![0..1, 1..2, 2..4]);
        assert_eq!(chunks([10, 10], 10), vec![0..1, 1..2]);
    }

    #[test]
    fn a_thousand_leases_of_the_longest_names_need_at_most_two_reads() {
        // The longest lease name (128) and candidate id (256) under a 64-byte chroot.
        let cost = super::read_cost(&"x".repeat(64 + 1 + 128 + 12 + 30), &grant(256));
        assert_eq!(chunks(vec![cost; 1000], super::READ_BYTES).len(), 2);
        // Typical names: one read.
        let cost = super::read_cost(
            "/leasehold/shards-17/candidates/c-0123456789abcdef-0000000042",
            &grant(8),
        );
        assert_eq!(chunks(vec![cost; 1000], super::READ_BYTES).len(), 1);
    }

    fn grant(holder_len: usize) -> leasehold_core::Grant {
        leasehold_core::Grant {
            lease: "l".parse().expect("lease"),
            holder: leasehold_core::CandidateId::new("h".repeat(holder_len)).expect("id"),
            term: leasehold_core::Term(1),
            ttl: std::time::Duration::from_secs(1),
            token: String::new(),
        }
    }
}
