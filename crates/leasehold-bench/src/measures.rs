//! The measures, one function each, run against one backend.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold::{AcquireRequest, Acquired, CandidateId, Elector, Event, Leader, LeaseName, LeaseStore, Renewed};
use leasehold_conformance::{Direction, Fault, Faults, FaultyStore, RequestCounts};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use crate::Stats;
use crate::backends::{Available, Backend};

pub(crate) type Outcome<T> = Result<T, String>;

/// How much of everything to do.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) smoke: bool,
    /// Run crash-failover leaders and the scale measures in child processes of this executable.
    pub(crate) child_processes: bool,
    latency_reps: usize,
    handover_reps: usize,
    failover_reps: usize,
    pub(crate) transition_candidates: Vec<usize>,
    transition_reps: usize,
    idle_followers: usize,
    pub(crate) scale_sizes: Vec<usize>,
    /// Shards of the 3-member group.
    pub(crate) group_shards: u32,
    /// Measures to run (`--only`); empty: all.
    pub(crate) only: Vec<String>,
}

impl Plan {
    pub(crate) fn new(smoke: bool, child_processes: bool) -> Plan {
        if smoke {
            Plan {
                smoke,
                child_processes,
                latency_reps: 5,
                handover_reps: 2,
                failover_reps: 1,
                transition_candidates: vec![1, 2],
                transition_reps: 2,
                idle_followers: 2,
                scale_sizes: vec![10],
                group_shards: 16,
                only: Vec::new(),
            }
        } else {
            Plan {
                smoke,
                child_processes,
                latency_reps: 200,
                handover_reps: 20,
                failover_reps: 5,
                transition_candidates: vec![1, 10, 100],
                transition_reps: 5,
                idle_followers: 3,
                scale_sizes: vec![1_000, 10_000],
                group_shards: 64,
                only: Vec::new(),
            }
        }
    }

    /// Whether `measure` is to run (`--only`).
    pub(crate) fn wants(&self, measure: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|m| m == measure)
    }

    /// Repetitions of the graceful handover (also those of the etcd references).
    pub(crate) fn handover_reps(&self) -> usize {
        self.handover_reps
    }

    /// Long TTLs (Azure: 15 s) get fewer repetitions so that the full run stays under 15 minutes.
    fn reps(&self, n: usize, ttl: Duration) -> usize {
        if ttl >= Duration::from_secs(10) {
            n.div_ceil(4).max(2).min(n)
        } else {
            n
        }
    }
}

/// Everything measured on one backend.
#[derive(Debug)]
pub(crate) struct BackendReport {
    pub(crate) name: &'static str,
    /// `Some(why)` when the backend could not be measured at all.
    pub(crate) unavailable: Option<String>,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) retry_every: Duration,
    pub(crate) notifies: bool,
    /// Whether the store itself expires a silent holder (its clock or its session).
    pub(crate) server_expiry: bool,
    /// What the store notifies waiting candidates of.
    pub(crate) notifications: &'static str,
    pub(crate) acquire: Outcome<Stats>,
    pub(crate) renew: Outcome<Stats>,
    /// From `resign()` returning to the successor's Elected event.
    pub(crate) handover: Outcome<Stats>,
    /// From `resign()` being called to the successor's Elected event.
    pub(crate) handover_from_call: Outcome<Stats>,
    /// From `hand_over(C)` being called to C's election, with B queued before C.
    pub(crate) planned: Outcome<Planned>,
    /// From the leader's last renew to the successor's Elected event.
    pub(crate) failover: Outcome<Stats>,
    pub(crate) failover_method: &'static str,
    /// Stores with server-side expiry but no notification (followers poll): crash failover and
    /// idle follower requests again with followers polling every [`FAST_POLL`] x TTL.
    pub(crate) fast_poll: Option<FastPoll>,
    /// Crash of the leader L with candidates N (next) and T (third): from N's Elected event to
    /// T's `observe()` showing N.
    pub(crate) observe: Outcome<Stats>,
    /// The store's own expiry of a session or key, timed from its last keepalive.
    pub(crate) expiry_floor: Outcome<crate::floor::Floor>,
    pub(crate) transitions: Vec<(usize, Outcome<Transitions>)>,
    pub(crate) idle: Outcome<Idle>,
    pub(crate) scale_ttl: Duration,
    pub(crate) scale: Vec<(usize, Outcome<Scale>)>,
    pub(crate) group: Outcome<crate::groups::GroupReport>,
    pub(crate) group_cost: Outcome<crate::groups::Cost>,
}

/// On a store that does not notify, what a shorter `retry_every` buys and costs.
#[derive(Clone, Debug)]
pub(crate) struct FastPoll {
    pub(crate) retry_every: Duration,
    pub(crate) failover: Outcome<Stats>,
    pub(crate) idle: Outcome<Idle>,
}

/// The poll interval, as a fraction of the TTL, of [`FastPoll`]: 1.05 x TTL is then within reach
/// of every sample (expiry, then at most one poll with its jitter).
pub(crate) const FAST_POLL: f64 = 1.0 / 30.0;

/// A planned handover to a named successor.
#[derive(Clone, Debug)]
pub(crate) enum Planned {
    /// The store's `hand_over` answered `Unsupported`: the engine releases to everyone instead,
    /// so there is no handover to a named successor to time.
    Unsupported,
    /// From `leader.hand_over(C)` being called to C's `elected_at`; every sample had C (not B,
    /// queued before it) win.
    Measured(Stats),
}

