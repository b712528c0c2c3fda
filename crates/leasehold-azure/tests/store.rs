//! The Azure store beyond the shared suite: breaking a blob lease by hand, repeated grants to one
//! candidate, and secrets kept out of everything printed. Needs Azurite (`scripts/services up azurite`).

use crate::common;

use std::time::Duration;

use leasehold_azure::{Auth, AzureBlobStore};
use leasehold_core::config::Secret;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, EndReason, Error, Grant, LeaseName, LeaseStore, Renewed, Term, random_u64,
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
    Some(AzureBlobStore::from_config(config).await.unwrap())
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

/// A reservation ([`LeaseStore::hand_over`]) is no grant: a grant of the successor at the
/// handed-over term (made from what `inspect` shows) neither renews, releases nor hands it over;
/// the successor's withdrawal frees it at once, and a break frees it, both keeping the term ended
/// handed over by its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_no_grant() {
    let Some(store) = store().await else { return };
    let c = CandidateId::new("c").unwrap();
    let ends = |history: &[leasehold_core::Transition]| {
        history
            .iter()
            .map(|t| (t.term, t.holder.to_string(), t.ended.map(|(_, r)| r)))
            .collect::<Vec<_>>()
    };
    let lease = lease("reserved");
    let a = granted(&store, &lease, "a").await;
    store.hand_over(&a, &c).await.unwrap();
    let reserved = store.inspect(&lease).await.unwrap().holder.unwrap();
    assert!(
        reserved.reserved && reserved.id == c && reserved.term == a.term,
        "{reserved:?}"
    );
    let as_if_c = Grant {
        holder: c.clone(),
        token: reserved.version.clone(),
        ..a.clone()
    };
    match store.renew(&as_if_c).await.unwrap() {
        Renewed::Lost(seen) => assert!(seen.holder.is_some_and(|h| h.reserved), "still reserved"),
        other => panic!("a reservation must not renew as a grant: {other:?}"),
    }
    store.release(&as_if_c).await.unwrap();
    store
        .hand_over(&as_if_c, &CandidateId::new("d").unwrap())
        .await
        .unwrap();
    assert_eq!(store.inspect(&lease).await.unwrap().holder, Some(reserved), "unchanged");

    store.withdraw(&lease, &c).await.unwrap();
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!((seen.holder, seen.previous_end), (None, Some(EndReason::HandedOver)));
    assert_eq!(
        ends(&store.history(&lease, 10).await.unwrap()),
        [(a.term, "a".into(), Some(EndReason::HandedOver))]
    );
    let b = granted(&store_b().await, &lease, "b").await;
    assert!(b.term > a.term);

    store.hand_over(&b, &c).await.unwrap();
    assert_eq!(store.break_lease(&lease).await.unwrap(), Some(b.term));
    assert_eq!(store.inspect(&lease).await.unwrap().holder, None);
    assert_eq!(
        ends(&store.history(&lease, 10).await.unwrap())[1],
        (b.term, "b".into(), Some(EndReason::HandedOver)),
        "a broken reservation leaves its term handed over by its holder"
    );
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

/// A SAS signed with the wrong key, and a wrong account key: `connect` fails at once with a
/// definite error that says to check the credential, and no signature or key in anything printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_credential_fails_at_connect_without_secrets() {
    let Some(mut config) = common::azurite() else { return };
    let wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleQ==";
    let wrong = common::account_sas(&config.account, wrong_key, Duration::from_secs(3600));
    let sig = wrong
        .expose()
        .split('&')
        .find_map(|p| p.strip_prefix("sig="))
        .unwrap()
        .to_string();
    let decoded = percent_decode(&sig);
    for auth in [Auth::Sas(wrong.clone()), Auth::AccountKey(Secret::new(wrong_key))] {
        config.auth = auth;
        let err = AzureBlobStore::from_config(config.clone()).await.unwrap_err();
        let shown = format!("{err} | {err:?} | {config:?} | {wrong} | {wrong:?}");
        for secret in [sig.as_str(), decoded.as_str(), wrong_key] {
            assert!(!shown.contains(secret), "a secret leaked: {shown}");
        }
        assert!(err.is_permanent(), "refused authorisation is permanent: {err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with("azure store refused connect: HTTP 403")
                && text.contains("check the credential")
                && !text.contains('\n'),
            "{text}"
        );
    }

    // An endpoint nobody listens on: transient, says where, and still no signature.
    config.auth = Auth::Sas(wrong.clone());
    config.endpoint.set_port(Some(1)).unwrap();
    let err = AzureBlobStore::from_config(config).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let shown = format!("{err} | {err:?}");
    assert!(shown.contains("cannot reach http://127.0.0.1:1/"), "{shown}");
    assert!(
        !shown.contains(&sig) && !shown.contains(&decoded),
        "a signature leaked: {shown}"
    );

    // URLs given to connect.
    let url = format!("azblob://acct/leases?sv=1&sig={sig}&nope=1");
    let err = AzureBlobStore::connect(&url).await.unwrap_err();
    let shown = format!("{err} | {err:?}");
    assert!(!shown.contains(&sig) && shown.contains("sig=***"), "{shown}");
    assert_eq!(format!("{:?}", Secret::new(format!("sig={sig}"))), "***");
}

