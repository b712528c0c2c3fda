//! Lease groups ([`LeaseGroup`]): balance, stability, a crashed member, a join, on the real store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_core::{Error, Leader, LeaseGroup, LeaseStore, ShardLeader, Term};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Scene, secs};
use crate::backend::Backend;
use crate::faults::{Direction, Fault, Faults};

const SHARDS: u32 = 64;

/// Shards of the group at scale.
const MANY_SHARDS: u32 = 10_000;

/// Who runs each shard, every term, and any overlap, as the shard tasks report it.
#[derive(Default)]
struct Book {
    /// shard -> (member, term, leadership) of the task running it now (from a valid start).
    running: Mutex<HashMap<u32, (String, Term, Leader)>>,
    /// shard -> (term, when its task ended) of the last task that ended.
    ended: Mutex<HashMap<u32, (Term, Instant)>>,
    violations: Mutex<Vec<String>>,
    starts: Mutex<usize>,
}

impl Book {
    fn start(&self, shard: &ShardLeader) {
        let (n, me, term) = (shard.shard(), shard.holder().to_string(), shard.term());
        *self.starts.lock().unwrap() += 1;
        // A task that starts after its leadership ended (its member too busy to see the step-down
        // in time) acts on nothing: `ensure_valid` refuses it. Only valid tasks count.
        if shard.ensure_valid(Duration::ZERO).is_err() {
            return;
        }
        let mut running = self.running.lock().unwrap();
        if let Some((other, other_term, other_leader)) = running.get(&n)
            && other_leader.ensure_valid(Duration::ZERO).is_ok()
        {
            self.violation(format!(
                "shard {n}: {me} (term {term}) started while {other} (term {other_term}) runs and is valid"
            ));
        }
        if let Some((last, _)) = self.ended.lock().unwrap().get(&n)
            && *last >= term
        {
            self.violation(format!("shard {n}: term {term} after term {last}"));
        }
        running.insert(n, (me, term, shard.leader().clone()));
    }

    fn end(&self, shard: &ShardLeader) {
        let mut running = self.running.lock().unwrap();
        if running.get(&shard.shard()).is_some_and(|(_, t, _)| *t == shard.term()) {
            running.remove(&shard.shard());
        }
        self.ended
            .lock()
            .unwrap()
            .insert(shard.shard(), (shard.term(), Instant::now()));
    }

    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    fn counts(&self) -> Vec<usize> {
        let mut per: HashMap<String, usize> = HashMap::new();
        for (member, _, _) in self.running.lock().unwrap().values() {
            *per.entry(member.clone()).or_default() += 1;
        }
        let mut counts: Vec<usize> = per.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts
    }

    fn starts(&self) -> usize {
        *self.starts.lock().unwrap()
    }
}

/// Records a shard task's end when dropped: when it returns, and when the engine aborts it at
/// `valid_until` (a member whose runtime was too busy to see its step-down in time: its task
/// stopped then, and a later start elsewhere is no overlap).
struct Running<'a> {
    book: &'a Book,
    shard: &'a ShardLeader,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.book.end(self.shard);
    }
}

struct Member {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
    faults: Option<Faults>,
}

fn join(scene: &Scene, store: Arc<dyn LeaseStore>, group: &str, id: &str, book: &Arc<Book>) -> Member {
    join_group(scene, store, group, (SHARDS, None), id, book)
}

/// A member of a group of `shards`, with `max_moves_per_round` if given.
fn join_group(
    scene: &Scene,
    store: Arc<dyn LeaseStore>,
    group: &str,
    (shards, max_moves): (u32, Option<usize>),
    id: &str,
    book: &Arc<Book>,
) -> Member {
    let ttl = scene.ttl;
    let (retry, timeout) = (scene.retry_every(), scene.request_timeout());
    let builder = LeaseGroup::builder(store, group, shards);
    let builder = match max_moves {
        Some(moves) => builder.max_moves_per_round(moves),
        None => builder,
    };
    let group = builder
        .member_id(id)
        .ttl(ttl)
        .electors(move |b| b.retry_every(retry).request_timeout(timeout))
        .build()
        .unwrap_or_else(|e| panic!("{}: cannot build member {id}: {e}", scene.prefix));
    let (stop, mut stopped) = watch::channel(false);
    let book = book.clone();
    let handle = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let task = move |shard: ShardLeader| {
            let book = book.clone();
            async move {
                book.start(&shard);
                let _running = Running {
                    book: &book,
                    shard: &shard,
                };
                shard.cancelled().await;
                Ok::<(), Error>(())
            }
        };
        if let Err(e) = group.run_until(task, shutdown).await {
            panic!("member stopped: {e}");
        }
    });
    Member {
        stop,
        handle,
        faults: None,
    }
}

