//! Lease groups on one backend: 3 members x 64 shards from cold, a member cut off, a fourth
//! joining, 10 TTLs of stable membership; and what one member alone asks of the store per second
//! at 100, 1,000 and 10,000 shards.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{CountingStore, Elector, LeaseGroup, LeaseStore, Operation, RequestCounts, ShardLeader, Term};
use leasehold_conformance::{Direction, Fault, Faults, FaultyStore};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::backends::Available;
use crate::plan::{Outcome, Plan, connect, within};

/// The group measure of one backend.
#[derive(Debug)]
pub(crate) struct GroupReport {
    pub(crate) shards: u32,
    pub(crate) ttl: Duration,
    /// From the three members starting to 22/21/21 (every shard owned).
    pub(crate) cold: Outcome<Duration>,
    pub(crate) crash: Outcome<Crash>,
    pub(crate) join: Outcome<Join>,
    pub(crate) stable: Outcome<Stable>,
    /// Shard tasks started while another member's task still ran on the same shard.
    pub(crate) overlaps: usize,
    /// How c crashed.
    pub(crate) crash_method: &'static str,
}

/// A member cut off from the store (every request and reply blackholed).
#[derive(Clone, Debug)]
pub(crate) struct Crash {
    /// The shards it owned when it was cut off.
    pub(crate) lost: usize,
    /// From the cut to every shard owned by the remaining members.
    pub(crate) took: Duration,
    /// The remaining members' counts at that moment, largest first.
    pub(crate) counts: Vec<usize>,
}

/// A fourth member joining (three live members after the crash).
#[derive(Clone, Debug)]
pub(crate) struct Join {
    /// From its start to balanced (every shard owned, counts as the quotas).
    pub(crate) took: Duration,
    /// Shard tasks started meanwhile (each is one shard changing owner).
    pub(crate) moves: usize,
    pub(crate) counts: Vec<usize>,
}

/// Stable membership.
#[derive(Clone, Debug)]
pub(crate) struct Stable {
    pub(crate) window: Duration,
    pub(crate) moves: usize,
}

/// One member holding many shards: its store calls over a few renewal rounds.
#[derive(Clone, Debug)]
pub(crate) struct Cost {
    pub(crate) shards: u32,
    pub(crate) ttl: Duration,
    /// From the member starting to it running every shard.
    pub(crate) all_owned_after: Duration,
    pub(crate) window: Duration,
    pub(crate) calls: RequestCounts,
}

impl Cost {
    pub(crate) fn per_second(&self, n: u64) -> f64 {
        n as f64 / self.window.as_secs_f64().max(1e-9)
    }

    /// Store calls at the `LeaseStore` API, every operation (each one request but a listing of
    /// many pages).
    pub(crate) fn calls_per_second(&self) -> f64 {
        self.per_second(self.calls.total())
    }
}

/// Runs the group measures of one backend: `(the 3-member group, the cost of one member at each
/// shard count)`.
pub(crate) async fn measure(av: &Available, run: u64, plan: &Plan) -> (Outcome<GroupReport>, Vec<Outcome<Cost>>) {
    let long_ttl = av.ttl > Duration::from_secs(5);
    let group = if plan.smoke && long_ttl {
        Err(format!("skipped in smoke mode (TTL {:?})", av.ttl))
    } else {
        eprintln!("   group: 3 members, {} shards", plan.group_shards);
        let t = Instant::now();
        let g = group(av, run, plan).await;
        if let Err(e) = &g {
            eprintln!("      {e}");
        }
        eprintln!("      {:.1} s", t.elapsed().as_secs_f64());
        g
    };
    let mut costs = Vec::new();
    for &shards in &plan.group_cost_shards {
        eprintln!("   group: one member, {shards} shards, store calls");
        let t = Instant::now();
        let c = cost(av, run, shards).await;
        if let Err(e) = &c {
            eprintln!("      {e}");
        }
        eprintln!("      {:.1} s", t.elapsed().as_secs_f64());
        costs.push(c);
    }
    (group, costs)
}

