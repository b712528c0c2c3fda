//! Benchmarks of the core engine, without any backend.
//!
//! 1. The state machine's step cost: nanoseconds per `Machine::handle` over a leader's renew
//!    cycle (Tick -> Send Renew, Reply Renewed -> Extended).
//! 2. Idle leaders: 10,000 electors (one lease each) on one `MemoryStore`, in real time, elected
//!    and then left to renew; resident memory per idle leader and CPU time per renewal.
//!
//! Run with `cargo bench -p leasehold-core --bench engine`. It prints the numbers and rewrites
//! the "Core engine" section of `docs/benchmarks.md` (pass `--no-write` to only print).

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use leasehold_core::machine::{Input, Machine, Output, Reply, Request};
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, Changes, Elector, Event, Expiry, Grant, LeaseName, LeaseStore,
    MemoryStore, Notifications, Observation, PerMille, Renewed, Result, Term, Timing, Transition,
};

const STEPS: u64 = 1_000_000;
const STEP_ROUNDS: usize = 5;
const LEADERS: usize = 10_000;
const IDLE_TTL: Duration = Duration::from_secs(3);
const IDLE_WINDOW: Duration = Duration::from_secs(30);

fn main() {
    if std::env::args().any(|a| a == "--child-event-channels") {
        return event_channels_child();
    }
    let write = !std::env::args().any(|a| a == "--no-write");

    println!("machine step cost: {STEPS} steps x {STEP_ROUNDS} rounds ...");
    let mut rounds: Vec<f64> = (0..STEP_ROUNDS).map(|_| machine_step_ns(STEPS)).collect();
    rounds.sort_by(f64::total_cmp);
    let (best, median) = (rounds[0], rounds[STEP_ROUNDS / 2]);
    println!("  ns per Machine::handle (renew cycle): best {best:.1}, median {median:.1}");

    println!("idle leaders: {LEADERS} electors, ttl {IDLE_TTL:?}, window {IDLE_WINDOW:?} ...");
    let idle = idle_leaders();
    println!("  elected all in {:?}", idle.elect_time);
    println!(
        "  resident memory: {:.1} MiB before, {:.1} MiB after; {:.0} bytes per idle leader",
        mib(idle.rss_before),
        mib(idle.rss_after),
        idle.bytes_per_leader()
    );
    println!(
        "  {} renewals in {:?} ({:.2}/s per leader), all {} still leading: {}",
        idle.renewals,
        idle.window,
        idle.renewals_per_leader_second(),
        LEADERS,
        idle.all_leading
    );
    println!(
        "  CPU {:.2} s in the window ({:.1}% of one core): {:.1} us per renewal",
        idle.cpu.as_secs_f64(),
        100.0 * idle.cpu.as_secs_f64() / idle.window.as_secs_f64(),
        idle.cpu_per_renewal_us()
    );

    let channel_bytes = event_channel_bytes();
    println!(
        "  not included: the event channel made on the first events() call (broadcast::channel::<Event>(128), measured alone): {channel_bytes:.0} bytes \
         per elector; size_of::<Event>() = {}",
        std::mem::size_of::<Event>()
    );

    let section = section(best, median, &idle, channel_bytes);
    if write {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/benchmarks.md");
        match update_docs(path, &section) {
            Ok(()) => println!("updated docs/benchmarks.md (section \"Core engine\")"),
            Err(e) => eprintln!("could not update {path}: {e}"),
        }
    } else {
        println!("\n{section}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Machine step cost
// ---------------------------------------------------------------------------------------------

/// Nanoseconds per `Machine::handle` for a leader that renews `steps / 2` times.
fn machine_step_ns(steps: u64) -> f64 {
    let timing = Timing {
        jitter: PerMille(0),
        ..Timing::new(Duration::from_secs(10))
    };
    let lease = LeaseName::new("bench").unwrap();
    let me = CandidateId::new("bench-candidate-1").unwrap();
    let base = Instant::now();
    let mut m = Machine::new(
        timing,
        Expiry::ServerClock,
        Notifications::Release,
        lease.clone(),
        me.clone(),
        base,
        1,
    )
    .unwrap();
    let mut out = Vec::with_capacity(8);

    m.handle(base, Input::Tick, &mut out);
    let Some(Output::Send(op, Request::Acquire(_))) = out.pop() else {
        panic!("no acquire")
    };
    out.clear();
    let grant = Grant {
        lease,
        holder: me,
        term: Term(1),
        ttl: timing.ttl,
        token: "0123456789abcdef".into(),
    };
    m.handle(
        base,
        Input::Reply(op, Reply::Acquire(Ok(Acquired::Granted(grant)))),
        &mut out,
    );
    assert!(out.iter().any(|o| matches!(o, Output::Elected { .. })));
    out.clear();

    let reply_after = Duration::from_millis(2);
    let started = Instant::now();
    for _ in 0..steps / 2 {
        let now = m.next_wake().expect("a leader always has a wake-up");
        m.handle(black_box(now), Input::Tick, &mut out);
        let Some(Output::Send(op, Request::Renew(grant))) = out.pop() else {
            panic!("no renew: {out:?}")
        };
        out.clear();
        // The store answers with the grant it was sent, as MemoryStore does.
        let reply = Reply::Renew(Ok(Renewed::Renewed(grant)));
        m.handle(black_box(now + reply_after), Input::Reply(op, reply), &mut out);
        debug_assert!(matches!(out.as_slice(), [Output::Extended { .. }]));
        black_box(&out);
        out.clear();
    }
    let elapsed = started.elapsed();
    assert!(m.believes_leader(m.next_wake().unwrap()));
    elapsed.as_nanos() as f64 / (steps / 2 * 2) as f64
}

// ---------------------------------------------------------------------------------------------
// 2. Idle leaders
// ---------------------------------------------------------------------------------------------

/// A [`MemoryStore`] that counts renewals.
#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    renewals: AtomicU64,
}

#[async_trait]
impl LeaseStore for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(request).await
    }
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(grant).await
    }
    async fn release(&self, grant: &Grant) -> Result<()> {
        self.inner.release(grant).await
    }
    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.inner.inspect(lease).await
    }
    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.inner.history(lease, limit).await
    }
    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        self.inner.changes(lease, candidate).await
    }
}

