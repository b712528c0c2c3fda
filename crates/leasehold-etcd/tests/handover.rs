//! `hand_over` against the etcd test server (`scripts/services up etcd`), each test under a
//! store prefix of its own, removed at the end: the successor goes before candidates queued
//! ahead of it without any key older than its term staying queued; a corrupt reservation is a
//! typed error naming it; breaking a reservation opens the lease.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, DeleteOptions};
use leasehold_conformance::require_server;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Grant, LeaseName, LeaseStore, Observation,
};
use leasehold_etcd::EtcdStore;

const TTL: Duration = Duration::from_secs(30);
const LEASE: &str = "jobs";

struct Setup {
    raw: Client,
    address: String,
    prefix: String,
}

impl Setup {
    async fn new(name: &str) -> Option<Setup> {
        let server = require_server("etcd", "LEASEHOLD_ETCD_URL")?;
        let address = server.trim_start_matches("etcd://").trim_end_matches('/').to_string();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let prefix = format!("leasehold-handover-tests/{name}-{nanos}");
        let raw = Client::connect([address.as_str()], None)
            .await
            .expect("raw client connects");
        Some(Setup { raw, address, prefix })
    }

    /// A store of its own (a process of its own, as candidates are).
    async fn store(&self) -> EtcdStore {
        EtcdStore::connect(&format!("etcd://{}/{}", self.address, self.prefix))
            .await
            .expect("store connects")
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{LEASE}/{rest}", self.prefix)
    }

    async fn exists(&mut self, rest: &str) -> bool {
        let key = self.key(rest);
        !self.raw.get(key, None).await.expect("raw read").kvs().is_empty()
    }

    async fn finish(mut self) {
        let prefix = format!("{}/", self.prefix);
        self.raw
            .delete(prefix, Some(DeleteOptions::new().with_prefix()))
            .await
            .expect("clean up");
    }
}

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid id")
}

fn lease() -> LeaseName {
    LeaseName::new(LEASE).expect("valid lease name")
}

fn request(who: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease(),
        candidate: id(who),
        ttl: TTL,
        takeover: None,
    }
}

async fn grant(store: &EtcdStore, who: &str) -> Grant {
    match store.acquire(&request(who)).await.expect("acquire") {
        Acquired::Granted(grant) => grant,
        held => panic!("{who} must be granted: {held:?}"),
    }
}

async fn held(store: &EtcdStore, who: &str) -> Observation {
    match store.acquire(&request(who)).await.expect("acquire") {
        Acquired::Held(seen) => seen,
        granted => panic!("{who} must be told Held: {granted:?}"),
    }
}

fn shown(seen: &Observation) -> Option<(&str, u64, bool)> {
    seen.holder.as_ref().map(|h| (h.id.as_str(), h.term.0, h.reserved))
}

/// A leads, B queues, C queues behind B; A hands over to C. Until C asks, everyone sees C
/// reserved at A's term (inspect, list, B's acquire). C is granted before B, and B's key (older
/// than C's term) is gone with the take, so B queues again behind C: when C releases, B is
/// granted with a term above C's. Without `hand_over` on etcd the first call is Unsupported.
#[tokio::test]
async fn the_successor_goes_before_candidates_queued_ahead_of_it() {
    let Some(mut setup) = Setup::new("ahead").await else {
        return;
    };
    let (store_a, store_b, store_c) = (setup.store().await, setup.store().await, setup.store().await);
    let a = grant(&store_a, "a").await;
    let seen = held(&store_b, "b").await;
    assert_eq!(shown(&seen), Some(("a", a.term.0, false)));
    held(&store_c, "c").await;

    store_a.hand_over(&a, &id("c")).await.expect("hand_over");
    assert!(setup.exists("reserved").await, "the reservation key is written");
    assert!(!setup.exists("c/a").await, "the holder's key is deleted");
    let inspected = store_b.inspect(&lease()).await.expect("inspect");
    assert_eq!(shown(&inspected), Some(("c", a.term.0, true)), "{inspected:?}");
    let listed = store_b.list("").await.expect("list");
    assert_eq!(
        listed,
        vec![inspected.clone()],
        "list shows the reservation as inspect does"
    );
    let seen = held(&store_b, "b").await;
    assert_eq!(
        shown(&seen),
        Some(("c", a.term.0, true)),
        "B, first in the queue, is held: {seen:?}"
    );

    let c = grant(&store_c, "c").await;
    assert!(c.term > a.term, "C's term {} above A's {}", c.term, a.term);
    assert!(!setup.exists("reserved").await, "the take deletes the reservation");
    assert!(
        !setup.exists("c/b").await,
        "B's key, queued before C's term, goes with the take"
    );
    let history = store_b.history(&lease(), 10).await.expect("history");
    let ended = history.iter().find(|t| t.term == a.term).and_then(|t| t.ended);
    assert_eq!(ended.map(|(_, why)| why), Some(EndReason::HandedOver), "{history:?}");

    let seen = held(&store_b, "b").await;
    assert_eq!(
        shown(&seen),
        Some(("c", c.term.0, false)),
        "B queues again behind C: {seen:?}"
    );
    store_c.release(&c).await.expect("release");
    let b = grant(&store_b, "b").await;
    assert!(b.term > c.term, "B's term {} above C's {}", b.term, c.term);
    store_b.release(&b).await.expect("release");
    setup.finish().await;
}

/// A reservation key holding something leasehold did not write is a CorruptRecord naming it,
/// for inspect and for a candidate's acquire alike.
#[tokio::test]
async fn a_corrupt_reservation_is_an_error_naming_it() {
    let Some(mut setup) = Setup::new("corrupt").await else {
        return;
    };
    let store = setup.store().await;
    let a = grant(&store, "a").await;
    store.hand_over(&a, &id("c")).await.expect("hand_over");
    let key = setup.key("reserved");
    setup.raw.put(key, "leasehold1 r soon", None).await.expect("raw write");
    for what in ["inspect", "acquire"] {
        let answer = match what {
            "inspect" => store.inspect(&lease()).await.map(|_| ()),
            _ => store.acquire(&request("b")).await.map(|_| ()),
        };
        match answer {
            Err(Error::CorruptRecord { lease, detail, .. }) => {
                assert_eq!(lease, LEASE);
                assert!(detail.contains("reserved"), "{what}: {detail}");
            }
            other => panic!("{what} of a garbled reservation must be CorruptRecord, got {other:?}"),
        }
    }
    setup.finish().await;
}

/// Breaking a reserved lease ends the reservation and returns the handed-over term; the lease
/// is then free (its last term handed over), a second break finds nothing, and the next grant
/// has a higher term.
#[tokio::test]
async fn breaking_a_reservation_opens_the_lease() {
    let Some(setup) = Setup::new("break").await else { return };
    let store = setup.store().await;
    let a = grant(&store, "a").await;
    store.hand_over(&a, &id("nobody")).await.expect("hand_over");
    assert_eq!(store.break_lease(&lease()).await.expect("break"), Some(a.term));
    let seen = store.inspect(&lease()).await.expect("inspect");
    assert!(
        seen.holder.is_none() && seen.last_term == a.term && seen.previous_end == Some(EndReason::HandedOver),
        "{seen:?}"
    );
    assert_eq!(store.break_lease(&lease()).await.expect("break"), None);
    let b = grant(&store, "b").await;
    assert!(b.term > a.term);
    store.release(&b).await.expect("release");
    setup.finish().await;
}