/// Store requests per leadership transition.
#[derive(Clone, Debug)]
pub(crate) struct Transitions {
    pub(crate) counts: Vec<u64>,
}

impl Transitions {
    pub(crate) fn mean(&self) -> f64 {
        self.counts.iter().sum::<u64>() as f64 / self.counts.len().max(1) as f64
    }
    pub(crate) fn max(&self) -> u64 {
        self.counts.iter().copied().max().unwrap_or(0)
    }
}

/// Store requests while nothing changes.
#[derive(Clone, Debug)]
pub(crate) struct Idle {
    pub(crate) window: Duration,
    pub(crate) followers: usize,
    pub(crate) follower_requests: u64,
    pub(crate) leader_requests: u64,
}

impl Idle {
    /// Requests per second of one follower.
    pub(crate) fn per_follower(&self) -> f64 {
        self.follower_requests as f64 / self.followers.max(1) as f64 / self.window.as_secs_f64()
    }
}

/// Many leases held by one process.
#[derive(Clone, Debug)]
pub(crate) struct Scale {
    pub(crate) campaign_time: Duration,
    pub(crate) window: Duration,
    pub(crate) on_time: usize,
    pub(crate) n: usize,
    pub(crate) cores: f64,
    pub(crate) rss_delta_mib: f64,
    pub(crate) rss_mib: f64,
}

pub(crate) async fn measure_backend(backend: &Backend, plan: &Plan) -> BackendReport {
    let na = || Err::<Stats, String>("n/a".into());
    let mut report = BackendReport {
        name: backend.name,
        unavailable: None,
        ttl: Duration::ZERO,
        renew_every: Duration::ZERO,
        retry_every: Duration::ZERO,
        notifies: false,
        server_expiry: false,
        notifications: "",
        acquire: na(),
        renew: na(),
        handover: na(),
        handover_from_call: na(),
        planned: Err("n/a".into()),
        failover: na(),
        failover_method: "",
        fast_poll: None,
        observe: na(),
        expiry_floor: Err("n/a".into()),
        transitions: Vec::new(),
        idle: Err("n/a".into()),
        scale_ttl: Duration::ZERO,
        scale: Vec::new(),
        group: Err("n/a".into()),
        group_cost: Err("n/a".into()),
    };
    let av = match &backend.available {
        Ok(av) => av,
        Err(why) => {
            report.unavailable = Some(why.clone());
            return report;
        }
    };
    let run = leasehold::random_u64() % 1_000_000;
    let ttl = av.ttl;
    let timing = Elector::builder(Arc::new(leasehold::MemoryStore::new()), "x")
        .ttl(ttl)
        .timing();
    report.ttl = ttl;
    report.renew_every = timing.renew_every;
    report.retry_every = timing.retry_every;
    report.notifies = av.notifies();
    report.server_expiry = matches!(
        av.caps.expiry,
        leasehold::Expiry::ServerClock | leasehold::Expiry::ServerSession
    );
    report.notifications = match (av.caps.notifications, av.caps.announces) {
        (leasehold::Notifications::None, _) => "none (polling)",
        (leasehold::Notifications::ReleaseAndExpiry, _) => "releases and expiry",
        (leasehold::Notifications::Release, leasehold::Announces::GrantsAndRenewals) => {
            "releases; renewals announced (expiry timed without polls)"
        }
        (leasehold::Notifications::Release, _) => "releases (polls for expiry)",
        _ => "other",
    };
    report.scale_ttl = av.scale_ttl;

    if plan.wants("latency") {
        eprintln!("   acquire/renew latency");
        match latency(av, run, plan.latency_reps).await {
            Ok((a, r)) => {
                report.acquire = Ok(a);
                report.renew = Ok(r);
            }
            Err(e) => {
                report.acquire = Err(e.clone());
                report.renew = Err(e);
            }
        }
    }
    if plan.wants("handover") {
        eprintln!("   graceful handover");
        match handover(av, run, plan.reps(plan.handover_reps, ttl)).await {
            Ok((h, c)) => {
                report.handover = Ok(h);
                report.handover_from_call = Ok(c);
            }
            Err(e) => {
                report.handover = Err(e.clone());
                report.handover_from_call = Err(e);
            }
        }
    }
    if plan.wants("planned") {
        eprintln!("   planned handover");
        let t = Instant::now();
        report.planned = planned_handover(av, run, plan.reps(plan.handover_reps, ttl)).await;
        if let Err(e) = &report.planned {
            eprintln!("      {e}");
        }
        eprintln!("      {:.1} s", t.elapsed().as_secs_f64());
    }
    report.failover_method = if av.url().is_some() && plan.child_processes {
        "kill -9 of a leader process"
    } else {
        "leader's store blackholed"
    };
    if plan.wants("failover") {
        eprintln!("   crash failover");
        report.failover = failover(av, run, plan.reps(plan.failover_reps, ttl), plan.child_processes, None).await;
        if report.server_expiry && !report.notifies {
            let retry_every = ttl.mul_f64(FAST_POLL);
            eprintln!(
                "   crash failover and idle requests, followers polling every {}",
                crate::ms(retry_every)
            );
            let reps = plan.reps(plan.failover_reps, ttl);
            report.fast_poll = Some(FastPoll {
                retry_every,
                failover: failover(av, run + 1, reps, plan.child_processes, Some(retry_every)).await,
                idle: idle(av, run + 1, plan, Some(retry_every)).await,
            });
        }
    }
    if plan.wants("observe") {
        eprintln!("   observe() after a crash");
        report.observe = observe_after_crash(av, run, plan.reps(plan.failover_reps, ttl), plan.child_processes).await;
        match &report.observe {
            Ok(s) => eprintln!("      p50 {}, max {} (n = {})", crate::ms(s.p50), crate::ms(s.max), s.n),
            Err(e) => eprintln!("      {e}"),
        }
    }
    if plan.wants("expiry-floor") {
        eprintln!("   store expiry floor");
        report.expiry_floor = crate::floor::measure(backend.name, av, plan.smoke).await;
        match &report.expiry_floor {
            Ok(f) => eprintln!(
                "      {}: p50 {}, max {} (n = {}, TTL {})",
                f.what,
                crate::ms(f.stats.p50),
                crate::ms(f.stats.max),
                f.stats.n,
                crate::ms(f.ttl)
            ),
            Err(e) => eprintln!("      {e}"),
        }
    }
    if plan.wants("transitions") {
        for &n in &plan.transition_candidates {
            eprintln!("   requests per transition, {n} candidate(s)");
            let t = transitions(av, run, n, plan.reps(plan.transition_reps, ttl)).await;
            report.transitions.push((n, t));
        }
    }
    if plan.wants("idle") {
        eprintln!("   idle requests");
        report.idle = idle(av, run, plan, None).await;
    }
    for &n in plan.scale_sizes.iter().filter(|_| plan.wants("scale")) {
        if n > 1_000 && matches!(backend.name, "dynamodb" | "azure" | "s3") {
            report
                .scale
                .push((n, Err("not attempted on an emulator (1,000 only)".into())));
            continue;
        }
        eprintln!("   {n} leases in one process");
        let s = if plan.child_processes {
            scale_in_child(av, run, n, plan.smoke).await
        } else {
            match connect(av).await {
                Ok(store) => scale(store, run, n, av.scale_ttl, plan.smoke).await,
                Err(e) => Err(e),
            }
        };
        if let Err(e) = &s {
            eprintln!("      {e}");
        }
        report.scale.push((n, s));
    }
    if plan.wants("groups") {
        let (group, cost) = crate::groups::measure(backend.name, av, run, plan).await;
        report.group = group;
        report.group_cost = cost;
    }
    report
}

