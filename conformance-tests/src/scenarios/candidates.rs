//! Who campaigns: the store's list of candidates (`LeaseStore::candidates`, where it keeps one),
//! a hand-over asked from another instance (`HandOverRequest`), which checks the successor
//! against that list, and the turn a waiting candidate is told of when the holder releases.

use futures::StreamExt;
use leasehold_core::{Change, Error, HandOverError, HandOverRequest, Notifications, Renewed, TargetCheck};

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
    let campaign = spawn_campaign(elector);
    scene.sees(elector, holder, scene.ttl * 2).await;
    tokio::time::sleep(scene.ttl / 10).await;
    campaign
}

/// A holds the lease (raw store API); B, queued behind it, opens its change stream; A releases.
/// A store that grants by waiting ([`Backend::grants_by_waiting`]) tells B on that stream that
/// its turn has come ([`Change::YourTurn`]) within a TTL: B's grant, at a term above A's, for
/// the TTL B asked, valid from no earlier than B's client was made and no later than the turn
/// arrived; B's renewal confirms it and `inspect` shows B at that term. Any other notifying
/// store says something changed within a TTL (a turn, if it sends one, is held to the same), and
/// B's acquire is then granted.
///
/// # Panics
///
/// When no turn (or change) comes, or the turn is not a grant the store stands by.
pub async fn a_release_is_the_next_candidates_turn(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "a_release_is_the_next_candidates_turn").await;
    let p = &scene.prefix;
    if scene.caps.notifications == Notifications::None {
        return scene.not_applicable("the store does not notify (notifications: None)");
    }
    let by_waiting = scene.backend.grants_by_waiting();
    let lease = scene.lease_name();
    let ttl = scene.ttl * 3;
    let request = |who: &str| AcquireRequest {
        lease: lease.clone(),
        candidate: id(who),
        ttl,
        takeover: None,
    };
    let a = scene.connect().await;
    let granted_a = scene.grant(a.as_ref(), &request("A")).await;
    let b_made = Instant::now();
    let b = scene.connect().await;
    scene.held(b.as_ref(), &request("B")).await;
    let mut changes = match b.changes(&lease, &id("B")).await {
        Ok(Some(changes)) => changes,
        Ok(None) => return scene.not_applicable("the store gives this candidate no change stream"),
        Err(e) => panic!("{p}: changes: {e}"),
    };
    // The stream is polled all along, as the engine does, and given a moment to set its watches.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let forward = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            if tx.send((change, Instant::now())).is_err() {
                return;
            }
        }
    });
    tokio::time::sleep(scene.ttl / 2).await;
    // What the stream had to say before the release is not what this scenario is about.
    while rx.try_recv().is_ok() {}

    a.release(&granted_a)
        .await
        .unwrap_or_else(|e| panic!("{p}: A's release: {e}"));
    let released = Instant::now();
    let turn = scene
        .within("a change on B's stream after A released", scene.ttl * 2, async {
            loop {
                match rx.recv().await {
                    Some((Change::YourTurn(turn), arrived)) => return Some((turn, arrived)),
                    // Something changed (or a change this suite does not know of).
                    Some(_) if !by_waiting => return None,
                    Some(_) => {}
                    None => panic!("{p}: B's change stream ended after A released"),
                }
            }
        })
        .await;
    forward.abort();
    let grant = match turn {
        Some((turn, arrived)) => {
            let g = &turn.grant;
            assert_eq!(
                (&g.lease, &g.holder, g.ttl),
                (&lease, &id("B"), ttl),
                "{p}: the turn's grant"
            );
            assert!(
                g.term > granted_a.term,
                "{p}: the turn's term {} is above A's {}",
                g.term,
                granted_a.term
            );
            assert!(
                b_made <= turn.valid_from && turn.valid_from <= arrived,
                "{p}: the turn is valid from an instant between B's client and its arrival"
            );
            scene.log(format_args!(
                "B's turn {} after the release, valid from {} before it arrived",
                secs(arrived - released),
                secs(arrived - turn.valid_from)
            ));
            match b.renew(g).await {
                Ok(Renewed::Renewed(_)) => {}
                other => panic!("{p}: B's renewal of its turn: {other:?}"),
            }
            turn.grant
        }
        None => match b.acquire(&request("B")).await {
            Ok(Acquired::Granted(grant)) => grant,
            other => panic!("{p}: B's acquire after the change: {other:?}"),
        },
    };
    let seen = a.inspect(&lease).await.unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert_eq!(
        seen.holder.map(|h| (h.id, h.term)),
        Some((id("B"), grant.term)),
        "{p}: the store shows B at its term"
    );
    b.release(&grant)
        .await
        .unwrap_or_else(|e| panic!("{p}: B's release: {e}"));
    scene.finish().await;
}