/// `account_key=` in the URL: the store signs its own SAS for every request, so the emulator's
/// published key is all a URL needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_key_in_the_url() {
    let Some(config) = common::azurite() else { return };
    let Auth::AccountKey(key) = &config.auth else {
        unreachable!()
    };
    let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let url = format!(
        "azblob://{}/{}?prefix=key/&endpoint={}&account_key={}",
        config.account,
        config.container,
        encode(config.endpoint.as_str()),
        encode(key.expose())
    );
    let store = AzureBlobStore::connect(&url).await.unwrap();
    assert!(!format!("{store:?}").contains(key.expose()));
    let lease = lease("key");
    let grant = granted(&store, &lease, "a").await;
    assert!(matches!(store.renew(&grant).await.unwrap(), Renewed::Renewed(_)));
    store.release(&grant).await.unwrap();
    assert!(store.inspect(&lease).await.unwrap().holder.is_none());
}

/// A grant the engine never learnt of (its acquire's answer was lost and the read-back failed):
/// `withdraw` of that candidate releases it and ends its term in the history, so the lease is
/// free at once and the history has no open term. Another candidate's withdraw touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdraw_gives_up_a_grant_the_engine_never_saw() {
    let Some(store) = store().await else { return };
    let (a, b) = (CandidateId::new("a").unwrap(), CandidateId::new("b").unwrap());

    // A blob lease.
    let leased = lease("withdraw-leased");
    let grant = granted(&store, &leased, "a").await;
    store.withdraw(&leased, &b).await.unwrap();
    assert_eq!(
        store.inspect(&leased).await.unwrap().holder.map(|h| h.term),
        Some(grant.term)
    );
    store.withdraw(&leased, &a).await.unwrap();
    let seen = store.inspect(&leased).await.unwrap();
    assert_eq!((seen.holder, seen.previous_end), (None, Some(EndReason::Released)));
    let history = store.history(&leased, 10).await.unwrap();
    assert!(
        matches!(history.last(), Some(t) if t.term == grant.term && matches!(t.ended, Some((_, EndReason::Released)))),
        "{history:?}"
    );

    // A claim that never became a blob lease (the acquire stopped after its first request).
    let claimed = lease("withdraw-claimed");
    let first = granted(&store, &claimed, "a").await;
    store.release(&first).await.unwrap();
    let record = [
        ("leasehold_term", "2"),
        ("leasehold_holder", "a"),
        ("leasehold_ttl_ms", "15000"),
        ("leasehold_acquired_ms", "1700000000000"),
        ("leasehold_state", "claimed"),
    ];
    common::raw_set_metadata(store.config(), &store.blob_name(&claimed), &record, None)
        .await
        .unwrap();
    let other = store_b().await;
    assert_eq!(
        other.inspect(&claimed).await.unwrap().holder.map(|h| h.term.0),
        Some(2),
        "a live claim is held"
    );
    other.withdraw(&claimed, &a).await.unwrap();
    assert!(other.inspect(&claimed).await.unwrap().holder.is_none());
    let history = other.history(&claimed, 10).await.unwrap();
    let ends: Vec<(u64, Option<EndReason>)> = history.iter().map(|t| (t.term.0, t.ended.map(|(_, r)| r))).collect();
    assert_eq!(ends, [(1, Some(EndReason::Released)), (2, Some(EndReason::Released))]);
    assert_eq!(granted(&store_b().await, &claimed, "b").await.term.0, 3);
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
    let Auth::AccountKey(key) = &config.auth else {
        unreachable!()
    };
    let sas = common::account_sas(&config.account, key.expose(), Duration::from_secs(3600));
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

