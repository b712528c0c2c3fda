//! A release or withdrawal of this store that failed (its request never reached Redis), while
//! the same store goes on leading another lease of the same TTL, and nobody sends it again (the
//! engine does, while its driver runs; not once the process is gone): what the failed request
//! would have deleted must go by itself. `LeaseStore::release` leaves an unreleased lease to
//! expire after its TTL, and a withdrawn candidate must not stay queued forever. (etcd and
//! ZooKeeper keep such state on a session the store's other leases keep alive, which only the
//! engine's resend ends.)
//!
//! Here nothing of `jobs` is shared with `other`: the lease hash has its own `PEXPIRE`, which
//! only a renewal of that grant extends, and a queue place counts only while the candidate's own
//! channel has a listener (a release skips and drops a waiter whose channel has none, and a
//! woken key left untaken expires after the TTL).

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisBackend, id, request};
use futures::StreamExt;
use leasehold_conformance::{Direction, Fault, Faults, require_server};
use leasehold_core::{Acquired, LeaseName, LeaseStore, random_u64};
use leasehold_redis::RedisStore;

const SHORT: Duration = Duration::from_secs(2);
const DELAY: Duration = Duration::from_millis(300);

fn backend() -> Option<RedisBackend> {
    let url = require_server("redis", "LEASEHOLD_REDIS_URL")?;
    let mut config = common::config(&url);
    config.restart_guard = false;
    Some(RedisBackend::with_config(config))
}

/// The candidate's acquire, asked again after an error as the engine does.
async fn acquire(store: &RedisStore, lease: &LeaseName, who: &str) -> Acquired {
    let mut attempt = 0;
    loop {
        match store.acquire(&request(lease, who, SHORT)).await {
            Ok(answer) => return answer,
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, "acquire failed; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{who}'s acquire keeps failing: {e}"),
        }
    }
}