pub(crate) fn lease(run: u64, what: &str, i: usize) -> Outcome<LeaseName> {
    LeaseName::new(format!("bench-{run}-{what}-{i}")).map_err(|e| e.to_string())
}

pub(crate) fn elector(store: Arc<dyn LeaseStore>, lease: &LeaseName, id: &str, ttl: Duration) -> Outcome<Elector> {
    elector_polling(store, lease, id, ttl, None)
}

/// [`elector`], polling every `retry_every` where given.
fn elector_polling(
    store: Arc<dyn LeaseStore>,
    lease: &LeaseName,
    id: &str,
    ttl: Duration,
    retry_every: Option<Duration>,
) -> Outcome<Elector> {
    let mut builder = Elector::builder(store, lease.as_str()).ttl(ttl).candidate_id(id);
    if let Some(every) = retry_every {
        builder = builder.retry_every(every);
    }
    builder.build().map_err(|e| e.to_string())
}

pub(crate) async fn connect(av: &Available) -> Outcome<Arc<dyn LeaseStore>> {
    match tokio::time::timeout(Duration::from_secs(20), av.connect()).await {
        Ok(r) => r.map_err(|e| format!("connect: {e}")),
        Err(_) => Err("connect: no answer in 20 s".into()),
    }
}

pub(crate) async fn connect_many(av: &Available, n: usize) -> Outcome<Vec<Arc<dyn LeaseStore>>> {
    let clients: Vec<Outcome<Arc<dyn LeaseStore>>> = futures::stream::iter(0..n)
        .map(|_| connect(av))
        .buffer_unordered(16)
        .collect()
        .await;
    clients.into_iter().collect()
}

pub(crate) async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> Outcome<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what}: nothing within {limit:?}"))
}

pub(crate) async fn campaign(e: &Elector, limit: Duration) -> Outcome<Leader> {
    within(limit, "campaign", e.campaign())
        .await?
        .map_err(|e| e.to_string())
}

