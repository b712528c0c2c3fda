//! Listing leases by name prefix.

use leasehold_core::{EndReason, Error};

use super::*;

/// `list(prefix)` returns exactly the leases whose names start with `prefix`, in name order
/// (bytes, as [`LeaseName`]'s `Ord`), each as [`inspect`](LeaseStore::inspect) shows it: held
/// leases with their holder and term, a released lease with no holder and its last term; a lease
/// only ever inspected, a queued candidate and the store's history are not listed. The prefix is
/// literal: SQL `LIKE` (`%`, `_`, `\`), glob (`*`, `?`, `[`) and regex (`.`) characters match
/// only themselves, letters only their own case. An empty prefix lists every lease. Every store
/// must list: `Unsupported` fails.
///
/// Under one fresh base name `B`:
///
/// | lease | state |
/// |---|---|
/// | `B-a-held` | held by A; B asked too (Held, queued where the store queues) |
/// | `B-a-free` | granted to A, released |
/// | `B-a-again` | granted to A, released, granted to B |
/// | `B-a-broken` | granted to A, broken (where the store can break leases) |
/// | `B-a-never` | only inspected |
/// | `B-b-held` | held by A |
/// | `B-m.1`, `B-m_1`, `B-mx1`, `B-Mx1` | held by A (names that differ at a metacharacter or in case) |
///
/// # Panics
///
/// When a listing misses, adds or misorders a lease, disagrees with `inspect`, treats a prefix
/// as a pattern, or the store cannot list.
pub async fn list_by_prefix(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "list_by_prefix").await;
    let p = &scene.prefix;
    let (store, store_b) = (scene.connect().await, scene.connect().await);
    let (a, b) = (id("list-a"), id("list-b"));
    // Long enough that no raw grant lapses while the scenario lists.
    let hold = pick_ttl(&scene.caps, Duration::from_secs(30));
    let base = scene.lease.as_str();
    let name = |suffix: &str| LeaseName::new(format!("{base}-{suffix}")).expect("valid lease names");

    let mut grants = Vec::new();
    let mut expected: Vec<Expected> = Vec::new();

    // Held by A; B's attempt is answered Held (on FIFO stores it queues: an internal key).
    let held = name("a-held");
    let grant = scene.grant(&*store, &request(&held, &a, hold)).await;
    let seen = scene.held(&*store_b, &request(&held, &b, hold)).await;
    assert_eq!(
        seen.holder.as_ref().map(|h| (&h.id, h.term)),
        Some((&a, grant.term)),
        "{p}: B's acquire of {held} names A"
    );
    expected.push(Expected::held(&grant));
    grants.push((store.clone(), grant));

    // Released: free, with its last term.
    let free = name("a-free");
    let grant = scene.grant(&*store, &request(&free, &a, hold)).await;
    store
        .release(&grant)
        .await
        .unwrap_or_else(|e| panic!("{p}: release of {free}: {e}"));
    expected.push(Expected::free(&grant, EndReason::Released));

    // Released by A, then granted to B at a higher term.
    let again = name("a-again");
    let first = scene.grant(&*store, &request(&again, &a, hold)).await;
    store
        .release(&first)
        .await
        .unwrap_or_else(|e| panic!("{p}: release of {again}: {e}"));
    let grant = scene.grant(&*store_b, &request(&again, &b, hold)).await;
    assert!(
        grant.term > first.term,
        "{p}: {again}: term {} after {}",
        grant.term,
        first.term
    );
    expected.push(Expected::held(&grant));
    grants.push((store_b.clone(), grant));

    // Broken by an operator, where the store can: free, with its last term.
    if scene.can_break {
        let broken = name("a-broken");
        let grant = scene.grant(&*store, &request(&broken, &a, hold)).await;
        let term = store
            .break_lease(&broken)
            .await
            .unwrap_or_else(|e| panic!("{p}: break_lease of {broken}: {e}"));
        assert_eq!(term, Some(grant.term), "{p}: break_lease of {broken}");
        expected.push(Expected::free(&grant, EndReason::Broken));
    }

    // Only inspected: the store keeps no record of it.
    let never = name("a-never");
    let seen = store
        .inspect(&never)
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect of {never}: {e}"));
    assert!(seen.holder.is_none(), "{p}: {never} was never granted: {seen:?}");

    // The other prefix.
    let other = name("b-held");
    let grant = scene.grant(&*store, &request(&other, &a, hold)).await;
    let expected_b = vec![Expected::held(&grant)];
    grants.push((store.clone(), grant));

    // Names that differ exactly at a metacharacter, or in case.
    let mut expected_m = Vec::new();
    for suffix in ["m.1", "m_1", "mx1", "Mx1"] {
        let lease = name(suffix);
        let grant = scene.grant(&*store, &request(&lease, &a, hold)).await;
        expected_m.push(Expected::held(&grant));
        grants.push((store.clone(), grant));
    }
    sort(&mut expected);
    sort(&mut expected_m);

    // One prefix: exactly its leases, in order, as inspect shows each.
    let prefix_a = format!("{base}-a-");
    let listed = list(&scene, &*store, &prefix_a).await;
    check_listing(&scene, &*store, &prefix_a, &listed, &expected).await;
    scene.log(format_args!(
        "list({prefix_a:?}): {}",
        listed.iter().map(|o| describe(base, o)).collect::<Vec<_>>().join(", ")
    ));

    // The other prefix: its lease only.
    let prefix_b = format!("{base}-b-");
    let listed = list(&scene, &*store_b, &prefix_b).await;
    check_listing(&scene, &*store_b, &prefix_b, &listed, &expected_b).await;

    // The common prefix: all of them, in name order.
    let mut everything: Vec<Expected> = expected.iter().chain(&expected_b).chain(&expected_m).cloned().collect();
    sort(&mut everything);
    let prefix_all = format!("{base}-");
    let listed = list(&scene, &*store, &prefix_all).await;
    check_listing(&scene, &*store, &prefix_all, &listed, &everything).await;

    // Literal prefixes: a metacharacter matches itself only, a letter its own case only.
    let only = |suffixes: &[&str]| -> Vec<Expected> {
        let names: Vec<LeaseName> = suffixes.iter().map(|s| name(s)).collect();
        expected_m
            .iter()
            .filter(|e| names.contains(&e.lease))
            .cloned()
            .collect()
    };
    let literal: [(&str, Vec<Expected>); 11] = [
        ("m", only(&["m.1", "m_1", "mx1"])),
        ("M", only(&["Mx1"])),
        ("m_", only(&["m_1"])),
        ("m.", only(&["m.1"])),
        ("m%", Vec::new()),
        ("%", Vec::new()),
        ("m*", Vec::new()),
        ("m?", Vec::new()),
        ("m[_.x]", Vec::new()),
        ("m\\_", Vec::new()),
        ("m\\", Vec::new()),
    ];
    for (suffix, wanted) in &literal {
        let prefix = format!("{base}-{suffix}");
        let listed = list(&scene, &*store, &prefix).await;
        check_names(&scene, &prefix, &listed, wanted);
    }
    scene.log(format_args!(
        "{} metacharacter and case prefixes are literal",
        literal.len()
    ));

    // Everything: ours among the rest (other scenarios' leases may appear), in name order.
    check_list_all(&scene, &*store, &everything).await;

    store_b
        .withdraw(&held, &b)
        .await
        .unwrap_or_else(|e| panic!("{p}: withdraw of B from {held}: {e}"));
    for (client, grant) in grants {
        client
            .release(&grant)
            .await
            .unwrap_or_else(|e| panic!("{p}: release of {}: {e}", grant.lease));
    }
    scene.finish().await;
}

