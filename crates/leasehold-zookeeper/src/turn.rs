//! A waiting candidate's turn, taken by a read, and the records its confirmation writes.
//!
//! When the one znode ahead of a waiting candidate's own is deleted, the candidate's change
//! stream reads, in one multi-read on the candidate's session ([`Inner::read_turn`]), what the
//! grant transaction would check: its own znode present and unchanged, the znode that was ahead
//! of it gone, no reservation; and its term's history entry. Then it leads, from that read's
//! send ([`Change::YourTurn`](leasehold_core::Change::YourTurn)), with no write: the term's
//! history entry and announcement, when a release did not write them already, are written by
//! the engine's confirmation, its renewal sent at once ([`Inner::write_records_due`]).
//!
//! # Why a read is enough
//!
//! - **Who holds the lease.** As in ZooKeeper's lock recipe, the first znode of the queue
//!   holds it, with two refinements. A *reservation* (a hand-over) puts its successor first,
//!   ahead of the queue: it exists only after a holder's hand-over, created in the transaction
//!   that deletes the holder's znode, and only its successor (or, after a full TTL unchanged,
//!   the head of the queue) ends it. And a first znode whose candidate *polls* has not taken the
//!   lease until its acquire wrote the term's *history entry*; a first znode whose candidate
//!   *waits* (its record says so: it asked for its change stream before it queued, as the
//!   engine does) takes it the moment it is first: by this read, or by its acquire. `inspect`
//!   and `list` show exactly that ([`Inner::observe`]): the first znode, not reserved, whose
//!   history entry exists or whose record says waiting, is the holder, with its own `czxid`
//!   as term. So a turn whose records are still due reads as this candidate's
//!   term, never as free.
//! - **The history entry adds no exclusion.** No grant checks another term's history entry:
//!   every grant requires its own znode first (each znode listed ahead of it gone, in its
//!   transaction) or ends a reservation. The entry is the audit trail, the announcement's
//!   companion, and a polling head's mark of having taken the lease.
//! - **Nothing can grant or hand over between the read and the records.** The read is served
//!   after the deletion it follows (a session's watch event comes before the replies to its
//!   later requests) and shows no reservation, then our znode present and first (the one
//!   listed ahead gone; a znode queued later sorts after ours; a deleted name never comes
//!   back; for the order of the reads see [`Inner::read_turn`]). From then on, while our
//!   znode exists:
//!   - another candidate's acquire lists ours ahead of its own (ours was created first), so
//!     its grant transaction fails on ours; a reservation's takeover needs a reservation;
//!   - a hand-over needs a grant on a znode that still exists, owned by the hander's session.
//!     Every znode granted before was first when granted (or deleted everything ahead of it),
//!     so it was ahead of ours and is gone: only our own engine, leading on this turn, can
//!     hand over, and `hand_over` (as `release`) writes the term's entry, ended, if it is
//!     missing;
//!   - our own acquire, running at the same time, is serialised with the turn by the
//!     candidate's operation lock; the turn only takes an unchanged, ungranted cached znode
//!     and caches it as granted, so a later acquire retires it and takes a new term;
//!   - an operator's `break` breaks the first znode, ours: it ends our term in the history
//!     (creating the entry, ended, if it is missing) and deletes our znode in one transaction,
//!     as for any holder; the records' write checks our znode and does nothing, and the
//!     renewal answers `Lost`;
//!   - our session's expiry deletes our znode no earlier than a full session timeout (the TTL)
//!     after the server last heard from the session, so after the read reached it: the engine
//!     believes the turn from the read's send, as it would the grant transaction's. Its
//!     records are then never written; the history lacks that term (a turn whose confirmation
//!     never reached the server), and the terms around it are unaffected.
//! - **The term.** It is our znode's `czxid`, the term the records are written under. It is
//!   above every earlier grant's: a znode granted while ours existed was first, so created
//!   before ours; one granted before ours was created has a smaller zxid.
//!
//! A graceful release usually leaves nothing due: a release whose next candidate waits hands
//! the lease over in its own transaction, writing that candidate's history entry and
//! announcement (`end_term`), so the read finds them and the turn costs one read. A candidate
//! that queued before it asked for its stream (its record says it polls) is shown free until
//! its entry exists, so its turn still sends the grant transaction ([`TurnRead::Unrecorded`]).

