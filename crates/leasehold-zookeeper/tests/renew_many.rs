//! [`LeaseStore::renew_many`] on ZooKeeper: 50 grants on two sessions (two TTLs) renewed in a
//! handful of requests (one `sync` and one multi-read per session, counted by the server), and,
//! once some are no longer held (released, released and taken, broken, handed over, handed over
//! and taken, a wrong term, a znode that never existed, a session that does not exist), each
//! answer equal to what `renew` of that grant answers. Against the ZooKeeper test server
//! (`LEASEHOLD_ZOOKEEPER_URL`), under a chroot of its own.

use crate::common;

use std::time::Duration;

use leasehold_conformance::require_server;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Grant, LeaseName, LeaseStore, Renewed, Result, Term, random_u64,
};
use leasehold_zookeeper::ZookeeperStore;

const TTL: Duration = Duration::from_secs(4);
/// The TTL of the last ten grants: a second session.
const OTHER_TTL: Duration = Duration::from_secs(6);
const GRANTS: usize = 50;

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid candidate id")
}

fn lease(i: usize) -> LeaseName {
    LeaseName::new(format!("lease-{i:02}")).expect("valid lease name")
}

fn ttl(i: usize) -> Duration {
    if i >= 40 { OTHER_TTL } else { TTL }
}

async fn acquire(store: &ZookeeperStore, i: usize, candidate: &str) -> Grant {
    let request = AcquireRequest {
        lease: lease(i),
        candidate: id(candidate),
        ttl: ttl(i),
        takeover: None,
    };
    match store.acquire(&request).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        Acquired::Held(seen) => panic!("lease {i}: expected a grant, got Held({seen:?})"),
    }
}

/// An answer in full, errors by kind and text.
fn render(answer: &Result<Renewed>) -> String {
    match answer {
        Ok(renewed) => format!("{renewed:?}"),
        Err(e) => format!("error (transient: {}): {e}", e.is_transient()),
    }
}

/// The holder an answer shows: who, whether reserved; or how the free lease's last term ended.
fn lost_to(answer: &Result<Renewed>) -> String {
    match answer {
        Ok(Renewed::Lost(seen)) => match &seen.holder {
            Some(h) if h.reserved => format!("reserved for {}", h.id),
            Some(h) => format!("held by {}", h.id),
            None => format!("free, {:?}", seen.previous_end),
        },
        other => format!("not lost: {}", render(other)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_is_what_renew_answers_and_a_batch_costs_two_requests_per_session() {
    let Some(server) = require_server("zookeeper", "LEASEHOLD_ZOOKEEPER_URL") else {
        return;
    };
    let url = format!(
        "{}/leasehold-renew-many-{:016x}",
        server.trim_end_matches('/'),
        random_u64()
    );
    let addr = common::address(&server);
    let (a, b) = (
        ZookeeperStore::connect(&url).await.expect("connect"),
        ZookeeperStore::connect(&url).await.expect("connect"),
    );
    let mut grants = Vec::with_capacity(GRANTS);
    for i in 0..GRANTS {
        grants.push(acquire(&a, i, "holder").await);
    }
    // Let the grants' history tidying (tasks of their own) finish before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // All held: one sync and one multi-read per session (TTL), whatever the number of grants.
    let before = common::requests_by_connection(&addr);
    let answers = a.renew_many(&grants).await.expect("renew_many");
    let after = common::requests_by_connection(&addr);
    assert_eq!(answers.len(), GRANTS);
    for (grant, answer) in grants.iter().zip(&answers) {
        assert!(
            matches!(answer, Ok(Renewed::Renewed(g)) if g == grant),
            "{}: {}",
            grant.lease,
            render(answer)
        );
    }
    match before.zip(after) {
        Some((before, after)) => {
            let requests = common::since(&before, &after);
            println!("renew_many of {GRANTS} held grants on 2 sessions: {requests} ZooKeeper requests");
            // 2 per session; one more if a session's ping fell in between. renew of each: 100.
            assert!(requests <= 5, "{requests} requests for {GRANTS} grants on 2 sessions");
        }
        None => println!("the server does not answer `stat`: requests not counted"),
    }

    // Some no longer held, in every way one can lose a lease.
    let mut expected: Vec<String> = vec!["renewed".to_string(); GRANTS];
    a.release(&grants[0]).await.expect("release");
    expected[0] = "free, Some(Released)".into();
    a.release(&grants[1]).await.expect("release");
    acquire(&b, 1, "b").await;
    expected[1] = "held by b".into();
    a.release(&grants[41]).await.expect("release");
    expected[41] = "free, Some(Released)".into();
    for i in [10, 11, 42] {
        assert_eq!(b.break_lease(&lease(i)).await.expect("break"), Some(grants[i].term));
        expected[i] = "free, Some(Broken)".into();
    }
    a.hand_over(&grants[20], &id("b")).await.expect("hand over");
    expected[20] = "reserved for b".into();
    a.hand_over(&grants[21], &id("b")).await.expect("hand over");
    acquire(&b, 21, "b").await;
    expected[21] = "held by b".into();
    a.hand_over(&grants[45], &id("c")).await.expect("hand over");
    expected[45] = "reserved for c".into();
    // A term that is not the znode's, a znode that never existed, a session never opened.
    grants[30].term = Term(grants[30].term.0 + 1);
    expected[30] = "held by holder".into();
    grants[31].token = format!("{}-0000099999", &grants[31].token[..18]);
    expected[31] = "held by holder".into();
    grants[32].ttl = Duration::from_secs(7);
    expected[32] = "error".into();

    let answers = a.renew_many(&grants).await.expect("renew_many");
    assert_eq!(answers.len(), GRANTS);
    for (i, (grant, answer)) in grants.iter().zip(&answers).enumerate() {
        let single = a.renew(grant).await;
        assert_eq!(render(answer), render(&single), "grant {i} ({})", grant.lease);
        match expected[i].as_str() {
            "renewed" => assert!(
                matches!(answer, Ok(Renewed::Renewed(g)) if g == grant),
                "grant {i}: {}",
                render(answer)
            ),
            "error" => assert!(
                matches!(answer, Err(e) if e.is_transient()),
                "grant {i}: {}",
                render(answer)
            ),
            lost => assert_eq!(lost_to(answer), lost, "grant {i}"),
        }
    }
    let renewed = answers.iter().filter(|a| matches!(a, Ok(Renewed::Renewed(_)))).count();
    assert_eq!(renewed, GRANTS - 12);
    let history = a.history(&lease(20), 1).await.expect("history");
    assert_eq!(history[0].ended.map(|(_, r)| r), Some(EndReason::HandedOver));

    for (grant, answer) in grants.iter().zip(&answers) {
        if matches!(answer, Ok(Renewed::Renewed(_))) {
            a.release(grant).await.expect("release");
        }
    }
}
