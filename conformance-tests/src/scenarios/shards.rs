//! Shard records: the compare-and-set records a lease group's members own shards through
//! ([`LeaseStore::write_shard`], [`LeaseStore::shard_records`]).

use leasehold_core::{Error, MAX_SHARD_VALUE_LEN, ShardRecord, ShardWrite};
use tokio::sync::Barrier;

use super::*;

/// How many writers race for one record.
const WRITERS: usize = 16;

/// How many rounds of racing writes.
const ROUNDS: usize = 5;

/// One client writes and reads shard records; then 16 clients race writes of one record.
///
/// - A record is created only where none exists (expected `None`), and replaced only at the
///   version it has: a write naming no version or another version is answered
///   [`ShardWrite::Conflict`] with the record the store holds, and changes nothing.
/// - Every write gives the record a version it never had (also when the same value is written
///   again), and the value comes back as written: up to [`MAX_SHARD_VALUE_LEN`] bytes with
///   spaces, quotes, `%`, `\`, `'`, `*`, `?`, `/`, `:`, `{`, `}` and non-ASCII letters.
/// - `shard_records(prefix)` lists the records whose name starts with the prefix, in name order,
///   and nothing else; shard records are not leases: `list` and `inspect` show none of them,
///   and a lease of the same name is not a shard record.
/// - 16 writers, each with its own client, released together at the same version: exactly one
///   is answered `Written` (or, if none is, the record holds the value of one whose answer was
///   an error), and the store then holds its value.
///
/// # Panics
///
/// When any of the above does not hold. A store that keeps no shard records (the trait's
/// default) fails: lease groups need them on every backend.
pub async fn shard_records_compare_and_set(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "shard_records_compare_and_set").await;
    let p = &scene.prefix;
    let store = scene.connect().await;
    let prefix = scene.other_lease("g.s.");
    let name = |n: u32| LeaseName::new(format!("{prefix}{n:02}")).expect("valid shard record name");
    let write = |name: LeaseName, expected: Option<String>, value: String| {
        let store = store.clone();
        async move {
            store
                .write_shard(&name, expected.as_deref(), &value)
                .await
                .unwrap_or_else(|e| panic!("{p}: write_shard {name} at {expected:?}: {e}"))
        }
    };
    let written = |answer: ShardWrite, what: &str| match answer {
        ShardWrite::Written(record) => record,
        ShardWrite::Conflict(held) => panic!("{p}: {what}: conflict, the store holds {held:?}"),
    };

    // Created where none exists; a second create conflicts with what the first wrote.
    let first = written(write(name(0), None, "leasehold1 1 1 a".into()).await, "create");
    assert_eq!(
        (&first.name, first.value.as_str()),
        (&name(0), "leasehold1 1 1 a"),
        "{p}: created"
    );
    match write(name(0), None, "leasehold1 1 1 b".into()).await {
        ShardWrite::Conflict(Some(held)) => assert_eq!(held, first, "{p}: a second create answers the record"),
        other => panic!("{p}: a second create must conflict with the record: {other:?}"),
    }
    // Replaced at its version only; the same value written again is a new version.
    let second = written(
        write(name(0), Some(first.version.clone()), first.value.clone()).await,
        "replace with the same value",
    );
    assert_ne!(second.version, first.version, "{p}: every write gives a new version");
    for stale in [Some(first.version.clone()), Some(format!("{}x", second.version))] {
        match write(name(0), stale.clone(), "leasehold1 2 2 c".into()).await {
            ShardWrite::Conflict(Some(held)) => {
                assert_eq!(held, second, "{p}: a write at {stale:?} answers the record")
            }
            other => panic!("{p}: a write at version {stale:?} must conflict: {other:?}"),
        }
    }
    match write(name(9), Some(second.version.clone()), "leasehold1 1 1 d".into()).await {
        ShardWrite::Conflict(None) => {}
        other => panic!("{p}: a replace of a record that does not exist must conflict with none: {other:?}"),
    }

    // Values come back as written, up to the longest.
    let mut long = String::from("leasehold1 3 3 ");
    for c in " \"'%\\*?/:{}[]<>|&;$#@!=+,.~`^éß東".chars().cycle() {
        if long.len() + c.len_utf8() > MAX_SHARD_VALUE_LEN {
            break;
        }
        long.push(c);
    }
    let odd = written(write(name(1), None, long.clone()).await, "create a long value");
    assert_eq!(odd.value, long, "{p}: the value comes back as written");
    let third = written(write(name(2), None, "x".into()).await, "create");

    // Listing: by prefix, in name order; nothing of another prefix; no leases.
    let lease = LeaseName::new(scene.other_lease("g.s.05")).expect("valid");
    scene.grant(&*store, &request(&lease, &id("a"), scene.ttl)).await;
    let records = store
        .shard_records(&prefix)
        .await
        .unwrap_or_else(|e| panic!("{p}: shard_records: {e}"));
    assert_eq!(
        records,
        vec![second.clone(), odd, third],
        "{p}: shard_records({prefix:?})"
    );
    let one = store
        .shard_records(name(0).as_str())
        .await
        .unwrap_or_else(|e| panic!("{p}: shard_records: {e}"));
    assert_eq!(one, vec![second.clone()], "{p}: a record's full name lists it alone");
    let leases = store.list(&prefix).await.unwrap_or_else(|e| panic!("{p}: list: {e}"));
    let listed: Vec<&str> = leases.iter().map(|o| o.lease.as_str()).collect();
    assert_eq!(
        listed,
        vec![lease.as_str()],
        "{p}: list shows the lease, not the shard records"
    );
    let seen = store
        .inspect(&name(0))
        .await
        .unwrap_or_else(|e| panic!("{p}: inspect: {e}"));
    assert!(seen.holder.is_none(), "{p}: a shard record is not a lease: {seen:?}");

    // Racing writers, each with its own client.
    let mut stores = Vec::new();
    for _ in 0..WRITERS {
        stores.push(scene.connect().await);
    }
    let mut current = second;
    for round in 1..=ROUNDS {
        current = race(&scene, &stores, &current, round).await;
    }
    scene.log(format_args!("{ROUNDS} rounds of {WRITERS} writers, one winner each"));
    scene.finish().await;
}

