//! A grant whose answers are lost, against the etcd test server (`scripts/services up etcd`),
//! through the conformance suite's fault proxy:
//!
//! 1. a queued candidate's `acquire` is written with every reply lost (it needs no answer to
//!    go out), and the next `acquire`, once replies flow again, hands out that very term;
//! 2. once `inspect` has shown that grant (the engine may have adopted it), the next `acquire`
//!    does not hand it out again: it ends it and grants a new, higher term.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_conformance::{Direction, Fault, FaultProxy, require_server};
use leasehold_core::{AcquireRequest, Acquired, CandidateId, Grant, LeaseName, LeaseStore, Term};
use leasehold_etcd::EtcdStore;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(2);
const PREFIX: &str = "leasehold-tests";

struct Setup {
    observer: EtcdStore,
    /// C's store, whose connection runs through the proxy.
    store: EtcdStore,
    proxy: FaultProxy,
    lease: LeaseName,
    request: AcquireRequest,
    /// The term C's lost acquire was granted.
    term: Term,
    /// The acquire whose replies were lost, still running.
    lost: tokio::task::JoinHandle<()>,
}

fn request(lease: &LeaseName, id: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(id).expect("valid id"),
        ttl: TTL,
        takeover: None,
    }
}

/// C queues behind a blocker; every reply to C is lost; the blocker releases; C's next acquire
/// (never answered) must still be written. Replies flow again afterwards.
async fn lost_grant(name: &str) -> Option<Setup> {
    let server = require_server("etcd", "LEASEHOLD_ETCD_URL")?;
    let address = server.trim_start_matches("etcd://").trim_end_matches('/');
    let upstream: SocketAddr = tokio::net::lookup_host(address)
        .await
        .expect("resolvable etcd address")
        .next()
        .expect("an etcd address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let observer = EtcdStore::connect(&format!("etcd://{address}/{PREFIX}"))
        .await
        .expect("observer connects");
    let store = EtcdStore::connect(&format!("etcd://{}/{PREFIX}", proxy.addr()))
        .await
        .expect("C connects through the proxy");
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let lease = LeaseName::new(format!("lost-answers-{name}-{suffix}")).expect("valid lease name");
    let Ok(Acquired::Granted(blocking)) = observer.acquire(&request(&lease, "blocker")).await else {
        panic!("the blocker cannot take a fresh lease");
    };
    let request = request(&lease, "C");
    let queued = store.acquire(&request).await.expect("C queues");
    assert!(
        matches!(queued, Acquired::Held(_)),
        "C must queue behind the blocker: {queued:?}"
    );

    proxy.faults().set(Direction::Reply, Fault::Blackhole);
    observer.release(&blocking).await.expect("the blocker releases");
    let lost = {
        let store = store.clone();
        let request = request.clone();
        tokio::spawn(async move {
            let _ = store.acquire(&request).await;
        })
    };
    let written = timeout(TTL, async {
        loop {
            let seen = observer.inspect(&lease).await.expect("observer inspects");
            if let Some(holder) = seen.holder.filter(|h| h.id == request.candidate) {
                return holder.term;
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let term =
        written.unwrap_or_else(|_| panic!("C's acquire was not written within {TTL:?} while its replies were lost"));
    proxy.faults().heal();
    Some(Setup {
        observer,
        store,
        proxy,
        lease,
        request,
        term,
        lost,
    })
}

/// Asks until the store answers (the connection the lost replies broke is replaced meanwhile),
/// as the engine would after a failed read-back.
async fn acquire_answered(store: &EtcdStore, request: &AcquireRequest) -> Acquired {
    let deadline = Instant::now() + TTL;
    loop {
        match store.acquire(request).await {
            Ok(answer) => return answer,
            Err(e) if Instant::now() < deadline => {
                eprintln!("acquire failed ({e}); asking again");
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("acquire still fails after {TTL:?}: {e}"),
        }
    }
}

async fn finish(setup: Setup, grant: &Grant) {
    setup.store.release(grant).await.expect("release");
    setup.lost.abort();
    drop(setup.proxy);
    let after = setup.observer.inspect(&setup.lease).await.expect("inspect");
    assert!(after.holder.is_none(), "released: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_answers_were_lost_is_handed_out_at_its_term() {
    let Some(setup) = lost_grant("handed-out").await else {
        return;
    };
    let answer = acquire_answered(&setup.store, &setup.request).await;
    let Acquired::Granted(grant) = answer else {
        panic!("C's applied grant (term {}) must be handed out: {answer:?}", setup.term);
    };
    assert_eq!(grant.term, setup.term, "the term the store granted, not a new one");
    let seen = setup.observer.inspect(&setup.lease).await.expect("inspect");
    assert_eq!(
        seen.holder.map(|h| (h.id, h.term)),
        Some((grant.holder.clone(), grant.term))
    );
    finish(setup, &grant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_inspect_has_shown_is_not_handed_out_again() {
    let Some(setup) = lost_grant("shown").await else { return };
    let deadline = Instant::now() + TTL;
    let shown = loop {
        match setup.store.inspect(&setup.lease).await {
            Ok(seen) => break seen,
            Err(e) if Instant::now() < deadline => {
                eprintln!("inspect failed ({e}); asking again");
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("inspect still fails after {TTL:?}: {e}"),
        }
    };
    assert_eq!(
        shown.holder.map(|h| (h.id, h.term)),
        Some((setup.request.candidate.clone(), setup.term)),
        "C's own store shows its grant (its session is alive)"
    );
    let answer = acquire_answered(&setup.store, &setup.request).await;
    let Acquired::Granted(grant) = answer else {
        panic!("C is first: it must be granted: {answer:?}");
    };
    assert!(
        grant.term > setup.term,
        "a term inspect has shown (the engine may have led with it) must not be handed out again: {} after {}",
        grant.term,
        setup.term
    );
    let history = setup.observer.history(&setup.lease, 10).await.expect("history");
    let ended = history.iter().find(|t| t.term == setup.term).and_then(|t| t.ended);
    assert!(ended.is_some(), "the shown term ended before the new one: {history:?}");
    finish(setup, &grant).await;
}
