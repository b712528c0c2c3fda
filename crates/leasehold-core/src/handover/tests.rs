//! The request's judgement of what it sees, and its checks, on the memory store with paused time.

use super::*;
use crate::{MemoryStore, async_trait};

fn holder(id: &str, term: u64, reserved: bool) -> HolderInfo {
    HolderInfo {
        id: CandidateId::new(id).unwrap(),
        term: Term(term),
        ttl: Duration::from_secs(2),
        version: "v".into(),
        orphaned: false,
        reserved,
        store_remaining: None,
    }
}

fn seen(holder: Option<HolderInfo>) -> Observation {
    let lease = LeaseName::new("jobs").unwrap();
    match holder {
        Some(h) => Observation {
            lease,
            last_term: h.term,
            holder: Some(h),
            previous_end: None,
        },
        None => Observation::free(lease, Term(4), None),
    }
}

fn pending(target: TargetCheck) -> PendingHandOver {
    PendingHandOver {
        store: Arc::new(MemoryStore::new()),
        lease: LeaseName::new("jobs").unwrap(),
        to: CandidateId::new("web-2").unwrap(),
        from: holder("web-1", 4, false),
        request: None,
        target,
        within: Duration::from_secs(6),
        deadline: Instant::now(),
        asked: Instant::now(),
    }
}

#[test]
fn only_the_successor_at_a_higher_term_ends_the_wait() {
    let watch = pending(TargetCheck::Campaigning);
    let progress = |h| match watch.progress(&seen(h)) {
        Progress::Done(term) => Ok(Some(term)),
        Progress::Waiting => Ok(None),
        Progress::Failed(e) => Err(e.to_string()),
    };
    assert_eq!(progress(Some(holder("web-1", 4, false))), Ok(None));
    assert_eq!(progress(Some(holder("web-2", 4, true))), Ok(None));
    assert_eq!(progress(None), Ok(None));
    assert_eq!(progress(Some(holder("web-2", 5, false))), Ok(Some(Term(5))));
    assert_eq!(
        progress(Some(holder("web-3", 5, false))),
        Err("web-3 took lease jobs at term 5, not web-2".into())
    );
    assert_eq!(
        progress(Some(holder("web-1", 6, false))),
        Err("web-1 leads lease jobs again at term 6: web-2 did not take it".into())
    );
    assert_eq!(
        progress(Some(holder("web-3", 4, true))),
        Err("lease jobs was handed over to web-3 (term 4 ended), not to web-2".into())
    );

    let timed_out = watch.timed_out(Some(&seen(Some(holder("web-2", 4, true)))), None);
    assert_eq!(
        timed_out.to_string(),
        "web-2 did not take lease jobs within 6s; the lease opens to everyone once the reservation's TTL (2s) has \
         passed"
    );
    let ignored = watch.timed_out(Some(&seen(Some(holder("web-1", 4, false)))), None);
    assert!(
        ignored
            .to_string()
            .starts_with("web-1 still leads lease jobs at term 4 after 6s"),
        "{ignored}"
    );
    // Where the store could not say whether web-2 campaigns, the failure says so.
    let unchecked = pending(TargetCheck::StoreCannotList).timed_out(Some(&seen(None)), None);
    assert_eq!(
        unchecked.to_string(),
        "web-2 did not take lease jobs within 6s; the lease opens to everyone (the store keeps no list of \
         candidates, so whether web-2 campaigns was not checked)"
    );
}

/// A memory store that lists no candidates, as SQLite or Postgres.
#[derive(Debug)]
struct Unlisted(MemoryStore);