use leasehold_core::{CandidateId, Error, LeaseName, Result, Term};
use zookeeper_client as zk;

use crate::error::{STORE, map};
use crate::reads::{Got, READ_BYTES, Read, read_many};
use crate::record::{CandidateRecord, HistoryRecord, history_name};
use crate::state::{Inner, OwnNode, lock};

/// What a turn's read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnRead {
    /// The candidate leads; `records_due`: its history entry and announcement are still to be
    /// written (by its confirmation).
    Leads { records_due: bool },
    /// First, with no reservation, but its candidate did not wait when it queued (its record
    /// says so) and the term has no history entry: `inspect` shows such a head as free until
    /// its grant transaction writes the entry, so the turn sends that transaction.
    Unrecorded,
    /// Anything else (our znode gone or changed, a znode ahead of ours still there, a
    /// reservation, a history entry that is not this term's start): the engine asks.
    Ask,
}

/// How writing a term's records went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Records {
    /// Written now, or found written (an earlier write whose reply was lost).
    Written,
    /// Our znode is gone: the term is over, and the renewal finds it lost.
    Gone,
    /// The lease has no `leader/` znode (made before grants were announced).
    NoLeaderDir,
}

impl Inner {
    /// The read of a turn: `own` (cached as waiting, second in line) leads once `ahead`, the
    /// znodes that were ahead of it, are gone. One multi-read: the reservation, our znode, our
    /// term's history entry, and each znode of `ahead`.
    ///
    /// The reservation is read before our znode. A server's multi-read is served between two
    /// writes, but a server before 3.6 answers the reads one by one, and writes of other
    /// sessions may come between them. Read the other way round, a reservation created by the
    /// hand-over whose deletion woke us and taken by its successor in between (deleting our
    /// znode with the znodes ahead of its own) would show our znode present and no reservation,
    /// beside a successor that leads. In this order, no reservation at the first read means
    /// our znode, existing at the second, was first with none from the first read on, and only
    /// a hand-over of our own could make one.
    pub(crate) async fn read_turn(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        own: &OwnNode,
        ahead: &[String],
    ) -> Result<TurnRead> {
        let term = Term(own.czxid as u64);
        let mut reads = vec![
            Read::Data(self.reserved_path(lease)),
            Read::Data(self.candidate_path(lease, &own.name)),
            Read::Data(format!("{}/{}", self.history_dir(lease), history_name(term))),
        ];
        reads.extend(ahead.iter().map(|name| Read::Data(self.candidate_path(lease, name))));
        let mut got = read_many(client, &reads, READ_BYTES).await.into_iter();
        let mut next = || {
            got.next()
                .unwrap_or(Err(zk::Error::UnexpectedError("a short multi-read".into())))
        };
        let (reserved, node, history) = (next().map_err(map)?, next().map_err(map)?, next().map_err(map)?);
        // Ours: present and unchanged (the grant transaction's version check), on our session.
        let Got::Data(data, stat) = node else {
            return Ok(TurnRead::Ask);
        };
        let record = CandidateRecord::decode(&data)
            .map_err(|detail| Error::corrupt(STORE, lease, format!("candidate znode {}: {detail}", own.name)))?;
        if stat.czxid != own.czxid
            || stat.ephemeral_owner != own.session
            || stat.version != 0
            || record.candidate != *candidate
        {
            return Ok(TurnRead::Ask);
        }
        if !matches!(reserved, Got::NoNode) {
            return Ok(TurnRead::Ask);
        }
        for _ in ahead {
            if !matches!(next().map_err(map)?, Got::NoNode) {
                return Ok(TurnRead::Ask);
            }
        }
        let records_due = match history {
            // Due: shown as holder meanwhile only because it waits.
            Got::NoNode if record.waiting => true,
            Got::NoNode => return Ok(TurnRead::Unrecorded),
            // Written by the release that handed the lease to us.
            Got::Data(data, _) => match HistoryRecord::decode(&data) {
                Ok(h) if h.holder == *candidate && h.ended.is_none() => false,
                _ => return Ok(TurnRead::Ask),
            },
            Got::Children(_) => return Ok(TurnRead::Ask),
        };
        Ok(TurnRead::Leads { records_due })
    }