async fn balanced(scene: &Scene, book: &Book, expected: &[usize], limit: Duration) -> Duration {
    let started = Instant::now();
    while book.counts() != expected {
        assert!(
            started.elapsed() < limit,
            "{}: the group did not balance to {expected:?} within {limit:?}: shards run per member {:?}",
            scene.prefix,
            book.counts()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Three members share 64 shards 22/21/21 from cold; no shard moves over 10 stable TTLs; a
/// member cut off by a blackhole loses its shards, which the other two take 32/32; a new member
/// joins and takes at most ceil(64 / 3) = 22 (22/21/21 again); a graceful leave (32/32);
/// throughout, no shard runs twice at once and every shard's term increases with every owner.
///
/// # Panics
///
/// On two tasks of one shard at once, a term that does not increase, balance not reached within
/// its bound, or a move while membership is stable.
pub async fn lease_group_balances_and_survives_a_crash(backend: Arc<dyn Backend>) {
    // A store slow enough to need a long TTL for 1,000 leases needs a fifth of it for the
    // members' leases, their listings and the shard records written while the group changes.
    let ttl = backend
        .many_leases_ttl()
        .map_or(Duration::from_secs(1), |t| (t / 5).max(Duration::from_secs(1)));
    let scene = Scene::with_ttl(backend, "lease_group_balances_and_survives_a_crash", ttl).await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let group = scene.lease.clone();
    let book = Arc::new(Book::default());
    // Rounds every ttl / 4; moves need two rounds and a notification or a poll.
    let bound = ttl * 10;

    let mut members = Vec::new();
    for id in ["a", "b"] {
        members.push(join(&scene, scene.connect().await, &group, id, &book));
    }
    let (store_c, faults_c) = scene.connect_faulty().await;
    let mut c = join(&scene, store_c, &group, "c", &book);
    c.faults = Some(faults_c);
    let took = balanced(&scene, &book, &[22, 21, 21], bound).await;
    scene.log(format_args!(
        "3 members, {SHARDS} shards: balanced from cold in {}",
        secs(took)
    ));

    let starts = book.starts();
    tokio::time::sleep(ttl * 10).await;
    assert_eq!(
        book.starts(),
        starts,
        "{p}: shards moved over 10 TTLs of stable membership"
    );

    let cut = Instant::now();
    let faults = c.faults.as_ref().expect("c is faulty");
    faults.set(Direction::Request, Fault::Blackhole);
    faults.set(Direction::Reply, Fault::Blackhole);
    balanced(&scene, &book, &[32, 32], bound).await;
    scene.log(format_args!(
        "c cut off: its shards owned again 32/32 after {} (TTL {})",
        secs(cut.elapsed()),
        secs(ttl)
    ));

    let starts = book.starts();
    let d = join(&scene, scene.connect().await, &group, "d", &book);
    let took = balanced(&scene, &book, &[22, 21, 21], bound).await;
    let moves = book.starts() - starts;
    scene.log(format_args!(
        "d joined: balanced after {} with {moves} moves",
        secs(took)
    ));
    assert!(
        moves <= 22,
        "{p}: a join moved {moves} shards (at most ceil(64 / 3) = 22)"
    );

    let left = members.pop().expect("b");
    let _ = left.stop.send(true);
    scene
        .within("b leaving", ttl * 3, left.handle)
        .await
        .unwrap_or_else(|e| panic!("{p}: b: {e}"));
    let took = balanced(&scene, &book, &[32, 32], bound).await;
    scene.log(format_args!("b left gracefully: balanced after {}", secs(took)));

    let violations = book.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{p}: {violations:#?}");
    for m in members.into_iter().chain([d]) {
        let _ = m.stop.send(true);
        let _ = scene.within("a member leaving", ttl * 3, m.handle).await;
    }
    c.faults.as_ref().expect("c").heal();
    let _ = c.stop.send(true);
    c.handle.abort();
    scene.finish().await;
}

/// Three members share 10,000 shards from cold (3,334/3,333/3,333); a member cut off by a
/// blackhole loses its shards, which the other two take 5,000/5,000; a new member joins and
/// takes at most ceil(10,000 / 3) = 3,334 (moves capped only by the shard count here); no shard
/// moves over 3 stable TTLs; throughout, no shard runs twice at once and every shard's term
/// increases with every owner. A member's lease is the only thing renewed, so this costs the
/// store writes only while the group changes.
///
/// Not in [`suite!`](crate::suite): beside the suite's other scenarios on a loaded 2-core CI
/// machine (eight at once, every backend's) its 40,000 record writes made members' renewals
/// late there; call it from a test of your own that runs alone, or run the bench's
/// `group-scale` measure (4 members x 10,000 shards, each in a process of its own).
///
/// # Panics
///
/// As [`lease_group_balances_and_survives_a_crash`].
pub async fn lease_group_at_scale(backend: Arc<dyn Backend>) {
    let ttl = backend
        .many_leases_ttl()
        .map_or(Duration::from_secs(2), |t| (t / 5).max(Duration::from_secs(2)));
    let scene = Scene::with_ttl(backend, "lease_group_at_scale", ttl).await;
    let p = &scene.prefix;
    let ttl = scene.ttl;
    let group = scene.lease.clone();
    let book = Arc::new(Book::default());
    let size = (MANY_SHARDS, Some(MANY_SHARDS as usize));
    // Writing 10,000 records at once (64 at a time) takes a while on a local server.
    let bound = ttl * 10 + Duration::from_secs(120);
    let mut members = Vec::new();
    for id in ["a", "b"] {
        members.push(join_group(&scene, scene.connect().await, &group, size, id, &book));
    }
    let (store_c, faults_c) = scene.connect_faulty().await;
    let mut c = join_group(&scene, store_c, &group, size, "c", &book);
    c.faults = Some(faults_c);
    let took = balanced(&scene, &book, &[3334, 3333, 3333], bound).await;
    scene.log(format_args!(
        "3 members, {MANY_SHARDS} shards: balanced from cold in {}",
        secs(took)
    ));

    let cut = Instant::now();
    let faults = c.faults.as_ref().expect("c is faulty");
    faults.set(Direction::Request, Fault::Blackhole);
    faults.set(Direction::Reply, Fault::Blackhole);
    balanced(&scene, &book, &[5000, 5000], bound).await;
    scene.log(format_args!(
        "c cut off: its shards owned again after {}",
        secs(cut.elapsed())
    ));

    let starts = book.starts();
    let d = join_group(&scene, scene.connect().await, &group, size, "d", &book);
    let took = balanced(&scene, &book, &[3334, 3333, 3333], bound).await;
    let moves = book.starts() - starts;
    scene.log(format_args!(
        "d joined: balanced after {} with {moves} moves",
        secs(took)
    ));
    assert!(moves <= 3334, "{p}: a join moved {moves} shards (at most 3,334)");
    let starts = book.starts();
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        book.starts(),
        starts,
        "{p}: shards moved over 3 TTLs of stable membership"
    );

    let violations = book.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "{p}: {} violations, e.g. {:#?}",
        violations.len(),
        violations.first()
    );
    for m in members.into_iter().chain([d]) {
        let _ = m.stop.send(true);
        let _ = scene
            .within("a member leaving", ttl * 3 + Duration::from_secs(60), m.handle)
            .await;
    }
    c.faults.as_ref().expect("c").heal();
    let _ = c.stop.send(true);
    c.handle.abort();
    scene.finish().await;
}
