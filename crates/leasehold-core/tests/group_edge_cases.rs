//! Lease groups at their edges (found by review s12, each test failed before its fix): a
//! graceful leave while a task stops slowly, a member that can never plan, settings that
//! `build()` must reject (shard elector settings, a huge `rebalance_every`, zero moves per round),
//! and a member's stale lease under an old weight on a store without a clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Error, LeaseGroup, LeaseStore, MemoryStore, ShardLeader};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);

/// Who runs each shard now (by the shard tasks themselves), and how many tasks started.
#[derive(Default)]
struct Running {
    now: Mutex<HashMap<u32, String>>,
    starts: AtomicUsize,
    /// Tasks that started while another task of the same shard still ran.
    overlaps: AtomicUsize,
}

impl Running {
    fn count(&self, member: &str) -> usize {
        self.now.lock().unwrap().values().filter(|m| *m == member).count()
    }
}

struct Member {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<leasehold_core::Result<()>>,
}

/// Runs member `id` of `group`; each task records itself in `running` while it runs. With
/// `slow_stop`, the first task of this member to be cancelled returns only `slow_stop` later
/// (a command that takes its grace period to exit).
fn spawn_member(group: LeaseGroup, running: &Arc<Running>, slow_stop: Option<Duration>) -> Member {
    let stop = CancellationToken::new();
    let shutdown = stop.clone().cancelled_owned();
    let running = running.clone();
    let slow_taken = Arc::new(AtomicBool::new(false));
    let handle = tokio::spawn(async move {
        group
            .run_until(
                move |shard: ShardLeader| {
                    let running = running.clone();
                    let slow_taken = slow_taken.clone();
                    async move {
                        running.starts.fetch_add(1, Ordering::SeqCst);
                        let before = running
                            .now
                            .lock()
                            .unwrap()
                            .insert(shard.shard(), shard.holder().to_string());
                        if before.is_some() {
                            running.overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        shard.cancelled().await;
                        if let Some(slow) = slow_stop
                            && !slow_taken.swap(true, Ordering::SeqCst)
                        {
                            tokio::time::sleep(slow).await;
                        }
                        let mut now = running.now.lock().unwrap();
                        if now.get(&shard.shard()).map(String::as_str) == Some(shard.holder().as_str()) {
                            now.remove(&shard.shard());
                        }
                        Ok::<(), Error>(())
                    }
                },
                shutdown,
            )
            .await
    });
    Member { stop, handle }
}

/// `error` is a configuration error naming `field`.
fn assert_field(error: &Error, field: &str) {
    assert!(
        matches!(error, Error::InvalidConfig { field: f, .. } if *f == field),
        "expected an invalid {field}, got {error}"
    );
}

async fn wait_for(what: &str, bound: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        if done() {
            return started.elapsed();
        }
        assert!(started.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Members a and b of an 8-shard group, balanced 4/4; then b leaves gracefully (with
/// `slow_stop`, one of its tasks takes that long to stop). Returns how long after b began to
/// leave a ran at least `taken` shards; then waits for b's end and for a to run all 8, and checks
/// that no shard ran twice at once.
async fn leave(slow_stop: Option<Duration>, taken: usize) -> Duration {
    let store = Arc::new(MemoryStore::new());
    let running = Arc::new(Running::default());
    let build = |id: &str| {
        LeaseGroup::builder(store.clone(), "leave", 8)
            .member_id(id)
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let a = spawn_member(build("a"), &running, None);
    let b = spawn_member(build("b"), &running, slow_stop);
    wait_for("balanced 4/4", TTL * 10, || {
        running.count("a") == 4 && running.count("b") == 4
    })
    .await;
    b.stop.cancel();
    let took = wait_for(&format!("a runs {taken} shards"), TTL * 10, || {
        running.count("a") >= taken
    })
    .await;
    println!("a ran {taken} shards {took:?} after b began to leave");
    b.handle.await.unwrap().unwrap();
    wait_for("a owns all 8", TTL * 10, || running.count("a") == 8).await;
    a.stop.cancel();
    a.handle.await.unwrap().unwrap();
    assert_eq!(running.overlaps.load(Ordering::SeqCst), 0, "a shard ran twice at once");
    took
}

/// Review s12 finding 1 (liveness). Before its fix a graceful leave released the shards whose
/// tasks stopped at once but kept its member lease until its slowest task had returned
/// (`run_until`: `stop_all`, then `member.resign()`). Meanwhile every other member still counted
/// the leaver as a live member below its quota, so its plan gave the freed shards back to the
/// leaver and nobody campaigned for them: unowned until the slowest task was done, plus a round.
/// Now the member lease goes first; no shard runs twice.
#[tokio::test(start_paused = true)]
async fn a_leavers_released_shards_are_taken_within_a_round_even_while_one_of_its_tasks_stops_slowly() {
    // One of b's tasks takes 1.5 s to stop (well within its lease: TTL 2 s); its three fast
    // shards are free at once, and a should own them at its next round.
    let took = leave(Some(Duration::from_millis(1500)), 7).await;
    let rebalance_every = TTL / 4;
    assert!(
        took <= rebalance_every + Duration::from_millis(100),
        "b's released shards stayed unowned for {took:?} (rebalance_every {rebalance_every:?}): \
         a planned them for b, still a member while its slow task stopped"
    );
}

/// Control for finding 1 (passes): when every task of the leaver stops at once, its member
/// lease goes right after its shards and the other member owns them within a round.
#[tokio::test(start_paused = true)]
async fn control_a_leave_whose_tasks_stop_at_once_is_taken_within_a_round() {
    let took = leave(None, 8).await;
    assert!(took <= TTL / 4 + Duration::from_millis(100), "{took:?}");
}

/// Review s12 finding 2 (quality). Before its fix `LeaseGroupBuilder::electors` settings were
/// validated only when a round built a shard's elector: `build()` accepted a `step_down_margin`
/// longer than the TTL, then every round failed at `start`, logged as "could not list the group;
/// keeping the current shards"; the member never led a shard, and `run_until` never returned an
/// error naming the field. Now `build()` returns `InvalidConfig` for `step_down_margin`.
#[tokio::test(start_paused = true)]
async fn invalid_shard_elector_settings_are_an_error_not_a_member_that_owns_nothing() {
    let store = Arc::new(MemoryStore::new());
    let built = LeaseGroup::builder(store, "bad-electors", 4)
        .member_id("a")
        .ttl(TTL)
        .electors(|b| b.step_down_margin(Duration::from_secs(5)))
        .build();
    let group = match built {
        Ok(group) => group,
        Err(error) => return assert_field(&error, "step_down_margin"), // rejected at build: fixed
    };
    let running = Arc::new(Running::default());
    let a = spawn_member(group, &running, None);
    tokio::time::sleep(TTL * 10).await;
    let led = running.starts.load(Ordering::SeqCst);
    a.stop.cancel();
    let outcome = a.handle.await.unwrap();
    assert!(
        led > 0 || outcome.is_err(),
        "build() accepted step_down_margin 5s with ttl 2s; run_until ran 10 TTLs, led {led} shards \
         and returned {outcome:?}"
    );
}

/// Review s12 finding 3 (quality). Before its fix a huge `rebalance_every` was accepted by
/// `build()` and panicked in `run_until` (`tokio::time::Instant::now() + every` overflowed).
/// Now it is an `InvalidConfig` naming the field.
#[tokio::test(start_paused = true)]
async fn a_huge_rebalance_every_is_a_config_error_not_a_panic() {
    let store = Arc::new(MemoryStore::new());
    let built = LeaseGroup::builder(store, "huge", 4)
        .member_id("a")
        .ttl(TTL)
        .rebalance_every(Duration::MAX)
        .build();
    let group = match built {
        Ok(group) => group,
        Err(error) => return assert_field(&error, "rebalance_every"), // rejected at build: fixed
    };
    let running = Arc::new(Running::default());
    let a = spawn_member(group, &running, None);
    tokio::time::sleep(TTL).await;
    a.stop.cancel();
    let outcome = a.handle.await;
    assert!(
        outcome.as_ref().is_ok_and(|r| r.is_ok()),
        "run_until with rebalance_every = Duration::MAX: {:?}",
        outcome.map_err(|e| e.is_panic())
    );
}

/// The bounds of `rebalance_every` and `max_moves_per_round` are inclusive at 30 days and 1.
#[test]
fn build_accepts_the_bounds_of_rebalance_every_and_max_moves_per_round() {
    let build = |every: Duration, moves: usize| {
        LeaseGroup::builder(Arc::new(MemoryStore::new()), "bounds", 4)
            .member_id("a")
            .ttl(TTL)
            .rebalance_every(every)
            .max_moves_per_round(moves)
            .build()
    };
    let month = Duration::from_secs(30 * 24 * 3600);
    build(month, 1).unwrap();
    assert_field(
        &build(month + Duration::from_nanos(1), 1).unwrap_err(),
        "rebalance_every",
    );
    assert_field(&build(Duration::ZERO, 1).unwrap_err(), "rebalance_every");
    assert_field(&build(month, 0).unwrap_err(), "max_moves_per_round");
}

/// Review s12 finding 4 (quality). Before its fix `max_moves_per_round(0)` was accepted: no
/// shard ever moved between live members, so a member that joined a group whose shards were all
/// owned never got one (the documented balance, floor or ceil of N/W, was never reached). Now it
/// is an `InvalidConfig` naming the field.
#[tokio::test(start_paused = true)]
async fn zero_moves_per_round_is_rejected_or_still_balances() {
    let store = Arc::new(MemoryStore::new());
    let build = |id: &str| {
        LeaseGroup::builder(store.clone(), "frozen", 8)
            .member_id(id)
            .ttl(TTL)
            .max_moves_per_round(0)
            .build()
    };
    let (first, second) = match (build("a"), build("b")) {
        (Ok(first), Ok(second)) => (first, second),
        // Rejected at build: fixed.
        (Err(error), _) | (_, Err(error)) => return assert_field(&error, "max_moves_per_round"),
    };
    let running = Arc::new(Running::default());
    let a = spawn_member(first, &running, None);
    wait_for("a owns all 8", TTL * 10, || running.count("a") == 8).await;
    let b = spawn_member(second, &running, None);
    tokio::time::sleep(TTL * 20).await;
    let counts = (running.count("a"), running.count("b"));
    a.stop.cancel();
    b.stop.cancel();
    assert_eq!(counts, (4, 4), "20 TTLs after b joined (a, b) own {counts:?}");
}

/// Review s12 finding 5 (quality). Before its fix, on a store without a clock, a member that came
/// back with the same id and another weight left its old member lease (`…-w1`) listed for ever:
/// `clear_dead_members` skipped every record whose holder id was a live member's, and the stale
/// record's holder id is the live member's. `LeaseGroup::status` (and `leasehold shards status`)
/// showed the member twice. Now each record is judged by itself.
#[tokio::test(start_paused = true)]
async fn a_members_stale_lease_under_an_old_weight_is_cleared_on_a_store_without_a_clock() {
    let store = MemoryStore::observed_expiry();
    let running = Arc::new(Running::default());
    // a's first run, weight 1, crashes: a link that stops answering, and the run is dropped.
    let cut = Arc::new(AtomicBool::new(false));
    let first = LeaseGroup::builder(
        Arc::new(Cuttable {
            store: store.clone(),
            cut: cut.clone(),
            no_list: Arc::new(AtomicBool::new(false)),
        }),
        "weights",
        8,
    )
    .member_id("a")
    .ttl(TTL)
    .build()
    .unwrap();
    let old = spawn_member(first, &running, None);
    wait_for("a owns all 8", TTL * 10, || running.count("a") == 8).await;
    cut.store(true, Ordering::SeqCst);
    old.handle.abort();
    let _ = old.handle.await;
    running.now.lock().unwrap().clear();
    // a comes back with weight 2, and b joins.
    let build = |id: &str, weight: u32| {
        LeaseGroup::builder(Arc::new(store.clone()), "weights", 8)
            .member_id(id)
            .weight(weight)
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let a = spawn_member(build("a", 2), &running, None);
    let b = spawn_member(build("b", 1), &running, None);
    tokio::time::sleep(TTL * 15).await;
    let status = LeaseGroup::status(&store, "weights").await.unwrap();
    let members: Vec<(String, u32)> = status.members.iter().map(|m| (m.id.to_string(), m.weight)).collect();
    a.stop.cancel();
    b.stop.cancel();
    assert_eq!(
        members,
        vec![("a".to_string(), 2), ("b".to_string(), 1)],
        "15 TTLs after a came back with weight 2"
    );
}

/// Review s12 finding 6 (liveness). Before its fix a member that renews its member lease but
/// whose rounds never succeed (every `list` fails: a throttled scan, a missing list permission)
/// counted as a live member with a full quota: the others planned that quota for it, handed their
/// shards over to it (reserved for a member that never campaigns) and left them unowned for as
/// long as it kept its member lease: here 4 of 8 shards, for ever. Now a member joins only once it
/// can list the group.
#[tokio::test(start_paused = true)]
async fn a_member_whose_rounds_always_fail_does_not_strand_the_others_shards() {
    let store = MemoryStore::new();
    let running = Arc::new(Running::default());
    let member = |id: &str, no_list: bool| {
        let link = Arc::new(Cuttable {
            store: store.clone(),
            cut: Arc::new(AtomicBool::new(false)),
            no_list: Arc::new(AtomicBool::new(no_list)),
        });
        LeaseGroup::builder(link, "gray", 8)
            .member_id(id)
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let a = spawn_member(member("a", false), &running, None);
    wait_for("a owns all 8", TTL * 10, || running.count("a") == 8).await;
    let b = spawn_member(member("b", true), &running, None);
    tokio::time::sleep(TTL * 20).await;
    let owned = running.now.lock().unwrap().len();
    let status = LeaseGroup::status(&store, "gray").await.unwrap();
    let held: Vec<String> = status
        .shards
        .iter()
        .map(|s| format!("{}:{:?}", s.shard, s.owner().map(|(id, _)| id.to_string())))
        .collect();
    a.stop.cancel();
    b.stop.cancel();
    assert_eq!(
        owned, 8,
        "20 TTLs after b (which cannot list) joined, {owned} of 8 shards run; store: {held:?}"
    );
}

/// The same once the member joined (it could list then): it leaves the group after its rounds
/// have failed for two TTLs, and does not join again while it cannot list, so the shards that
/// were handed over to it are owned again once their reservations end. Before, it stayed a member
/// for ever and 4 of 8 shards stayed unowned.
#[tokio::test(start_paused = true)]
async fn a_member_whose_rounds_fail_from_its_first_on_leaves_the_group() {
    let store = MemoryStore::new();
    let running = Arc::new(Running::default());
    let no_list = Arc::new(AtomicBool::new(false));
    let member = |id: &str, no_list: Arc<AtomicBool>| {
        let link = Arc::new(Cuttable {
            store: store.clone(),
            cut: Arc::new(AtomicBool::new(false)),
            no_list,
        });
        LeaseGroup::builder(link, "gray-later", 8)
            .member_id(id)
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let a = spawn_member(member("a", Arc::new(AtomicBool::new(false))), &running, None);
    wait_for("a owns all 8", TTL * 10, || running.count("a") == 8).await;
    let b = spawn_member(member("b", no_list.clone()), &running, None);
    let mut joined = false;
    for _ in 0..1000 {
        let status = LeaseGroup::status(&store, "gray-later").await.unwrap();
        if status.members.iter().any(|m| m.id.as_str() == "b") {
            joined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(joined, "b did not join");
    // b's listings fail from its first round on.
    no_list.store(true, Ordering::SeqCst);
    tokio::time::sleep(TTL * 20).await;
    let owned = running.now.lock().unwrap().len();
    let status = LeaseGroup::status(&store, "gray-later").await.unwrap();
    let members: Vec<String> = status.members.iter().map(|m| m.id.to_string()).collect();
    a.stop.cancel();
    b.stop.cancel();
    a.handle.await.unwrap().unwrap();
    b.handle.await.unwrap().unwrap();
    assert_eq!(
        (owned, members),
        (8, vec!["a".to_string()]),
        "20 TTLs after b's listings began to fail: shards run, members"
    );
    assert_eq!(running.overlaps.load(Ordering::SeqCst), 0, "a shard ran twice at once");
}

/// A store link that fails every request once `cut` is set (a crashed process).
#[derive(Debug)]
struct Cuttable {
    store: MemoryStore,
    cut: Arc<AtomicBool>,
    /// While set, every `list` fails (the rest works).
    no_list: Arc<AtomicBool>,
}

impl Cuttable {
    fn check(&self) -> leasehold_core::Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            Err(Error::unreachable("memory", "cut off"))
        } else {
            Ok(())
        }
    }
}

#[leasehold_core::async_trait]
impl LeaseStore for Cuttable {
    fn name(&self) -> &'static str {
        self.store.name()
    }
    fn capabilities(&self) -> leasehold_core::Capabilities {
        self.store.capabilities()
    }
    async fn acquire(
        &self,
        request: &leasehold_core::AcquireRequest,
    ) -> leasehold_core::Result<leasehold_core::Acquired> {
        self.check()?;
        self.store.acquire(request).await
    }
    async fn renew(&self, grant: &leasehold_core::Grant) -> leasehold_core::Result<leasehold_core::Renewed> {
        self.check()?;
        self.store.renew(grant).await
    }
    async fn release(&self, grant: &leasehold_core::Grant) -> leasehold_core::Result<()> {
        self.check()?;
        self.store.release(grant).await
    }
    async fn hand_over(
        &self,
        grant: &leasehold_core::Grant,
        to: &leasehold_core::CandidateId,
    ) -> leasehold_core::Result<()> {
        self.check()?;
        self.store.hand_over(grant, to).await
    }
    async fn inspect(&self, lease: &leasehold_core::LeaseName) -> leasehold_core::Result<leasehold_core::Observation> {
        self.check()?;
        self.store.inspect(lease).await
    }
    async fn history(
        &self,
        lease: &leasehold_core::LeaseName,
        limit: usize,
    ) -> leasehold_core::Result<Vec<leasehold_core::Transition>> {
        self.check()?;
        self.store.history(lease, limit).await
    }
    async fn list(&self, prefix: &str) -> leasehold_core::Result<Vec<leasehold_core::Observation>> {
        self.check()?;
        if self.no_list.load(Ordering::SeqCst) {
            return Err(Error::unreachable("memory", "listing throttled"));
        }
        self.store.list(prefix).await
    }
    async fn shard_records(&self, prefix: &str) -> leasehold_core::Result<Vec<leasehold_core::ShardRecord>> {
        self.check()?;
        if self.no_list.load(Ordering::SeqCst) {
            return Err(Error::unreachable("memory", "listing throttled"));
        }
        self.store.shard_records(prefix).await
    }
    async fn write_shard(
        &self,
        name: &leasehold_core::LeaseName,
        expected: Option<&str>,
        value: &str,
    ) -> leasehold_core::Result<leasehold_core::ShardWrite> {
        self.check()?;
        self.store.write_shard(name, expected, value).await
    }
    async fn changes(
        &self,
        lease: &leasehold_core::LeaseName,
        candidate: &leasehold_core::CandidateId,
    ) -> leasehold_core::Result<Option<leasehold_core::Changes>> {
        self.check()?;
        self.store.changes(lease, candidate).await
    }
}