struct Idle {
    elect_time: Duration,
    rss_before: u64,
    rss_after: u64,
    renewals: u64,
    window: Duration,
    cpu: Duration,
    all_leading: bool,
    threads: usize,
}

impl Idle {
    fn bytes_per_leader(&self) -> f64 {
        self.rss_after.saturating_sub(self.rss_before) as f64 / LEADERS as f64
    }
    fn renewals_per_leader_second(&self) -> f64 {
        self.renewals as f64 / LEADERS as f64 / self.window.as_secs_f64()
    }
    fn cpu_per_renewal_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.renewals.max(1) as f64
    }
}

fn idle_leaders() -> Idle {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Arc::new(Counting {
            inner: MemoryStore::new(),
            renewals: AtomicU64::new(0),
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rss_before = rss_bytes();

        let started = Instant::now();
        let electors: Vec<Elector> = (0..LEADERS)
            .map(|i| {
                Elector::builder(store.clone(), format!("lease-{i:05}"))
                    .candidate_id(format!("bench-{i:05}"))
                    .ttl(IDLE_TTL)
                    .build()
                    .unwrap()
            })
            .collect();
        let leaders: Vec<_> = futures::future::try_join_all(electors.iter().map(Elector::campaign))
            .await
            .unwrap();
        let elect_time = started.elapsed();

        // Let the first round of renewals settle, then measure an idle window.
        tokio::time::sleep(IDLE_TTL).await;
        let rss_after = rss_bytes();
        let (cpu_before, renewals_before, window_start) =
            (cpu_time(), store.renewals.load(Ordering::Relaxed), Instant::now());
        tokio::time::sleep(IDLE_WINDOW).await;
        let (cpu_after, renewals_after, window) = (
            cpu_time(),
            store.renewals.load(Ordering::Relaxed),
            window_start.elapsed(),
        );
        let all_leading = leaders
            .iter()
            .all(|l| !l.is_cancelled() && l.remaining() > Duration::ZERO);

        for leader in leaders {
            leader.resign().await;
        }
        drop(electors);
        Idle {
            elect_time,
            rss_before,
            rss_after,
            renewals: renewals_after - renewals_before,
            window,
            cpu: cpu_after.saturating_sub(cpu_before),
            all_leading,
            threads,
        }
    })
}

