//! The raw store API, leading for 10 TTLs, corrupt records and invalid inputs.

use leasehold_core::{DeposedReason, EndReason, Error, Renewed};

use super::*;

/// Raw store API: acquire a free lease, a second candidate sees it held, release, reacquire
/// with a higher term; `inspect` and `history` agree.
///
/// # Panics
///
/// When the store breaks the contract.
pub async fn acquire_release_reacquire(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "acquire_release_reacquire").await;
    let p = &scene.prefix;
    let (store_a, store_b) = (scene.connect().await, scene.connect().await);
    let lease = scene.lease_name();
    let a = CandidateId::new("candidate-a").expect("valid id");
    let b = CandidateId::new("candidate-b").expect("valid id");

    let free = store_a
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect of a new lease: {e}"));
    assert!(free.holder.is_none(), "{p}: a new lease must be free: {free:?}");

    let g1 = match store_a.acquire(&request(&lease, &a, scene.ttl)).await {
        Ok(Acquired::Granted(g)) => g,
        other => panic!("{p}: acquiring a free lease must grant it, got {other:?}"),
    };
    assert_eq!(
        (&g1.lease, &g1.holder),
        (&lease, &a),
        "{p}: the grant names the lease and the holder"
    );
    assert!(
        g1.term > free.last_term,
        "{p}: term {} must exceed the last term {}",
        g1.term,
        free.last_term
    );

    match store_b.acquire(&request(&lease, &b, scene.ttl)).await {
        Ok(Acquired::Held(observation)) => {
            let holder = observation
                .holder
                .unwrap_or_else(|| panic!("{p}: Held must name the holder"));
            assert_eq!(
                (&holder.id, holder.term),
                (&a, g1.term),
                "{p}: Held names the holder and its term"
            );
            assert!(
                observation.last_term >= g1.term,
                "{p}: last_term {} < {}",
                observation.last_term,
                g1.term
            );
        }
        other => panic!("{p}: a held lease must answer Held to a second candidate, got {other:?}"),
    }
    let seen = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let holder = seen
        .holder
        .unwrap_or_else(|| panic!("{p}: inspect must show the holder"));
    assert_eq!(
        (&holder.id, holder.term),
        (&a, g1.term),
        "{p}: inspect shows the holder and term"
    );

    let g1 = match store_a.renew(&g1).await {
        Ok(Renewed::Renewed(g)) => g,
        other => panic!("{p}: renewing a held grant must succeed, got {other:?}"),
    };
    assert_eq!(
        (&g1.holder, g1.term),
        (&a, holder.term),
        "{p}: a renewal keeps holder and term"
    );

    store_a
        .release(&g1)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let released = store_b
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(
        released.holder.is_none(),
        "{p}: a released lease is free at once: {released:?}"
    );
    assert!(
        released.last_term >= g1.term,
        "{p}: last_term must not go back: {released:?}"
    );
    store_a
        .release(&g1)
        .await
        .unwrap_or_else(|e| panic!("{p}: releasing twice must not be an error: {e}"));

    let g2 = match store_b.acquire(&request(&lease, &b, scene.ttl)).await {
        Ok(Acquired::Granted(g)) => g,
        other => panic!("{p}: acquiring a released lease must grant it, got {other:?}"),
    };
    assert!(
        g2.term > g1.term,
        "{p}: reacquired at term {} after term {}",
        g2.term,
        g1.term
    );
    match store_a.renew(&g1).await {
        Ok(Renewed::Lost(observation)) => {
            let holder = observation.holder.map(|h| (h.id, h.term));
            assert_eq!(
                holder,
                Some((b.clone(), g2.term)),
                "{p}: Lost must prove the new holder"
            );
        }
        other => panic!("{p}: renewing a superseded grant must answer Lost, got {other:?}"),
    }

    let seen = store_a
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let history = store_a
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let holder = seen
        .holder
        .unwrap_or_else(|| panic!("{p}: inspect must show the new holder"));
    assert_eq!(
        (&holder.id, holder.term),
        (&b, g2.term),
        "{p}: inspect shows the new holder"
    );
    let n = history.len();
    assert!(n >= 2, "{p}: history must list both terms: {history:?}");
    let (first, last) = (&history[n - 2], &history[n - 1]);
    assert_eq!((first.term, &first.holder), (g1.term, &a), "{p}: history: {history:?}");
    assert!(
        matches!(first.ended, Some((_, EndReason::Released))),
        "{p}: term {} ended by release: {first:?}",
        g1.term
    );
    assert_eq!(
        (last.term, &last.holder, last.ended),
        (g2.term, &b, None),
        "{p}: history agrees with inspect"
    );

    store_b
        .release(&g2)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let history = store_b
        .history(&lease, 10)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let last = history
        .last()
        .unwrap_or_else(|| panic!("{p}: history must not be empty"));
    assert!(
        last.term == g2.term && matches!(last.ended, Some((_, EndReason::Released))),
        "{p}: the released term is recorded as released: {history:?}"
    );
    scene.log("ok");
}