#[async_trait]
impl LeaseStore for Unlisted {
    fn name(&self) -> &'static str {
        "unlisted"
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, r: &crate::AcquireRequest) -> crate::Result<crate::Acquired> {
        self.0.acquire(r).await
    }
    async fn renew(&self, g: &crate::Grant) -> crate::Result<crate::Renewed> {
        self.0.renew(g).await
    }
    async fn release(&self, g: &crate::Grant) -> crate::Result<()> {
        self.0.release(g).await
    }
    async fn hand_over(&self, g: &crate::Grant, to: &CandidateId) -> crate::Result<()> {
        self.0.hand_over(g, to).await
    }
    async fn inspect(&self, lease: &LeaseName) -> crate::Result<Observation> {
        self.0.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> crate::Result<Vec<crate::Transition>> {
        self.0.history(lease, limit).await
    }
}

fn name(s: &str) -> LeaseName {
    s.parse().unwrap()
}

fn id(s: &str) -> CandidateId {
    s.parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_successor_that_is_not_campaigning_is_refused_where_the_store_lists_candidates() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let elector = |who: &str| {
        Elector::builder(store.clone(), "jobs")
            .candidate_id(who)
            .hand_over_requests(true)
            .build()
            .unwrap()
    };
    let (a, b) = (elector("a"), elector("b"));
    let leader = a.campaign().await.unwrap();
    let campaign = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.candidates(&name("jobs")).await.unwrap(), vec![id("a"), id("b")]);

    // A typo: refused before anything is asked, naming who does campaign.
    let typo = HandOverRequest::new(store.clone(), name("jobs"), id("bb")).send().await;
    let Err(e @ HandOverError::NotCampaigning { .. }) = typo else {
        panic!("expected NotCampaigning, got {typo:?}")
    };
    assert_eq!(
        e.to_string(),
        "cannot hand over lease jobs to bb: bb is not campaigning for it (the store lists a, b); start it first, or \
         check the id"
    );
    let requests = name("jobs").hand_over_requests().unwrap();
    assert!(
        store.inspect(&requests).await.unwrap().holder.is_none(),
        "nothing was asked"
    );
    assert!(!leader.is_cancelled());

    // The right one: checked, asked, handed over.
    let work = tokio::spawn(async move { leader.cancelled().await });
    let done = HandOverRequest::new(store.clone(), name("jobs"), id("b"))
        .send()
        .await
        .unwrap();
    assert_eq!(done.target, TargetCheck::Campaigning);
    assert_eq!(done.previous.as_ref().map(|h| h.id.as_str()), Some("a"));
    let b_leads = campaign.await.unwrap().unwrap();
    assert_eq!(b_leads.term(), done.term);
    work.await.unwrap();
    assert!(
        store.inspect(&requests).await.unwrap().holder.is_none(),
        "the request was given back"
    );

    // Asked of the successor itself: nothing to do.
    let again = HandOverRequest::new(store.clone(), name("jobs"), id("b"))
        .send()
        .await
        .unwrap();
    assert!(again.previous.is_none() && again.term == done.term);
}

#[tokio::test(start_paused = true)]
async fn where_the_store_cannot_list_the_request_says_it_did_not_check() {
    let store: Arc<dyn LeaseStore> = Arc::new(Unlisted(MemoryStore::new()));
    let a = Elector::builder(store.clone(), "jobs")
        .candidate_id("a")
        .hand_over_requests(true)
        .build()
        .unwrap();
    let leader = a.campaign().await.unwrap();
    let work = tokio::spawn(async move { leader.cancelled().await });
    let request = HandOverRequest::new(store.clone(), name("jobs"), id("ghost")).within(Duration::from_secs(40));
    assert_eq!(request.check_target().await.unwrap(), TargetCheck::StoreCannotList);
    let failed = request.send().await.unwrap_err();
    assert!(
        matches!(
            failed,
            HandOverError::NotTaken {
                target: TargetCheck::StoreCannotList,
                ..
            }
        ),
        "{failed:?}"
    );
    assert!(
        failed.to_string().contains("whether ghost campaigns was not checked"),
        "{failed}"
    );
    work.await.unwrap();

    let nobody = HandOverRequest::new(store.clone(), name("free"), id("b"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        nobody.to_string(),
        "cannot hand over lease free: nobody holds it (b takes it by campaigning)"
    );
}
