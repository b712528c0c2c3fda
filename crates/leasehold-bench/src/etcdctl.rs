//! The references on the same etcd: `etcdctl elect` (handover by SIGINT, failover by kill -9)
//! against `leasehold run` (handover by SIGTERM), and etcd-client's `Election` (server-side
//! campaign/resign) against the library's graceful handover.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::Stats;
use crate::plan::{Outcome, Plan};

/// etcdctl 3.4's `elect` keeps its session lease for 60 s and has no flag to change it.
pub(crate) const ETCDCTL_SESSION_TTL: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(crate) struct EtcdctlReport {
    pub(crate) handover: Outcome<Stats>,
    pub(crate) failover: Outcome<Stats>,
    /// etcd-client's `Election` and the library, interleaved.
    pub(crate) election: Outcome<Paired>,
    /// `leasehold run`: from SIGTERM of the leader's process to the successor's command's first
    /// line.
    pub(crate) cli: Outcome<Stats>,
    /// The like-for-like floor of `cli`: `etcdctl elect` with the same command started and stopped
    /// around it by a shell wrapper (no containment), timed the same way.
    pub(crate) wrapped: Outcome<Stats>,
    /// What `leasehold run` does and `etcdctl elect` does not, measured alone: stopping the
    /// leader's command and starting the successor's. See [`command_costs`].
    pub(crate) command: Outcome<CommandCosts>,
}

/// Stopping and starting the benchmark's command, each measured alone ([`command_costs`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommandCosts {
    pub(crate) stop: Stats,
    pub(crate) start: Stats,
}

impl EtcdctlReport {
    pub(crate) fn unavailable(why: &str) -> EtcdctlReport {
        EtcdctlReport {
            handover: Err(why.to_string()),
            failover: Err(why.to_string()),
            election: Err(why.to_string()),
            cli: Err(why.to_string()),
            wrapped: Err(why.to_string()),
            command: Err(why.to_string()),
        }
    }
}

struct Candidate {
    child: Child,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
}

