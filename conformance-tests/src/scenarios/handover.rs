//! From one leader to the next: a graceful handover, FIFO order, record-version takeover and
//! `break_lease`.

use leasehold_core::{DeposedReason, EndReason, Error, Expiry, Renewed};

use crate::faults::{Direction, Fault};

use super::*;

/// The leader resigns: the follower is elected within one retry (poll) interval plus slack.
///
/// # Panics
///
/// When the handover is slower.
pub async fn graceful_release_fast_handover(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "graceful_release_fast_handover").await;
    let p = &scene.prefix;
    let a = scene.elector(scene.connect().await, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let (_campaign_b, elected_b) = spawn_campaign(&b);
    tokio::time::sleep(scene.ttl).await;

    let resigned = Instant::now();
    leader_a.resign().await;
    let leader_b = scene
        .within("B taking over after A resigned", scene.ttl * 3, elected_b)
        .await
        .expect("B campaigns");
    let handover = leader_b.elected_at() - resigned;
    let bound = scene.retry_bound() + Duration::from_millis(250);
    scene.log(format_args!(
        "handover {} (notifications {:?}; bound {})",
        secs(handover),
        scene.caps.notifications,
        secs(bound)
    ));
    assert!(
        handover <= bound,
        "{p}: handover took {} > retry_every * (1 + jitter) + 250ms = {}",
        secs(handover),
        secs(bound)
    );
    leader_b.resign().await;
    scene.finish().await;
}

/// Where candidates queue (`fifo`): the leader resigns three times and the lease goes to the
/// candidates in the order they started waiting, each within a retry interval plus slack.
///
/// # Panics
///
/// When a later candidate overtakes an earlier one, or a handover is slow.
pub async fn fifo_order(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "fifo_order").await;
    let p = &scene.prefix;
    if !scene.caps.fifo {
        return scene.not_applicable("the store does not queue candidates (fifo: false)");
    }
    let a = scene.elector(scene.connect().await, "A");
    let mut leader = scene.campaign(&a, scene.ttl * 3).await;
    let a_id = a.id().clone();
    let mut queued = Vec::new();
    for who in ["B", "C", "D"] {
        let elector = scene.elector(scene.connect().await, who);
        let campaign = spawn_campaign(&elector);
        // Queued once its first acquire was answered (it has seen the leader).
        scene.sees(&elector, &a_id, scene.ttl * 2).await;
        tokio::time::sleep(scene.ttl / 10).await;
        queued.push((who, elector, campaign));
    }
    let bound = scene.retry_bound() + Duration::from_millis(250);
    let mut last = leader.term();
    for (who, _elector, (_task, elected)) in queued {
        let resigned = Instant::now();
        leader.resign().await;
        let what = format!("{who}, the longest waiter, being elected");
        let next = scene.within(&what, scene.ttl * 3, elected).await.unwrap_or_else(|_| {
            panic!("{p}: {who}'s campaign ended without a leader");
        });
        assert_eq!(next.holder().as_str(), who, "{p}: {} overtook {who}", next.holder());
        assert!(next.term() > last, "{p}: term {} after {last}", next.term());
        let took = next.elected_at().saturating_duration_since(resigned);
        scene.log(format_args!("{who} elected {} after the resignation", secs(took)));
        assert!(took <= bound, "{p}: {who} took {} > {}", secs(took), secs(bound));
        last = next.term();
        leader = next;
    }
    leader.resign().await;
    scene.finish().await;
}