/// The next Elected event's instant.
async fn elected(rx: &mut broadcast::Receiver<Event>) -> Option<Instant> {
    loop {
        match rx.recv().await {
            Ok(Event::Elected { at, .. }) => return Some(at),
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// Until the candidate has seen someone lead (its first acquire answered Held).
pub(crate) async fn sees_holder(rx: &mut broadcast::Receiver<Event>) {
    loop {
        match rx.recv().await {
            Ok(Event::LeaderChanged(Some(_))) | Err(broadcast::error::RecvError::Closed) => return,
            _ => {}
        }
    }
}

/// Raw store latency: `acquire` of a free lease, then `renew` of the grant.
async fn latency(av: &Available, run: u64, reps: usize) -> Outcome<(Stats, Stats)> {
    let store = connect(av).await?;
    let candidate = CandidateId::new("bench-latency").map_err(|e| e.to_string())?;
    let (mut acquires, mut renews) = (Vec::new(), Vec::new());
    let limit = Duration::from_secs(10);
    for i in 0..reps {
        let request = AcquireRequest {
            lease: lease(run, "lat", i)?,
            candidate: candidate.clone(),
            ttl: av.ttl,
            takeover: None,
        };
        let t = Instant::now();
        let grant = match within(limit, "acquire", store.acquire(&request)).await? {
            Ok(Acquired::Granted(g)) => g,
            Ok(Acquired::Held(o)) => return Err(format!("acquire of a fresh lease answered Held: {o:?}")),
            Err(e) => return Err(format!("acquire: {e}")),
        };
        acquires.push(t.elapsed());
        let t = Instant::now();
        let grant = match within(limit, "renew", store.renew(&grant)).await? {
            Ok(Renewed::Renewed(g)) => g,
            Ok(Renewed::Lost(o)) => return Err(format!("renew right after acquire answered Lost: {o:?}")),
            Err(e) => return Err(format!("renew: {e}")),
        };
        renews.push(t.elapsed());
        within(limit, "release", store.release(&grant))
            .await?
            .map_err(|e| format!("release: {e}"))?;
    }
    Ok((
        Stats::of(&acquires).expect("reps > 0"),
        Stats::of(&renews).expect("reps > 0"),
    ))
}

/// Graceful handover: a leader resigns, a waiting candidate (on its own client) takes over.
async fn handover(av: &Available, run: u64, reps: usize) -> Outcome<(Stats, Stats)> {
    let clients = connect_many(av, 2).await?;
    let (mut from_return, mut from_call) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let lease = lease(run, "handover", i)?;
        let (ret, call) = handover_once(&clients, &lease, av.ttl, Duration::from_millis(20)).await?;
        from_return.push(ret);
        from_call.push(call);
    }
    Ok((
        Stats::of(&from_return).expect("reps > 0"),
        Stats::of(&from_call).expect("reps > 0"),
    ))
}

/// One graceful handover on `lease`: A (on `clients[0]`) leads, B (on `clients[1]`) campaigns
/// and, once it has seen A lead, waits `settle` more; A resigns. From `resign()` returning and
/// from it being called to B's Elected event.
pub(crate) async fn handover_once(
    clients: &[Arc<dyn LeaseStore>],
    lease: &LeaseName,
    ttl: Duration,
    settle: Duration,
) -> Outcome<(Duration, Duration)> {
    let a = elector(clients[0].clone(), lease, "a", ttl)?;
    let b = elector(clients[1].clone(), lease, "b", ttl)?;
    let la = campaign(&a, ttl * 5).await?;
    let mut events = b.events();
    let waiting = tokio::spawn(async move { b.campaign().await });
    let _ = tokio::time::timeout(ttl, sees_holder(&mut events)).await;
    tokio::time::sleep(settle).await;
    let called = Instant::now();
    la.resign().await;
    let returned = Instant::now();
    let at = within(ttl * 3, "successor elected", elected(&mut events))
        .await?
        .ok_or("the successor's events closed")?;
    let lb = within(ttl, "successor handle", waiting)
        .await?
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    lb.resign().await;
    Ok((
        at.saturating_duration_since(returned),
        at.saturating_duration_since(called),
    ))
}

/// Planned handover: A leads, B then C campaign (B queued first, each on its own client), and
/// A calls `hand_over(C)`; the sample is from that call to C's `elected_at`. B winning instead
/// of C is an error. A raw `hand_over` on a lease of our own first tells whether the store can
/// reserve at all (`Unsupported`: the engine would release to everyone, nothing to time).
async fn planned_handover(av: &Available, run: u64, reps: usize) -> Outcome<Planned> {
    let clients = connect_many(av, 3).await?;
    let ttl = av.ttl;
    let c_id = CandidateId::new("c").map_err(|e| e.to_string())?;
    let limit = Duration::from_secs(10);
    let probe = AcquireRequest {
        lease: lease(run, "planned-probe", 0)?,
        candidate: CandidateId::new("a").map_err(|e| e.to_string())?,
        ttl,
        takeover: None,
    };
    let grant = match within(limit, "probe acquire", clients[0].acquire(&probe)).await? {
        Ok(Acquired::Granted(g)) => g,
        Ok(Acquired::Held(o)) => return Err(format!("probe acquire of a fresh lease answered Held: {o:?}")),
        Err(e) => return Err(format!("probe acquire: {e}")),
    };
    match within(limit, "probe hand_over", clients[0].hand_over(&grant, &c_id)).await? {
        Ok(()) => {}
        Err(leasehold::Error::Unsupported { .. }) => {
            let _ = within(limit, "probe release", clients[0].release(&grant)).await;
            return Ok(Planned::Unsupported);
        }
        Err(e) => return Err(format!("probe hand_over: {e}")),
    }
    let mut samples = Vec::new();
    for i in 0..reps {
        let lease = lease(run, "planned", i)?;
        let a = elector(clients[0].clone(), &lease, "a", ttl)?;
        let b = elector(clients[1].clone(), &lease, "b", ttl)?;
        let c = elector(clients[2].clone(), &lease, "c", ttl)?;
        let la = campaign(&a, ttl * 5).await?;
        let handed_over = la.term();
        let (mut b_events, mut c_events) = (b.events(), c.events());
        let mut b_wait = tokio::spawn(async move { b.campaign().await });
        let _ = tokio::time::timeout(ttl, sees_holder(&mut b_events)).await;
        let mut c_wait = tokio::spawn(async move { c.campaign().await });
        let _ = tokio::time::timeout(ttl, sees_holder(&mut c_events)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let called = Instant::now();
        la.hand_over(&c_id).await;
        let first = within(ttl * 3, "a successor elected", async {
            tokio::select! {
                r = &mut c_wait => ("c", r),
                r = &mut b_wait => ("b", r),
            }
        })
        .await;
        let (who, joined) = match first {
            Ok(first) => first,
            Err(e) => {
                b_wait.abort();
                c_wait.abort();
                return Err(format!("rep {i}: {e}"));
            }
        };
        let leader = joined.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        if who != "c" {
            leader.resign().await;
            c_wait.abort();
            return Err(format!(
                "rep {i}: b (queued first) was elected instead of c, the named successor"
            ));
        }
        if leader.term() <= handed_over {
            return Err(format!(
                "rep {i}: c's term {} is not above the handed-over {handed_over}",
                leader.term()
            ));
        }
        samples.push(leader.elected_at().saturating_duration_since(called));
        leader.resign().await;
        // B takes over from C's release; then it leaves too.
        match within(ttl * 3, "b after c", b_wait).await {
            Ok(Ok(Ok(lb))) => lb.resign().await,
            Ok(Ok(Err(e))) => return Err(format!("rep {i}: b: {e}")),
            Ok(Err(e)) => return Err(format!("rep {i}: b: {e}")),
            Err(e) => return Err(format!("rep {i}: {e}")),
        }
    }
    Ok(Planned::Measured(Stats::of(&samples).expect("reps > 0")))
}

/// Crash failover, from the leader's last confirmed renew (the instant its request was sent) to
/// the successor's Elected event; followers poll every `retry_every` where given.
async fn failover(
    av: &Available,
    run: u64,
    reps: usize,
    child_processes: bool,
    retry_every: Option<Duration>,
) -> Outcome<Stats> {
    let mut samples = Vec::new();
    for i in 0..reps {
        let lease = lease(run, "failover", i)?;
        let sample = match av.url().filter(|_| child_processes) {
            Some(url) => failover_process(av, url, &lease, retry_every).await?,
            None => failover_blackhole(av, &lease, retry_every).await?,
        };
        samples.push(sample);
    }
    Ok(Stats::of(&samples).expect("reps > 0"))
}

async fn follower(
    av: &Available,
    lease: &LeaseName,
    retry_every: Option<Duration>,
) -> Outcome<(broadcast::Receiver<Event>, tokio::task::JoinHandle<()>)> {
    let b = elector_polling(connect(av).await?, lease, "successor", av.ttl, retry_every)?;
    let mut events = b.events();
    let task = tokio::spawn(async move {
        if let Ok(leader) = b.campaign().await {
            leader.resign().await;
        }
    });
    let _ = tokio::time::timeout(av.ttl, sees_holder(&mut events)).await;
    Ok((events, task))
}

async fn failover_blackhole(av: &Available, lease: &LeaseName, retry_every: Option<Duration>) -> Outcome<Duration> {
    let ttl = av.ttl;
    let faults = Faults::new();
    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(connect(av).await?, faults.clone()));
    let a = elector(store, lease, "crashing", ttl)?;
    let believed = a.timing().believed_ttl();
    let la = campaign(&a, ttl * 5).await?;
    let (mut events, task) = follower(av, lease, retry_every).await?;
    // Crash right after a renewal, so no renewal is in flight.
    let before = la.valid_until();
    within(ttl, "a renewal", async {
        while la.valid_until() == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let last_renew = la.valid_until() - believed;
    faults.set(Direction::Both, Fault::Blackhole);
    let at = within(ttl * 3, "successor elected", elected(&mut events)).await?;
    faults.heal();
    drop(la);
    let _ = tokio::time::timeout(ttl, task).await;
    Ok(at
        .ok_or("the successor's events closed")?
        .saturating_duration_since(last_renew))
}

/// The leader process (`--child-leader`), once it printed `ELECTED`, and its stdout lines.
async fn leader_process(
    url: &str,
    lease: &LeaseName,
    ttl: Duration,
) -> Outcome<(tokio::process::Child, mpsc::UnboundedReceiver<(Instant, String)>)> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(exe)
        .args(["--child-leader", url, "--lease", lease.as_str(), "--ttl-ms"])
        .arg(ttl.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawning the leader process: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, mut lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    within(
        Duration::from_secs(30) + ttl * 5,
        "leader process elected",
        next_line(&mut lines, "ELECTED"),
    )
    .await?
    .ok_or("the leader process exited before being elected")?;
    Ok((child, lines))
}

async fn failover_process(
    av: &Available,
    url: &str,
    lease: &LeaseName,
    retry_every: Option<Duration>,
) -> Outcome<Duration> {
    let ttl = av.ttl;
    // A random pause first, so that samples do not keep one phase against the store's expiry
    // timers (each sample would otherwise start right after the last one's expiry, on a tick).
    tokio::time::sleep(Duration::from_millis(leasehold::random_u64() % 500)).await;
    let (mut child, mut lines) = leader_process(url, lease, ttl).await?;
    let (mut events, task) = follower(av, lease, retry_every).await?;
    let (seen, age) = within(ttl * 2, "leader process renewed", next_line(&mut lines, "RENEWED "))
        .await?
        .ok_or("the leader process exited")?;
    let age = Duration::from_micros(age.parse().map_err(|_| format!("bad RENEWED line: {age}"))?);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let last_renew = seen - age;
    child.start_kill().map_err(|e| format!("kill -9: {e}"))?;
    let _ = child.wait().await;
    let at = within(
        ttl * 3 + Duration::from_secs(5),
        "successor elected",
        elected(&mut events),
    )
    .await?;
    let _ = tokio::time::timeout(ttl, task).await;
    Ok(at
        .ok_or("the successor's events closed")?
        .saturating_duration_since(last_renew))
}

/// How long the third candidate may take to observe the new leader before the sample fails
/// (the issue measured 13.6 s on etcd and 18.1 s on ZooKeeper before).
const OBSERVE_LIMIT: Duration = Duration::from_secs(40);

/// `observe()` after a crash: leader L (a child process killed with SIGKILL, or a blackholed
/// store in process), N queued next and T third, each on its own client. From the Elected event
/// of whichever of them takes over (N on FIFO stores; either where an expiry wakes everyone) to
/// the `since` of the other's `observe()` value that shows it (when it first saw the new leader).
async fn observe_after_crash(av: &Available, run: u64, reps: usize, child_processes: bool) -> Outcome<Stats> {
    let ttl = av.ttl;
    let mut samples = Vec::new();
    for i in 0..reps {
        let lease = lease(run, "observe", i)?;
        let faults = Faults::new();
        let mut process = None;
        let mut in_process = None;
        match av.url().filter(|_| child_processes) {
            Some(url) => process = Some(leader_process(url, &lease, ttl).await?.0),
            None => {
                let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(connect(av).await?, faults.clone()));
                in_process = Some(campaign(&elector(store, &lease, "crashing", ttl)?, ttl * 5).await?);
            }
        }
        // Whoever takes over holds on (until the sample is taken), so that the other can see it
        // lead.
        let holding = |e: Elector| async move {
            if let Ok(leader) = e.campaign().await {
                std::future::pending::<()>().await;
                leader.resign().await;
            }
        };
        let n = elector(connect(av).await?, &lease, "next", ttl)?;
        let mut n_events = n.events();
        let n_task = tokio::spawn(holding(n.clone()));
        let _ = tokio::time::timeout(ttl, sees_holder(&mut n_events)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = elector(connect(av).await?, &lease, "third", ttl)?;
        let mut t_events = t.events();
        let t_task = tokio::spawn(holding(t.clone()));
        let _ = tokio::time::timeout(ttl, sees_holder(&mut t_events)).await;
        // Let N and T settle into waiting.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(mut child) = process.take() {
            child.start_kill().map_err(|e| format!("kill -9: {e}"))?;
            let _ = child.wait().await;
        } else {
            faults.set(Direction::Both, Fault::Blackhole);
        }
        let (winner, at, observer) = within(ttl * 3 + Duration::from_secs(5), "N or T elected", async {
            tokio::select! {
                Some(at) = elected(&mut n_events) => Ok((n.id().clone(), at, &t)),
                Some(at) = elected(&mut t_events) => Ok((t.id().clone(), at, &n)),
                else => Err("N's and T's events closed".to_string()),
            }
        })
        .await??;
        let mut seen = observer.observe();
        let what = format!("{} observing {winner}", observer.id());
        let seen = within(
            OBSERVE_LIMIT,
            &what,
            seen.wait_for(|v| v.as_ref().is_some_and(|info| info.holder == winner)),
        )
        .await?
        .map_err(|_| format!("{}'s observe() closed", observer.id()))?
        .as_ref()
        .map(|info| info.since)
        .ok_or("observe() shows nobody")?;
        samples.push(seen.saturating_duration_since(at));
        // Dropping a campaign's future (the task's) releases what it holds.
        n_task.abort();
        t_task.abort();
        faults.heal();
        drop(in_process);
    }
    Stats::of(&samples).ok_or_else(|| "no samples".into())
}

/// The next line of the leader process that starts with `prefix`: when it arrived, and the rest.
async fn next_line(lines: &mut mpsc::UnboundedReceiver<(Instant, String)>, prefix: &str) -> Option<(Instant, String)> {
    while let Some((at, line)) = lines.recv().await {
        if let Some(rest) = line.strip_prefix(prefix) {
            return Some((at, rest.trim().to_string()));
        }
    }
    None
}

/// The hidden `--child-leader` mode: campaign, print `ELECTED`, then `RENEWED <µs since the
/// renew request was sent>` after every renewal, until killed.
///
/// # Errors
///
/// When the store cannot be reached or the elector cannot be built.
pub async fn child_leader(url: &str, lease: &str, ttl: Duration) -> Result<(), String> {
    let store = leasehold::connect(url).await.map_err(|e| e.to_string())?;
    let e = Elector::builder(store, lease)
        .ttl(ttl)
        .candidate_id("crash-leader")
        .build()
        .map_err(|e| e.to_string())?;
    let believed = e.timing().believed_ttl();
    let leader = e.campaign().await.map_err(|e| e.to_string())?;
    println!("ELECTED");
    let mut last = leader.valid_until();
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = leader.valid_until();
        if now != last {
            last = now;
            let sent = now - believed;
            println!("RENEWED {}", Instant::now().saturating_duration_since(sent).as_micros());
        }
        if leader.is_cancelled() {
            println!("DEPOSED");
            return Ok(());
        }
    }
}

/// Store requests of all candidates from the leader's `resign()` until the successor is elected
/// (plus 50 ms for stragglers), with `n` candidates each on its own client.
async fn transitions(av: &Available, run: u64, n: usize, reps: usize) -> Outcome<Transitions> {
    let ttl = av.ttl;
    let lease = lease(run, &format!("transition{n}"), 0)?;
    let faults = Faults::new();
    let clients = connect_many(av, n).await?;
    // Each candidate's own store too, for the per-operation breakdown printed per transition.
    let stores: Vec<Arc<FaultyStore>> = clients
        .into_iter()
        .map(|c| Arc::new(FaultyStore::new(c, faults.clone())))
        .collect();
    let electors: Vec<Elector> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| elector(s.clone(), &lease, &format!("c{i}"), ttl))
        .collect::<Outcome<_>>()?;
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Leader)>();
    let mut campaigns = JoinSet::new();
    let spawn = |campaigns: &mut JoinSet<()>, i: usize| {
        let (e, tx) = (electors[i].clone(), tx.clone());
        campaigns.spawn(async move {
            if let Ok(leader) = e.campaign().await {
                let _ = tx.send((i, leader));
            }
        });
    };
    for i in 0..n {
        spawn(&mut campaigns, i);
    }
    let limit = ttl * 3 + Duration::from_secs(10);
    let mut current = within(limit, "first leader", rx.recv()).await?.ok_or("no leader")?;
    // Let every follower finish its first attempt and settle into waiting.
    tokio::time::sleep(ttl.mul_f64(0.5).max(Duration::from_millis(300))).await;
    let mut counts = Vec::new();
    for rep in 0..reps {
        faults.reset_counts();
        let before: Vec<_> = stores.iter().map(|s| s.counts()).collect();
        let (i, leader) = current;
        let started = Instant::now();
        leader.resign().await;
        spawn(&mut campaigns, i);
        current = within(limit, "successor", rx.recv()).await?.ok_or("no successor")?;
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_millis(50)).await;
        counts.push(faults.counts().total());
        let delta: Vec<_> = stores.iter().zip(&before).map(|(s, b)| s.counts().since(b)).collect();
        eprintln!(
            "{} ({took:.1?} to the successor)",
            transition_breakdown(av, n, rep, i, current.0, &delta)
        );
    }
    current.1.resign().await;
    campaigns.shutdown().await;
    Ok(Transitions { counts })
}