/// What a listing must show of one lease.
#[derive(Clone, Debug)]
struct Expected {
    lease: LeaseName,
    /// The holder and term, or `None` for a free lease.
    holder: Option<(CandidateId, Term)>,
    /// The highest term granted.
    last_term: Term,
    /// How the last term ended, for a free lease (a store may not know: `None` is accepted).
    end: Option<EndReason>,
}

impl Expected {
    fn held(grant: &Grant) -> Self {
        Expected {
            lease: grant.lease.clone(),
            holder: Some((grant.holder.clone(), grant.term)),
            last_term: grant.term,
            end: None,
        }
    }

    fn free(ended: &Grant, how: EndReason) -> Self {
        Expected {
            lease: ended.lease.clone(),
            holder: None,
            last_term: ended.term,
            end: Some(how),
        }
    }
}

fn sort(expected: &mut [Expected]) {
    expected.sort_by(|x, y| x.lease.cmp(&y.lease));
}

/// `list(prefix)`, which must answer.
async fn list(scene: &Scene, store: &dyn LeaseStore, prefix: &str) -> Vec<Observation> {
    let p = &scene.prefix;
    match store.list(prefix).await {
        Ok(listed) => listed,
        Err(e @ Error::Unsupported { .. }) => {
            panic!("{p}: every store must list leases by prefix, but list({prefix:?}) says: {e}")
        }
        Err(e) => panic!("{p}: list({prefix:?}): {e}"),
    }
}