/// The holder's own acquire keeps the lease for it: granted again to it (a new term, or its
/// own grant), never freed for the candidates queued behind it. An engine's acquire that it gave
/// up on may reach the store late, while that candidate leads on a newer grant: a store that
/// then let the lease go would make two leaders (the model check's
/// `an_acquire_that_frees_the_callers_own_grant_is_caught`).
///
/// # Panics
///
/// When the holder's acquire is refused, or leaves the lease free or to another candidate.
pub async fn acquire_by_the_holder_keeps_the_lease(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "acquire_by_the_holder_keeps_the_lease").await;
    let p = &scene.prefix;
    let (store_a, store_b) = (scene.connect().await, scene.connect().await);
    let lease = scene.lease_name();
    let a = CandidateId::new("candidate-a").expect("valid id");
    let b = CandidateId::new("candidate-b").expect("valid id");
    let g1 = scene.grant(&*store_a, &request(&lease, &a, scene.ttl)).await;
    // B queues behind A (on FIFO stores it is next).
    scene.held(&*store_b, &request(&lease, &b, scene.ttl)).await;

    let mut latest = g1.clone();
    match store_a.acquire(&request(&lease, &a, scene.ttl)).await {
        Ok(Acquired::Granted(g)) => {
            assert_eq!(g.holder, a, "{p}: granted to the wrong candidate: {g:?}");
            assert!(g.term >= g1.term, "{p}: term {} below the holder's {}", g.term, g1.term);
            latest = g;
        }
        Ok(Acquired::Held(seen)) => {
            assert_eq!(
                seen.holder.as_ref().map(|h| &h.id),
                Some(&a),
                "{p}: the holder's own acquire let the lease go: {seen:?}"
            );
        }
        Err(e) => panic!("{p}: the holder's own acquire failed: {e}"),
    }
    for (what, seen) in [
        ("inspect", store_b.inspect(&lease).await.expect("inspect")),
        (
            "B's acquire",
            scene.held(&*store_b, &request(&lease, &b, scene.ttl)).await,
        ),
    ] {
        assert_eq!(
            seen.holder.as_ref().map(|h| &h.id),
            Some(&a),
            "{p}: after the holder's own acquire, {what} shows {seen:?}"
        );
    }
    scene.log(format_args!("A's grants: term {} then {}", g1.term, latest.term));
    store_a.release(&latest).await.expect("release");
    if latest.term != g1.term {
        // The first grant ended with the second: its release changes nothing.
        store_a.release(&g1).await.expect("a stale release is not an error");
    }
    store_b.withdraw(&lease, &b).await.expect("withdraw");
    scene.finish().await;
}

/// One elector leads for 10 TTLs: one election, no deposition, the term unchanged, and
/// `ensure_valid` succeeding throughout.
///
/// # Panics
///
/// When leadership is lost or the term changes.
pub async fn renew_keeps_lease(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "renew_keeps_lease").await;
    let p = &scene.prefix;
    let raw = scene.connect().await;
    let elector = scene.elector(scene.connect().await, "A");
    let leader = scene.campaign(&elector, scene.ttl * 3).await;
    let term = leader.term();
    let until = Instant::now() + scene.ttl * 10;
    let mut least = scene.ttl;
    while Instant::now() < until {
        if let Err(e) = leader.ensure_valid(scene.ttl / 10) {
            panic!("{p}: leadership not valid after {}: {e}", secs(scene.started.elapsed()));
        }
        least = least.min(leader.remaining());
        tokio::time::sleep(scene.ttl / 20).await;
    }
    assert_eq!(leader.term(), term);
    let seen = raw
        .inspect(&scene.lease_name())
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    let holder = seen.holder.map(|h| (h.id, h.term));
    assert_eq!(
        holder,
        Some((elector.id().clone(), term)),
        "{p}: the store shows the same holder and term"
    );
    let events = scene.events_of(&scene.lease).await;
    let elected = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Elected { .. }))
        .count();
    let deposed: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Deposed { .. }))
        .collect();
    assert_eq!(elected, 1, "{p}: exactly one election in 10 TTLs");
    assert!(deposed.is_empty(), "{p}: no deposition in 10 TTLs: {deposed:?}");
    scene.log(format_args!(
        "led 10 TTLs at term {term}; least remaining validity {}",
        secs(least)
    ));
    leader.resign().await;
    scene.finish().await;
}