/// One transition's requests by operation and by whom: the old leader `old`, its successor `new`
/// and the others (those that made requests, and theirs together), printed by [`transitions`], e.g.
/// `transitions sqlite n=100 #3: 4 = old c5 [release 1 changes 1] new c7 [acquire 1] others (c9) [acquire 1]`.
fn transition_breakdown(
    av: &Available,
    n: usize,
    rep: usize,
    old: usize,
    new: usize,
    delta: &[RequestCounts],
) -> String {
    fn ops(c: &RequestCounts) -> String {
        let mut parts: Vec<String> = c
            .per_operation()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(operation, n)| format!("{operation} {n}"))
            .collect();
        if c.failed > 0 {
            parts.push(format!("failed {}", c.failed));
        }
        format!("[{}]", parts.join(" "))
    }
    let mut others = RequestCounts::default();
    let mut who = Vec::new();
    for (j, d) in delta
        .iter()
        .enumerate()
        .filter(|(j, d)| *j != old && *j != new && d.total() > 0)
    {
        who.push(format!("c{j}"));
        others = others.plus(d);
    }
    let total: u64 = delta.iter().map(RequestCounts::total).sum();
    format!(
        "transitions {} n={n} #{rep}: {total} = old c{old} {} new c{new} {} others ({}) {}",
        av.url().and_then(|u| u.split(':').next()).unwrap_or("memory"),
        ops(&delta[old]),
        ops(&delta[new]),
        who.join(" "),
        ops(&others)
    )
}