/// Fails `operation` of the store behind `faults`: its request is held back `DELAY` in the
/// proxy, and after `after` the proxy's connections are reset, so it never reaches Redis.
async fn fail<T: Send + 'static>(
    faults: &Faults,
    after: Duration,
    operation: impl std::future::Future<Output = leasehold_core::Result<T>> + Send + 'static,
) -> leasehold_core::Result<T> {
    faults.set(Direction::Request, Fault::Delay(DELAY));
    let running = tokio::spawn(operation);
    tokio::time::sleep(after).await;
    faults.set(Direction::Request, Fault::Reset);
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the failed operation answers")
        .expect("the operation's task");
    faults.heal();
    outcome
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Left {
    Released,
    Withdrawn,
    WithdrawnStillListening,
}

/// `h` holds `jobs` and leads `other` (same TTL, same store); `c` is queued behind it. `h`'s
/// release of `jobs` never reaches Redis; `h` goes on renewing `other`. `c` must be granted
/// within three TTLs, and never beside `h`.
#[tokio::test]
async fn a_lease_left_by_a_failed_release_expires_while_other_leases_renew() {
    left_while_other_leases_renew(Left::Released).await;
}

/// `a` holds `jobs`, `h` (leading `other`) and `c` are queued in that order, each listening on
/// its own channel. `h` withdraws (its engine stops campaigning and drops its change stream);
/// the withdrawal never reaches Redis, so `h` stays first in the queue. `a` releases; `h`'s store
/// goes on renewing `other`. `c` must be granted within three TTLs.
#[tokio::test]
async fn a_queue_place_left_by_a_failed_withdraw_goes_while_other_leases_renew() {
    left_while_other_leases_renew(Left::Withdrawn).await;
}

/// The same, with `h` still listening on its own channel of `jobs` (as if its store kept the
/// subscription): `a`'s release wakes `h`, which never takes the lease; the woken key expires
/// after the TTL and its expiry event wakes every follower, `c` among them.
#[tokio::test]
async fn a_woken_place_left_by_a_failed_withdraw_expires_while_other_leases_renew() {
    left_while_other_leases_renew(Left::WithdrawnStillListening).await;
}

/// The queue's members, first first.
async fn members(backend: &RedisBackend, lease: &LeaseName) -> Vec<String> {
    let keys = backend.config.keys(lease);
    match common::raw_cmd(backend, &["ZRANGE", &keys.queue, "0", "-1"]).await {
        redis::Value::Array(values) => values
            .into_iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b).expect("utf-8"),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

async fn left_while_other_leases_renew(left: Left) {
    let Some(backend) = backend() else {
        return;
    };
    let (h, faults) = backend.faulty().await.expect("h connects");
    let a = RedisStore::from_config(backend.config.clone())
        .await
        .expect("a connects");
    let c = RedisStore::from_config(backend.config.clone())
        .await
        .expect("c connects");
    let tag = random_u64();
    let lease = LeaseName::new(format!("left-jobs-{tag:x}")).expect("lease name");
    let other = LeaseName::new(format!("left-other-{tag:x}")).expect("lease name");

    let Acquired::Granted(grant_other) = acquire(&h, &other, "h").await else {
        panic!("h is first for other and must be granted");
    };
    let grant_a = if left != Left::Released {
        let Acquired::Granted(g) = acquire(&a, &lease, "a").await else {
            panic!("a is first and must be granted");
        };
        Some(g)
    } else {
        None
    };
    // Both listen on their own channels while they campaign, as the engine's followers do.
    let h_changes = h.changes(&lease, &id("h")).await.expect("changes").expect("a stream");
    let mut c_changes = c.changes(&lease, &id("c")).await.expect("changes").expect("a stream");
    let for_h = acquire(&h, &lease, "h").await;
    assert!(matches!(
        (&for_h, left),
        (Acquired::Granted(_), Left::Released) | (Acquired::Held(_), Left::Withdrawn | Left::WithdrawnStillListening)
    ));
    assert!(matches!(acquire(&c, &lease, "c").await, Acquired::Held(_)));

    let failed = match (&for_h, left) {
        (Acquired::Granted(grant_h), Left::Released) => {
            let (h, grant_h) = (h.clone(), grant_h.clone());
            fail(&faults, DELAY / 2, async move { h.release(&grant_h).await }).await
        }
        _ => {
            let (h, lease) = (h.clone(), lease.clone());
            fail(&faults, DELAY / 2, async move { h.withdraw(&lease, &id("h")).await }).await
        }
    };
    assert!(failed.is_err(), "the {left:?} was not failed: {failed:?}");
    // The engine stopped campaigning: its change stream goes (unless the case keeps it, as if
    // h's store still listened on h's channel for jobs: then a release wakes h, which never
    // takes the lease, and the woken key's expiry must wake c).
    // (The proxy's reset ended h's streams with their connection: listen again.)
    drop(h_changes);
    let h_changes = if left == Left::WithdrawnStillListening {
        Some(h.changes(&lease, &id("h")).await.expect("changes").expect("a stream"))
    } else {
        None
    };
    if left != Left::Released {
        assert_eq!(
            members(&backend, &lease).await,
            ["h", "c"],
            "h's withdrawal was not applied"
        );
    }
    let seen = c.inspect(&lease).await.expect("inspect");
    if let Acquired::Granted(grant_h) = &for_h {
        let holder = seen.holder.as_ref().map(|x| (x.id.clone(), x.term));
        assert_eq!(
            holder,
            Some((grant_h.holder.clone(), grant_h.term)),
            "h's release was not applied: {seen:?}"
        );
    }
    if let Some(grant_a) = &grant_a {
        a.release(grant_a).await.expect("a releases");
        let woken = common::raw_cmd(&backend, &["GET", &backend.config.keys(&lease).woken]).await;
        let expected = if left == Left::WithdrawnStillListening {
            "h"
        } else {
            "c"
        };
        assert_eq!(
            woken,
            redis::Value::BulkString(expected.into()),
            "the waiter a's release woke"
        );
    }

    // h's store goes on leading `other`.
    let renewing = {
        let (h, grant_other) = (h.clone(), grant_other.clone());
        tokio::spawn(async move {
            loop {
                let _ = h.renew(&grant_other).await;
                tokio::time::sleep(SHORT / 4).await;
            }
        })
    };
    let start = Instant::now();
    let deadline = start + SHORT * 3;
    // c acquires only when woken (its own channel, the lease's channel, or the expiry events of
    // the lease record and of an untaken wake-up), as the engine's follower does with expiry
    // events: no polling that would hide a waiter left first in the queue.
    let mut last: Option<leasehold_core::Observation> = None;
    let granted = loop {
        let Some(left_for) = deadline.checked_duration_since(Instant::now()) else {
            break Err(last);
        };
        if !matches!(tokio::time::timeout(left_for, c_changes.next()).await, Ok(Some(_))) {
            continue;
        }
        match acquire(&c, &lease, "c").await {
            Acquired::Granted(g) => break Ok(g),
            Acquired::Held(seen) => {
                if let Acquired::Granted(grant_h) = &for_h {
                    let holder = seen.holder.as_ref().map(|x| (x.id.clone(), x.term));
                    assert!(
                        holder.is_none() || holder == Some((grant_h.holder.clone(), grant_h.term)),
                        "only h holds jobs until c: {seen:?}"
                    );
                }
                last = Some(seen);
            }
        }
    };
    let took = start.elapsed();
    let queue = members(&backend, &lease).await;
    renewing.abort();
    drop(h_changes);
    let grant_c = granted.unwrap_or_else(|seen| {
        panic!(
            "c is not granted {:?} after h's {left:?} failed (queue {queue:?}): {seen:?}",
            SHORT * 3
        )
    });
    // Never two holders: h's grant of jobs is gone (a renewal answers Lost), and c's term is new.
    if let Acquired::Granted(grant_h) = &for_h {
        assert!(grant_c.term > grant_h.term, "{grant_c:?} after {grant_h:?}");
        assert!(
            matches!(h.renew(grant_h).await, Ok(leasehold_core::Renewed::Lost(_))),
            "h's grant of jobs must be lost once c holds it"
        );
    }
    let seen = c.inspect(&lease).await.expect("inspect");
    assert_eq!(
        seen.holder.map(|x| (x.id, x.term)),
        Some((id("c"), grant_c.term)),
        "c alone holds jobs"
    );
    eprintln!("{left:?}: c granted {took:?} after the failure (TTL {SHORT:?})");
    c.release(&grant_c).await.expect("c releases");
    h.release(&grant_other).await.expect("h releases other");
}