/// Someone overwrites the lease's record with garbage: reads (`inspect`, a `list` that takes it
/// in) give a typed [`Error::CorruptRecord`] naming the lease, a listing that leaves it out
/// reads, the leader steps down with a store error within a TTL, and nobody
/// becomes leader while the record is garbage.
///
/// # Panics
///
/// On a missing or untyped error, a leader that stays, or a new leader.
pub async fn corrupt_record_is_typed_error(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "corrupt_record_is_typed_error").await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let lease = scene.lease_name();
    let raw = scene.connect().await;
    let a = scene.elector(scene.connect().await, "A");
    let b = scene.elector(scene.connect().await, "B");
    let leader_a = scene.campaign(&a, ttl * 3).await;
    let (campaign_b, mut elected_b) = spawn_campaign(&b);
    tokio::time::sleep(ttl / 2).await;

    let corrupted = Instant::now();
    scene
        .backend
        .corrupt(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot corrupt the record: {e}"));
    let expect_corrupt = |what: &str, result: Result<String, Error>| match result {
        Err(Error::CorruptRecord { lease: named, .. }) => {
            assert_eq!(named, scene.lease, "{p}: {what}: the error must name the lease");
        }
        other => {
            panic!("{p}: {what} of a garbage record must fail with CorruptRecord, got {other:?}")
        }
    };
    expect_corrupt("inspect", raw.inspect(&lease).await.map(|o| format!("{o:?}")));
    // A listing that takes the lease in fails the same way; one that leaves it out reads.
    expect_corrupt("list", raw.list(&scene.lease).await.map(|o| format!("{o:?}")));
    let elsewhere = raw
        .list(&scene.other_lease("elsewhere"))
        .await
        .unwrap_or_else(|e| panic!("{p}: a listing that leaves the garbage out: {e}"));
    assert!(elsewhere.is_empty(), "{p}: nothing to list elsewhere: {elsewhere:?}");
    let intruder = CandidateId::new("intruder").expect("valid id");
    expect_corrupt(
        "acquire",
        raw.acquire(&request(&lease, &intruder, ttl))
            .await
            .map(|o| format!("{o:?}")),
    );

    scene
        .within("the leader stepping down", ttl, leader_a.cancelled())
        .await;
    let stepped_down = corrupted.elapsed();
    drop(leader_a);
    let (campaign_a, mut elected_a) = spawn_campaign(&a);
    tokio::time::sleep(ttl * 2).await;
    assert!(
        elected_a.try_recv().is_err() && elected_b.try_recv().is_err(),
        "{p}: a leader was elected on a garbage record"
    );
    let events = scene.events_of(&scene.lease).await;
    let late: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Elected { at, .. } if *at > corrupted))
        .collect();
    assert!(late.is_empty(), "{p}: elected on a garbage record: {late:?}");
    let reason = events.iter().find_map(|(who, e)| match e {
        Event::Deposed { reason, .. } if who == a.id() => Some(reason.clone()),
        _ => None,
    });
    assert!(
        matches!(reason, Some(DeposedReason::StoreError { .. })),
        "{p}: the leader must step down with a store error, got {reason:?}"
    );
    scene.log(format_args!(
        "the leader stepped down {} after the corruption: {}",
        secs(stepped_down),
        reason.expect("checked")
    ));
    campaign_a.abort();
    campaign_b.abort();
    scene.finish().await;

    // The garbage goes, so that a listing of the whole store (`list_by_prefix`) reads again.
    let removed = scene
        .backend
        .remove(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot remove the garbage: {e}"));
    if removed {
        raw.inspect(&lease)
            .await
            .unwrap_or_else(|e| panic!("{p}: inspect after the garbage was removed: {e}"));
    } else {
        scene.log("the backend cannot remove the garbage: it stays");
    }
}

