//! One seed, and many: running, watching for hangs and livelocks, reporting failures.

use super::*;

#[derive(Debug)]
pub(crate) struct SeedReport {
    pub(crate) seed: u64,
    pub(crate) plan: Plan,
    pub(crate) violations: Vec<Violation>,
    pub(crate) stats: Stats,
    pub(crate) trace: Vec<String>,
}

pub(crate) fn mix(seed: u64, mode: Mode) -> u64 {
    let salt = match mode {
        Mode::ServerClock => 0x5eed_0001,
        Mode::ObservedExpiry => 0x5eed_0002,
    };
    Rng::new(seed ^ (salt << 32)).next()
}

/// What the watchdog thread sees of a running seed.
#[derive(Clone)]
pub(crate) struct Running {
    pub(crate) world: Shared,
    /// Moves every time the probe runs (every 5 simulated ms).
    pub(crate) progress: Arc<AtomicU64>,
    pub(crate) nudge: mpsc::UnboundedSender<()>,
}

/// Unsticks a livelocked runtime: a task that is always ready (it spins at one instant) keeps
/// paused time from advancing, so every timer waits forever. The watchdog thread nudges when the
/// probe has not run for a while; if time does not move before [`STUCK_NUDGES`] more nudges (half
/// a second of wall time: a loaded machine only slows a step down), this reports a livelock and moves the clock by hand for up to two TTLs, so the seed (and its other checks)
/// can go on. In real time such a spin burns a core for as long as it lasts.
pub(crate) async fn unstick(mut nudges: mpsc::UnboundedReceiver<()>, world: Shared) {
    'nudged: while nudges.recv().await.is_some() {
        while nudges.try_recv().is_ok() {}
        // A runtime that is only slow (a loaded machine: a step at one instant taking more wall
        // time than the watchdog's patience) moves time again; one that spins never does. Half
        // a second of wall time without a simulated millisecond passing is a spin.
        for _ in 0..STUCK_NUDGES {
            tokio::select! {
                biased;
                () = sleep(Duration::from_millis(1)) => continue 'nudged,
                Some(()) = nudges.recv() => {}
            }
        }
        let now = Instant::now();
        lock(&world).violation(
            Kind::Livelock,
            "simulated time stopped: some task is always ready (it spins at one instant); the \
             clock is moved by hand from here (see the trace just before)"
                .to_string(),
        );
        while Instant::now() < now + 2 * TTL {
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        lock(&world).log("the clock was moved by hand for two TTLs");
    }
}

pub(crate) fn simulate(mode: Mode, seed: u64, shared: Arc<Mutex<Option<Running>>>) -> SeedReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = runtime.block_on(async {
        let start = Instant::now();
        let end = start + sim_length();
        let mut rng = Rng::new(mix(seed, mode));
        let plan = Plan::draw(&mut rng);
        let store = match mode {
            Mode::ServerClock => MemoryStore::new(),
            Mode::ObservedExpiry => MemoryStore::observed_expiry(),
        };
        let world: Shared = Arc::new(Mutex::new(World {
            lock_delay: plan.lock_delay.is_some(),
            lock_delay_length: plan.lock_delay.unwrap_or_default(),
            ..World::new(start, plan.candidates)
        }));
        lock(&world).log(format!("{} seed {seed}: {plan:?}", mode.name()));
        let progress = Arc::new(AtomicU64::new(0));
        let (nudge, nudges) = mpsc::unbounded_channel();
        *shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running {
            world: world.clone(),
            progress: progress.clone(),
            nudge,
        });
        for c in 0..plan.candidates {
            let net_rng = rng.fork();
            let mut window_rng = rng.fork();
            let service_rng = rng.fork();
            let pauses = windows(&mut window_rng, start, 6, 50, 1_500);
            let outage_count = window_rng.below(3);
            let outages = windows(&mut window_rng, start, outage_count, 2_000, 5_000);
            lock(&world).outages.push(outages.clone());
            let net = Net {
                me: c,
                store: store.clone(),
                faults: plan.faults,
                pauses,
                outages,
                calm_from: calm_from(start),
                notifications: plan.notifications,
                rng: Mutex::new((net_rng, 0)),
                world: world.clone(),
            };
            let mut builder = Elector::builder(Arc::new(net), "sim")
                .candidate_id(format!("c{c}"))
                .ttl(TTL)
                .renew_every(RENEW_EVERY)
                .retry_every(RETRY_EVERY)
                .jitter(0.0);
            if let Some(delay) = plan.lock_delay {
                builder = builder.lock_delay(delay);
            }
            if let Some(stall) = plan.stall_timeout {
                builder = builder.stall_timeout(stall);
            }
            let elector = builder.build().expect("a valid configuration");
            tokio::spawn(record_events(c, elector.events(), world.clone()));
            tokio::spawn(service(c, elector, world.clone(), service_rng, plan, end));
        }
        tokio::spawn(probe(world.clone(), end, progress));
        tokio::spawn(unstick(nudges, world.clone()));
        sleep_until(end).await;
        // Let the event subscribers catch up with what happened at the last instant.
        tokio::task::yield_now().await;
        let mut w = lock(&world);
        w.finished = true;
        w.check(end);
        SeedReport {
            seed,
            plan,
            violations: std::mem::take(&mut w.violations),
            stats: w.stats,
            trace: std::mem::take(&mut w.trace),
        }
    });
    drop(runtime);
    report
}