/// What the shard tasks of every member record.
#[derive(Debug, Default)]
struct Book {
    starts: AtomicUsize,
    overlaps: AtomicUsize,
    running: Mutex<HashMap<u32, (String, Term)>>,
}

/// A running shard task; dropping it (the task returned or was aborted) records the stop.
struct Running {
    book: Arc<Book>,
    shard: u32,
    term: Term,
}

impl Book {
    fn start(self: &Arc<Self>, shard: &ShardLeader) -> Running {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let me = shard.holder().to_string();
        let mut running = self.running.lock().expect("book lock");
        if running.get(&shard.shard()).is_some_and(|(other, _)| *other != me) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        running.insert(shard.shard(), (me, shard.term()));
        Running {
            book: self.clone(),
            shard: shard.shard(),
            term: shard.term(),
        }
    }

    fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.book.running.lock().expect("book lock");
        if running.get(&self.shard).is_some_and(|(_, term)| *term == self.term) {
            running.remove(&self.shard);
        }
    }
}

/// A member running in a task of its own, or in a child process (`--child-member`) that prints
/// the shards it leads whenever they change.
pub(crate) enum Member {
    Local {
        group: LeaseGroup,
        stop: Option<oneshot::Sender<()>>,
        handle: JoinHandle<leasehold::Result<()>>,
    },
    Process {
        child: tokio::process::Child,
        owned: Arc<Mutex<Vec<u32>>>,
    },
}

impl Member {
    fn join(
        store: Arc<dyn LeaseStore>,
        name: &str,
        shards: u32,
        id: &str,
        ttl: Duration,
        book: &Arc<Book>,
    ) -> Outcome<Member> {
        let group = LeaseGroup::builder(store, name, shards)
            .member_id(id)
            .ttl(ttl)
            .build()
            .map_err(|e| e.to_string())?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (g, book) = (group.clone(), book.clone());
        let handle = tokio::spawn(async move {
            g.run_until(
                move |shard: ShardLeader| {
                    let book = book.clone();
                    async move {
                        let _running = book.start(&shard);
                        shard.cancelled().await;
                        Ok::<(), leasehold::Error>(())
                    }
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        Ok(Member::Local {
            group,
            stop: Some(stop),
            handle,
        })
    }

    /// A member in a child process of this executable, so that it can be killed with SIGKILL.
    pub(crate) fn spawn(url: &str, name: &str, shards: u32, id: &str, ttl: Duration) -> Outcome<Member> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(exe)
            .args(["--child-member", url, "--group", name, "--id", id])
            .args([
                "--shards",
                &shards.to_string(),
                "--ttl-ms",
                &ttl.as_millis().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning a member process: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let owned = Arc::new(Mutex::new(Vec::new()));
        let seen = owned.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.strip_prefix("OWNED") {
                    let shards = rest.split(',').filter_map(|s| s.trim().parse().ok()).collect();
                    *seen.lock().expect("owned lock") = shards;
                }
            }
        });
        Ok(Member::Process { child, owned })
    }

    /// The process id of a member in a process of its own.
    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Member::Local { .. } => None,
            Member::Process { child, .. } => child.id(),
        }
    }

    pub(crate) fn owned(&self) -> Vec<u32> {
        match self {
            Member::Local { group, .. } => group.owned(),
            Member::Process { owned, .. } => owned.lock().expect("owned lock").clone(),
        }
    }