/// Finding 10 of issue 12: a term read from blob metadata was incremented with `+ 1`, which
/// panics at `u64::MAX` in a debug build (and wraps to 0 in release). It is bad data: a typed
/// error, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_that_cannot_be_followed_is_corrupt() {
    let Some(store) = store().await else { return };
    let lease = lease("max-term");
    let grant = granted(&store, &lease, "a").await;
    store.release(&grant).await.unwrap();
    let blob = store.blob_name(&lease);
    let max = u64::MAX.to_string();
    let record = [
        ("leasehold_term", max.as_str()),
        ("leasehold_holder", "a"),
        ("leasehold_ttl_ms", "15000"),
        ("leasehold_acquired_ms", "1700000000000"),
        ("leasehold_state", "released"),
    ];
    common::raw_set_metadata(store.config(), &blob, &record, None)
        .await
        .unwrap();
    for (who, client) in [("b", &store), ("c", &store_b().await)] {
        let err = client.acquire(&request(&lease, who)).await.unwrap_err();
        assert!(matches!(err, Error::CorruptRecord { .. }), "{who}: {err:?}");
        assert!(err.to_string().contains("no term can follow"), "{err}");
    }
    let seen = store.inspect(&lease).await.unwrap();
    assert_eq!((seen.holder, seen.last_term.0), (None, u64::MAX), "nothing was written");
}

async fn history_blobs(store: &AzureBlobStore, lease: &LeaseName) -> Vec<u64> {
    let prefix = format!("{}.history/", store.blob_name(lease));
    common::raw_list(store.config(), &prefix)
        .await
        .unwrap()
        .iter()
        .map(|name| name.strip_prefix(&prefix).unwrap().parse().unwrap())
        .collect()
}

/// Finding 10 of issue 12: history blobs were never deleted, and `history` read all of them, so
/// requests and memory grew with every term ever granted. The store keeps the most recent
/// `history_limit` terms, deleting the one that falls out with each grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_most_recent_terms() {
    let Some(mut config) = common::azurite() else { return };
    config.history_limit = 5;
    let store = AzureBlobStore::from_config(config).await.unwrap();
    let lease = lease("pruned");
    let mut terms = Vec::new();
    for _ in 0..12 {
        terms.push(granted(&store, &lease, "a").await.term.0);
    }
    let kept = history_blobs(&store, &lease).await;
    assert_eq!(kept, terms[7..], "the blobs of the 5 most recent terms, of {terms:?}");
    let history = store.history(&lease, 3).await.unwrap();
    assert_eq!(
        history.iter().map(|t| t.term.0).collect::<Vec<_>>(),
        terms[9..],
        "history(3) is the newest 3 terms, oldest first"
    );
    assert_eq!(store.history(&lease, 100).await.unwrap().len(), 5);
}