    /// Writes the records of a turn of `candidate` on its znode `name` at `term` (its history
    /// entry and its announcement), if they are due: one transaction, only while the znode is
    /// unchanged. Written (or found written), nothing is due any more; a znode gone meanwhile
    /// leaves nothing to write (the renewal that follows finds it gone). An error leaves them
    /// due: the engine's next renewal writes them.
    pub(crate) async fn write_records_due(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        name: &str,
        term: Term,
    ) -> Result<()> {
        let due = self.own(lease, candidate).is_some_and(|n| {
            n.name == name
                && n.granted
                && n.records_due
                && n.czxid as u64 == term.0
                && n.session == client.session_id().0
        });
        if !due {
            return Ok(());
        }
        let mut written = self.try_write_records(client, lease, candidate, name, term).await?;
        if written == Records::NoLeaderDir {
            // A lease made before grants were announced: make the directory, and write again.
            self.ensure_leader_dir(client, lease).await?;
            written = self.try_write_records(client, lease, candidate, name, term).await?;
        }
        if written != Records::NoLeaderDir {
            self.records_written(lease, candidate, name);
        }
        Ok(())
    }

    async fn try_write_records(
        &self,
        client: &zk::Client,
        lease: &LeaseName,
        candidate: &CandidateId,
        name: &str,
        term: Term,
    ) -> Result<Records> {
        let history = format!("{}/{}", self.history_dir(lease), history_name(term));
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let announcement = self.announcement_path(lease, term, name, client.session_timeout(), candidate);
        let mut writer = client.new_multi_writer();
        let add = |r: std::result::Result<(), zk::Error>| r.map_err(map);
        add(writer.add_check_version(&self.candidate_path(lease, name), 0))?;
        add(writer.add_create(&history, &HistoryRecord::new(candidate.clone()).encode(), &options))?;
        add(writer.add_create(&announcement, &[], &options))?;
        add(writer.add_delete(&announcement, None))?;
        match writer.commit().await {
            Ok(_) => Ok(Records::Written),
            Err(zk::MultiWriteError::OperationFailed { index, source }) => match (index, source) {
                (0, zk::Error::NoNode) => Ok(Records::Gone),
                (0, zk::Error::BadVersion) => Err(Error::corrupt(
                    STORE,
                    lease,
                    format!("candidate znode {name} was overwritten"),
                )),
                // Only our own earlier write can have made it: a break that ends our term
                // deletes our znode in the same transaction (the check above fails first).
                (1, zk::Error::NodeExists) => Ok(Records::Written),
                (2, zk::Error::NoNode) => Ok(Records::NoLeaderDir),
                (_, other) => Err(map(other)),
            },
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(map(source)),
        }
    }

    /// The records of the candidate's cached turn on `name` are written.
    fn records_written(&self, lease: &LeaseName, candidate: &CandidateId, name: &str) {
        let mut candidates = lock(&self.candidates);
        if let Some(node) = candidates
            .get_mut(&(lease.clone(), candidate.clone()))
            .and_then(|c| c.node.as_mut())
            .filter(|n| n.name == name)
        {
            node.records_due = false;
        }
    }
}