impl Candidate {
    fn spawn(endpoints: &str, election: &str, proposal: &str) -> Outcome<Candidate> {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["elect", election, proposal]);
        Candidate::start(command, "etcdctl")
    }

    /// Starts `command` (stdout read line by line, each with when it came; stderr discarded).
    fn start(mut command: Command, what: &str) -> Outcome<Candidate> {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{what}: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Candidate { child, lines })
    }

    /// When it printed `proposal` (it prints the key, then the proposal, once elected).
    async fn elected(&mut self, proposal: &str, limit: Duration) -> Outcome<Instant> {
        let wait = async {
            while let Some((at, line)) = self.lines.recv().await {
                if line.trim() == proposal {
                    return Some(at);
                }
            }
            None
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| format!("etcdctl elect {proposal}: not elected within {limit:?}"))?
            .ok_or_else(|| format!("etcdctl elect {proposal} exited"))
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    async fn stop(self) {
        self.stop_with(Signal::SIGINT).await;
    }

    async fn stop_with(mut self, signal: Signal) {
        self.signal(signal);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

pub(crate) async fn measure(etcd_url: &str, plan: &Plan, cli: Option<&Outcome<PathBuf>>) -> EtcdctlReport {
    let endpoints = etcd_url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|e| format!("http://{e}"))
        .collect::<Vec<_>>()
        .join(",");
    let run = leasehold::random_u64() % 1_000_000;
    let reps = plan.handover_reps();
    let skipped = || Err::<Stats, String>("not run (--only)".into());
    let mut report = EtcdctlReport {
        handover: skipped(),
        failover: skipped(),
        election: Err("not run (--only)".into()),
        cli: skipped(),
        wrapped: skipped(),
        command: Err("not run (--only)".into()),
    };
    // The CLI handovers and their references, interleaved: in each repetition every one runs
    // once, starting with a different one each time.
    let cli_exe = match cli {
        Some(Ok(exe)) => Ok(exe.clone()),
        Some(Err(e)) => Err(e.clone()),
        None => Err("the leasehold CLI was not located".to_string()),
    };
    let (wants_etcdctl, wants_cli) = (plan.wants("etcdctl"), plan.wants("cli"));
    if wants_etcdctl || wants_cli {
        eprintln!("== CLI handovers: etcdctl elect, leasehold run, the wrapper, the command alone (interleaved)");
        let mut samples: [Vec<Duration>; 5] = Default::default();
        let mut failed: [Option<String>; 5] = Default::default();
        for i in 0..reps {
            for turn in 0..4 {
                let which = (i + turn) % 4;
                let result = match which {
                    0 if wants_etcdctl => graceful(&endpoints, format!("bench-etcdctl-{run}-h{i}"))
                        .await
                        .map(|d| vec![d]),
                    1 if wants_cli => match &cli_exe {
                        Ok(exe) => cli_graceful(exe, etcd_url, format!("bench-cli-{run}-h{i}"), plan.smoke)
                            .await
                            .map(|d| vec![d]),
                        Err(e) => Err(e.clone()),
                    },
                    2 if wants_cli => wrapped_graceful(&endpoints, format!("bench-wrapped-{run}-h{i}"))
                        .await
                        .map(|d| vec![d]),
                    3 if wants_cli => command_costs().await.map(|(stop, start)| vec![stop, start]),
                    _ => continue,
                };
                let slots: &[usize] = if which == 3 { &[3, 4] } else { &[which] };
                match result {
                    Ok(ds) => slots.iter().zip(ds).for_each(|(&k, d)| samples[k].push(d)),
                    Err(e) => slots.iter().for_each(|&k| failed[k] = Some(e.clone())),
                }
            }
        }
        let stats = |k: usize| -> Outcome<Stats> {
            match &failed[k] {
                Some(e) => Err(e.clone()),
                None => Stats::of(&samples[k]).ok_or_else(|| "no samples".into()),
            }
        };
        if wants_etcdctl {
            report.handover = stats(0);
            print_stats("etcdctl elect handover", &report.handover);
            report.failover = if plan.smoke {
                Err("skipped in smoke mode (etcdctl's session TTL is 60 s)".into())
            } else {
                repeat(1, |i| crash(&endpoints, format!("bench-etcdctl-{run}-f{i}"))).await
            };
        }
        if wants_cli {
            report.cli = stats(1);
            report.wrapped = stats(2);
            report.command = stats(3).and_then(|stop| Ok(CommandCosts { stop, start: stats(4)? }));
            print_stats("leasehold run handover", &report.cli);
            print_stats("etcdctl elect + sh wrapper handover", &report.wrapped);
            print_stats("the command alone, stopped", &stats(3));
            print_stats("the command alone, started", &stats(4));
        }
    }
    if plan.wants("election") {
        eprintln!("== etcd-client Election (reference), interleaved with the library's handover");
        let pairs = if plan.smoke { reps } else { PAIRED_REPS };
        report.election = paired(etcd_url, run, pairs).await;
        match &report.election {
            Ok(p) => {
                print_stats("Election handover from resign() returning", &Ok(p.election.0));
                print_stats("Election handover from resign() called", &Ok(p.election.1));
                print_stats("leasehold handover from resign() returning", &Ok(p.leasehold.0));
                print_stats("leasehold handover from resign() called", &Ok(p.leasehold.1));
                print_stats("the release protocol without the library", &Ok(p.protocol));
                eprintln!(
                    "   paired difference, protocol minus Election: {}",
                    p.protocol_difference
                );
                eprintln!(
                    "   paired difference from resign() called, leasehold minus Election: {}",
                    p.difference
                );
            }
            Err(e) => eprintln!("   {e}"),
        }
    }
    report
}

fn print_stats(what: &str, s: &Outcome<Stats>) {
    match s {
        Ok(s) => eprintln!(
            "   {what}: p50 {}, p99 {}, max {} (n = {})",
            crate::ms(s.p50),
            crate::ms(s.p99),
            crate::ms(s.max),
            s.n
        ),
        Err(e) => eprintln!("   {what}: {e}"),
    }
}

/// Graceful handovers of etcd-client's `Election` and of the library, interleaved in one loop
/// (alternating which goes first) so that both see the same machine and server state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Paired {
    /// `Election`: from the leader's `resign` returning, and from it being called, to the
    /// successor's `campaign` returning.
    pub(crate) election: (Stats, Stats),
    /// The library on the same etcd: from `resign()` returning, and from it being called, to the
    /// successor's Elected event.
    pub(crate) leasehold: (Stats, Stats),
    /// From `resign()` called: the library's sample minus `Election`'s in the same repetition.
    pub(crate) difference: Difference,
    /// The library's release on etcd without the library ([`protocol_once`]): from the
    /// transaction's send to the successor's watch event.
    pub(crate) protocol: Stats,
    /// That minus `Election`'s sample in the same repetition.
    pub(crate) protocol_difference: Difference,
}