/// Blobs the per-grant deletion misses (left by a store that kept every term, or by a term that
/// a lost race skipped) are swept every 100 terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_history_blobs_are_swept() {
    let Some(mut config) = common::azurite() else { return };
    config.history_limit = 5;
    let store = AzureBlobStore::from_config(config.clone()).await.unwrap();
    let lease = lease("swept");
    let grant = granted(&store, &lease, "a").await;
    store.release(&grant).await.unwrap();
    let prefix = format!("{}.history/", store.blob_name(&lease));
    let entry = [("leasehold_holder", "old"), ("leasehold_acquired_ms", "1700000000000")];
    for term in [2_u64, 40, 90] {
        common::raw_upload(&config, &format!("{prefix}{term:020}"), &entry)
            .await
            .unwrap();
    }
    // The lease blob says term 98 was the last: the next grants are 99 and 100.
    let record = [
        ("leasehold_term", "98"),
        ("leasehold_holder", "a"),
        ("leasehold_ttl_ms", "15000"),
        ("leasehold_acquired_ms", "1700000000000"),
        ("leasehold_state", "released"),
    ];
    common::raw_set_metadata(&config, &store.blob_name(&lease), &record, None)
        .await
        .unwrap();
    let fresh = AzureBlobStore::from_config(config).await.unwrap();
    assert_eq!(granted(&fresh, &lease, "a").await.term.0, 99);
    assert_eq!(history_blobs(&store, &lease).await, [1, 2, 40, 90, 99]);
    assert_eq!(granted(&fresh, &lease, "a").await.term.0, 100);
    // The sweep runs in a task of its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let kept = history_blobs(&store, &lease).await;
        if kept == [99, 100] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still there: {kept:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `list(prefix)` under a store prefix of its own: the leases under a lease-name prefix, sorted,
/// each exactly as `inspect` shows it (held, released twice so that history blobs exist,
/// broken); history blobs, blobs without a record and names that are no lease names never
/// listed; the prefix is literal; a corrupt lease blob is a CorruptRecord naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_by_prefix() {
    let Some(mut config) = common::azurite() else { return };
    config.prefix = format!("t/list-{:x}/", random_u64());
    let store = AzureBlobStore::from_config(config.clone()).await.unwrap();
    let name = |n: &str| LeaseName::new(n).unwrap();

    let held = granted(&store, &name("a-held"), "h1").await;
    let released = granted(&store, &name("a-released"), "h2").await;
    store.release(&released).await.unwrap();
    let again = granted(&store, &name("a-released"), "h4").await;
    store.release(&again).await.unwrap();
    granted(&store, &name("a-broken"), "h3").await;
    assert_eq!(store.break_blob_lease(&name("a-broken")).await.unwrap(), Some(Term(1)));
    granted(&store, &name("a_x"), "u").await;
    granted(&store, &name("b-one"), "b").await;
    let history = common::raw_list(&config, &format!("{}a-released.history/", config.prefix))
        .await
        .unwrap();
    assert_eq!(history.len(), 2, "history blobs to skip: {history:?}");
    // A blob leasehold has not written a record to, and names that are no lease names.
    for blob in ["a-plain", "a-dir/x", ".a-hidden", "a b"] {
        common::raw_upload(&config, &format!("{}{blob}", config.prefix), &[("other", "x")])
            .await
            .unwrap();
    }

    let listed = store.list("a-").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|o| o.lease.as_str()).collect();
    assert_eq!(names, ["a-broken", "a-held", "a-released"]);
    for observation in &listed {
        assert_eq!(observation, &store.inspect(&observation.lease).await.unwrap());
    }
    let holder = listed[1].holder.as_ref().expect("a-held is held");
    assert_eq!((holder.id.as_str(), holder.term, holder.ttl), ("h1", held.term, TTL));
    assert_eq!(holder.version, held.token);
    assert_eq!(
        (listed[0].holder.is_none(), listed[0].last_term, listed[0].previous_end),
        (true, Term(1), Some(EndReason::Broken))
    );
    assert_eq!(
        (listed[2].holder.is_none(), listed[2].last_term, listed[2].previous_end),
        (true, again.term, Some(EndReason::Released))
    );

    let all: Vec<String> = store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.lease.to_string())
        .collect();
    assert_eq!(all, ["a-broken", "a-held", "a-released", "a_x", "b-one"]);
    let underscore = store.list("a_").await.unwrap();
    assert_eq!(underscore.len(), 1);
    assert_eq!(underscore[0].lease.as_str(), "a_x");
    for literal in ["a%", "a*", "a?", "[a", "%", "_", "a-released.history"] {
        assert!(store.list(literal).await.unwrap().is_empty(), "{literal}");
    }

    // A corrupt lease blob fails the listing that includes it, naming it; others are unaffected.
    granted(&store, &name("c-bad"), "c").await;
    let record = [
        ("leasehold_term", "garbage"),
        ("leasehold_holder", "c"),
        ("leasehold_ttl_ms", "15000"),
        ("leasehold_acquired_ms", "1700000000000"),
        ("leasehold_state", "released"),
    ];
    let bad = store.blob_name(&name("c-bad"));
    let lease_id = match store.inspect(&name("c-bad")).await.unwrap().holder {
        Some(holder) => holder.version.split(';').next().unwrap().to_string(),
        None => panic!("c-bad is held"),
    };
    common::raw_set_metadata(&config, &bad, &record, Some(&lease_id))
        .await
        .unwrap();
    match store.list("c").await {
        Err(Error::CorruptRecord { lease, detail, .. }) => {
            assert_eq!(lease, "c-bad");
            assert!(detail.contains("leasehold_term"), "{detail}");
        }
        other => panic!("expected CorruptRecord naming c-bad, got {other:?}"),
    }
    assert_eq!(store.list("a-").await.unwrap().len(), 3);
}