/// Where the store announces new holders ([`LeaseStore::announcements`]): the leader is cut off
/// and one follower takes over; the other learns of the new leader (`observe()`) within 250 ms
/// of the election, from the announcement, though it need not read the lease then (on FIFO
/// stores only the next in line is woken).
///
/// # Panics
///
/// When the other follower learns of the new leader later, or learns of someone else.
pub async fn followers_learn_of_a_new_leader(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "followers_learn_of_a_new_leader").await;
    let p = &scene.prefix;
    let lease = LeaseName::new(&scene.lease).expect("lease name");
    let announced = scene.connect().await.announcements(&lease).await;
    if announced.expect("asking for announcements").is_none() {
        return scene.not_applicable("the store does not announce new holders");
    }
    let (store_a, faults_a) = scene.connect_faulty().await;
    let a = scene.elector(store_a, "A");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let mut followers = Vec::new();
    for who in ["B", "C"] {
        let elector = scene.elector(scene.connect().await, who);
        let (_task, elected) = spawn_campaign(&elector);
        scene.sees(&elector, a.id(), scene.ttl * 2).await;
        tokio::time::sleep(scene.ttl / 10).await;
        followers.push((elector, elected));
    }
    let (c, elected_c) = followers.pop().expect("C");
    let (b, elected_b) = followers.pop().expect("B");

    faults_a.set(Direction::Both, Fault::Blackhole);
    let (winner, other) = scene
        .within("B or C taking over from A", scene.ttl * 4, async {
            tokio::select! {
                Ok(leader) = elected_b => (leader, c.clone()),
                Ok(leader) = elected_c => (leader, b.clone()),
                else => panic!("{p}: B's and C's campaigns ended without a leader"),
            }
        })
        .await;
    assert!(
        winner.term() > leader_a.term(),
        "{p}: term {} after A's {}",
        winner.term(),
        leader_a.term()
    );
    let mut sees = other.observe();
    let what = format!("{} learning that {} leads", other.id(), winner.holder());
    let seen = scene
        .within(
            &what,
            scene.ttl * 2,
            sees.wait_for(|l| l.as_ref().is_some_and(|l| l.term >= winner.term())),
        )
        .await
        .expect("the elector lives")
        .clone()
        .expect("a leader");
    assert_eq!(
        (&seen.holder, seen.term),
        (winner.holder(), winner.term()),
        "{p}: {} sees the wrong leader",
        other.id()
    );
    let late = seen.since.saturating_duration_since(winner.elected_at());
    scene.log(format_args!(
        "{} elected; {} learned of it {} later",
        winner.holder(),
        other.id(),
        secs(late)
    ));
    let bound = Duration::from_millis(250);
    assert!(
        late <= bound,
        "{p}: {} learned of the new leader {} after its election (> {})",
        other.id(),
        secs(late),
        secs(bound)
    );
    winner.resign().await;
    drop(leader_a);
    faults_a.heal();
    scene.finish().await;
}

/// Where contenders observe expiry (`Expiry::ObservedByContenders`): a takeover names the record
/// version the contender watched for a TTL. A version the holder has renewed past, or no record
/// version at all, is answered `Held` with the current version; the current one is granted with
/// a higher term; the old holder then learns `Lost` and its late release frees nothing; the
/// history says the old term expired.
///
/// # Panics
///
/// When a stale or bogus version takes the lease, or the current one does not.
pub async fn version_takeover(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "version_takeover").await;
    let p = &scene.prefix;
    if scene.caps.expiry != Expiry::ObservedByContenders {
        return scene.not_applicable(format_args!(
            "expiry is {:?}, not observed by contenders",
            scene.caps.expiry
        ));
    }
    let (store_a, store_b) = (scene.connect().await, scene.connect().await);
    let lease = scene.lease_name();
    let (a, b) = (id("a"), id("b"));
    let takeover = |version: &str| AcquireRequest {
        takeover: Some(version.to_string()),
        ..request(&lease, &b, scene.ttl)
    };
    let first = scene.grant(&*store_a, &request(&lease, &a, scene.ttl)).await;
    let renewed = match store_a.renew(&first).await {
        Ok(Renewed::Renewed(grant)) => grant,
        other => panic!("{p}: renewing a held grant must succeed, got {other:?}"),
    };
    let seen = scene.held(&*store_b, &takeover(&first.token)).await;
    let holder = seen.holder.unwrap_or_else(|| panic!("{p}: Held must name the holder"));
    assert_eq!(
        holder.version, renewed.token,
        "{p}: a renewal moves the record version, and Held shows the new one"
    );
    scene.held(&*store_b, &takeover("not-a-version")).await;

    let taken = scene.grant(&*store_b, &takeover(&renewed.token)).await;
    assert!(
        taken.term > renewed.term,
        "{p}: term {} after {}",
        taken.term,
        renewed.term
    );
    match store_a.renew(&renewed).await {
        Ok(Renewed::Lost(seen)) => assert_eq!(
            seen.holder.map(|h| (h.id, h.term)),
            Some((b.clone(), taken.term)),
            "{p}: Lost names the new holder"
        ),
        other => panic!("{p}: renewing after a takeover must answer Lost, got {other:?}"),
    }
    store_a
        .release(&renewed)
        .await
        .unwrap_or_else(|e| panic!("{p}: a late release is no error: {e}"));
    let seen = store_a
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert_eq!(
        seen.holder.map(|h| h.id),
        Some(b.clone()),
        "{p}: the old holder's late release must not free the new holder's lease"
    );
    let history = store_b
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let old = history.iter().find(|t| t.term == first.term);
    assert_eq!(
        old.and_then(|t| t.ended).map(|(_, why)| why),
        Some(EndReason::Expired),
        "{p}: a term taken over ended Expired: {history:?}"
    );
    store_b
        .release(&taken)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    scene.log("ok");
}