    /// Ends it at once: SIGKILL for a process; for a local member (whose store the caller has
    /// cut off), its run future is dropped.
    pub(crate) async fn kill(self) {
        match self {
            Member::Local { handle, .. } => handle.abort(),
            Member::Process { mut child, .. } => {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    /// Stops it gracefully (its shards released), within `limit`.
    pub(crate) async fn leave(self, limit: Duration) {
        match self {
            Member::Local { stop, mut handle, .. } => {
                if let Some(stop) = stop {
                    let _ = stop.send(());
                }
                if tokio::time::timeout(limit, &mut handle).await.is_err() {
                    handle.abort();
                }
            }
            Member::Process { mut child, .. } => {
                drop(child.stdin.take());
                if tokio::time::timeout(limit, child.wait()).await.is_err() {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
    }
}

/// The hidden `--child-member` mode: one group member; prints `OWNED s1,s2,...` whenever the
/// shards it leads change, until its stdin closes (then it leaves the group) or SIGKILL.
///
/// # Errors
///
/// When the store cannot be reached or the group cannot be built.
pub async fn child_member(url: &str, group: &str, shards: u32, id: &str, ttl: Duration) -> Result<(), String> {
    let store: Arc<dyn LeaseStore> = leasehold::connect(url).await.map_err(|e| e.to_string())?;
    let group = LeaseGroup::builder(store, group, shards)
        .member_id(id)
        .ttl(ttl)
        .build()
        .map_err(|e| e.to_string())?;
    let watched = group.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let owned = watched.owned();
            if last.as_ref() != Some(&owned) {
                let list: Vec<String> = owned.iter().map(ToString::to_string).collect();
                println!("OWNED {}", list.join(","));
                last = Some(owned);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // The parent closes our stdin to make us leave.
    let (leave, stdin_closed) = oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut buf = [0_u8; 64];
        while matches!(std::io::Read::read(&mut std::io::stdin(), &mut buf), Ok(n) if n > 0) {}
        let _ = leave.send(());
    });
    group
        .run_until(
            |shard: ShardLeader| async move {
                shard.cancelled().await;
                Ok::<(), leasehold::Error>(())
            },
            async move {
                let _ = stdin_closed.await;
            },
        )
        .await
        .map_err(|e| e.to_string())
}

/// floor / ceil of `shards / members`, largest first.
pub(crate) fn quotas(shards: u32, members: usize) -> Vec<usize> {
    let (q, r) = (shards as usize / members, shards as usize % members);
    (0..members).map(|i| if i < r { q + 1 } else { q }).collect()
}

/// The members' shard counts (largest first), if every shard has exactly one owner among them.
fn owners(members: &[&Member], shards: u32) -> (Vec<usize>, bool) {
    let mut counts = Vec::new();
    let mut seen = BTreeSet::new();
    let mut twice = false;
    for m in members {
        let owned = m.owned();
        counts.push(owned.len());
        for s in owned {
            twice |= !seen.insert(s);
        }
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    (counts, !twice && seen.len() == shards as usize)
}

/// Polls every 10 ms until `done(counts, all owned once)`; how long it took and the counts then.
pub(crate) async fn until(
    members: &[&Member],
    shards: u32,
    limit: Duration,
    what: &str,
    done: impl Fn(&[usize], bool) -> bool,
) -> Outcome<(Duration, Vec<usize>)> {
    let started = Instant::now();
    loop {
        let (counts, all) = owners(members, shards);
        if done(&counts, all) {
            return Ok((started.elapsed(), counts));
        }
        if started.elapsed() > limit {
            return Err(format!(
                "{what}: not within {limit:?} (counts {counts:?}, every shard owned: {all})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn group(av: &Available, run: u64, plan: &Plan) -> Outcome<GroupReport> {
    let ttl = av.ttl;
    let shards = plan.group_shards;
    let name = format!("bench-{run}-group");
    let book = Arc::new(Book::default());
    let mut report = GroupReport {
        shards,
        ttl,
        cold: Err("not run".into()),
        crash: Err("skipped (an earlier phase failed)".into()),
        join: Err("skipped (an earlier phase failed)".into()),
        stable: Err("skipped (an earlier phase failed)".into()),
        overlaps: 0,
        crash_method: "its store blackholed",
    };
    let faults = Faults::new();
    let (a, b) = (connect(av).await?, connect(av).await?);
    let d = connect(av).await?;
    let c_store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(connect(av).await?, faults.clone()));

    // Cold start.
    let started = Instant::now();
    let c = match av.url().filter(|_| plan.child_processes) {
        Some(url) => {
            report.crash_method = "SIGKILL of its process";
            Member::spawn(url, &name, shards, "c", ttl)?
        }
        None => Member::join(c_store, &name, shards, "c", ttl, &book)?,
    };
    let a = Member::join(a, &name, shards, "a", ttl, &book)?;
    let b = Member::join(b, &name, shards, "b", ttl, &book)?;
    let three = quotas(shards, 3);
    let limit = ttl * 10 + Duration::from_secs(20);
    report.cold = until(&[&a, &b, &c], shards, limit, "balanced from cold", |counts, all| {
        all && counts == three
    })
    .await
    .map(|_| started.elapsed());
    let mut live = vec![a, b];
    if report.cold.is_ok() {
        // c crashes: a member process is killed with SIGKILL; in this process, its store is
        // cut off (nothing it sends arrives, no answer comes back) and its run future dropped.
        let lost = c.owned().len();
        faults.set(Direction::Both, Fault::Blackhole);
        let cut = Instant::now();
        c.kill().await;
        let limit = ttl * 6 + Duration::from_secs(10);
        let refs: Vec<&Member> = live.iter().collect();
        report.crash = until(&refs, shards, limit, "c's shards led again", |_, all| all)
            .await
            .map(|(_, counts)| Crash {
                lost,
                took: cut.elapsed(),
                counts,
            });
    } else {
        c.kill().await;
    }
    if report.crash.is_ok() {
        let starts = book.starts();
        let started = Instant::now();
        live.push(Member::join(d, &name, shards, "d", ttl, &book)?);
        let refs: Vec<&Member> = live.iter().collect();
        let limit = ttl * 20 + Duration::from_secs(20);
        report.join = until(&refs, shards, limit, "balanced after d joined", |counts, all| {
            all && counts == three
        })
        .await
        .map(|(_, counts)| Join {
            took: started.elapsed(),
            moves: book.starts() - starts,
            counts,
        });
    }
    if report.join.is_ok() {
        let window = ttl * if plan.smoke { 1 } else { 10 };
        let starts = book.starts();
        tokio::time::sleep(window).await;
        report.stable = Ok(Stable {
            window,
            moves: book.starts() - starts,
        });
    }
    report.overlaps = book.overlaps.load(Ordering::SeqCst);
    let leaving = live.into_iter().map(|m| m.leave(ttl * 3));
    futures::future::join_all(leaving).await;
    // Whatever failed, the figures that were measured are reported; a failed cold start is an
    // error of the whole measure.
    if let Err(e) = &report.cold {
        return Err(e.clone());
    }
    Ok(report)
}

async fn cost(av: &Available, run: u64, shards: u32) -> Outcome<Cost> {
    let ttl = av.scale_ttl;
    let counted = Arc::new(CountingStore::new(connect(av).await?));
    let book = Arc::new(Book::default());
    let group_name = format!("bench-{run}-cost{shards}");
    let started = Instant::now();
    let member = Member::join(counted.clone(), &group_name, shards, "solo", ttl, &book)?;
    let limit = Duration::from_secs(300) + ttl * 3;
    let owned = until(&[&member], shards, limit, "every shard owned", |_, all| all).await;
    let all_owned_after = started.elapsed();
    let result = match owned {
        Err(e) => {
            let c = counted.counts();
            Err(format!(
                "{e}; its store calls meanwhile: {} write_shard, {} shard_records, {} list, {} failed",
                c.get(Operation::WriteShard),
                c.get(Operation::ShardRecords),
                c.get(Operation::List),
                c.failed
            ))
        }
        Ok(_) => {
            let renew_every = Elector::builder(Arc::new(leasehold::MemoryStore::new()), "x")
                .ttl(ttl)
                .timing()
                .renew_every;
            // The reads that confirm the claims settle first (two agreeing reads).
            tokio::time::sleep(renew_every * 2).await;
            let (calls, t) = (counted.counts(), Instant::now());
            let rounds = 3;
            tokio::time::sleep(renew_every * rounds).await;
            let window = t.elapsed();
            let lost = shards as usize - member.owned().len();
            if lost > 0 {
                Err(format!("{lost} of {shards} shards lost during the window"))
            } else {
                Ok(Cost {
                    shards,
                    ttl,
                    all_owned_after,
                    window,
                    calls: counted.counts().since(&calls),
                })
            }
        }
    };
    let _ = within(ttl * 3 + Duration::from_secs(60), "leaving", member.leave(ttl * 3)).await;
    result
}
