//! The candidate queue of a lease, written: a candidate's znode created, the lease granted to
//! the head of the queue, a term ended (and handed over to a waiting successor).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use leasehold_core::{Acquired, CandidateId, EndReason, Error, Grant, LeaseName, Observation, Result, Term};
use tracing::warn;
use zookeeper_client as zk;

use crate::error::{Failed, STORE, map};
use crate::record::{
    CandidateRecord, Child, HISTORY_LIMIT, HistoryRecord, ReservationRecord, history_name, holder_observation,
};
use crate::state::{Inner, OwnNode, lock};

impl Inner {
    /// Queues the candidate: its znode at the end of the lease's queue, or, for a lease that
    /// does not exist yet, the lease's znodes with ours alone in the queue, in one request
    /// (`true`: this created the lease).
    pub(crate) async fn enqueue(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(OwnNode, bool)> {
        if let Some(own) = self.create_own(client, lease, candidate, ttl, prefix).await? {
            return Ok((own, false));
        }
        if let Some(own) = self.create_lease(client, lease, candidate, ttl, prefix).await? {
            return Ok((own, true));
        }
        // Someone else created the lease meanwhile, or the chroot does not exist yet: make
        // sure every directory exists (mkdir creates the parents too), then queue.
        self.ensure_dirs(client, lease).await?;
        match self.create_own(client, lease, candidate, ttl, prefix).await? {
            Some(own) => Ok((own, false)),
            None => Err(Error::store(
                STORE,
                Failed::new(format!(
                    "the znodes of lease {lease} were deleted as soon as they were made; is something deleting them?"
                )),
            )),
        }
    }

    /// Creates a lease's znodes together with the first candidate's; `None` when the lease
    /// exists already (someone was quicker) or the chroot does not exist yet.
    pub(crate) async fn create_lease(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        ttl: Duration,
        prefix: &str,
    ) -> Result<Option<OwnNode>> {
        let dir = self.lease_dir(lease);
        let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
        let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let waiting = self.is_waiting(lease, candidate);
        let record = CandidateRecord {
            candidate: candidate.clone(),
            ttl,
            waiting,
        }
        .encode();
        let own_path = format!("{}/{prefix}", self.candidates_dir(lease));
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
        add(writer.add_create(&dir, &[], &persistent))?;
        add(writer.add_create(&self.candidates_dir(lease), &[], &persistent))?;
        add(writer.add_create(&self.history_dir(lease), &[], &persistent))?;
        add(writer.add_create(&own_path, &record, &ephemeral))?;
        add(writer.add_create(&self.leader_dir(lease), &[], &persistent))?;
        let results = match writer.commit().await {
            Ok(results) => results,
            // The lease exists (NodeExists), or the chroot does not (NoNode at index 0).
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NodeExists,
                ..
            })
            | Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode,
            }) => return Ok(None),
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => return Err(map(source)),
            Err(zk::MultiWriteError::RequestFailed { source }) => return Err(map(source)),
        };
        let Some(zk::MultiWriteResult::Create { path, stat }) = results.into_iter().nth(3) else {
            return Err(Error::store(
                STORE,
                Failed::new("unexpected reply to the multi that creates a lease"),
            ));
        };
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        // Some servers answer a create inside a multi without a valid stat.
        let czxid = if stat.czxid > 0 {
            stat.czxid
        } else {
            match self.read_candidate(client, lease, &name).await? {
                Some((_, stat)) => stat.czxid,
                None => return Ok(None),
            }
        };
        let node = OwnNode {
            name,
            czxid,
            session: client.session_id().0,
            client: client.clone(),
            ahead: Vec::new(),
            granted: false,
            records_due: false,
        };
        self.set_own(lease, candidate, Some(node.clone()));
        Ok(Some(node))
    }

    /// Creates this candidate's znode at the end of the queue; `None` when the lease does not
    /// exist yet.
    pub(crate) async fn create_own(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        ttl: Duration,
        prefix: &str,
    ) -> Result<Option<OwnNode>> {
        let waiting = self.is_waiting(lease, candidate);
        let record = CandidateRecord {
            candidate: candidate.clone(),
            ttl,
            waiting,
        };
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let path = format!("{}/{prefix}", self.candidates_dir(lease));
        let (stat, seq) = match client.create(&path, &record.encode(), &options).await {
            Ok(created) => created,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map(e)),
        };
        let node = OwnNode {
            name: format!("{prefix}{seq}"),
            czxid: stat.czxid,
            session: client.session_id().0,
            client: client.clone(),
            ahead: Vec::new(),
            granted: false,
            records_due: false,
        };
        self.set_own(lease, candidate, Some(node.clone()));
        Ok(Some(node))
    }

    /// Takes one of this store's znodes out of the queue. A release may have handed it the lease
    /// already (its term has a history entry): then the term ends as released, and the lease
    /// passes on to the next waiting candidate, as with any release.
    pub(crate) async fn withdraw_node(&self, client: &zk::Client, lease: &LeaseName, name: &str) -> Result<()> {
        let Some((record, stat)) = self.read_candidate(client, lease, name).await? else {
            return Ok(());
        };
        let term = Term(stat.czxid as u64);
        let entry = format!("{}/{}", self.history_dir(lease), history_name(term));
        if client.check_stat(&entry).await.map_err(map)?.is_some() {
            let ending = Ending {
                node: name,
                version: stat.version,
                term,
                holder: &record.candidate,
            };
            self.end_term(client, lease, &ending, EndReason::Released).await?;
            return Ok(());
        }
        self.delete_own(client, lease, name).await
    }

    /// Deletes one of this store's candidate znodes (only if nobody else wrote to it).
    pub(crate) async fn delete_own(&self, client: &zk::Client, lease: &LeaseName, name: &str) -> Result<()> {
        match client.delete(&self.candidate_path(lease, name), Some(0)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(zk::Error::BadVersion) => Err(Error::corrupt(
                STORE,
                lease,
                format!("candidate znode {name} was overwritten by someone else"),
            )),
            Err(e) => Err(map(e)),
        }
    }

    pub(crate) async fn ensure_dirs(&self, client: &zk::Client, lease: &LeaseName) -> Result<()> {
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        client.mkdir(&self.candidates_dir(lease), &options).await.map_err(map)?;
        client.mkdir(&self.history_dir(lease), &options).await.map_err(map)?;
        self.ensure_leader_dir(client, lease).await
    }

    /// What anyone would observe: the first znode of the queue is the holder once its term has
    /// a history entry, or as soon as it is first when its candidate waits (see `turn`). One
    /// listing; the head is the first listed znode that still exists (see [`Inner::head`]).
    pub(crate) async fn observe(&self, client: &zk::Client, lease: &LeaseName) -> Result<Observation> {
        match self.observe_existing(client, lease).await? {
            Some(observation) => Ok(observation),
            None => self.free(client, lease).await,
        }
    }

    /// As [`Inner::observe`]; `None` when the lease has no znodes (it was never acquired here).
    pub(crate) async fn observe_existing(&self, client: &zk::Client, lease: &LeaseName) -> Result<Option<Observation>> {
        let (listed, reservation) = tokio::join!(self.queue_at(client, lease), self.read_reservation(client, lease));
        let Some((queue, listed_at)) = listed? else {
            return Ok(None);
        };
        if let Some(reservation) = reservation? {
            return Ok(Some(reservation.observation(lease)));
        }
        let Some((first, record, stat)) = self.head(client, lease, &queue).await? else {
            // Every listed znode is gone (none, or all left during the reads). A term newer than
            // the listing belongs to a znode queued after it, which may hold the lease now: this
            // one pass cannot tell who, and says so rather than guess "free".
            let observation = self.free(client, lease).await?;
            if !queue.is_empty() && observation.last_term.0 > listed_at as u64 {
                return Err(Error::unreachable(
                    STORE,
                    Failed::new("the lease changed hands while its candidates were read; read again"),
                ));
            }
            return Ok(Some(observation));
        };
        let name = &queue[first].name;
        if self.is_dead(lease, name) {
            // This store's own expired session still leads on the server: nobody may adopt
            // it, and the server frees it within a session timeout.
            return Err(Error::unreachable(
                STORE,
                Failed::new(format!(
                    "the holder of {lease} is this store's expired session; the server has not removed it yet"
                )),
            ));
        }
        let term = Term(stat.czxid as u64);
        let entry = format!("{}/{}", self.history_dir(lease), history_name(term));
        let recorded = client.check_stat(&entry).await.map_err(map)?.is_some();
        if !recorded && !record.waiting {
            // Next in line, but its candidate polls and has not taken the lease yet.
            return self.free(client, lease).await.map(Some);
        }
        // Taken (its history entry exists), or first and waiting: its candidate takes it by its
        // turn's read, and its entry is written by the confirmation (see `turn`).
        self.may_be_adopted(lease, &record.candidate, name, recorded);
        Ok(Some(holder_observation(lease, name, &record, &stat)))
    }

    /// A free lease, as its newest history entry tells: its term and how it ended.
    async fn free(&self, client: &zk::Client, lease: &LeaseName) -> Result<Observation> {
        let last = self.last_history(client, lease).await?;
        let last_term = last.as_ref().map_or(Term(0), |(t, _)| *t);
        let previous_end = last.and_then(|(_, r)| r.ended.map(|(_, reason)| reason));
        Ok(Observation::free(lease.clone(), last_term, previous_end))
    }

    /// The first znode of a listing that still exists, with its index and record: the head of
    /// the queue when it was read (a znode queued after the listing sorts after every listed
    /// one, and a deleted name never comes back). One read, unless the first ones left since
    /// the listing: each listed znode is read at most once.
    pub(crate) async fn head(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        listed: &[Child],
    ) -> Result<Option<(usize, CandidateRecord, zk::Stat)>> {
        for (i, child) in listed.iter().enumerate() {
            if let Some((record, stat)) = self.read_candidate(client, lease, &child.name).await? {
                return Ok(Some((i, record, stat)));
            }
        }
        Ok(None)
    }

    /// The engine adopts a grant it reads back (after an acquire with an unknown outcome), so a
    /// znode of ours that a read shows first counts as granted: leadership on it may end without
    /// this store hearing of it, and the next acquire must then make a new term. One that is not
    /// cached (its acquire's reply was lost) is remembered, so that a withdrawal keeps it.
    /// `recorded`: its term's history entry exists (otherwise the next renewal writes it).
    pub(crate) fn may_be_adopted(&self, lease: &LeaseName, candidate: &CandidateId, name: &str, recorded: bool) {
        let mut candidates = lock(&self.candidates);
        if let Some(c) = candidates.get_mut(&(lease.clone(), candidate.clone())) {
            let cached = c.node.as_ref().is_some_and(|n| n.name == name);
            if let Some(node) = c.node.as_mut().filter(|n| n.name == name && !n.granted) {
                node.granted = true;
                node.records_due = !recorded;
                c.changed.send_modify(|n| *n += 1);
            } else if !cached && name.starts_with(&self.prefix(candidate)) {
                c.shown = Some(name.to_string());
            }
        }
    }

    /// Grants the lease to `own` in one transaction: the lease is not reserved (the reservation
    /// znode is created and deleted again, which fails if it exists), every znode that was ahead
    /// of ours is gone (each is created and deleted again likewise: ZooKeeper has no "check
    /// absent" op), our znode is unchanged, and the term's history entry is created. That entry
    /// is what makes the head of the queue the holder.
    pub(crate) async fn grant(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        own: &OwnNode,
        candidate: &CandidateId,
        version: i32,
    ) -> Result<GrantOutcome> {
        self.grant_with(client, lease, own, candidate, version, None, Ahead::MustBeGone)
            .await
    }

    /// [`Inner::grant`], ending a reservation in the same transaction (`consume`: only if it is
    /// still that very reservation, by its generation), and with the znodes ahead of ours
    /// either required gone or deleted (the successor of a handover goes before them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn grant_with(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        own: &OwnNode,
        candidate: &CandidateId,
        version: i32,
        consume: Option<&ReservationRecord>,
        ahead: Ahead,
    ) -> Result<GrantOutcome> {
        let outcome = self
            .grant_once(client, lease, own, candidate, version, consume, ahead)
            .await?;
        if !matches!(outcome, GrantOutcome::NoLeaderDir) {
            return Ok(outcome);
        }
        // A lease made before grants were announced: make the directory, and grant again.
        self.ensure_leader_dir(client, lease).await?;
        match self
            .grant_once(client, lease, own, candidate, version, consume, ahead)
            .await?
        {
            GrantOutcome::NoLeaderDir => Err(Error::store(
                STORE,
                Failed::new(format!(
                    "the znode {} vanished as soon as it was made",
                    self.leader_dir(lease)
                )),
            )),
            outcome => Ok(outcome),
        }
    }

    /// Makes `{lease}/leader` (a lease made before grants were announced has none).
    pub(crate) async fn ensure_leader_dir(&self, client: &zk::Client, lease: &LeaseName) -> Result<()> {
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match client.create(&self.leader_dir(lease), &[], &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(map(e)),
        }
    }

    /// One try of [`Inner::grant_with`].
    #[allow(clippy::too_many_arguments)]
    async fn grant_once(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        own: &OwnNode,
        candidate: &CandidateId,
        version: i32,
        consume: Option<&ReservationRecord>,
        ahead: Ahead,
    ) -> Result<GrantOutcome> {
        let term = Term(own.czxid as u64);
        let history = format!("{}/{}", self.history_dir(lease), history_name(term));
        let record = HistoryRecord::new(candidate.clone()).encode();
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
        let reserved = self.reserved_path(lease);
        match consume {
            None => {
                add(writer.add_create(&reserved, &[], &options))?;
                add(writer.add_delete(&reserved, None))?;
            }
            Some(reservation) => {
                add(writer.add_set_data(&self.lease_dir(lease), &[], Some(reservation.generation)))?;
                add(writer.add_delete(&reserved, None))?;
            }
        }
        for name in &own.ahead {
            let path = self.candidate_path(lease, name);
            match ahead {
                Ahead::MustBeGone => {
                    add(writer.add_create(&path, &[], &options))?;
                    add(writer.add_delete(&path, None))?;
                }
                Ahead::Delete => add(writer.add_delete(&path, None))?,
            }
        }
        add(writer.add_check_version(&self.candidate_path(lease, &own.name), version))?;
        add(writer.add_create(&history, &record, &options))?;
        // Announce the holder to every session watching `leader/` (the session timeout is the TTL).
        let announcement = self.announcement_path(lease, term, &own.name, client.session_timeout(), candidate);
        add(writer.add_create(&announcement, &[], &options))?;
        add(writer.add_delete(&announcement, None))?;
        let per_ahead = match ahead {
            Ahead::MustBeGone => 2,
            Ahead::Delete => 1,
        };
        let checks = RESERVATION_OPS + own.ahead.len() * per_ahead;
        match writer.commit().await {
            Ok(_) => Ok(GrantOutcome::Granted),
            Err(zk::MultiWriteError::OperationFailed { index, source }) => match source {
                zk::Error::NodeExists if index == 0 && consume.is_none() => Ok(GrantOutcome::Reserved),
                zk::Error::BadVersion | zk::Error::NoNode if index < RESERVATION_OPS && consume.is_some() => {
                    Ok(GrantOutcome::Reserved)
                }
                zk::Error::NodeExists if index < checks => Ok(GrantOutcome::NotFirst),
                zk::Error::NoNode if index < checks && ahead == Ahead::Delete => {
                    Ok(GrantOutcome::AheadLeft((index - RESERVATION_OPS) / per_ahead))
                }
                // An earlier acquire of ours was applied but its reply was lost.
                zk::Error::NodeExists if index == checks + 1 => Ok(GrantOutcome::Granted),
                zk::Error::NoNode if index == checks + 2 => Ok(GrantOutcome::NoLeaderDir),
                zk::Error::NoNode if index == checks => Ok(GrantOutcome::Gone),
                zk::Error::BadVersion if index == checks => Err(Error::corrupt(
                    STORE,
                    lease,
                    format!("candidate znode {} was overwritten", own.name),
                )),
                zk::Error::NoNode => Ok(GrantOutcome::Gone),
                other => Err(map(other)),
            },
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(map(source)),
        }
    }

    /// The successor of a handover takes its reservation: granted at its own znode's term (above
    /// the handed-over one: every znode still queued was created after the holder's grant), in
    /// one transaction that ends the reservation and deletes the znodes queued ahead of ours,
    /// so that no candidate queued before the new term's znode is ever granted after it. Their
    /// candidates find their znodes gone and queue again. A znode that leaves meanwhile makes
    /// the transaction fail; it is tried again without it (at most once per znode).
    pub(crate) async fn take_reservation(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        own: &OwnNode,
        candidate: &CandidateId,
        reservation: &ReservationRecord,
    ) -> Result<GrantOutcome> {
        let mut own = own.clone();
        loop {
            match self
                .grant_with(client, lease, &own, candidate, 0, Some(reservation), Ahead::Delete)
                .await?
            {
                GrantOutcome::AheadLeft(i) if i < own.ahead.len() => {
                    own.ahead.remove(i);
                }
                outcome => return Ok(outcome),
            }
        }
    }

    /// Records a grant this store answers: from here on, a new acquire means a new term.
    pub(crate) async fn granted(
        self: &Arc<Self>,
        lease: &LeaseName,
        candidate: &CandidateId,
        own: OwnNode,
        ttl: Duration,
        client: &zk::Client,
        fresh: bool,
    ) -> Acquired {
        let term = Term(own.czxid as u64);
        let token = own.name.clone();
        self.set_own(
            lease,
            candidate,
            Some(OwnNode {
                granted: true,
                ahead: Vec::new(),
                ..own.clone()
            }),
        );
        // Tidying the history needs no answer: the grant does not wait for it. A lease created
        // by this grant has nothing to tidy.
        if !own.ahead.is_empty() || !fresh {
            let (inner, client, tidy) = (Arc::clone(self), client.clone(), lease.clone());
            tokio::spawn(async move { inner.record_grant(&client, &tidy, term).await });
        }
        Acquired::Granted(Grant {
            lease: lease.clone(),
            holder: candidate.clone(),
            term,
            ttl,
            token,
        })
    }

    /// Ends the previous term as expired if its holder did not record an end, and trims old
    /// entries. Best effort: the grant stands regardless.
    pub(crate) async fn record_grant(&self, client: &zk::Client, lease: &LeaseName, term: Term) {
        if let Err(e) = self.try_record_grant(client, lease, term).await {
            warn!(%lease, %term, error = %e, "could not tidy the history");
        }
    }

    pub(crate) async fn try_record_grant(&self, client: &zk::Client, lease: &LeaseName, term: Term) -> Result<()> {
        let dir = self.history_dir(lease);
        let terms = self.history_terms(client, lease).await?;
        if let Some(&previous) = terms.iter().rev().find(|t| **t < term) {
            let path = format!("{dir}/{}", history_name(previous));
            if let Ok((data, stat)) = client.get_data(&path).await
                && let Ok(record) = HistoryRecord::decode(&data)
                && record.ended.is_none()
            {
                let ended = record.ended(EndReason::Expired).encode();
                let _ = client.set_data(&path, &ended, Some(stat.version)).await;
            }
        }
        if terms.len() > HISTORY_LIMIT {
            let old = &terms[..terms.len() - HISTORY_LIMIT];
            let deletes: Vec<String> = old.iter().map(|t| format!("{dir}/{}", history_name(*t))).collect();
            join_all(deletes.iter().map(|path| client.delete(path, None))).await;
        }
        Ok(())
    }

    /// Ends a term in the history and deletes its znode, in one transaction.
    pub(crate) async fn end_term(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        term: &Ending<'_>,
        reason: EndReason,
    ) -> Result<bool> {
        let Ending {
            node,
            version: node_version,
            term,
            holder,
        } = *term;
        let history_path = format!("{}/{}", self.history_dir(lease), history_name(term));
        let released = reason == EndReason::Released;
        // The term's entry and, for a release, the queue: both read at once.
        let (history, queue) = tokio::join!(self.read_history(client, lease, term), async {
            if released {
                self.queue(client, lease).await
            } else {
                Ok(None)
            }
        });
        let history = match history {
            Ok(Some(record)) => Some(record),
            Ok(None) => None,
            Err(Error::CorruptRecord { .. }) => None,
            Err(e) => return Err(e),
        };
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        // A release hands the lease to the next candidate in the same transaction when that
        // candidate is waiting for it (it campaigns with change notifications).
        let mut handover = None;
        if released {
            let queue = queue?.unwrap_or_default();
            if let Some(next) = queue.iter().skip_while(|c| c.name != node).nth(1)
                && let Ok(Some((record, stat))) = self.read_candidate(client, lease, &next.name).await
                && record.waiting
            {
                handover = Some((next.name.clone(), stat, record.candidate, record.ttl));
            }
        }
        if let Some((next, stat, candidate, next_ttl)) = &handover {
            let mut writer = client.new_multi_writer();
            let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
            match &history {
                Some(record) => add(writer.add_set_data(&history_path, &record.clone().ended(reason).encode(), None))?,
                None => add(writer.add_create(
                    &history_path,
                    &HistoryRecord::new(holder.clone()).ended(reason).encode(),
                    &options,
                ))?,
            }
            add(writer.add_delete(&self.candidate_path(lease, node), Some(node_version)))?;
            // Never while reserved (a holder's lease never is: a reservation replaces its holder).
            add(writer.add_create(&self.reserved_path(lease), &[], &options))?;
            add(writer.add_delete(&self.reserved_path(lease), None))?;
            add(writer.add_check_version(&self.candidate_path(lease, next), stat.version))?;
            let next_history = format!("{}/{}", self.history_dir(lease), history_name(Term(stat.czxid as u64)));
            add(writer.add_create(&next_history, &HistoryRecord::new(candidate.clone()).encode(), &options))?;
            let announcement = self.announcement_path(lease, Term(stat.czxid as u64), next, *next_ttl, candidate);
            add(writer.add_create(&announcement, &[], &options))?;
            add(writer.add_delete(&announcement, None))?;
            match writer.commit().await {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::RequestFailed { source }) => return Err(map(source)),
                Err(zk::MultiWriteError::OperationFailed { .. }) => {} // end the term without handing over
            }
        }
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
        match &history {
            Some(record) => add(writer.add_set_data(&history_path, &record.clone().ended(reason).encode(), None))?,
            None => add(writer.add_create(
                &history_path,
                &HistoryRecord::new(holder.clone()).ended(reason).encode(),
                &options,
            ))?,
        }
        add(writer.add_delete(&self.candidate_path(lease, node), Some(node_version)))?;
        match writer.commit().await {
            Ok(_) => Ok(true),
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoNode,
            }) => Ok(false),
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::BadVersion,
            }) => Err(Error::corrupt(
                STORE,
                lease,
                format!("candidate znode {node} was changed by someone else"),
            )),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NodeExists | zk::Error::NoNode,
            }) => {
                // The history entry appeared or vanished meanwhile: end the term without it.
                match client
                    .delete(&self.candidate_path(lease, node), Some(node_version))
                    .await
                {
                    Ok(()) => Ok(true),
                    Err(zk::Error::NoNode) => Ok(false),
                    Err(e) => Err(map(e)),
                }
            }
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => Err(map(source)),
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(map(source)),
        }
    }
}

/// The term to end: the holder's znode (at its data version), its term and holder.
#[derive(Clone, Copy)]
pub(crate) struct Ending<'a> {
    pub(crate) node: &'a str,
    pub(crate) version: i32,
    pub(crate) term: Term,
    pub(crate) holder: &'a CandidateId,
}

/// The ops of a grant's transaction about the reservation (its absence checked, or it ended).
const RESERVATION_OPS: usize = 2;

/// What a grant requires of the znodes queued ahead of ours.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ahead {
    /// They are gone.
    MustBeGone,
    /// They are deleted (a handover's successor goes first).
    Delete,
}

/// How a one-request grant went.
#[derive(Debug)]
pub(crate) enum GrantOutcome {
    Granted,
    /// A znode ahead of ours still exists.
    NotFirst,
    /// Our znode is gone.
    Gone,
    /// The lease is reserved (a grant that was to end a reservation: not that one any more).
    Reserved,
    /// The znode at this index of those ahead of ours had left already (for [`Ahead::Delete`]).
    AheadLeft(usize),
    /// The lease has no `leader/` directory yet (it was made before grants were announced).
    NoLeaderDir,
}