/// Where leases can be broken (`can_break`): breaking a free lease is `None`; breaking a held one
/// returns its term, frees it at once (`previous_end` broken), and a second break is `None`; the
/// leader learns it at its next renewal and steps down as superseded within a TTL; the next
/// candidate is elected with a higher term; the history says the term was broken.
///
/// # Panics
///
/// When a break is not seen by the store, the leader or the history.
pub async fn break_lease_ends_the_term(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "break_lease_ends_the_term").await;
    let p = &scene.prefix;
    if !scene.can_break {
        return scene.not_applicable("the store cannot break leases");
    }
    let lease = scene.lease_name();
    let operator = scene.connect().await;
    let broken = operator
        .break_lease(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: break of a free lease: {e}"));
    assert_eq!(broken, None, "{p}: a free lease has nothing to break");
    // Raw: a broken grant's renewal is lost, and the lease free.
    let raw_lease = LeaseName::new(scene.other_lease("raw")).expect("valid lease name");
    let holder = scene.connect().await;
    let grant = scene.grant(&*holder, &request(&raw_lease, &id("raw"), scene.ttl)).await;
    let broken = operator
        .break_lease(&raw_lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: break: {e}"));
    assert_eq!(broken, Some(grant.term), "{p}: a break returns the broken term");
    match holder.renew(&grant).await {
        Ok(Renewed::Lost(seen)) => assert!(seen.holder.is_none(), "{p}: {seen:?}"),
        other => panic!("{p}: renewing a broken grant must answer Lost, got {other:?}"),
    }

    let a = scene.elector(scene.connect().await, "A");
    let mut events = a.events();
    let leader = scene.campaign(&a, scene.ttl * 3).await;
    let term = leader.term();
    let broke = Instant::now();
    let broken = operator
        .break_lease(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: break: {e}"));
    assert_eq!(broken, Some(term), "{p}: a break returns the broken term");
    let seen = operator
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(
        seen.holder.is_none() && seen.previous_end == Some(EndReason::Broken) && seen.last_term == term,
        "{p}: a broken lease is free at once: {seen:?}"
    );
    let again = operator
        .break_lease(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: second break: {e}"));
    assert_eq!(again, None, "{p}: nothing is left to break");

    scene
        .within("the broken leader stepping down", scene.ttl, leader.cancelled())
        .await;
    let stepped_down = broke.elapsed();
    let reason = loop {
        let event = scene
            .within("A's deposition event", scene.ttl, events.recv())
            .await
            .unwrap_or_else(|e| panic!("{p}: events: {e}"));
        if let Event::Deposed { reason, .. } = event {
            break reason;
        }
    };
    assert!(
        matches!(reason, DeposedReason::Superseded { .. }),
        "{p}: a broken leader is superseded, got {reason:?}"
    );
    drop(leader);
    let b = scene.elector(scene.connect().await, "B");
    let next = scene.campaign(&b, scene.ttl * 2).await;
    assert!(next.term() > term, "{p}: term {} after the broken {term}", next.term());
    let history = operator
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let ended = history
        .iter()
        .find(|t| t.term == term)
        .and_then(|t| t.ended)
        .map(|(_, why)| why);
    assert_eq!(ended, Some(EndReason::Broken), "{p}: history: {history:?}");
    scene.log(format_args!(
        "the leader stepped down {} after the break; B leads at term {}",
        secs(stepped_down),
        next.term()
    ));
    next.resign().await;
    scene.finish().await;
}

/// A planned handover to a named successor ([`LeaseStore::hand_over`]), on the raw store API:
/// A hands its grant to C. Until C takes it the lease shows C as reserved at A's term; B's
/// acquire is `Held`; A's renewal is `Lost` and its late release frees nothing. C's acquire is
/// granted with a higher term and the history says A's term was handed over. Handing over a
/// grant that is no longer held changes nothing. A reservation nobody takes opens to everyone
/// once its TTL has passed, and not before. Not applicable where `hand_over` is unsupported (the
/// engine then releases to everyone).
///
/// # Panics
///
/// When anyone but the successor can take a reserved lease, the successor cannot, or a stale
/// grant hands the lease over.
pub async fn hand_over_reserves_the_lease(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "hand_over_reserves_the_lease").await;
    let p = &scene.prefix;
    let (store_a, store_b, store_c) = (scene.connect().await, scene.connect().await, scene.connect().await);
    let lease = scene.lease_name();
    let (a, b, c) = (id("a"), id("b"), id("c"));
    let first = scene.grant(&*store_a, &request(&lease, &a, scene.ttl)).await;
    match store_a.hand_over(&first, &c).await {
        Ok(()) => {}
        Err(Error::Unsupported { .. }) => {
            store_a
                .release(&first)
                .await
                .unwrap_or_else(|e| panic!("{p}: release: {e}"));
            return scene.not_applicable("the store cannot reserve a lease for a successor (hand_over unsupported)");
        }
        Err(e) => panic!("{p}: handing a held grant over must succeed: {e}"),
    }

    let reserved_for_c = |seen: &Observation, what: &str| {
        let holder = seen
            .holder
            .as_ref()
            .unwrap_or_else(|| panic!("{p}: {what}: the reserved lease must show a holder: {seen:?}"));
        assert!(
            holder.id == c && holder.reserved && holder.term == first.term,
            "{p}: {what}: the lease must show C reserved at A's term {}: {seen:?}",
            first.term
        );
    };
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    reserved_for_c(&seen, "inspect after the handover");
    let seen = scene.held(&*store_b, &request(&lease, &b, scene.ttl)).await;
    reserved_for_c(&seen, "B's acquire");
    match store_a.renew(&first).await {
        Ok(Renewed::Lost(_)) => {}
        other => panic!("{p}: renewing a handed-over grant must answer Lost, got {other:?}"),
    }
    store_a
        .release(&first)
        .await
        .unwrap_or_else(|e| panic!("{p}: a late release is no error: {e}"));
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    reserved_for_c(&seen, "inspect after A's late release");

    let taken = scene.grant(&*store_c, &request(&lease, &c, scene.ttl)).await;
    assert!(
        taken.term > first.term,
        "{p}: the successor's term {} must be above the handed-over {}",
        taken.term,
        first.term
    );
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert_eq!(
        seen.holder.as_ref().map(|h| (&h.id, h.term, h.reserved)),
        Some((&c, taken.term, false)),
        "{p}: once taken, the lease shows C holding its own term: {seen:?}"
    );
    match store_c.renew(&taken).await {
        Ok(Renewed::Renewed(_)) => {}
        other => panic!("{p}: the successor's renewal must succeed, got {other:?}"),
    }
    let history = store_b
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let ended = history.iter().find(|t| t.term == first.term).and_then(|t| t.ended);
    assert_eq!(
        ended.map(|(_, why)| why),
        Some(EndReason::HandedOver),
        "{p}: A's term ended handed over: {history:?}"
    );

    // A stale grant hands nothing over.
    let _ = store_a.hand_over(&first, &b).await;
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert_eq!(
        seen.holder.as_ref().map(|h| (&h.id, h.term, h.reserved)),
        Some((&c, taken.term, false)),
        "{p}: handing over a grant that is no longer held must change nothing: {seen:?}"
    );

    // A reservation nobody takes opens to everyone after its TTL.
    let renewed = match store_c.renew(&taken).await {
        Ok(Renewed::Renewed(grant)) => grant,
        other => panic!("{p}: the successor's renewal must succeed, got {other:?}"),
    };
    let handed = Instant::now();
    store_c
        .hand_over(&renewed, &id("nobody"))
        .await
        .unwrap_or_else(|e| panic!("{p}: hand_over: {e}"));
    let elector = scene.elector(store_b.clone(), "B");
    let leader = scene.campaign(&elector, scene.ttl * 5).await;
    let waited = leader.elected_at() - handed;
    scene.log(format_args!("an untaken reservation opened after {}", secs(waited)));
    assert!(
        leader.term() > renewed.term,
        "{p}: term {} after the reservation of {}",
        leader.term(),
        renewed.term
    );
    assert!(
        waited >= scene.ttl.mul_f64(0.9),
        "{p}: B took a lease reserved for someone else after {} (TTL {})",
        secs(waited),
        secs(scene.ttl)
    );
    leader.resign().await;
    scene.finish().await;
}

/// A planned handover through the engine, both ways it is asked for: A leads with B and C
/// campaigning; `Leader::hand_over(C)` makes C the leader (not B, who queued first) with a higher
/// term within one notification or poll; then a request through the store (someone holds
/// [`LeaseName::hand_over_requests`] as B, as `leasehold handover` does) makes C step down (its
/// work is cancelled) and hand over to B. No two leaders at once. Not applicable where
/// `hand_over` is unsupported.
///
/// # Panics
///
/// When the lease goes to anyone but the named successor, too slowly, or with overlap.
pub async fn leader_hands_over_to_a_named_successor(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "leader_hands_over_to_a_named_successor").await;
    let p = &scene.prefix;
    let probe_store = scene.connect().await;
    let probe = LeaseName::new(scene.other_lease("probe")).expect("valid");
    let probed = scene.grant(&*probe_store, &request(&probe, &id("a"), scene.ttl)).await;
    match probe_store.hand_over(&probed, &id("b")).await {
        Err(Error::Unsupported { .. }) => {
            let _ = probe_store.release(&probed).await;
            return scene.not_applicable("the store cannot reserve a lease for a successor (hand_over unsupported)");
        }
        other => other.unwrap_or_else(|e| panic!("{p}: hand_over: {e}")),
    }

    // Leaders that watch for requests through the store.
    let elector = |store, id| scene.watched(scene.builder(store, &scene.lease, id).hand_over_requests(true));
    let a = elector(scene.connect().await, "A");
    let b = elector(scene.connect().await, "B");
    let c = elector(scene.connect().await, "C");
    let leader_a = scene.campaign(&a, scene.ttl * 3).await;
    let (_campaign_b, elected_b) = spawn_campaign(&b);
    tokio::time::sleep(scene.ttl / 4).await;
    let (_campaign_c, elected_c) = spawn_campaign(&c);
    tokio::time::sleep(scene.ttl / 2).await;

    let bound = scene.retry_bound() + Duration::from_millis(250);
    let first_term = leader_a.term();
    let handed = Instant::now();
    leader_a.hand_over(c.id()).await;
    let leader_c = scene
        .within("C taking over after A handed it over", scene.ttl * 3, elected_c)
        .await
        .expect("C campaigns");
    let gap = leader_c.elected_at() - handed;
    scene.log(format_args!(
        "hand_over -> successor elected {} (notifications {:?}; bound {})",
        secs(gap),
        scene.caps.notifications,
        secs(bound)
    ));
    assert!(
        leader_c.term() > first_term,
        "{p}: term {} after {first_term}",
        leader_c.term()
    );
    assert!(
        gap <= bound,
        "{p}: the planned handover took {} > {}",
        secs(gap),
        secs(bound)
    );

    // Asked through the store: B holds the request lease; C's work is cancelled and C hands over.
    let requests = scene.lease_name().hand_over_requests().expect("short lease names");
    let requester = scene.connect().await;
    let ask = scene
        .grant(&*requester, &request(&requests, b.id(), scene.ttl * 3))
        .await;
    let asked = Instant::now();
    scene
        .within(
            "C's work being cancelled after the request",
            scene.ttl * 2,
            leader_c.cancelled(),
        )
        .await;
    let second_term = leader_c.term();
    drop(leader_c); // the work returns
    let leader_b = scene
        .within("B taking over after the request", scene.ttl * 3, elected_b)
        .await
        .expect("B campaigns");
    scene.log(format_args!(
        "request -> successor elected {}",
        secs(leader_b.elected_at() - asked)
    ));
    assert!(
        leader_b.term() > second_term,
        "{p}: term {} after {second_term}",
        leader_b.term()
    );
    let _ = requester.release(&ask).await;
    leader_b.resign().await;
    scene.finish().await;
}