/// The listing has exactly the names of `expected`, in order.
fn check_names(scene: &Scene, prefix: &str, listed: &[Observation], expected: &[Expected]) {
    let p = &scene.prefix;
    let names: Vec<&str> = listed.iter().map(|o| o.lease.as_str()).collect();
    let wanted: Vec<&str> = expected.iter().map(|e| e.lease.as_str()).collect();
    assert_eq!(
        names, wanted,
        "{p}: list({prefix:?}) must return exactly these leases, in name order"
    );
}

/// The listing has exactly the leases of `expected`, in order, with their holders and terms,
/// and agrees with `inspect` of each.
async fn check_listing(
    scene: &Scene,
    store: &dyn LeaseStore,
    prefix: &str,
    listed: &[Observation],
    expected: &[Expected],
) {
    let p = &scene.prefix;
    check_names(scene, prefix, listed, expected);
    for (seen, want) in listed.iter().zip(expected) {
        let lease = &want.lease;
        let holder = seen.holder.as_ref().map(|h| (h.id.clone(), h.term));
        assert_eq!(holder, want.holder, "{p}: list({prefix:?}): holder and term of {lease}");
        assert_eq!(
            seen.last_term, want.last_term,
            "{p}: list({prefix:?}): last term of {lease}"
        );
        if seen.holder.is_none() {
            assert!(
                seen.previous_end.is_none() || seen.previous_end == want.end,
                "{p}: list({prefix:?}): {lease} ended {:?}, not {:?}",
                want.end,
                seen.previous_end
            );
        }
        let inspected = store
            .inspect(lease)
            .await
            .unwrap_or_else(|e| panic!("{p}: inspect of {lease}: {e}"));
        assert_eq!(
            (&inspected.lease, inspected.last_term, inspected.previous_end),
            (&seen.lease, seen.last_term, seen.previous_end),
            "{p}: list({prefix:?}) and inspect disagree on {lease}"
        );
        match (&seen.holder, &inspected.holder) {
            (None, None) => {}
            (Some(listed), Some(inspected)) => {
                // The store's remaining time goes down between the two reads; the rest is equal.
                assert_eq!(
                    (&listed.id, listed.term, listed.ttl, &listed.version, listed.orphaned),
                    (
                        &inspected.id,
                        inspected.term,
                        inspected.ttl,
                        &inspected.version,
                        inspected.orphaned
                    ),
                    "{p}: list({prefix:?}) and inspect disagree on the holder of {lease}"
                );
                assert_eq!(
                    listed.store_remaining.is_some(),
                    inspected.store_remaining.is_some(),
                    "{p}: list({prefix:?}) and inspect disagree on whether the store counts {lease} down"
                );
                if let Some(remaining) = listed.store_remaining {
                    assert!(
                        remaining <= listed.ttl,
                        "{p}: list({prefix:?}): {lease} remains {remaining:?}, more than its TTL {:?}",
                        listed.ttl
                    );
                }
            }
            (listed, inspected) => {
                panic!("{p}: list({prefix:?}) shows {lease} held by {listed:?}, inspect by {inspected:?}")
            }
        }
    }
}

