//! A withdrawal of this store whose first request (the read of the candidate's key) fails,
//! while the store renews another lease of the same TTL: etcd's own request structure. The
//! contract itself (a failed release, hand-over or withdrawal never keeps the lease, nor the
//! queue behind it; the candidate campaigning again gets a higher term) is the shared scenario
//! `a_failed_release_does_not_keep_the_lease`, on every backend.
//!
//! The read fails through a fault proxy in front of the candidate's store: its request is held
//! back in the proxy, then the proxy's connections are reset, so it is never forwarded.

use std::time::Duration;

use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, LeaseName, LeaseStore};
use leasehold_etcd::EtcdStore;

const DELAY: Duration = Duration::from_millis(300);

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("candidate id")
}

async fn acquire_for(store: &EtcdStore, lease: &LeaseName, candidate: &str, ttl: Duration) -> Acquired {
    let mut attempt = 0;
    loop {
        match store
            .acquire(&AcquireRequest {
                lease: lease.clone(),
                candidate: id(candidate),
                ttl,
                takeover: None,
            })
            .await
        {
            Ok(answer) => return answer,
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, "acquire failed; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{candidate}'s acquire keeps failing: {e}"),
        }
    }
}

struct Etcd {
    prefix: String,
    raw: etcd_client::Client,
}

impl Etcd {
    async fn new(address: &str, prefix: &str) -> Etcd {
        let raw = etcd_client::Client::connect([address], None).await.expect("raw client");
        Etcd {
            prefix: prefix.to_string(),
            raw,
        }
    }

    /// The create_revision of `candidate`'s key of lease `jobs`, if it is there.
    async fn key(&mut self, candidate: &str) -> Option<i64> {
        let key = format!("{}/jobs/c/{candidate}", self.prefix);
        let resp = self.raw.get(key, None).await.expect("get");
        resp.kvs().first().map(etcd_client::KeyValue::create_revision)
    }

    async fn finish(mut self) {
        self.raw
            .delete(
                format!("{}/", self.prefix),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("clean up");
    }
}

/// Fails `operation` of the store behind `proxy`: its requests are held back `DELAY` in the
/// proxy, and after `after` (its earlier requests answered, the deletion's held back) the
/// proxy's connections are reset, so that the deletion never reaches etcd.
async fn fail<T: Send + 'static>(
    proxy: &FaultProxy,
    after: Duration,
    operation: impl std::future::Future<Output = leasehold_core::Result<T>> + Send + 'static,
) -> leasehold_core::Result<T> {
    proxy.faults().set(Direction::Request, Fault::Delay(DELAY));
    let running = tokio::spawn(operation);
    tokio::time::sleep(after).await;
    proxy.faults().set(Direction::Request, Fault::Reset);
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the failed operation answers")
        .expect("the operation's task");
    proxy.faults().heal();
    outcome
}
/// `h`, queued behind the holder `a` and leading `other` (the same TTL: both keys on the store's
/// one session of that TTL), withdraws `jobs`, and the withdrawal's first request (the read of
/// `h`'s key) is the one that fails: the store does not know the key's revision, and must send
/// the whole withdrawal again (review finding: it returned the error and left the key for good).
/// Once `a` releases, `h`'s left key is first; `c`, queued behind it, must be granted within
/// three TTLs while `h`'s store renews `other`. (A failed release, or a withdrawal whose delete
/// fails, is the shared scenario `a_failed_release_does_not_keep_the_lease`.)
#[tokio::test]
async fn a_queued_key_left_by_a_withdraw_whose_read_failed_goes_while_other_leases_renew() {
    const SHORT: Duration = Duration::from_secs(2);
    let Some(url) = leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL") else {
        return;
    };
    let address = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .expect("host")
        .to_string();
    let upstream = tokio::net::lookup_host(address.as_str())
        .await
        .expect("etcd address resolves")
        .next()
        .expect("an address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let prefix = format!("leasehold-left-key/{}", leasehold_core::random_u64());
    let mut etcd = Etcd::new(&address, &prefix).await;
    let direct_url = format!("etcd://{address}/{prefix}");
    let direct = || EtcdStore::connect(&direct_url);
    let h = EtcdStore::connect(&format!("etcd://{}/{prefix}", proxy.addr()))
        .await
        .expect("h connects");
    let a = direct().await.expect("a connects");
    let c = direct().await.expect("c connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let other = LeaseName::new("other").expect("lease name");
    let Acquired::Granted(grant_other) = acquire_for(&h, &other, "h", SHORT).await else {
        panic!("h is first for other and must be granted");
    };
    let Acquired::Granted(grant_a) = acquire_for(&a, &lease, "a", SHORT).await else {
        panic!("a is first and must be granted");
    };
    assert!(matches!(acquire_for(&h, &lease, "h", SHORT).await, Acquired::Held(_)));
    assert!(matches!(acquire_for(&c, &lease, "c", SHORT).await, Acquired::Held(_)));
    let h_rev = etcd.key("h").await.expect("h's key");

    let failed = {
        let (h, lease) = (h.clone(), lease.clone());
        fail(&proxy, DELAY / 2, async move { h.withdraw(&lease, &id("h")).await }).await
    };
    assert!(failed.is_err(), "the withdrawal was not failed: {failed:?}");
    assert_eq!(etcd.key("h").await, Some(h_rev), "h's key is left as it was");
    a.release(&grant_a).await.expect("a releases");

    // h's store goes on leading `other`.
    let renewing = {
        let h = h.clone();
        tokio::spawn(async move {
            loop {
                let _ = h.renew(&grant_other).await;
                tokio::time::sleep(SHORT / 4).await;
            }
        })
    };
    // The lease is free within a TTL of the failure, and a margin for etcd's lease sweep.
    let deadline = std::time::Instant::now() + SHORT * 3;
    let granted = loop {
        match acquire_for(&c, &lease, "c", SHORT).await {
            Acquired::Granted(g) => break Ok(g),
            Acquired::Held(seen) if std::time::Instant::now() > deadline => break Err(seen),
            Acquired::Held(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let left_now = etcd.key("h").await;
    renewing.abort();
    if let Ok(g) = &granted {
        c.release(g).await.expect("c releases");
    }
    etcd.finish().await;
    let grant_c = granted.unwrap_or_else(|seen| {
        panic!(
            "c is still answered Held {:?} after h's withdrawal of its key at revision {h_rev} failed: the left key (now {left_now:?}) lives on the session the renewals of `other` keep alive; {seen:?}",
            SHORT * 3,
        )
    });
    assert!(u64::try_from(h_rev).is_ok_and(|r| grant_c.term.0 > r), "{grant_c:?}");
}