/// Bytes of resident memory per `broadcast::channel::<Event>(128)`, as each `Elector` makes
/// on its first `events()` subscription, measured in a child process so that the allocator's state does not blur the numbers.
fn event_channel_bytes() -> f64 {
    std::env::current_exe()
        .and_then(|exe| std::process::Command::new(exe).arg("--child-event-channels").output())
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn event_channels_child() {
    let before = rss_bytes();
    let senders: Vec<_> = (0..LEADERS)
        .map(|_| tokio::sync::broadcast::channel::<Event>(128).0)
        .collect();
    let after = rss_bytes();
    black_box(&senders);
    println!("{}", after.saturating_sub(before) as f64 / LEADERS as f64);
}

/// Resident memory of this process (`VmRSS` in /proc/self/status).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// User + system CPU time of the whole process (utime + stime in /proc/self/stat).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let hz = clock_ticks_per_second();
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz as f64)
}

fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------------------------------------
// docs/benchmarks.md
// ---------------------------------------------------------------------------------------------

fn section(best: f64, median: f64, idle: &Idle, channel_bytes: f64) -> String {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown".into(), |s| s.trim().to_string());

    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "## Core engine\n");
    let _ = writeln!(
        w,
        "The election engine alone, without a backend: the sans-IO state machine and the tokio driver on\n\
         `MemoryStore`. Command (release build, takes about a minute):\n"
    );
    let _ = writeln!(w, "```sh\ncargo bench -p leasehold-core --bench engine\n```\n");
    let _ = writeln!(
        w,
        "Measured {} on {} cores of `{cpu_model}` ({memory} RAM), {rustc}.\n",
        today(),
        idle.threads
    );
    let _ = writeln!(w, "| measurement | result |\n|---|---|");
    let _ = writeln!(
        w,
        "| `Machine::handle`, leader renew cycle (Tick -> Send Renew, Reply Renewed -> Extended), {STEPS} steps | {best:.0} ns per step (best of {STEP_ROUNDS} rounds; median {median:.0} ns) |"
    );
    let _ = writeln!(
        w,
        "| time to elect {LEADERS} electors at once (one lease each, `try_join_all` of `campaign()`) | {:.2} s |",
        idle.elect_time.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| resident memory, {LEADERS} idle leaders (VmRSS after minus before) | {:.1} MiB, {:.0} bytes per leader |",
        mib(idle.rss_after.saturating_sub(idle.rss_before)),
        idle.bytes_per_leader()
    );
    let _ = writeln!(
        w,
        "| not included: the event channel an `Elector` makes when first subscribed to with `events()` (`broadcast::channel::<Event>(128)`, measured alone; `size_of::<Event>()` = {}) | {channel_bytes:.0} bytes per elector |",
        std::mem::size_of::<Event>()
    );
    let _ = writeln!(
        w,
        "| renewals in a {:.0} s idle window, ttl {:?} (renew every ttl/3) | {} ({:.2} per leader per second); all still leading: {} |",
        idle.window.as_secs_f64(),
        IDLE_TTL,
        idle.renewals,
        idle.renewals_per_leader_second(),
        if idle.all_leading { "yes" } else { "NO" }
    );
    let _ = writeln!(
        w,
        "| CPU (user + system, whole process) in that window | {:.2} s = {:.1}% of one core; {:.1} µs per renewal |",
        idle.cpu.as_secs_f64(),
        100.0 * idle.cpu.as_secs_f64() / idle.window.as_secs_f64(),
        idle.cpu_per_renewal_us()
    );
    let _ = writeln!(
        w,
        "\nCPU per renewal is everything the process does per renewal: the driver's wake-up, the \
         machine, the `MemoryStore` call (a mutex and a map lookup) and the metrics macros (no \
         recorder installed). Memory per leader is the driver task, its `Elector`, the `Leader` \
         handle and the store's record; nobody subscribes to events here, so no event channel is \
         made (a subscriber adds {channel_bytes:.0} bytes per elector)."
    );
    s
}

/// Replaces the "## Core engine" section of the file at `path` (up to the next `## ` heading), or
/// appends it; creates the file if needed.
fn update_docs(path: &str, section: &str) -> std::io::Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_string(),
        Err(e) => return Err(e),
    };
    let heading = "## Core engine";
    let new = match old.find(heading) {
        Some(start) => {
            let after = start + heading.len();
            let end = old[after..].find("\n## ").map_or(old.len(), |i| after + i + 1);
            let tail = &old[end..];
            let gap = if tail.is_empty() { "" } else { "\n" };
            format!("{}{section}{gap}{tail}", &old[..start])
        }
        None => format!("{}\n\n{section}", old.trim_end()),
    };
    std::fs::write(path, new)
}

/// Today's UTC date as YYYY-MM-DD.
fn today() -> String {
    let days = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
