//! Terms only increase, and `history` says who held each and how it ended.

use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold_core::{EndReason, Expiry, Renewed};

use super::*;

/// 100 transitions between three electors campaigning and resigning quickly: every term greater
/// than the previous, and `history` lists them all in order with their holders, each released.
///
/// # Panics
///
/// When a term does not increase or history disagrees.
pub async fn terms_increase_and_history(backend: Arc<dyn Backend>) {
    const TRANSITIONS: usize = 100;
    let scene = Scene::new(backend, "terms_increase_and_history").await;
    let p = &scene.prefix;
    let lease = scene.lease_name();
    let done = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = watch::channel(false);
    let mut loops = Vec::new();
    for who in ["A", "B", "C"] {
        let builder = scene
            .builder(scene.connect().await, &scene.lease, who)
            .retry_every(scene.ttl / 20);
        let elector = scene.watched(builder);
        let (done, stop, mut stopped) = (done.clone(), stop.clone(), stopped.clone());
        loops.push(tokio::spawn(async move {
            loop {
                let leader = tokio::select! {
                    leader = elector.campaign() => leader.expect("the election runs"),
                    () = until_stopped(&mut stopped) => return,
                };
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                leader.resign().await;
                if n >= TRANSITIONS {
                    let _ = stop.send(true);
                    return;
                }
            }
        }));
    }
    drop(stop);
    let started = Instant::now();
    for task in loops {
        scene
            .within("100 transitions", scene.ttl * 30, task)
            .await
            .expect("the loops do not panic");
    }
    let elapsed = started.elapsed();
    let store = scene.connect().await;
    scene
        .within("the lease being free at the end", scene.ttl * 2, async {
            while store.inspect(&lease).await.map_or(true, |o| o.holder.is_some()) {
                tokio::time::sleep(scene.ttl / 20).await;
            }
        })
        .await;
    let mut elected: Vec<(Instant, Term, CandidateId)> = scene
        .events_of(&scene.lease)
        .await
        .into_iter()
        .filter_map(|(who, e)| match e {
            Event::Elected { term, at, .. } => Some((at, term, who)),
            _ => None,
        })
        .collect();
    elected.sort_by_key(|(at, ..)| *at);
    assert!(elected.len() >= TRANSITIONS, "{p}: only {} elections", elected.len());
    for pair in elected.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "{p}: term {} ({}) followed term {} ({})",
            pair[1].1,
            pair[1].2,
            pair[0].1,
            pair[0].2
        );
    }
    let history = store
        .history(&lease, 1000)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    assert!(
        history.len() >= elected.len(),
        "{p}: history lists {} terms, {} were granted",
        history.len(),
        elected.len()
    );
    // Every elected term is in the history, with its holder, in order. The history may also list
    // grants nobody was elected with (a grant that arrived after its campaign was dropped is
    // released at once); those must have ended too.
    for (_, term, who) in &elected {
        let entry = history
            .iter()
            .find(|entry| entry.term == *term)
            .unwrap_or_else(|| panic!("{p}: elected term {term} ({who}) is missing from the history"));
        assert_eq!(&entry.holder, who, "{p}: history names the wrong holder: {entry:?}");
        assert!(
            matches!(entry.ended, Some((_, EndReason::Released))),
            "{p}: term {term} was resigned but history says {:?}",
            entry.ended
        );
    }
    for entry in &history {
        assert!(
            entry.ended.is_some(),
            "{p}: the lease is free, yet the history has an open term: {entry:?}"
        );
    }
    for pair in history.windows(2) {
        assert!(
            pair[1].term > pair[0].term,
            "{p}: history terms must increase: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    scene.log(format_args!(
        "{} transitions in {} ({:.1} ms each), terms {}..={}",
        elected.len(),
        secs(elapsed),
        elapsed.as_secs_f64() * 1000.0 / elected.len() as f64,
        elected[0].1,
        elected[elected.len() - 1].1
    ));
    scene.finish().await;
}

