//! `candidates(lease)`: the lease's queue as ZooKeeper keeps it, one ephemeral sequential znode
//! per campaigning candidate under `candidates/`, in sequence order (the order the lease goes
//! to them, the holder's znode first), read in one `getChildren` and one multi-read.

use leasehold_core::{CandidateId, Error, LeaseName, Result};
use zookeeper_client as zk;

use crate::error::{STORE, map};
use crate::reads::{Got, READ_BYTES, Read, read_many};
use crate::record::{CandidateRecord, parse_queue};
use crate::state::Inner;

impl Inner {
    /// The candidates of `lease` in queue order. A znode whose session ended is gone with it; one
    /// that goes between the two reads is left out.
    pub(crate) async fn queued_candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        let client = self.reader().await?;
        let children = match client.list_children(&self.candidates_dir(lease)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(map(e)),
        };
        let queue = parse_queue(lease, children)?;
        let reads: Vec<Read> = queue
            .iter()
            .map(|child| Read::Data(self.candidate_path(lease, &child.name)))
            .collect();
        let mut listed = Vec::with_capacity(queue.len());
        for (child, got) in queue.iter().zip(read_many(&client, &reads, READ_BYTES).await) {
            match got.map_err(map)? {
                Got::Data(data, _) => listed.push(
                    CandidateRecord::decode(&data)
                        .map_err(|detail| {
                            Error::corrupt(STORE, lease, format!("candidate znode {}: {detail}", child.name))
                        })?
                        .candidate,
                ),
                Got::NoNode | Got::Children(_) => {}
            }
        }
        Ok(listed)
    }
}
