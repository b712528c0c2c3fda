//! The measures, one function each, run against one backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{AcquireRequest, Acquired, CandidateId, Elector, Leader, LeaseName, LeaseStore, Renewed};
use leasehold_conformance::{Faults, FaultyStore, RequestCounts};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::Stats;
use crate::backends::{Available, Backend};
use crate::crash::{failover, observe_after_crash};
use crate::plan::{
    Outcome, Plan, campaign, connect, connect_many, elected, elector, elector_polling, lease, sees_holder, within,
};
use crate::scale::{Scale, scale, scale_in_child};

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
    pub(crate) group_cost: Vec<Outcome<crate::groups::Cost>>,
    pub(crate) group_scale: Outcome<crate::group_scale::ScaleReport>,
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
        group_cost: Vec::new(),
        group_scale: Err("n/a".into()),
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
        let (group, cost) = crate::groups::measure(av, run, plan).await;
        report.group = group;
        report.group_cost = cost;
    }
    if plan.wants("group-scale") {
        report.group_scale = crate::group_scale::measure(av, run, plan).await;
    }
    report
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