/// Store requests per second of a leader and of idle followers, each on its own client;
/// followers poll every `retry_every` where given.
async fn idle(av: &Available, run: u64, plan: &Plan, retry_every: Option<Duration>) -> Outcome<Idle> {
    let ttl = av.ttl;
    let lease = lease(run, "idle", 0)?;
    let leader_faults = Faults::new();
    let follower_faults = Faults::new();
    let a = elector(
        Arc::new(FaultyStore::new(connect(av).await?, leader_faults.clone())),
        &lease,
        "leader",
        ttl,
    )?;
    let renew_every = a.timing().renew_every;
    let leader = campaign(&a, ttl * 5).await?;
    let mut campaigns = JoinSet::new();
    for (i, client) in connect_many(av, plan.idle_followers).await?.into_iter().enumerate() {
        let e = elector_polling(
            Arc::new(FaultyStore::new(client, follower_faults.clone())),
            &lease,
            &format!("follower{i}"),
            ttl,
            retry_every,
        )?;
        campaigns.spawn(async move {
            let _ = e.campaign().await;
        });
    }
    tokio::time::sleep(ttl.mul_f64(0.5).max(Duration::from_millis(300))).await;
    let window = if plan.smoke {
        ttl
    } else {
        (renew_every * 3).max(Duration::from_secs(5))
    };
    leader_faults.reset_counts();
    follower_faults.reset_counts();
    tokio::time::sleep(window).await;
    let result = Idle {
        window,
        followers: plan.idle_followers,
        follower_requests: follower_faults.counts().total(),
        leader_requests: leader_faults.counts().total(),
    };
    campaigns.shutdown().await;
    leader.resign().await;
    Ok(result)
}