/// One race: every writer writes its own value at `current`'s version, at once. The record as
/// the one winner left it.
async fn race(scene: &Scene, stores: &[Arc<dyn LeaseStore>], current: &ShardRecord, round: usize) -> ShardRecord {
    let p = &scene.prefix;
    let barrier = Arc::new(Barrier::new(stores.len()));
    let tasks: Vec<JoinHandle<Result<ShardWrite, Error>>> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let (store, barrier, current) = (store.clone(), barrier.clone(), current.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let value = format!("leasehold1 {round} {round} writer-{i:02}");
                store.write_shard(&current.name, Some(&current.version), &value).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut unknown = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.expect("a writer panicked") {
            Ok(ShardWrite::Written(record)) => winners.push(record),
            Ok(ShardWrite::Conflict(_)) => {}
            Err(e) if e.is_transient() => unknown.push(format!("writer-{i:02}")),
            Err(e) => panic!("{p}: round {round}: writer-{i:02} failed: {e}"),
        }
    }
    let held = scene
        .connect()
        .await
        .shard_records(current.name.as_str())
        .await
        .unwrap_or_else(|e| panic!("{p}: round {round}: shard_records: {e}"));
    let [held] = held.as_slice() else {
        panic!("{p}: round {round}: the record must be listed once: {held:?}");
    };
    match winners.as_slice() {
        [winner] => {
            assert_eq!(
                held, winner,
                "{p}: round {round}: the store holds what the winner wrote"
            );
            winner.clone()
        }
        [] if unknown.iter().any(|w| held.value.ends_with(w.as_str())) && held.version != current.version => {
            scene.log(format_args!(
                "round {round}: {} won, its answer was an error",
                held.value
            ));
            held.clone()
        }
        _ => panic!(
            "{p}: round {round}: {} winners of {} writers racing at one version: {winners:?}; the store holds {held:?}",
            winners.len(),
            stores.len()
        ),
    }
}