// ------------------------------------------------------------------------------------------------
// Many seeds

/// Panics on simulation threads, by thread name, for the report.
pub(crate) static PANICS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

pub(crate) fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            if thread.starts_with("sim-") {
                PANICS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((thread, info.to_string()));
            }
            default(info);
        }));
    });
}

/// When the seed's fault-free tail begins.
pub(crate) fn calm_from(start: Instant) -> Instant {
    start + sim_length().saturating_sub(CALM)
}

pub(crate) fn sim_length() -> Duration {
    env_u64("LEASEHOLD_SIM_SECONDS").map_or(SIM_LENGTH, Duration::from_secs)
}

pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
    })
}

/// FNV-1a of the trace, to compare two runs of one seed.
pub(crate) fn trace_hash(trace: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in trace {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

pub(crate) fn hung_trace(shared: &Mutex<Option<Running>>) -> Vec<String> {
    let Some(Running { world, .. }) = shared.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
        return Vec::new();
    };
    for _ in 0..100 {
        if let Ok(w) = world.try_lock() {
            let mut trace = w.trace.clone();
            trace.push("VIOLATION hang: the seed stopped here (its thread still runs)".into());
            return trace;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Vec::new()
}

pub(crate) fn run_seed(mode: Mode, seed: u64) -> SeedReport {
    let thread = format!("sim-{}-{seed}", mode.name());
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Mutex::new(None));
    let world = shared.clone();
    std::thread::Builder::new()
        .name(thread.clone())
        .spawn(move || {
            let _ = tx.send(simulate(mode, seed, world));
        })
        .expect("a simulation thread");
    let started = std::time::Instant::now();
    let mut last_progress = (u64::MAX, started);
    let outcome = loop {
        match rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if started.elapsed() < WALL_LIMIT => {
                let running = shared.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(running) = running {
                    let progress = running.progress.load(Ordering::Relaxed);
                    if progress != last_progress.0 {
                        last_progress = (progress, std::time::Instant::now());
                    } else if last_progress.1.elapsed() >= STUCK_AFTER {
                        let _ = running.nudge.send(());
                        last_progress.1 = std::time::Instant::now();
                    }
                }
            }
            other => break other,
        }
    };
    let mut report = match outcome {
        Ok(report) => report,
        Err(e) => SeedReport {
            seed,
            plan: Plan::draw(&mut Rng::new(mix(seed, mode))),
            violations: vec![Violation {
                kind: if matches!(e, std::sync::mpsc::RecvTimeoutError::Timeout) {
                    Kind::Hang
                } else {
                    Kind::Panic
                },
                at: Duration::ZERO,
                detail: format!("the seed did not finish ({e:?})"),
            }],
            stats: Stats::default(),
            // What happened before it hung, if the world can be had (it is not locked for long).
            trace: hung_trace(&shared),
        },
    };
    let panics: Vec<_> = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|p| p.into_inner()))
        .into_iter()
        .filter(|(t, _)| *t == thread)
        .collect();
    for (_, message) in panics {
        report.violations.push(Violation {
            kind: Kind::Panic,
            at: Duration::ZERO,
            detail: message,
        });
    }
    report
}

