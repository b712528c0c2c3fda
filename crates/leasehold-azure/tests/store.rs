//! The Azure store beyond the shared suite: breaking a lease, repeated grants to one candidate,
//! and secrets kept out of everything printed. Needs Azurite (`scripts/services up azurite`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_azure::{Auth, AzureBlobStore, SasToken};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, DeposedReason, Elector, EndReason, Error, Event, Grant, LeaseName,
    LeaseStore, Renewed, random_u64,
};

const TTL: Duration = Duration::from_secs(15);

fn lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("store-{tag}-{:x}", random_u64())).unwrap()
}

fn request(lease: &LeaseName, who: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease.clone(),
        candidate: CandidateId::new(who).unwrap(),
        ttl: TTL,
        takeover: None,
    }
}

async fn granted(store: &AzureBlobStore, lease: &LeaseName, who: &str) -> Grant {
    match store.acquire(&request(lease, who)).await.unwrap() {
        Acquired::Granted(grant) => grant,
        held => panic!("{who} must get {lease}: {held:?}"),
    }
}

async fn store() -> Option<AzureBlobStore> {
    let config = common::azurite()?;
    Some(AzureBlobStore::connect_with(config).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_lease_forces_the_leader_out() {
    let Some(admin) = store().await else { return };
    let lease = lease("break");
    assert_eq!(
        admin.break_lease(&lease).await.unwrap(),
        None,
        "a free lease has nothing to break"
    );

    let a = Elector::builder(Arc::new(store().await.unwrap()), lease.as_str())
        .candidate_id("A")
        .ttl(TTL)
        .build()
        .unwrap();
    let mut events = a.events();
    let leader = a.campaign().await.unwrap();
    let term = leader.term();

    assert_eq!(admin.break_lease(&lease).await.unwrap(), Some(term));
    // The old leader learns it on its next renewal (every ttl/3) and steps down.
    tokio::time::timeout(TTL, leader.cancelled())
        .await
        .expect("the broken leader steps down within a TTL");
    let reason = loop {
        match tokio::time::timeout(TTL, events.recv()).await.unwrap().unwrap() {
            Event::Deposed { reason, .. } => break reason,
            _ => continue,
        }
    };
    assert!(matches!(reason, DeposedReason::Superseded { .. }), "{reason:?}");
    drop(leader);

    let b = Elector::builder(Arc::new(store().await.unwrap()), lease.as_str())
        .candidate_id("B")
        .ttl(TTL)
        .build()
        .unwrap();
    let new = tokio::time::timeout(TTL * 2, b.campaign()).await.unwrap().unwrap();
    assert!(new.term() > term, "new term {} after broken {term}", new.term());

    let history = admin.history(&lease, 10).await.unwrap();
    let broken = history
        .iter()
        .find(|t| t.term == term)
        .expect("the broken term is in the history");
    assert!(matches!(broken.ended, Some((_, EndReason::Broken))), "{history:?}");
    new.resign().await;
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_break_then_renew_is_lost() {
    let Some(store) = store().await else { return };
    let lease = lease("raw-break");
    let grant = granted(&store, &lease, "a").await;
    assert_eq!(store.break_blob_lease(&lease).await.unwrap(), Some(grant.term));
    match store.renew(&grant).await.unwrap() {
        Renewed::Lost(seen) => {
            assert!(seen.holder.is_none(), "{seen:?}");
            assert_eq!(seen.previous_end, Some(EndReason::Broken));
        }
        renewed => panic!("a broken grant must be lost: {renewed:?}"),
    }
    let other = store_b().await;
    let next = granted(&other, &lease, "b").await;
    assert!(next.term > grant.term);
}

async fn store_b() -> AzureBlobStore {
    store().await.expect("azurite answered a moment ago")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_grant_has_a_new_term() {
    let Some(store) = store().await else { return };
    let lease = lease("again");
    let first = granted(&store, &lease, "a").await;
    let again = granted(&store, &lease, "a").await;
    assert!(again.term > first.term, "{} after {}", again.term, first.term);
    // From another client (another process of the same candidate) too.
    let third = granted(&store_b().await, &lease, "a").await;
    assert!(third.term > again.term);
    assert!(
        matches!(store.renew(&first).await.unwrap(), Renewed::Lost(_)),
        "the older grant is superseded"
    );
    assert!(matches!(store.renew(&third).await.unwrap(), Renewed::Renewed(_)));
    match store_b().await.acquire(&request(&lease, "b")).await.unwrap() {
        Acquired::Held(seen) => assert_eq!(
            seen.holder.map(|h| (h.id.to_string(), h.term)),
            Some(("a".into(), third.term))
        ),
        granted => panic!("b must see a's lease held: {granted:?}"),
    }
    store.release(&third).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_debug_and_errors() {
    let Some(mut config) = common::azurite() else { return };
    // A SAS signed with the wrong key: the emulator refuses every request.
    let wrong = common::account_sas(
        &config.account,
        "d3Jvbmcta2V5LXdyb25nLWtleQ==",
        Duration::from_secs(3600),
    );
    let sig = wrong
        .expose()
        .split('&')
        .find_map(|p| p.strip_prefix("sig="))
        .unwrap()
        .to_string();
    let decoded = percent_decode(&sig);
    config.auth = Auth::Sas(wrong.clone());
    let store = AzureBlobStore::connect_with(config.clone()).await.unwrap();
    let lease = lease("secret");
    let err = store.acquire(&request(&lease, "a")).await.unwrap_err();
    let shown = format!("{err} | {err:?} | {store:?} | {config:?} | {wrong} | {wrong:?}");
    assert!(
        !shown.contains(&sig) && !shown.contains(&decoded),
        "a signature leaked: {shown}"
    );
    assert!(
        matches!(err, Error::Store { .. }),
        "refused authorisation is definite: {err:?}"
    );

    // An endpoint nobody listens on: transient, and still no signature.
    config.endpoint.set_port(Some(1)).unwrap();
    let store = AzureBlobStore::connect_with(config).await.unwrap();
    let err = store.inspect(&lease).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let shown = format!("{err} | {err:?}");
    assert!(
        !shown.contains(&sig) && !shown.contains(&decoded),
        "a signature leaked: {shown}"
    );

    // URLs given to connect.
    let url = format!("azblob://acct/leases?sv=1&sig={sig}&nope=1");
    let err = AzureBlobStore::connect(&url).await.unwrap_err();
    let shown = format!("{err} | {err:?}");
    assert!(!shown.contains(&sig) && shown.contains("sig=***"), "{shown}");
    assert_eq!(format!("{:?}", SasToken::new(format!("sig={sig}"))), "SasToken(***)");
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .unwrap()
        .1
        .into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_url_and_ttls() {
    let Some(config) = common::azurite() else { return };
    let Auth::Sas(sas) = &config.auth else { unreachable!() };
    let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let url = format!(
        "azblob://{}/{}?prefix=url/&endpoint={}&sas={}",
        config.account,
        config.container,
        encode(config.endpoint.as_str()),
        encode(sas.expose())
    );
    let store = AzureBlobStore::connect(&url).await.unwrap();
    let lease = lease("url");
    for ttl in [Duration::from_secs(14), Duration::from_millis(60_001), Duration::ZERO] {
        let err = store
            .acquire(&AcquireRequest {
                ttl,
                ..request(&lease, "a")
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }), "{ttl:?}: {err:?}");
    }
    // A fractional TTL is rounded up to whole seconds for Azure, never down.
    let grant = match store
        .acquire(&AcquireRequest {
            ttl: Duration::from_millis(15_500),
            ..request(&lease, "a")
        })
        .await
        .unwrap()
    {
        Acquired::Granted(grant) => grant,
        held => panic!("{held:?}"),
    };
    assert_eq!(
        store.inspect(&lease).await.unwrap().holder.unwrap().ttl,
        Duration::from_millis(15_500)
    );
    store.release(&grant).await.unwrap();
    assert!(store.inspect(&lease).await.unwrap().holder.is_none());
    assert_eq!(leasehold_azure::URL_SCHEMES, &["azblob"]);
}