/// The raw API's history of one lease, oldest first: a term that expired (where the store's clock
/// expires leases: free at once in `inspect` and `history`), the same candidate acquiring again (a new term; the older grant is lost),
/// a broken term (where leases can be broken), a released one (released twice, no error), the
/// current open term; `history(2)` is the last two, `history(0)` none; and an expired last term
/// shows as ended before anyone takes over.
///
/// # Panics
///
/// When an ending is missing, wrong or out of order.
pub async fn history_records_how_terms_end(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "history_records_how_terms_end").await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let lease = scene.lease_name();
    let ttl = scene.ttl;
    let server_clock = scene.caps.expiry == Expiry::ServerClock;
    let ask = |who: &str| request(&lease, &id(who), ttl);
    let mut expected: Vec<(&str, Term, Option<EndReason>)> = Vec::new();

    // The store's clock lets an unrenewed grant go after its TTL.
    let expire = async |who: &'static str, expected: &mut Vec<(&str, Term, Option<EndReason>)>| {
        let grant = scene.grant(&*store, &ask(who)).await;
        let seen = scene
            .within("the unrenewed lease expiring", ttl * 3, async {
                loop {
                    tokio::time::sleep(ttl / 10).await;
                    let seen = store
                        .inspect(&lease)
                        .await
                        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
                    if seen.holder.is_none() {
                        return seen;
                    }
                }
            })
            .await;
        assert_eq!(
            (seen.previous_end, seen.last_term),
            (Some(EndReason::Expired), grant.term),
            "{p}: an expired lease says so: {seen:?}"
        );
        let last = store
            .history(&lease, 1)
            .await
            .unwrap_or_else(|e| panic!("{p}: history: {e}"));
        assert_eq!(
            last.iter()
                .map(|t| (t.term, t.ended.map(|(_, why)| why)))
                .collect::<Vec<_>>(),
            [(grant.term, Some(EndReason::Expired))],
            "{p}: an expired last term is ended before anyone takes over"
        );
        // (Whether renewing the expired grant now is Lost is left to the stores' own tests: Azure
        // renews a blob lease nobody took since, Redis answers Lost.)
        expected.push((who, grant.term, Some(EndReason::Expired)));
    };
    if server_clock {
        expire("a", &mut expected).await;
    }

    let b1 = scene.grant(&*store, &ask("b")).await;
    let b2 = scene.grant(&*store, &ask("b")).await;
    assert!(b2.term > b1.term, "{p}: the holder acquiring again gets a new term");
    match store.renew(&b1).await {
        Ok(Renewed::Lost(seen)) => assert_eq!(seen.holder.map(|h| h.term), Some(b2.term), "{p}"),
        other => panic!("{p}: the replaced grant must be lost, got {other:?}"),
    }
    expected.push(("b", b1.term, None)); // ended; how is the store's own choice
    let mut last = b2.clone();
    if scene.can_break {
        let broken = store
            .break_lease(&lease)
            .await
            .unwrap_or_else(|e| panic!("{p}: break: {e}"));
        assert_eq!(broken, Some(b2.term), "{p}");
        expected.push(("b", b2.term, Some(EndReason::Broken)));
    } else {
        store.release(&b2).await.unwrap_or_else(|e| panic!("{p}: release: {e}"));
        expected.push(("b", b2.term, Some(EndReason::Released)));
    }
    let c = scene.grant(&*store, &ask("c")).await;
    assert!(c.term > last.term, "{p}");
    for _ in 0..2 {
        store.release(&c).await.unwrap_or_else(|e| panic!("{p}: release: {e}"));
    }
    let seen = store
        .inspect(&lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert_eq!(seen.previous_end, Some(EndReason::Released), "{p}: {seen:?}");
    expected.push(("c", c.term, Some(EndReason::Released)));
    let d = scene.grant(&*store, &ask("d")).await;
    expected.push(("d", d.term, None));
    last = d.clone();

    let history = store
        .history(&lease, 100)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    let got: Vec<_> = history
        .iter()
        .map(|t| (t.holder.as_str(), t.term, t.ended.map(|(_, why)| why)))
        .collect();
    assert_eq!(got.len(), expected.len(), "{p}: history {got:?}, expected {expected:?}");
    for (entry, want) in got.iter().zip(&expected) {
        let ended_ok = match (want.0, want.2) {
            // b's first term ended (the same holder took a new one) however the store calls it.
            ("b", None) => entry.2.is_some(),
            (_, end) => entry.2 == end,
        };
        assert!(
            entry.0 == want.0 && entry.1 == want.1 && ended_ok,
            "{p}: history {got:?}, expected {expected:?}"
        );
    }
    let terms = |h: Vec<leasehold_core::Transition>| h.into_iter().map(|t| t.term).collect::<Vec<_>>();
    let two = store
        .history(&lease, 2)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    assert_eq!(terms(two), [c.term, d.term], "{p}: history(2) is the last two terms");
    let none = store
        .history(&lease, 0)
        .await
        .unwrap_or_else(|e| panic!("{p}: history: {e}"));
    assert!(none.is_empty(), "{p}: history(0) is empty: {none:?}");

    store
        .release(&last)
        .await
        .unwrap_or_else(|e| panic!("{p}: release: {e}"));
    if server_clock {
        expire("e", &mut expected).await;
    }
    scene.log(format_args!("{} terms, each ended as expected", expected.len()));
}
