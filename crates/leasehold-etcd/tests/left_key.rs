//! A candidate key left behind by a deletion of this store that failed (its request never
//! reached etcd), then the same candidate's next `acquire`. The store began the deletion
//! (`Inner::retire`) before sending it, so the key it finds again at that revision is stale:
//! a queued key is cleared and queued afresh (behind the keys now there), a granted one is
//! handed over to the candidate itself and taken with a new term (docs.md, "acquire"). Either
//! way: never two holders, terms only grow, and the candidates queued behind the left key are
//! woken and granted (a left key first in the queue would otherwise block them until its
//! session ends, and the store keeps that session alive while it has any other use for it).
//!
//! The deletion fails through a fault proxy in front of the candidate's store: a request reset
//! breaks its connections at once, and the request of the deletion, held back in the proxy, is
//! never forwarded.
//!
//! And when the candidate does not acquire again (its engine stopped after the failed release or
//! withdrawal) while its store renews another lease of the same TTL: the left key would live on
//! the shared session those renewals keep alive, and the candidate queued next would be answered
//! `Held` for as long as they go on; the store sends the failed deletion again after its next
//! keepalive (`Inner::leave`).

use std::time::Duration;

use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, FaultProxy};
use leasehold_core::{Acquired, CandidateId, Grant, LeaseName, LeaseStore, Term};
use leasehold_etcd::EtcdStore;
use tokio::sync::mpsc;

mod common;

const TTL: Duration = Duration::from_secs(10);
const DELAY: Duration = Duration::from_millis(300);

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("candidate id")
}

/// The candidate's acquire, asked again after an error as the engine does (the first request
/// after the proxy's reset may fail on the broken connection).
async fn acquire(store: &EtcdStore, lease: &LeaseName, candidate: &str) -> Acquired {
    acquire_for(store, lease, candidate, TTL).await
}

