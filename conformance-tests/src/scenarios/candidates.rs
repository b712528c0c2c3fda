//! Who campaigns: the store's list of candidates (`LeaseStore::candidates`, where it keeps one),
//! and a hand-over asked from another instance (`HandOverRequest`), which checks the successor
//! against that list.

use leasehold_core::{Error, HandOverError, HandOverRequest, TargetCheck};

use super::*;

/// A leads (watching hand-over requests), B and then C campaign. A store that keeps its
/// candidates lists them in queue order, A first, and drops C once C stops campaigning; a store
/// that does not says [`Error::Unsupported`] and nothing else. A hand-over request from a third
/// instance to a candidate that is not campaigning is refused before anything is asked where the
/// store lists candidates ([`HandOverError::NotCampaigning`]), and reported as unchecked
/// elsewhere ([`TargetCheck::StoreCannotList`]); the request to B makes B the leader with a
/// higher term (on every store: one that cannot reserve releases, and B is the only candidate
/// left), with no two leaders at once.
///
/// # Panics
///
/// When the list is wrong, a store that cannot list answers anything but `Unsupported`, the
/// check lets a non-candidate through, or the hand-over does not reach B.
pub async fn hand_over_request_checks_the_successor(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "hand_over_request_checks_the_successor").await;
    let p = &scene.prefix;
    let lease = scene.lease_name();
    let elector = |store, who| scene.watched(scene.builder(store, &scene.lease, who).hand_over_requests(true));
    let a = elector(scene.connect().await, "A");
    let b = elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let first_term = leader_a.term();
    let a_id = a.id().clone();
    let (_campaign_b, elected_b) = queue_behind(&scene, &b, &a_id).await;
    let c = elector(scene.connect().await, "C");
    let (campaign_c, _elected_c) = queue_behind(&scene, &c, &a_id).await;

    let store = scene.connect().await;
    let ids = |names: &[&str]| names.iter().map(|n| id(n)).collect::<Vec<_>>();
    let lists = match store.candidates(&lease).await {
        Ok(listed) => {
            assert_eq!(listed, ids(&["A", "B", "C"]), "{p}: the candidates in queue order");
            true
        }
        Err(Error::Unsupported { operation, .. }) => {
            assert_eq!(operation, "candidates", "{p}: Unsupported names the operation");
            scene.log("the store keeps no list of candidates (Unsupported)");
            false
        }
        Err(e) => panic!("{p}: candidates: {e}"),
    };
    if lists {
        // C stops campaigning: its place goes (withdrawn, or its subscription ended).
        campaign_c.abort();
        let gone = async {
            loop {
                match store.candidates(&lease).await {
                    Ok(listed) if listed == ids(&["A", "B"]) => return,
                    _ => tokio::time::sleep(scene.ttl / 20).await,
                }
            }
        };
        scene
            .within("C leaving the list after it stopped", scene.ttl * 2, gone)
            .await;
    } else {
        campaign_c.abort();
    }

    // A typo from another instance: refused before anything is asked where the store can tell.
    let ghost = HandOverRequest::new(scene.connect().await, lease.clone(), id("ghost"));
    match ghost.check_target().await {
        Err(HandOverError::NotCampaigning { campaigning, .. }) if lists => {
            assert_eq!(
                campaigning,
                ids(&["A", "B"]),
                "{p}: NotCampaigning lists the candidates"
            );
        }
        Ok(TargetCheck::StoreCannotList) if !lists => {}
        other => panic!("{p}: checking a candidate that does not campaign: {other:?}"),
    }
    if lists {
        let refused = ghost.send().await;
        assert!(
            matches!(refused, Err(HandOverError::NotCampaigning { .. })),
            "{p}: a hand-over to a candidate that does not campaign: {refused:?}"
        );
        let requests = lease.hand_over_requests().expect("short lease names");
        let asked = store.inspect(&requests).await.expect("inspect the request lease");
        assert!(
            asked.holder.is_none(),
            "{p}: a refused request asked nothing: {asked:?}"
        );
        assert!(!leader_a.is_cancelled(), "{p}: A kept leading");
    }

    // The real request, from a third instance: A's work stops, B leads at a higher term.
    let work_a = tokio::spawn(async move { leader_a.cancelled().await });
    let done = HandOverRequest::new(scene.connect().await, lease.clone(), b.id().clone())
        .within(scene.ttl * 4)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{p}: the hand-over to B: {e}"));
    let expected = if lists {
        TargetCheck::Campaigning
    } else {
        TargetCheck::StoreCannotList
    };
    assert_eq!(done.target, expected, "{p}: how B was checked");
    assert!(done.term > first_term, "{p}: term {} after {first_term}", done.term);
    let leader_b = scene
        .within("B being elected after the request", scene.ttl * 3, elected_b)
        .await
        .expect("B campaigns");
    assert_eq!(leader_b.term(), done.term, "{p}: the request saw B's term");
    scene.log(format_args!("request -> B leads {}", secs(done.took)));
    work_a.await.expect("A's work");
    leader_b.resign().await;
    scene.finish().await;
}

/// Starts `elector`'s campaign and returns once it has seen `holder` lead (its first acquire was
/// answered: it has its place in any queue).
async fn queue_behind(
    scene: &Scene,
    elector: &Elector,
    holder: &CandidateId,
) -> (JoinHandle<()>, oneshot::Receiver<Leader>) {
    let mut sees = elector.observe();
    let campaign = spawn_campaign(elector);
    let what = format!("{} queueing behind {holder}", elector.id());
    scene
        .within(
            &what,
            scene.ttl * 2,
            sees.wait_for(|l| l.as_ref().is_some_and(|l| l.holder == *holder)),
        )
        .await
        .expect("the elector lives");
    tokio::time::sleep(scene.ttl / 10).await;
    campaign
}