/// `list("")` includes the scenario's leases, with their last terms, and is in name order.
///
/// While another scenario's record is corrupt (`corrupt_record_is_typed_error` removes its
/// garbage when it ends), the store cannot list everything: `list("")` must then fail with
/// `CorruptRecord` naming a lease that `inspect` also finds corrupt, and is asked again, for up
/// to 5 TTLs (at least 5 s, at most 90 s). A record that stays corrupt (left by a run that could
/// not remove it) is accepted, and the inclusion is not checked.
async fn check_list_all(scene: &Scene, store: &dyn LeaseStore, ours: &[Expected]) {
    let p = &scene.prefix;
    let patience = (scene.ttl * 5).clamp(Duration::from_secs(5), Duration::from_secs(90));
    let deadline = Instant::now() + patience;
    let (listed, took) = loop {
        let started = Instant::now();
        match store.list("").await {
            Ok(listed) => break (listed, started.elapsed()),
            Err(Error::CorruptRecord { lease, detail, .. }) if !lease.starts_with(&scene.lease) => {
                let name = LeaseName::new(lease.clone()).unwrap_or_else(|e| {
                    panic!("{p}: list(\"\") names a corrupt lease {lease:?} that is no lease name: {e}")
                });
                match store.inspect(&name).await {
                    Err(Error::CorruptRecord { .. }) => {}
                    other => {
                        panic!("{p}: list(\"\") says {lease} is corrupt ({detail}), but inspect answers {other:?}")
                    }
                }
                if Instant::now() >= deadline {
                    return scene.log(format_args!(
                        "list(\"\") stops at {lease}, a corrupt record of another scenario, as inspect does, for {}: inclusion not checked",
                        secs(patience)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e @ Error::Unsupported { .. }) => {
                panic!("{p}: every store must list leases, but list(\"\") says: {e}")
            }
            Err(e) => panic!("{p}: list(\"\"): {e}"),
        }
    };
    if let Some(pair) = listed.windows(2).find(|w| w[0].lease >= w[1].lease) {
        panic!(
            "{p}: list(\"\") is not in name order (or lists a lease twice): {} before {}",
            pair[0].lease, pair[1].lease
        );
    }
    for want in ours {
        let seen = listed
            .iter()
            .find(|o| o.lease == want.lease)
            .unwrap_or_else(|| panic!("{p}: list(\"\") of {} leases misses {}", listed.len(), want.lease));
        assert_eq!(
            seen.last_term, want.last_term,
            "{p}: list(\"\"): last term of {}",
            want.lease
        );
    }
    scene.log(format_args!(
        "list(\"\") has {} leases, ours among them, in {}",
        listed.len(),
        secs(took)
    ));
}

fn describe(base: &str, o: &Observation) -> String {
    let name = o.lease.as_str().strip_prefix(base).unwrap_or(o.lease.as_str());
    match &o.holder {
        Some(h) => format!("{name} {} term {}", h.id, h.term),
        None => format!("{name} free (last term {})", o.last_term),
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use leasehold_core::{MemoryStore, Renewed, Result, Transition};

    use crate::MemoryBackend;

    use super::*;

    /// Ways a store can list wrongly.
    #[derive(Clone, Copy, Debug)]
    enum Bug {
        /// The trait's default.
        Unsupported,
        /// SQL `LIKE prefix || '%'` without escaping, case-insensitive (SQLite's default).
        Like,
        /// Glob `prefix*` without escaping.
        Glob,
        /// Reverse name order.
        Unsorted,
        /// Free leases left out.
        HeldOnly,
        /// A held lease's queue entry listed as a lease of its own.
        QueueEntry,
        /// Another holder id than inspect shows.
        WrongHolder,
    }

    #[derive(Debug)]
    struct Buggy {
        memory: MemoryStore,
        bug: Bug,
    }

    /// `%` and `_` of SQL LIKE, ASCII case-insensitive.
    fn like(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'%', rest)) => (0..=text.len()).any(|i| like(rest, &text[i..])),
            Some((c, rest)) => text
                .split_first()
                .is_some_and(|(t, tail)| (*c == b'_' || c.eq_ignore_ascii_case(t)) && like(rest, tail)),
        }
    }

    /// `*` and `?` of a glob (no classes).
    fn glob(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
            Some((c, rest)) => text
                .split_first()
                .is_some_and(|(t, tail)| (*c == b'?' || c == t) && glob(rest, tail)),
        }
    }

    #[async_trait]
    impl LeaseStore for Buggy {
        fn name(&self) -> &'static str {
            "buggy"
        }
        fn capabilities(&self) -> Capabilities {
            self.memory.capabilities()
        }
        async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
            self.memory.acquire(request).await
        }
        async fn renew(&self, grant: &Grant) -> Result<Renewed> {
            self.memory.renew(grant).await
        }
        async fn release(&self, grant: &Grant) -> Result<()> {
            self.memory.release(grant).await
        }
        async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
            self.memory.inspect(lease).await
        }
        async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
            self.memory.history(lease, limit).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
            let all = self.memory.list("").await?;
            let mut listed = self.memory.list(prefix).await?;
            match self.bug {
                Bug::Unsupported => {
                    return Err(Error::Unsupported {
                        store: "buggy",
                        operation: "list",
                    });
                }
                Bug::Like => {
                    let pattern = format!("{prefix}%");
                    listed = all
                        .into_iter()
                        .filter(|o| like(pattern.as_bytes(), o.lease.as_str().as_bytes()))
                        .collect();
                }
                Bug::Glob => {
                    let pattern = format!("{prefix}*");
                    listed = all
                        .into_iter()
                        .filter(|o| glob(pattern.as_bytes(), o.lease.as_str().as_bytes()))
                        .collect();
                }
                Bug::Unsorted => listed.reverse(),
                Bug::HeldOnly => listed.retain(|o| o.holder.is_some()),
                Bug::QueueEntry => {
                    if let Some(i) = listed.iter().position(|o| o.lease.as_str().ends_with("-a-held")) {
                        let mut queued = listed[i].clone();
                        queued.lease = LeaseName::new(format!("{}.q1", queued.lease)).expect("valid");
                        listed.insert(i + 1, queued);
                    }
                }
                Bug::WrongHolder => {
                    for o in &mut listed {
                        if let Some(h) = &mut o.holder {
                            h.id = id("someone-else");
                        }
                    }
                }
            }
            Ok(listed)
        }
    }

    struct BuggyBackend(Arc<Buggy>);

    #[async_trait]
    impl Backend for BuggyBackend {
        fn name(&self) -> &'static str {
            "buggy"
        }
        async fn connect(&self) -> Result<Arc<dyn LeaseStore>> {
            Ok(self.0.clone())
        }
        async fn corrupt(&self, lease: &LeaseName) -> Result<()> {
            self.0.memory.corrupt(lease);
            Ok(())
        }
    }

    #[test]
    fn the_patterns_of_the_bugs() {
        assert!(like(b"conf-m_%", b"CONF-MX1") && !like(b"conf-m_%", b"conf-m"));
        assert!(glob(b"conf-m?*", b"conf-mx1") && !glob(b"conf-m?*", b"CONF-MX1"));
    }

    /// Another scenario's corrupt record makes `list("")` fail until it is removed: the
    /// scenario asks again and checks the listing once it reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_for_another_scenarios_garbage_to_go() {
        let backend = MemoryBackend::server_clock();
        let garbage = LeaseName::new("conf-corrupt_record_is_typed_error-0").unwrap();
        backend.store().corrupt(&garbage);
        let store = backend.store().clone();
        let repair = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            store.repair(&garbage);
        });
        let started = Instant::now();
        list_by_prefix(Arc::new(backend)).await;
        repair.await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(4),
            "listed everything once the garbage went, not at the deadline: {took:?}"
        );
    }

    /// The scenario fails on every bug, and passes on the memory store itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fails_on_every_listing_bug() {
        list_by_prefix(Arc::new(MemoryBackend::server_clock())).await;
        for bug in [
            Bug::Unsupported,
            Bug::Like,
            Bug::Glob,
            Bug::Unsorted,
            Bug::HeldOnly,
            Bug::QueueEntry,
            Bug::WrongHolder,
        ] {
            let store = Arc::new(Buggy {
                memory: MemoryStore::new(),
                bug,
            });
            let run = tokio::spawn(list_by_prefix(Arc::new(BuggyBackend(store))));
            let failed = run.await.expect_err("the scenario must fail");
            let message = failed.into_panic();
            let message = message
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| message.downcast_ref::<&str>().map(ToString::to_string))
                .unwrap_or_default();
            assert!(message.contains("buggy::list_by_prefix"), "{bug:?}: {message}");
            eprintln!("{bug:?}: {message}");
        }
    }
}