/// Runs [`scale`] in a fresh process (`--child-scale`), so that its memory and CPU are its own.
async fn scale_in_child(av: &Available, run: u64, n: usize, smoke: bool) -> Outcome<Scale> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--child-scale", av.url().unwrap_or("memory")])
        .args(["--leases", &n.to_string(), "--run", &run.to_string()])
        .args(["--ttl-ms", &av.scale_ttl.as_millis().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if smoke {
        cmd.arg("--smoke");
    }
    let child = cmd.spawn().map_err(|e| format!("spawning the scale process: {e}"))?;
    let limit = Duration::from_secs(150) + av.scale_ttl * 3;
    let output = within(limit, "scale process", child.wait_with_output())
        .await?
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("SCALE ")) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(format!("scale process failed ({}): {last}", output.status));
    };
    let f: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    if f.len() != 7 {
        return Err(format!("bad SCALE line: {line}"));
    }
    Ok(Scale {
        campaign_time: Duration::from_secs_f64(f[0]),
        window: Duration::from_secs_f64(f[1]),
        on_time: f[2] as usize,
        n: f[3] as usize,
        cores: f[4],
        rss_delta_mib: f[5],
        rss_mib: f[6],
    })
}

/// The hidden `--child-scale` mode: runs the scale measure and prints one `SCALE` line.
///
/// # Errors
///
/// When the store cannot be reached or the measure fails.
pub async fn child_scale(url: &str, run: u64, n: usize, ttl: Duration, smoke: bool) -> Result<(), String> {
    let store: Arc<dyn LeaseStore> = if url == "memory" {
        Arc::new(leasehold::MemoryStore::new())
    } else {
        leasehold::connect(url).await.map_err(|e| e.to_string())?
    };
    let s = scale(store, run, n, ttl, smoke).await?;
    println!(
        "SCALE {} {} {} {} {} {} {}",
        s.campaign_time.as_secs_f64(),
        s.window.as_secs_f64(),
        s.on_time,
        s.n,
        s.cores,
        s.rss_delta_mib,
        s.rss_mib
    );
    Ok(())
}