async fn acquire_for(store: &EtcdStore, lease: &LeaseName, candidate: &str, ttl: Duration) -> Acquired {
    let mut attempt = 0;
    loop {
        match store.acquire(&common::request(lease, candidate, ttl)).await {
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

/// The candidate `candidate`'s change stream, polled by a task of its own (as the engine's driver
/// polls it): each notification is one message.
async fn woken(store: &EtcdStore, lease: &LeaseName, candidate: &str) -> mpsc::UnboundedReceiver<()> {
    let mut changes = store
        .changes(lease, &id(candidate))
        .await
        .expect("changes")
        .expect("a stream");
    let (woke, woken) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while changes.next().await.is_some() {
            if woke.send(()).is_err() {
                break;
            }
        }
    });
    woken
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

/// `b`, queued behind the holder `a` with `c` queued behind it, withdraws; the withdrawal's
/// delete never reaches etcd, so `b`'s key stays, and once `a` releases it is first: `c` is
/// answered `Held` by it. `b`'s next acquire clears it and queues afresh, behind `c` (`Held`, a
/// new key with a higher revision than `c`'s); `c`, woken by the left key's deletion, is granted
/// with its own key's term, and `b` after `c`'s release with its new key's term. (A store that
/// reused the left key instead would be as safe: `b` granted with that key's term, `c` `Held`
/// until `b` releases, then woken and granted; the test accepts that too.)
#[tokio::test]
async fn a_key_left_by_a_failed_withdraw_is_queued_afresh() {
    let Some(common::HolderAndQueued {
        address,
        prefix,
        proxy,
        a,
        b,
        lease,
        grant_a,
    }) = common::holder_and_queued("leasehold-left-key", TTL).await
    else {
        return;
    };
    let mut etcd = Etcd::new(&address, &prefix).await;
    let c = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("c connects");
    assert!(matches!(acquire(&c, &lease, "c").await, Acquired::Held(_)));
    let mut c_woken = woken(&c, &lease, "c").await;
    let b_rev = etcd.key("b").await.expect("b's key");
    let c_rev = etcd.key("c").await.expect("c's key");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The withdrawal's read is answered (one delayed request), its delete is held back and lost.
    let withdraw = {
        let (b, lease) = (b.clone(), lease.clone());
        async move { b.withdraw(&lease, &id("b")).await }
    };
    let withdrawn = fail(&proxy, DELAY * 3 / 2, withdraw).await;
    assert!(withdrawn.is_err(), "the withdrawal was not failed: {withdrawn:?}");
    assert_eq!(etcd.key("b").await, Some(b_rev), "b's key is left as it was");

    a.release(&grant_a).await.expect("a releases");
    tokio::time::sleep(Duration::from_millis(200)).await;
    while c_woken.try_recv().is_ok() {}
    let seen = c.inspect(&lease).await.expect("inspect");
    assert!(seen.holder.is_none(), "nobody holds the lease: {seen:?}");
    assert!(
        matches!(acquire(&c, &lease, "c").await, Acquired::Held(_)),
        "c is behind b's left key"
    );

    // b campaigns again: its left key is stale and queued afresh (what the store does: a new key
    // behind c), or reused (its term is that key's). Either way one holder, and c goes next.
    let again = acquire(&b, &lease, "b").await;
    let b_now = etcd.key("b").await.expect("b is queued");
    let revision = |r: i64| Term(u64::try_from(r).expect("revision"));
    let (first, second) = match &again {
        Acquired::Held(_) => {
            assert!(b_now > c_rev, "b queued afresh behind c: {b_now} vs {c_rev}");
            // c, woken by the left key's deletion, is granted.
            tokio::time::timeout(Duration::from_secs(5), c_woken.recv())
                .await
                .expect("c is woken when b's left key goes")
                .expect("c's stream");
            let Acquired::Granted(grant_c) = acquire(&c, &lease, "c").await else {
                panic!("c is first once b's left key is gone");
            };
            assert_eq!(grant_c.term, revision(c_rev), "{grant_c:?}");
            ((c.clone(), grant_c), (b.clone(), "b", revision(b_now)))
        }
        Acquired::Granted(grant_b) => {
            assert_eq!(
                (grant_b.term, b_now),
                (revision(b_rev), b_rev),
                "b's left key reused, with its own term"
            );
            ((b.clone(), grant_b.clone()), (c.clone(), "c", revision(c_rev)))
        }
    };
    let ((holder, grant), (next, name, term)) = (first, second);
    assert!(grant.term > grant_a.term, "{grant:?}");
    let for_next = acquire(&next, &lease, name).await;
    assert!(
        matches!(&for_next, Acquired::Held(seen) if seen.holder.as_ref().is_some_and(|h| h.id == grant.holder && h.term == grant.term)),
        "two holders: {grant:?} and {name} {for_next:?}"
    );
    holder.release(&grant).await.expect("the holder releases");
    if name == "c" {
        tokio::time::timeout(Duration::from_secs(5), c_woken.recv())
            .await
            .expect("c is woken by b's release")
            .expect("c's stream");
    }
    let Acquired::Granted(grant_next) = acquire(&next, &lease, name).await else {
        panic!("{name} is first after {grant:?} was released");
    };
    assert_eq!(grant_next.term, term, "{grant_next:?}");
    next.release(&grant_next).await.expect("the next releases");
    etcd.finish().await;
}

/// The holder `h` releases; the release's delete never reaches etcd, so `h`'s granted key stays
/// and still leads (nobody else is granted meanwhile). `h`'s next acquire finds it stale and
/// granted before: the term is handed over to `h` itself and taken with a new, higher term, and
/// `c` (queued behind, its key deleted by the take) is never granted beside it. Once `h`
/// releases, `c` is woken and granted, with a term above both of `h`'s.
#[tokio::test]
async fn a_granted_key_left_by_a_failed_release_is_taken_with_a_new_term() {
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
    let h = EtcdStore::connect(&format!("etcd://{}/{prefix}", proxy.addr()))
        .await
        .expect("h connects");
    let c = EtcdStore::connect(&format!("etcd://{address}/{prefix}"))
        .await
        .expect("c connects");
    let lease = LeaseName::new("jobs").expect("lease name");
    let Acquired::Granted(grant_h) = acquire(&h, &lease, "h").await else {
        panic!("h is first and must be granted");
    };
    assert!(matches!(acquire(&c, &lease, "c").await, Acquired::Held(_)));
    let mut c_woken = woken(&c, &lease, "c").await;
    let h_rev = etcd.key("h").await.expect("h's key");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The release's one request is held back and lost.
    let release = {
        let (h, grant_h) = (h.clone(), grant_h.clone());
        async move { h.release(&grant_h).await }
    };
    let released = fail(&proxy, DELAY / 2, release).await;
    assert!(released.is_err(), "the release was not failed: {released:?}");
    assert_eq!(etcd.key("h").await, Some(h_rev), "h's key is left as it was");
    let seen = c.inspect(&lease).await.expect("inspect");
    assert!(
        seen.holder
            .as_ref()
            .is_some_and(|x| x.id == id("h") && x.term == grant_h.term),
        "h's left key still leads: {seen:?}"
    );
    assert!(
        matches!(acquire(&c, &lease, "c").await, Acquired::Held(_)),
        "c is not granted beside h's left key"
    );
    // h's own store never shows its left key as holder: a read-back of h's engine (an acquire
    // of h's whose answer was lost) would adopt its term, and the store's resent deletion would
    // then delete the key under that leader.
    let is_h = |o: &leasehold_core::Observation| o.holder.as_ref().is_some_and(|x| x.id == id("h"));
    let seen_by_h = h.inspect(&lease).await;
    assert!(seen_by_h.as_ref().map_or(true, |o| !is_h(o)), "{seen_by_h:?}");
    let listed_by_h = h.list("").await;
    assert!(
        listed_by_h.as_ref().map_or(true, |all| !all.iter().any(is_h)),
        "{listed_by_h:?}"
    );

    // h campaigns again.
    let again = acquire(&h, &lease, "h").await;
    let for_c = acquire(&c, &lease, "c").await;
    let seen = c.inspect(&lease).await.expect("inspect");
    let grant_h2: Grant = match (&again, &for_c) {
        (Acquired::Granted(g), Acquired::Held(_)) => g.clone(),
        _ => panic!(
            "h again {again:?}, c {for_c:?}: h's left granted key is taken by h with a new term, c stays queued; inspect {seen:?}"
        ),
    };
    assert!(grant_h2.term > grant_h.term, "a new, higher term: {grant_h2:?}");
    assert!(
        seen.holder
            .as_ref()
            .is_some_and(|x| x.id == id("h") && x.term == grant_h2.term),
        "{seen:?}"
    );
    assert_eq!(
        etcd.key("h").await.and_then(|r| u64::try_from(r).ok()),
        Some(grant_h2.term.0)
    );

    // h releases; c is woken (perhaps first by the hand-over's deletion of h's left key) and
    // granted with a higher term.
    h.release(&grant_h2).await.expect("h releases");
    let grant_c = loop {
        tokio::time::timeout(Duration::from_secs(5), c_woken.recv())
            .await
            .expect("c is woken")
            .expect("c's stream");
        match acquire(&c, &lease, "c").await {
            Acquired::Granted(g) => break g,
            Acquired::Held(seen) => assert!(
                seen.holder
                    .as_ref()
                    .is_none_or(|x| x.id != id("h") || x.term == grant_h2.term),
                "{seen:?}"
            ),
        }
    };
    assert!(grant_c.term > grant_h2.term, "{grant_c:?}");
    // c may be granted on h's release: its records follow the grant.
    let expected = vec![
        (
            grant_h.term,
            "h".to_string(),
            Some(leasehold_core::EndReason::HandedOver),
        ),
        (
            grant_h2.term,
            "h".to_string(),
            Some(leasehold_core::EndReason::Released),
        ),
        (grant_c.term, "c".to_string(), None),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let history = c.history(&lease, 10).await.expect("history");
        let terms: Vec<_> = history
            .iter()
            .map(|t| (t.term, t.holder.as_str().to_string(), t.ended.map(|e| e.1)))
            .collect();
        if terms == expected {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{history:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.release(&grant_c).await.expect("c releases");
    etcd.finish().await;
}

/// The holder `h` of `jobs` also leads `other`, with the same TTL (so both keys are on the
/// store's one session of that TTL), and goes on renewing `other`. Its release of `jobs` fails
/// (the delete never reaches etcd). `LeaseStore::release` says a release that did not free the
/// lease leaves it to expire after its TTL; but `h`'s left key is on the session that the
/// renewals of `other` keep alive, so `c`, queued next, would be answered `Held` by it for as
/// long as `h`'s store renews anything of that TTL (nobody acquires `jobs` for `h` again: its
/// engine stopped campaigning when it released). The store sends the deletion again after its
/// next keepalive, and `c` is granted within three TTLs.
#[tokio::test]
async fn a_granted_key_left_by_a_failed_release_expires_while_other_leases_renew() {
    left_while_other_leases_renew(Left::Release).await;
}

/// The same for a queued key: `h`, queued behind the holder `a` and leading `other`, withdraws
/// `jobs` (its engine stops campaigning); the withdrawal's delete never reaches etcd. Once `a`
/// releases, `h`'s left key is first, and `c`, queued behind it, would be answered `Held` for as
/// long as `h`'s store renews `other` (`LeaseStore::withdraw` allows "queued until its session
/// expires", but the session is kept alive by other leases; the ZooKeeper store withdraws such a
/// left node on its live sessions since f1c5d4c). The store sends the withdrawal again after its
/// next keepalive.
#[tokio::test]
async fn a_queued_key_left_by_a_failed_withdraw_goes_while_other_leases_renew() {
    left_while_other_leases_renew(Left::Withdraw).await;
}

/// As the withdrawal above, but its first request (the read of `h`'s key) is the one that
/// fails: the store does not know the key's revision, and sends the whole withdrawal again
/// (review finding: it returned the error and left the key for good).
#[tokio::test]
async fn a_queued_key_left_by_a_withdraw_whose_read_failed_goes_while_other_leases_renew() {
    left_while_other_leases_renew(Left::WithdrawRead).await;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Left {
    Release,
    Withdraw,
    WithdrawRead,
}

/// See the three tests above: `h`'s key of `jobs` is left by a failed release (`h` holds `jobs`,
/// `c` queued next) or a failed withdrawal (`a` holds `jobs`, `h` and `c` queued in that order;
/// `a` releases after the withdrawal failed); `h`'s store goes on renewing `other`. `c` must be
/// granted within three TTLs.
async fn left_while_other_leases_renew(left: Left) {
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
    let grant_a = if left != Left::Release {
        let Acquired::Granted(g) = acquire_for(&a, &lease, "a", SHORT).await else {
            panic!("a is first and must be granted");
        };
        Some(g)
    } else {
        None
    };
    let for_h = acquire_for(&h, &lease, "h", SHORT).await;
    assert!(matches!(
        (&for_h, left),
        (Acquired::Granted(_), Left::Release) | (Acquired::Held(_), Left::Withdraw | Left::WithdrawRead)
    ));
    assert!(matches!(acquire_for(&c, &lease, "c", SHORT).await, Acquired::Held(_)));
    let h_rev = etcd.key("h").await.expect("h's key");

    let failed = match (&for_h, left) {
        (Acquired::Granted(grant_h), Left::Release) => {
            let (h, grant_h) = (h.clone(), grant_h.clone());
            fail(&proxy, DELAY / 2, async move { h.release(&grant_h).await }).await
        }
        _ => {
            let (h, lease) = (h.clone(), lease.clone());
            // Withdraw: the read is answered, the delete lost; WithdrawRead: the read lost.
            let after = if left == Left::Withdraw {
                DELAY * 3 / 2
            } else {
                DELAY / 2
            };
            fail(&proxy, after, async move { h.withdraw(&lease, &id("h")).await }).await
        }
    };
    assert!(failed.is_err(), "the {left:?} was not failed: {failed:?}");
    assert_eq!(etcd.key("h").await, Some(h_rev), "h's key is left as it was");
    if let Some(grant_a) = &grant_a {
        a.release(grant_a).await.expect("a releases");
    }

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
            "c is still answered Held {:?} after h's {left:?} of its key at revision {h_rev} failed: the left key (now {left_now:?}) lives on the session the renewals of `other` keep alive; {seen:?}",
            SHORT * 3,
        )
    });
    assert!(u64::try_from(h_rev).is_ok_and(|r| grant_c.term.0 > r), "{grant_c:?}");
}
