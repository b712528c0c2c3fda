//! `list`: every lease under the chroot, read in a few multi-reads whatever their number.
//!
//! A lease held in the usual way is read in three rounds, each one multi-read for all leases
//! (more when a round would not fit in one request): its queue and reservation, then the head
//! of its queue, then the head's history entry (which makes a polling head the holder; a waiting
//! head holds it as soon as it is first, see `turn`). These are the
//! reads [`Inner::observe`] makes, in the same order. A lease that is anything else (free, a
//! head that left meanwhile or has not taken the lease yet, this store's expired session) is
//! then observed on its own, exactly as `inspect` does.

use futures::StreamExt;
use leasehold_core::{Error, LeaseName, Observation, Result, Term};
use zookeeper_client as zk;

use crate::error::{STORE, map};
use crate::reads::{Got, READ_BYTES, Read, read_many};
use crate::record::{CandidateRecord, Child, ReservationRecord, history_name, holder_observation, parse_queue};
use crate::state::Inner;

/// How many leases `list` observes at once when they need a read of their own.
const OWN_READS_IN_FLIGHT: usize = 16;

/// Where the reading of one lease stands.
enum Step {
    /// Known: the observation, or `None` when it is no lease (no candidates znode).
    Done(Option<Observation>),
    /// To be observed on its own.
    Alone,
    /// Its queue, whose head is to be read.
    Queue(Vec<Child>),
    /// Its head's name and record and stat, whose history entry is to be read.
    Head(String, CandidateRecord, zk::Stat),
}

impl Inner {
    /// Every lease under the chroot whose name starts with `prefix`, in name order, each as
    /// [`Inner::observe`] shows it. Children of the chroot that are not leases (no valid lease
    /// name, or no candidates znode) are not listed.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let client = self.reader().await?;
        let names = match client.list_children(self.config.chroot()).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(map(e)),
        };
        let mut leases: Vec<LeaseName> = names
            .into_iter()
            .filter(|name| name.starts_with(prefix))
            .filter_map(|name| LeaseName::new(name).ok())
            .collect();
        leases.sort();
        let client = &client;

        // Round 1: each lease's queue and reservation.
        let reads: Vec<Read> = leases
            .iter()
            .flat_map(|lease| {
                [
                    Read::Children(self.candidates_dir(lease)),
                    Read::Data(self.reserved_path(lease)),
                ]
            })
            .collect();
        let mut got = read_many(client, &reads, READ_BYTES).await.into_iter();
        let mut steps = Vec::with_capacity(leases.len());
        for lease in &leases {
            let (Some(queue), Some(reservation)) = (got.next(), got.next()) else {
                return Err(short());
            };
            steps.push(match queue.map_err(map)? {
                Got::NoNode => Step::Done(None),
                Got::Children(children) => {
                    let queue = parse_queue(lease, children)?;
                    match reservation.map_err(map)? {
                        Got::Data(data, _) => Step::Done(Some(
                            ReservationRecord::decode(&data)
                                .map_err(|detail| Error::corrupt(STORE, lease, detail))?
                                .observation(lease),
                        )),
                        _ if queue.is_empty() => Step::Alone,
                        _ => Step::Queue(queue),
                    }
                }
                Got::Data(..) => return Err(short()),
            });
        }

        // Round 2: the head of each queue.
        let waiting: Vec<usize> = (0..steps.len())
            .filter(|&i| matches!(steps[i], Step::Queue(_)))
            .collect();
        let reads: Vec<Read> = waiting
            .iter()
            .map(|&i| match &steps[i] {
                Step::Queue(queue) => Read::Data(self.candidate_path(&leases[i], &queue[0].name)),
                _ => unreachable!("filtered"),
            })
            .collect();
        for (&i, head) in waiting.iter().zip(read_many(client, &reads, READ_BYTES).await) {
            let lease = &leases[i];
            let Step::Queue(queue) = &steps[i] else { continue };
            let name = queue[0].name.clone();
            steps[i] = match head.map_err(map)? {
                Got::Data(data, stat) => {
                    let record = CandidateRecord::decode(&data)
                        .map_err(|detail| Error::corrupt(STORE, lease, format!("candidate znode {name}: {detail}")))?;
                    if self.is_dead(lease, &name) {
                        Step::Alone
                    } else {
                        Step::Head(name, record, stat)
                    }
                }
                _ => Step::Alone,
            };
        }

        // Round 3: whether each head has taken the lease (its term's history entry exists, or it
        // waits).
        let heads: Vec<usize> = (0..steps.len())
            .filter(|&i| matches!(steps[i], Step::Head(..)))
            .collect();
        let reads: Vec<Read> = heads
            .iter()
            .map(|&i| match &steps[i] {
                Step::Head(_, _, stat) => Read::Data(format!(
                    "{}/{}",
                    self.history_dir(&leases[i]),
                    history_name(Term(stat.czxid as u64))
                )),
                _ => unreachable!("filtered"),
            })
            .collect();
        for (&i, entry) in heads.iter().zip(read_many(client, &reads, READ_BYTES).await) {
            let lease = &leases[i];
            let Step::Head(name, record, stat) = &steps[i] else {
                continue;
            };
            let recorded = matches!(entry.map_err(map)?, Got::Data(..));
            // As `observe`: a waiting head holds the lease before its entry is written.
            steps[i] = if recorded || record.waiting {
                self.may_be_adopted(lease, &record.candidate, name, recorded);
                Step::Done(Some(holder_observation(lease, name, record, stat)))
            } else {
                Step::Alone
            };
        }

        // The rest, each on its own.
        let own: Vec<LeaseName> = leases
            .iter()
            .zip(&steps)
            .filter(|(_, step)| matches!(step, Step::Alone))
            .map(|(lease, _)| lease.clone())
            .collect();
        let alone: Vec<Result<Option<Observation>>> = futures::stream::iter(own)
            .map(|lease| async move { self.observe_existing(client, &lease).await })
            .buffered(OWN_READS_IN_FLIGHT)
            .collect()
            .await;
        let mut alone = alone.into_iter();
        let mut listed = Vec::with_capacity(leases.len());
        for step in steps {
            let observed = match step {
                Step::Done(observed) => observed,
                Step::Alone => alone.next().ok_or_else(short)??,
                Step::Queue(_) | Step::Head(..) => return Err(short()),
            };
            listed.extend(observed);
        }
        Ok(listed)
    }
}

/// A multi-read that did not answer each of its reads as asked.
fn short() -> Error {
    Error::store(
        STORE,
        crate::error::Failed::new("ZooKeeper answered a multi-read with results of the wrong kind or number"),
    )
}