/// Invalid lease names, TTLs outside the store's range and inconsistent timings give typed
/// errors, from the builder and from the raw store.
///
/// # Panics
///
/// When an invalid input is accepted or the error has the wrong type.
pub async fn invalid_inputs(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "invalid_inputs").await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let long = "x".repeat(129);
    for bad in [
        "",
        long.as_str(),
        "a/b",
        "a\u{1}b",
        "line\nbreak",
        "tab\there",
        ".hidden",
        "-dash",
        "sp ace",
    ] {
        match LeaseName::new(bad) {
            Err(Error::InvalidLeaseName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{p}: lease name {bad:?} must be rejected, got {other:?}"),
        }
        match Elector::builder(store.clone(), bad).ttl(scene.ttl).build() {
            Err(Error::InvalidLeaseName { .. }) => {}
            other => panic!("{p}: an elector for lease {bad:?} must not build, got {other:?}"),
        }
    }
    let ok = "x".repeat(128);
    assert!(LeaseName::new(ok.as_str()).is_ok(), "{p}: 128 bytes are allowed");

    let lease = scene.lease_name();
    let who = CandidateId::new("candidate").expect("valid id");
    let (min, max) = (*scene.caps.ttl.start(), *scene.caps.ttl.end());
    let mut bad_ttls = vec![("above the maximum", max.checked_add(Duration::from_secs(1)))];
    match min.checked_sub(Duration::from_millis(1)) {
        Some(below) => bad_ttls.push(("below the minimum", Some(below))),
        None => scene.log("the store accepts any TTL down to zero: no TTL below its minimum to try"),
    }
    for (what, ttl) in bad_ttls {
        let Some(ttl) = ttl else { continue };
        match Elector::builder(store.clone(), scene.lease.clone()).ttl(ttl).build() {
            Err(Error::InvalidTtl {
                ttl: rejected,
                min: lo,
                max: hi,
                ..
            }) => {
                assert_eq!(
                    (rejected, lo, hi),
                    (ttl, min, max),
                    "{p}: the error names the TTL and the range"
                );
            }
            other => panic!("{p}: a TTL {what} ({ttl:?}) must not build, got {other:?}"),
        }
        match store.acquire(&request(&lease, &who, ttl)).await {
            Err(Error::InvalidTtl { ttl: rejected, .. }) => assert_eq!(rejected, ttl),
            other => panic!("{p}: acquire with a TTL {what} ({ttl:?}) must fail with InvalidTtl, got {other:?}"),
        }
    }
    let seen = store
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(
        seen.holder.is_none(),
        "{p}: rejected requests must change nothing: {seen:?}"
    );

    match Elector::builder(store.clone(), scene.lease.clone())
        .ttl(scene.ttl)
        .renew_every(scene.ttl)
        .build()
    {
        Err(
            e @ Error::InvalidConfig {
                field: "renew_every", ..
            },
        ) => {
            assert!(
                e.to_string().contains("renew_every"),
                "{p}: the message names the field: {e}"
            );
        }
        other => panic!("{p}: renew_every >= ttl must be a config error naming renew_every, got {other:?}"),
    }
    match Elector::builder(store.clone(), scene.lease.clone())
        .ttl(scene.ttl)
        .candidate_id("")
        .build()
    {
        Err(Error::InvalidCandidateId { .. }) => {}
        other => panic!("{p}: an empty candidate id must be rejected, got {other:?}"),
    }
    scene.log("ok");
}

