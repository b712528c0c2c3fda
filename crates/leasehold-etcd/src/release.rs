//! The paths that end a candidate key of this store: a hand-over (also of a term to its own
//! candidate, by an acquire), a withdrawal, and the transaction that closes a key (a
//! withdrawal's).

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use leasehold_core::{CandidateId, EndReason, Grant, Result};

use crate::record::{Keys, ended_value, reserved_value, session_ttl_secs};
use crate::state::Inner;

impl Inner {
    /// One transaction, if the grant's key is still there: delete it, end its term as handed
    /// over, and put the reservation naming `to`, bound to an etcd lease granted just before
    /// with the grant's TTL and never kept alive (etcd deletes an untaken reservation after it).
    /// Also how an acquire that finds its own key granted before hands the term to itself.
    pub(crate) async fn hand_over_key(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let keys = Keys::new(&self.config.prefix, &grant.lease);
        let own = keys.candidate(&grant.holder);
        let Ok(term) = i64::try_from(grant.term.0) else {
            return Ok(());
        };
        self.write_records_due(&keys, &own, grant.term).await?;
        let ttl_secs = session_ttl_secs(grant.ttl);
        let mut client = self.client();
        let lease = self
            .call("hand_over (lease grant)", async move {
                client.lease_grant(ttl_secs, None).await
            })
            .await?
            .id();
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.clone(), CompareOp::Equal, term),
                Compare::create_revision(keys.reserved(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::delete(own.clone(), None),
                TxnOp::put(keys.ended(term), ended_value(EndReason::HandedOver), None),
                TxnOp::put(
                    keys.reserved(),
                    reserved_value(to, term, grant.ttl),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        // On an unknown outcome the fresh lease is left alone: the reservation may be bound to it.
        self.retire(&own, term);
        let handed = self.txn("hand_over", txn).await?.succeeded();
        if handed {
            self.publish(&own, None);
        } else {
            // Not held any more: nothing is handed over, and the fresh lease binds nothing.
            let mut client = self.client();
            let _ = client.lease_revoke(lease).await;
        }
        Ok(())
    }

    /// Withdraws the candidate key `key`: reads it, retires it and closes it (see [`close_key`]).
    /// On an error the engine sends the withdrawal again.
    pub(crate) async fn withdraw_key(&self, keys: &Keys, key: String) -> Result<()> {
        let own = self.get("withdraw", key.clone(), None).await?;
        let Some(rev) = own.kvs().first().map(KeyValue::create_revision) else {
            return Ok(());
        };
        self.retire(&key, rev);
        self.txn("withdraw", close_key(keys, key, rev)).await?;
        Ok(())
    }
}

/// Deletes the candidate key `key` if it is still the one created at `rev`, and ends a term
/// granted to it (if any, and not ended yet) as expired: a withdrawal. A term granted to this key whose answer
/// never reached the engine ends here too.
pub(crate) fn close_key(keys: &Keys, key: String, rev: i64) -> Txn {
    let close = Txn::new()
        .when([
            Compare::create_revision(keys.started(rev), CompareOp::Greater, 0),
            Compare::create_revision(keys.ended(rev), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(keys.ended(rev), ended_value(EndReason::Expired), None)]);
    Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None), TxnOp::txn(close)])
}