/// The median of paired differences (`ours_i - theirs_i`, negative where ours was faster) with
/// a 95% percentile-bootstrap interval: two p50s of separate samples move with the machine's
/// load from run to run, a difference taken within each repetition much less.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Difference {
    /// Milliseconds.
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
    /// Repetitions in which ours was faster.
    pub(crate) faster: usize,
    pub(crate) n: usize,
}

/// "median +0.016 ms (95% interval -0.009 to +0.045 ms), faster in 92 of 200".
impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:+.3} ms (95% interval {:+.3} to {:+.3} ms), faster in {} of {}",
            self.median, self.low, self.high, self.faster, self.n
        )
    }
}

impl Difference {
    /// `None` without samples or with unequal counts.
    pub(crate) fn of(ours: &[Duration], theirs: &[Duration]) -> Option<Difference> {
        if ours.is_empty() || ours.len() != theirs.len() {
            return None;
        }
        let d: Vec<f64> = ours
            .iter()
            .zip(theirs)
            .map(|(o, t)| (o.as_secs_f64() - t.as_secs_f64()) * 1000.0)
            .collect();
        // A fixed seed: the same samples give the same interval.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        const ROUNDS: usize = 2000;
        let mut medians: Vec<f64> = (0..ROUNDS)
            .map(|_| median((0..d.len()).map(|_| d[(next() % d.len() as u64) as usize]).collect()))
            .collect();
        medians.sort_by(f64::total_cmp);
        Some(Difference {
            median: median(d.clone()),
            low: medians[ROUNDS * 25 / 1000],
            high: medians[ROUNDS * 975 / 1000 - 1],
            faster: d.iter().filter(|x| **x < 0.0).count(),
            n: d.len(),
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The TTL of both sides of [`paired`].
const ELECTION_LEASE_TTL: Duration = Duration::from_secs(10);

/// Before each resign, the successor waits this long (once it has seen the leader, for the
/// library): its campaign has reached the server and waits there.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);

/// Repetitions of [`paired`] in a full run: enough for the median of the paired differences to
/// settle within about 0.05 ms on this kind of machine.
pub(crate) const PAIRED_REPS: usize = 200;

/// `reps` samples each of [`election_once`], of the library's graceful handover and of
/// [`protocol_once`] on the same etcd, interleaved, with the same TTL as `Election`'s leases
/// (10 s): at the benchmark's 2 s a renewal (every 667 ms) or a waiting candidate's keepalive
/// round under way when the leader resigns delays the handover by its round trip, a cost
/// `Election`'s leases (never kept alive here) do not have.
async fn paired(etcd_url: &str, run: u64, reps: usize) -> Outcome<Paired> {
    let mut a = crate::floor::etcd_client(etcd_url).await?;
    let mut b = crate::floor::etcd_client(etcd_url).await?;
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(leasehold::connect(etcd_url).await.map_err(|e| e.to_string())?);
    }
    let ttl = ELECTION_LEASE_TTL;
    let (mut theirs, mut ours) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let mut protocol = Vec::new();
    for i in 0..reps {
        for turn in 0..3 {
            match (i + turn) % 3 {
                0 => {
                    let (ret, call) =
                        election_once(&mut a, &mut b, format!("bench-election-{run}-{i}"), SETTLE).await?;
                    theirs.0.push(ret);
                    theirs.1.push(call);
                }
                1 => {
                    let lease = crate::plan::lease(run, "paired", i)?;
                    let (ret, call) = crate::measures::handover_once(&clients, &lease, ttl, SETTLE).await?;
                    ours.0.push(ret);
                    ours.1.push(call);
                }
                _ => protocol.push(protocol_once(&mut a, &b, format!("bench-protocol-{run}-{i}")).await?),
            }
        }
    }
    let stats = |(ret, call): &(Vec<Duration>, Vec<Duration>)| -> Outcome<(Stats, Stats)> {
        Ok((
            Stats::of(ret).ok_or("no samples")?,
            Stats::of(call).ok_or("no samples")?,
        ))
    };
    Ok(Paired {
        election: stats(&theirs)?,
        leasehold: stats(&ours)?,
        difference: Difference::of(&ours.1, &theirs.1).ok_or("no samples")?,
        protocol: Stats::of(&protocol).ok_or("no samples")?,
        protocol_difference: Difference::of(&protocol, &theirs.1).ok_or("no samples")?,
    })
}

/// The library's graceful handover on etcd without the library: the transaction the etcd
/// backend sends to release a lease (`EtcdStore::release`: the holder's key deleted, the term's
/// end and the release marker written, on two compares), sent with etcd-client, and a watch on
/// another client of the released key, as the successor's change stream watches it. From the
/// send to the watch's delete event: the store's part of the handover, its floor.
async fn protocol_once(a: &mut etcd_client::Client, b: &etcd_client::Client, name: String) -> Outcome<Duration> {
    use etcd_client::{Compare, CompareOp, EventType, Txn, TxnOp};
    let e = |what: &'static str| move |err: etcd_client::Error| format!("etcd {what}: {err}");
    let limit = Duration::from_secs(10);
    let (own, reserved) = (format!("{name}/c/a"), format!("{name}/reserved"));
    let term = a.put(own.as_str(), "a", None).await.map_err(e("put"))?;
    let term = term.header().map_or(0, etcd_client::ResponseHeader::revision);
    let mut stream = b.clone().watch(own.as_str(), None).await.map_err(e("watch"))?;
    let waiting = tokio::spawn(async move {
        while let Ok(Some(r)) = stream.message().await {
            if r.events().iter().any(|ev| ev.event_type() == EventType::Delete) {
                return Some(Instant::now());
            }
        }
        None
    });
    tokio::time::sleep(SETTLE).await;
    let txn = Txn::new()
        .when([
            Compare::create_revision(own.as_str(), CompareOp::Equal, term),
            Compare::create_revision(reserved, CompareOp::Equal, 0),
        ])
        .and_then([
            TxnOp::delete(own.as_str(), None),
            TxnOp::put(format!("{name}/ended/{term}"), "released", None),
            TxnOp::put(format!("{name}/granted"), format!("released {term}"), None),
        ]);
    let sent = Instant::now();
    let done = a.txn(txn).await;
    if !done.as_ref().is_ok_and(etcd_client::TxnResponse::succeeded) {
        waiting.abort();
        return Err(done.map_or_else(e("txn"), |_| "the release transaction's compare failed".into()));
    }
    let at = crate::plan::within(limit, "the delete event", waiting)
        .await?
        .map_err(|e| e.to_string())?
        .ok_or("the watch ended")?;
    Ok(at.saturating_duration_since(sent))
}

/// One handover of etcd-client 0.21's `Election` (etcd's server-side campaign/resign, each
/// candidate with an etcd lease of its own on a client of its own): A campaigns and wins, B's
/// campaign waits on the server; from A's `resign` returning, and from it being called, to B's
/// `campaign` returning.
pub(crate) async fn election_once(
    a: &mut etcd_client::Client,
    b: &mut etcd_client::Client,
    name: String,
    settle: Duration,
) -> Outcome<(Duration, Duration)> {
    let e = |what: &'static str| move |err: etcd_client::Error| format!("etcd {what}: {err}");
    let limit = Duration::from_secs(10);
    let secs = ELECTION_LEASE_TTL.as_secs() as i64;
    let la = a.lease_grant(secs, None).await.map_err(e("lease grant"))?.id();
    let lb = b.lease_grant(secs, None).await.map_err(e("lease grant"))?.id();
    let mut ea = a.election_client();
    let key = crate::plan::within(limit, "A's campaign", ea.campaign(name.as_str(), "A", la))
        .await?
        .map_err(e("campaign"))?
        .take_leader()
        .ok_or("A's campaign returned no leader key")?;
    let mut eb = b.election_client();
    let waiting = tokio::spawn(async move {
        let r = eb.campaign(name, "B", lb).await;
        (Instant::now(), r)
    });
    tokio::time::sleep(settle).await;
    if waiting.is_finished() {
        return Err("B's campaign returned while A led".into());
    }
    let called = Instant::now();
    ea.resign(Some(etcd_client::ResignOptions::new().with_leader(key)))
        .await
        .map_err(e("resign"))?;
    let returned = Instant::now();
    let (at, r) = crate::plan::within(limit, "B's campaign", waiting)
        .await?
        .map_err(|e| e.to_string())?;
    r.map_err(e("campaign"))?;
    let _ = a.lease_revoke(la).await;
    let _ = b.lease_revoke(lb).await;
    Ok((
        at.saturating_duration_since(returned),
        at.saturating_duration_since(called),
    ))
}

/// The `leasehold` binary next to this executable (`target/release/leasehold` when the
/// benchmark runs from `cargo run --release`), built first with `cargo build --release -p
/// leasehold-cli` (a no-op when it is up to date). `LEASEHOLD_BENCH_CLI=/path/to/leasehold`
/// uses that binary instead, without building.
pub(crate) fn locate_or_build_cli() -> Outcome<PathBuf> {
    if let Some(given) = std::env::var_os("LEASEHOLD_BENCH_CLI") {
        let given = PathBuf::from(given);
        return if given.is_file() {
            Ok(given)
        } else {
            Err(format!("LEASEHOLD_BENCH_CLI: no file {}", given.display()))
        };
    }
    let root = crate::backends::repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let release = target.join("release").join("leasehold");
    eprintln!("building the CLI: cargo build --release -p leasehold-cli");
    let built = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "-p", "leasehold-cli"])
        .current_dir(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status();
    match built {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("cargo build of the CLI exited with {s}; using an existing binary if any"),
        Err(e) => eprintln!("could not run cargo ({e}); using an existing binary if any"),
    }
    if release.is_file() {
        Ok(release)
    } else {
        Err(format!("no leasehold CLI binary at {}", release.display()))
    }
}

/// A `leasehold run` candidate whose command prints `up NAME` and sleeps.
fn cli_spawn(exe: &Path, url: &str, lease: &str, name: &str, ttl: Duration) -> Outcome<Candidate> {
    let mut child = Command::new(exe)
        .args(["--store", url, "run", "--quiet", "--lease", lease, "--id", name])
        .arg(format!("--ttl={}ms", ttl.as_millis()))
        .args(["--", "sh", "-c"])
        .arg(format!("echo up {name}; exec sleep 1000"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    Ok(Candidate { child, lines })
}

/// Leader `A` (`leasehold run`) gets SIGTERM (it stops its command, releases and exits); time
/// until `B`'s command prints its first line.
async fn cli_graceful(exe: &Path, url: &str, lease: String, smoke: bool) -> Outcome<Duration> {
    let ttl = Duration::from_secs(if smoke { 1 } else { 2 });
    let mut a = cli_spawn(exe, url, &lease, "A", ttl)?;
    a.elected("up A", Duration::from_secs(15)).await?;
    let mut b = cli_spawn(exe, url, &lease, "B", ttl)?;
    // Let B connect and queue behind A (as the etcdctl measure does).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGTERM);
    let at = b.elected("up B", Duration::from_secs(15)).await;
    a.stop_with(Signal::SIGTERM).await;
    b.stop_with(Signal::SIGTERM).await;
    Ok(at?.saturating_duration_since(t0))
}

/// The benchmark's command alone (`sh -c 'echo up C; exec sleep 1000'`, as `leasehold run` and
/// the wrapper run it), started the way `leasehold run` starts a successor's command: forked
/// beforehand, waiting to be told (a `sh` blocked in `read`), then exec'd. From the word to its
/// first line (started), then from SIGTERM to its exit being reaped (stopped).
async fn command_costs() -> Outcome<(Duration, Duration)> {
    use tokio::io::AsyncWriteExt as _;
    let mut command = Command::new("sh");
    command
        .args(["-c", "read go && exec sh -c 'echo up C; exec sleep 1000'"])
        .stdin(Stdio::piped());
    let mut c = Candidate::start(command, "sh")?;
    let mut stdin = c.child.stdin.take().expect("piped");
    // Let it reach its `read`.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let told = Instant::now();
    stdin.write_all(b"go\n").await.map_err(|e| format!("sh: {e}"))?;
    let up = c.elected("up C", Duration::from_secs(10)).await?;
    let signalled = Instant::now();
    c.signal(Signal::SIGTERM);
    crate::plan::within(Duration::from_secs(10), "the command's exit", c.child.wait())
        .await?
        .map_err(|e| format!("sh: {e}"))?;
    Ok((signalled.elapsed(), up.saturating_duration_since(told)))
}

async fn repeat<F, Fut>(reps: usize, mut f: F) -> Outcome<Stats>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Outcome<Duration>>,
{
    let mut samples = Vec::new();
    for i in 0..reps {
        samples.push(f(i).await?);
    }
    Stats::of(&samples).ok_or_else(|| "no samples".into())
}

/// Leader `A` gets SIGINT (etcdctl resigns and exits); time until `B` prints its proposal.
async fn graceful(endpoints: &str, election: String) -> Outcome<Duration> {
    let mut a = Candidate::spawn(endpoints, &election, "A")?;
    a.elected("A", Duration::from_secs(10)).await?;
    let mut b = Candidate::spawn(endpoints, &election, "B")?;
    // Let B connect and queue behind A.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGINT);
    let at = b.elected("B", Duration::from_secs(10)).await;
    a.stop().await;
    b.stop().await;
    Ok(at?.saturating_duration_since(t0))
}

/// `etcdctl elect` run by a shell wrapper that starts the bench's command
/// (`sh -c 'echo up NAME; exec sleep 1000'`) once elected, and on SIGTERM stops it (SIGTERM,
/// waits for it) before it makes etcdctl resign (SIGINT): what `leasehold run` does, without
/// its containment (no process group, cgroup, subreapers or checks that the tree is empty).
const WRAPPER: &str = r#"
dir=$(mktemp -d) && mkfifo "$dir/out" || exit 1
ETCDCTL_API=3 etcdctl --endpoints="$1" elect "$2" "$3" > "$dir/out" 2>/dev/null & elect=$!
exec 3< "$dir/out"
rm -r "$dir"
trap 'kill -INT $elect; wait $elect; exit 143' TERM
while read -r line <&3; do [ "$line" = "$3" ] && break; done
sh -c "echo up $3; exec sleep 1000" & cmd=$!
trap 'kill -TERM $cmd; wait $cmd; kill -INT $elect; wait $elect; exit 143' TERM
wait $cmd
"#;

/// Leader `A` (the wrapper above) gets SIGTERM; time until `B`'s command prints its line.
async fn wrapped_graceful(endpoints: &str, election: String) -> Outcome<Duration> {
    let spawn = |name: &str| -> Outcome<Candidate> {
        let mut command = Command::new("sh");
        command
            .args(["-c", WRAPPER, "sh", endpoints, &election, name])
            .stdin(Stdio::null());
        Candidate::start(command, "sh")
    };
    let mut a = spawn("A")?;
    a.elected("up A", Duration::from_secs(10)).await?;
    let mut b = spawn("B")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGTERM);
    let at = b.elected("up B", Duration::from_secs(10)).await;
    a.stop_with(Signal::SIGTERM).await;
    b.stop_with(Signal::SIGTERM).await;
    Ok(at?.saturating_duration_since(t0))
}

/// Leader `A` gets SIGKILL; time until `B` prints its proposal (the session lease must expire).
async fn crash(endpoints: &str, election: String) -> Outcome<Duration> {
    let mut a = Candidate::spawn(endpoints, &election, "A")?;
    a.elected("A", Duration::from_secs(10)).await?;
    let mut b = Candidate::spawn(endpoints, &election, "B")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGKILL);
    let at = b.elected("B", ETCDCTL_SESSION_TTL * 2).await;
    a.stop().await;
    b.stop().await;
    Ok(at?.saturating_duration_since(t0))
}
