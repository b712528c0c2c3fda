//! `candidates(lease)`: the lease's queue as etcd keeps it, one key per campaigning candidate
//! (`P/L/c/{candidate}`, bound to its session), in the order of their create_revisions: the
//! order the lease goes to them, the holder's key first.

use etcd_client::{GetOptions, SortOrder, SortTarget};
use leasehold_core::{CandidateId, LeaseName, Result};

use crate::record::Keys;
use crate::state::Inner;

impl Inner {
    /// The candidates of `lease` in queue order, read in one range request. A key whose
    /// session ended is gone with it; a key this store is still deleting (a withdrawal or
    /// release sent again after a failure) is listed until the deletion lands.
    pub(crate) async fn queued_candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        let keys = Keys::new(&self.config.prefix, lease);
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut client = self.kv();
        let prefix = keys.candidates();
        let page = self
            .call("candidates", async move { client.get(prefix, Some(options)).await })
            .await?;
        page.kvs()
            .iter()
            .map(|kv| keys.parse_candidate(kv).map(|c| c.id))
            .collect()
    }
}