/// `n` leases held by one process on one client for a window of `ttl` (smoke) or 2 x `ttl`.
async fn scale(store: Arc<dyn LeaseStore>, run: u64, n: usize, ttl: Duration, smoke: bool) -> Outcome<Scale> {
    let rss_before = rss_mib();
    let electors: Vec<Elector> = (0..n)
        .map(|i| elector(store.clone(), &lease(run, &format!("scale{n}"), i)?, "scale", ttl))
        .collect::<Outcome<_>>()?;
    let started = Instant::now();
    let limit = Duration::from_secs(if smoke { 20 } else { 60 });
    let results: Vec<Outcome<Leader>> = futures::stream::iter(electors.iter())
        .map(|e| campaign(e, limit))
        .buffer_unordered(256)
        .collect()
        .await;
    let campaign_time = started.elapsed();
    let mut leaders = Vec::new();
    let mut first_error = None;
    for r in results {
        match r {
            Ok(l) => leaders.push(l),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if leaders.len() < n {
        let elected = leaders.len();
        resign_all(leaders).await;
        return Err(format!(
            "only {elected} of {n} elected within {limit:?} (first error: {})",
            first_error.unwrap_or_default()
        ));
    }
    let window = if smoke { ttl } else { ttl * 2 };
    let mut late = vec![false; n];
    let cpu_before = cpu_seconds();
    let w0 = Instant::now();
    while w0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (i, l) in leaders.iter().enumerate() {
            if l.is_cancelled() || l.remaining() < ttl / 3 {
                late[i] = true;
            }
        }
    }
    let elapsed = w0.elapsed();
    let cpu = cpu_seconds() - cpu_before;
    let rss_after = rss_mib();
    resign_all(leaders).await;
    Ok(Scale {
        campaign_time,
        window: elapsed,
        on_time: late.iter().filter(|l| !**l).count(),
        n,
        cores: cpu / elapsed.as_secs_f64(),
        rss_delta_mib: rss_after - rss_before,
        rss_mib: rss_after,
    })
}

async fn resign_all(leaders: Vec<Leader>) {
    let all = futures::stream::iter(leaders)
        .map(|l| l.resign())
        .buffer_unordered(256)
        .collect::<Vec<()>>();
    let _ = tokio::time::timeout(Duration::from_secs(30), all).await;
}

/// VmRSS of this process, MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// User + system CPU time of this process (all threads), seconds; Linux clock ticks are 1/100 s.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