pub(crate) fn print_failure(mode: Mode, report: &SeedReport, full_trace: bool) {
    println!("\n=== {} seed {} FAILED ({:?})", mode.name(), report.seed, report.plan);
    let mut shown: HashMap<Kind, usize> = HashMap::new();
    for v in &report.violations {
        let n = shown.entry(v.kind).or_default();
        *n += 1;
        if *n <= 3 || full_trace {
            println!("  {} at {:.3}s: {}", v.kind.name(), v.at.as_secs_f64(), v.detail);
        }
    }
    for (kind, n) in shown.into_iter().filter(|(_, n)| *n > 3) {
        println!("  ... {} {} violations in all", n, kind.name());
    }
    println!(
        "  replay: LEASEHOLD_SIM_SEED={} cargo test -p leasehold-core --test simulation {} -- --nocapture",
        report.seed,
        mode.name()
    );
    if report.trace.is_empty() {
        return;
    }
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "simulation-{}-{}.log",
        mode.name(),
        report.seed
    ));
    if std::fs::write(&path, report.trace.join("\n")).is_ok() {
        println!("  full trace: {}", path.display());
    }
    if !full_trace {
        // The trace up to the first violation found while running, or the last lines.
        let first = report
            .trace
            .iter()
            .position(|l| l.contains("VIOLATION"))
            .unwrap_or(report.trace.len() - 1);
        let from = first.saturating_sub(60);
        println!("  trace, lines {from}..={first}:");
        for line in &report.trace[from..=first] {
            println!("    {line}");
        }
    }
}

pub(crate) fn run_many(mode: Mode) {
    install_panic_hook();
    let single = env_u64("LEASEHOLD_SIM_SEED");
    // A replay may resolve a tie differently (see the module docs): try it up to this many times.
    let repeat = env_u64("LEASEHOLD_SIM_REPEAT").unwrap_or(1).max(1);
    let seeds: Vec<u64> = match single {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("LEASEHOLD_SIM_FIRST").unwrap_or(0);
            let count = env_u64("LEASEHOLD_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
            (first..first + count).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    let mut failed: Vec<(u64, Vec<Kind>)> = Vec::new();
    let (mut printed, mut printed_safety) = (0, 0);
    for &seed in &seeds {
        let mut report = run_seed(mode, seed);
        for _ in 1..repeat {
            if !report.violations.is_empty() {
                break;
            }
            report = run_seed(mode, seed);
        }
        total.add(&report.stats);
        if single.is_some() {
            for line in &report.trace {
                println!("{line}");
            }
            println!("trace hash {:016x}", trace_hash(&report.trace));
        }
        if !report.violations.is_empty() {
            let mut kinds: Vec<_> = report.violations.iter().map(|v| v.kind).collect();
            kinds.sort();
            kinds.dedup();
            // The first few failures, and the first few that broke safety itself.
            let safety = kinds.iter().any(|k| k.is_safety());
            if printed < 3 || (safety && printed_safety < 5) || single.is_some() {
                print_failure(mode, &report, single.is_some());
                printed += 1;
                printed_safety += usize::from(safety);
            } else if safety {
                println!("\n=== {} seed {} FAILED (safety; details only)", mode.name(), seed);
                for v in report.violations.iter().filter(|v| v.kind.is_safety()) {
                    println!("  {} at {:.3}s: {}", v.kind.name(), v.at.as_secs_f64(), v.detail);
                }
            }
            failed.push((seed, kinds));
        }
    }
    let wall = started.elapsed();
    println!(
        "\n{}: {} seeds x {:?} simulated in {:.1?} wall ({:.0?} per seed); {total:?}",
        mode.name(),
        seeds.len(),
        sim_length(),
        wall,
        wall / seeds.len().max(1) as u32
    );
    let mut by_kind: HashMap<Kind, Vec<u64>> = HashMap::new();
    for (seed, kinds) in &failed {
        for kind in kinds {
            by_kind.entry(*kind).or_default().push(*seed);
        }
    }
    let mut kinds: Vec<_> = by_kind.into_iter().collect();
    kinds.sort();
    for (kind, seeds) in &kinds {
        println!("  {} failed {} seeds: {:?}", kind.name(), seeds.len(), seeds);
    }
    // The simulation must have exercised something: elections and work under faults.
    assert!(
        single.is_some() || (total.elections >= seeds.len() as u64 * 10 && total.work > 0 && total.late > 0),
        "the simulation hardly elected anyone: {total:?}"
    );
    assert!(
        failed.is_empty(),
        "{}: {} of {} seeds failed: {}",
        mode.name(),
        failed.len(),
        seeds.len(),
        kinds
            .iter()
            .map(|(k, s)| format!("{} {:?}", k.name(), s))
            .collect::<Vec<_>>()
            .join("; ")
    );
}
