//! DynamoDB-specific behaviour beyond the shared suite: wall clocks that are hours off, the
//! table's shape, items written by others, deleted items, and secrets in errors.

mod load;
mod records;
mod table;

use std::time::Duration;

use leasehold_core::{AcquireRequest, Acquired, CandidateId, Error, LeaseName, LeaseStore, random_u64};
use leasehold_dynamodb::DynamoDbStore;

const SIX_HOURS: Duration = Duration::from_secs(6 * 3600);

fn fresh_lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("store-{tag}-{:x}", random_u64())).unwrap()
}

fn request(lease: &LeaseName, who: &str, ttl: Duration, takeover: Option<String>) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(who).unwrap(),
        ttl,
        takeover,
    }
}

async fn granted(store: &DynamoDbStore, request: &AcquireRequest) -> leasehold_core::Grant {
    match store.acquire(request).await {
        Ok(Acquired::Granted(grant)) => grant,
        other => panic!("expected a grant for {}, got {other:?}", request.candidate),
    }
}

fn expect_corrupt<T: std::fmt::Debug>(what: &str, lease: &LeaseName, result: leasehold_core::Result<T>, field: &str) {
    match result {
        Err(Error::CorruptRecord {
            lease: named, detail, ..
        }) => {
            assert_eq!(named, lease.as_str(), "{what}: names the lease");
            assert!(detail.contains(field), "{what}: {detail:?} should name {field}");
        }
        other => panic!("{what}: expected CorruptRecord naming {field}, got {other:?}"),
    }
}
