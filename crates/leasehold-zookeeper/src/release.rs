//! The paths that end a candidate's znode: a hand-over (also of a term to its own candidate,
//! by an acquire), a release, and a withdrawal (of a cached znode, or of the znodes an acquire
//! left queued when its reply was lost). Each is one pass of requests, never a retry (the
//! engine retries, reading back first, and sends a deletion whose outcome is unknown again).

use std::sync::Arc;

use leasehold_core::{CandidateId, EndReason, Error, Grant, LeaseName, Result};
use zookeeper_client as zk;

use crate::error::{Failed, STORE, map};
use crate::queue::Ending;
use crate::record::{HistoryRecord, ReservationRecord, history_name};
use crate::state::Inner;

// Needs the store's internals: a reply lost on the way is simulated by forgetting the znode an
// acquire cached (`Inner::set_own`), and "no session opened" is read from `Inner::sessions`.
#[cfg(test)]
mod tests;

impl Inner {
    pub(crate) async fn try_hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let lease = &grant.lease;
        let Some(client) = self.existing_session(grant.ttl).await else {
            return Ok(()); // the session is gone, and the znode with it
        };
        let path = self.candidate_path(lease, &grant.token);
        let history_path = format!("{}/{}", self.history_dir(lease), history_name(grant.term));
        let (stat, history, dir) = tokio::join!(
            client.check_stat(&path),
            client.get_data(&history_path),
            client.check_stat(&self.lease_dir(lease))
        );
        let Some(stat) = stat.map_err(map)? else {
            self.set_own(lease, &grant.holder, None);
            return Ok(());
        };
        if stat.czxid as u64 != grant.term.0 || stat.ephemeral_owner != client.session_id().0 {
            return Ok(()); // not our znode any more
        }
        let history = match history {
            Ok((data, stat)) => Some((HistoryRecord::decode(&data).ok(), stat.version)),
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(map(e)),
        };
        let Some(dir) = dir.map_err(map)? else {
            return Ok(()); // the lease's znodes are gone, ours with them
        };
        let reservation = ReservationRecord {
            to: to.clone(),
            term: grant.term,
            ttl: grant.ttl,
            generation: dir.version.wrapping_add(1),
        };
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let ended = match &history {
            Some((Some(record), _)) => record.clone().ended(EndReason::HandedOver),
            _ => HistoryRecord::new(grant.holder.clone()).ended(EndReason::HandedOver),
        };
        let doorbell = self.doorbell_path(lease, to);
        // One transaction: the reservation's generation, the term ended in the history, our
        // znode deleted, the reservation created, and the successor's doorbell rung (created
        // and deleted: its change stream watches for the creation).
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
        add(writer.add_set_data(&self.lease_dir(lease), &[], Some(dir.version)))?;
        add(writer.add_delete(&path, Some(stat.version)))?;
        match &history {
            Some((_, version)) => add(writer.add_set_data(&history_path, &ended.encode(), Some(*version)))?,
            None => add(writer.add_create(&history_path, &ended.encode(), &options))?,
        }
        add(writer.add_create(&self.reserved_path(lease), &reservation.encode(), &options))?;
        add(writer.add_create(&doorbell, &[], &options))?;
        add(writer.add_delete(&doorbell, None))?;
        match writer.commit().await {
            Ok(_) => {}
            // Our znode went meanwhile (expired or broken): nothing to hand over.
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoNode,
            }) => {}
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                let what = match index {
                    0 => "the lease's znode changed",
                    1 => "this grant's znode was changed by someone else",
                    2 => "the term's history entry changed",
                    3 => "the lease is reserved already",
                    _ => "the successor's wake-up znode exists",
                };
                return Err(Error::store(
                    STORE,
                    Failed::new(format!(
                        "{what} while being handed over ({source}); nothing was handed over"
                    )),
                ));
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => return Err(map(source)),
        }
        if self.own(lease, &grant.holder).is_none_or(|n| n.name == grant.token) {
            self.set_own(lease, &grant.holder, None);
        }
        Ok(())
    }

    pub(crate) async fn try_release(&self, grant: &Grant) -> Result<()> {
        let Some(client) = self.existing_session(grant.ttl).await else {
            return Ok(()); // the session is gone, and the znode with it
        };
        let own = self.own(&grant.lease, &grant.holder).filter(|n| n.name == grant.token);
        let path = self.candidate_path(&grant.lease, &grant.token);
        let stat = match client.check_stat(&path).await.map_err(map)? {
            Some(stat) => stat,
            None => {
                if own.is_some() {
                    self.set_own(&grant.lease, &grant.holder, None);
                }
                return Ok(());
            }
        };
        if stat.czxid as u64 != grant.term.0 || stat.ephemeral_owner != client.session_id().0 {
            return Ok(()); // not our znode any more
        }
        let ending = Ending {
            node: &grant.token,
            version: 0,
            term: grant.term,
            holder: &grant.holder,
        };
        self.end_term(&client, &grant.lease, &ending, EndReason::Released)
            .await?;
        if own.is_some() || self.own(&grant.lease, &grant.holder).is_none() {
            self.set_own(&grant.lease, &grant.holder, None);
        }
        Ok(())
    }

    pub(crate) async fn try_withdraw(self: &Arc<Self>, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let ops = self.ops(lease, candidate);
        let _serial = ops.lock().await;
        let own = self.own(lease, candidate);
        let Some(client) = own
            .as_ref()
            .map(|n| n.client.clone())
            .filter(|c| !c.state().is_terminated())
        else {
            return self.withdraw_uncached(lease, candidate).await;
        };
        // On an error the engine sends the withdrawal again.
        self.withdraw_cached(lease, candidate, &client).await
    }

    /// The withdrawal of a candidate with a znode cached on a live session, `client`.
    async fn withdraw_cached(&self, lease: &LeaseName, candidate: &CandidateId, client: &zk::Client) -> Result<()> {
        let prefix = self.prefix(candidate);
        let queue = self.queue(client, lease).await?.unwrap_or_default();
        // A campaign of the same candidate may have started (and been granted) since this one was
        // dropped: a granted znode is that campaign's, and only its release ends it.
        let current = self.own(lease, candidate);
        let keep = current.as_ref().filter(|n| n.granted).map(|n| n.name.clone());
        let mine: Vec<String> = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && !self.is_dead(lease, &c.name))
            .filter(|c| Some(&c.name) != keep.as_ref())
            .map(|c| c.name.clone())
            .collect();
        for name in &mine {
            self.withdraw_node(client, lease, name).await?;
        }
        if keep.is_none() && self.own(lease, candidate).is_some_and(|n| !n.granted) {
            self.set_own(lease, candidate, None);
        }
        Ok(())
    }

    /// A withdrawal with no usable znode cached for the candidate. An acquire whose create was
    /// applied while its reply was lost (given up on, or the connection dropped after it) left
    /// its znode queued on one of this store's sessions, which the store keeps alive for its
    /// other leases: every later candidate would queue behind it for as long. So the lease's
    /// queue is listed and this candidate's znodes on a live session of this store are
    /// withdrawn, each on its own session, as `withdraw_node` does with a cached one. Kept: a
    /// znode cached as granted meanwhile (a renewal of an adopted grant records it) and one a
    /// read of this store showed holding the lease (a read-back may have adopted it); skipped:
    /// znodes of ended sessions (dead, or owned by no live session of ours: they go with their
    /// session). With no live session there is nothing to do, and none is opened.
    async fn withdraw_uncached(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let sessions = self.live_sessions().await;
        let Some(reader) = sessions.first() else {
            return Ok(()); // ephemeral znodes die with their session
        };
        let prefix = self.prefix(candidate);
        let queue = self.queue(reader, lease).await?.unwrap_or_default();
        let current = self.own(lease, candidate);
        let keep = current.as_ref().filter(|n| n.granted).map(|n| n.name.clone());
        let shown = self.shown(lease, candidate);
        let mine = queue
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && !self.is_dead(lease, &c.name))
            .filter(|c| Some(&c.name) != keep.as_ref() && Some(&c.name) != shown.as_ref());
        for child in mine {
            let Some(stat) = reader
                .check_stat(&self.candidate_path(lease, &child.name))
                .await
                .map_err(map)?
            else {
                continue;
            };
            let Some(owner) = sessions.iter().find(|s| s.session_id().0 == stat.ephemeral_owner) else {
                continue; // an ended session's: the server deletes it
            };
            self.withdraw_node(owner, lease, &child.name).await?;
        }
        if keep.is_none() && self.own(lease, candidate).is_some_and(|n| !n.granted) {
            self.set_own(lease, candidate, None);
        }
        Ok(())
    }
}