/// [`LeaseStore::renew_many`] answers each grant as [`LeaseStore::renew`] would: of seven leases,
/// held ones are renewed (a new grant of the same term), released-and-taken, broken (where the
/// store can break), handed-over (where it can hand over) ones and an earlier term of the same
/// candidate (released and acquired again) are `Lost`, naming what `renew` names, and one whose
/// record is garbage fails alone with [`Error::CorruptRecord`]. No grants, no answers.
///
/// # Panics
///
/// When an answer of `renew_many` differs from `renew`'s for the same grant.
pub async fn renew_many_answers_as_renew_does(backend: Arc<dyn Backend>) {
    // Long enough that no grant lapses between the two answers compared, however loaded the
    // machine (a 1 s TTL did lapse under CI load on MySQL).
    let scene = Scene::with_ttl(backend, "renew_many_answers_as_renew_does", Duration::from_secs(30)).await;
    let p = &scene.prefix;
    let (store_a, store_b) = (scene.connect().await, scene.connect().await);
    let (a, b) = (id("a"), id("b"));
    let lease = |tag: &str| LeaseName::new(scene.other_lease(tag)).expect("valid");
    let mut grants = Vec::new();
    for tag in ["held", "held-too", "released", "handed", "broken", "earlier-term"] {
        grants.push(scene.grant(&*store_a, &request(&lease(tag), &a, scene.ttl)).await);
    }
    store_a
        .release(&grants[2])
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    scene
        .grant(&*store_b, &request(&lease("released"), &b, scene.ttl))
        .await;
    if let Err(e) = store_a.hand_over(&grants[3], &b).await {
        scene.log(format_args!("hand_over: {e} (the grant stays held)"));
    }
    if scene.can_break {
        store_b
            .break_lease(&grants[4].lease)
            .await
            .unwrap_or_else(|e| panic!("{p}: break_lease: {e}"));
    }
    // An earlier term of the same candidate: released, then acquired again.
    store_a
        .release(&grants[5])
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    let again = scene.grant(&*store_a, &request(&grants[5].lease, &a, scene.ttl)).await;
    grants.push(again);
    // Held, then its record overwritten with garbage.
    let garbled = scene.grant(&*store_a, &request(&lease("garbled"), &a, scene.ttl)).await;
    scene
        .backend
        .corrupt(&garbled.lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot corrupt the record: {e}"));
    grants.push(garbled);

    let many = store_a
        .renew_many(&grants)
        .await
        .unwrap_or_else(|e| panic!("{p}: renew_many: {e}"));
    assert_eq!(many.len(), grants.len(), "{p}: one answer per grant");
    let summary = |answer: &leasehold_core::Result<Renewed>| match answer {
        Ok(Renewed::Renewed(g)) => format!("renewed {} term {}", g.holder, g.term),
        Ok(Renewed::Lost(seen)) => format!(
            "lost to {:?}",
            seen.holder.as_ref().map(|h| (h.id.to_string(), h.term, h.reserved))
        ),
        Err(e) => format!("error {}", if e.is_transient() { "transient" } else { "definite" }),
    };
    for (grant, answer) in grants.iter().zip(&many) {
        // A renewed grant is renewed again with what renew_many returned (some stores check the
        // record version).
        let again = match answer {
            Ok(Renewed::Renewed(renewed)) => renewed,
            _ => grant,
        };
        let one = store_a.renew(again).await;
        assert_eq!(
            summary(answer),
            summary(&one),
            "{p}: renew_many and renew disagree on {} term {}",
            grant.lease,
            grant.term
        );
        scene.log(format_args!("{} term {}: {}", grant.lease, grant.term, summary(answer)));
    }
    assert!(
        matches!(&many[0], Ok(Renewed::Renewed(g)) if g.term == grants[0].term),
        "{p}: a held grant is renewed at its term: {:?}",
        many[0]
    );
    assert!(
        matches!(&many[2], Ok(Renewed::Lost(_))),
        "{p}: a grant released and taken by another is lost: {:?}",
        many[2]
    );
    assert!(
        matches!(&many[5], Ok(Renewed::Lost(_))),
        "{p}: a grant of an earlier term of the same candidate is lost: {:?}",
        many[5]
    );
    assert!(
        matches!(&many[6], Ok(Renewed::Renewed(g)) if g.term == grants[6].term),
        "{p}: the candidate's current grant is renewed: {:?}",
        many[6]
    );
    assert!(
        matches!(&many[7], Err(Error::CorruptRecord { lease, .. }) if *lease == grants[7].lease.as_str()),
        "{p}: a garbage record fails its own grant with CorruptRecord naming it: {:?}",
        many[7]
    );
    let none = store_a
        .renew_many(&[])
        .await
        .unwrap_or_else(|e| panic!("{p}: renew_many of no grants: {e}"));
    assert!(none.is_empty(), "{p}: no grants, no answers: {none:?}");
    scene
        .backend
        .remove(&grants[7].lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: cannot remove the garbage: {e}"));
    scene.finish().await;
}
