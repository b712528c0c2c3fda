//! The fault network: [`Net`], each candidate's seeded wrapper around the shared store.

use super::*;

pub(crate) enum Fate {
    Refuse,
    Deliver {
        to_store: Duration,
        to_caller: Duration,
        lose_reply: bool,
        late: bool,
    },
}

pub(crate) fn draw(rng: &mut Rng, f: &Faults) -> Fate {
    if rng.chance(f.refuse) {
        return Fate::Refuse;
    }
    let late = rng.chance(f.late);
    let to_store = if late {
        rng.ms(400, 2_000)
    } else if rng.chance(f.slow) {
        rng.ms(20, 400)
    } else {
        rng.ms(0, 5)
    };
    let to_caller = if rng.chance(f.slow) {
        rng.ms(20, 400)
    } else {
        rng.ms(0, 5)
    };
    Fate::Deliver {
        to_store,
        to_caller,
        lose_reply: rng.chance(f.lose_reply),
        late,
    }
}

/// Waits while the candidate's network is paused.
pub(crate) async fn wait_unpaused(pauses: &[(Instant, Instant)]) {
    while let Some(until) = within(pauses, Instant::now()) {
        sleep_until(until).await;
    }
}

/// What a reply says, for the trace, and the term it grants.
pub(crate) trait Describe {
    fn describe(&self) -> String;
    fn granted(&self) -> Option<Term> {
        None
    }
}

impl Describe for Acquired {
    fn describe(&self) -> String {
        match self {
            Acquired::Granted(g) => format!("granted term {}", g.term),
            Acquired::Held(o) => format!("held: {}", describe_observation(o)),
        }
    }
    fn granted(&self) -> Option<Term> {
        match self {
            Acquired::Granted(g) => Some(g.term),
            Acquired::Held(_) => None,
        }
    }
}

impl Describe for Vec<Result<Renewed>> {
    fn describe(&self) -> String {
        let renewed = self.iter().filter(|r| matches!(r, Ok(Renewed::Renewed(_)))).count();
        format!("{renewed} of {} renewed", self.len())
    }
}

impl Describe for Vec<Observation> {
    fn describe(&self) -> String {
        format!("{} leases", self.len())
    }
}

impl Describe for Option<Term> {
    fn describe(&self) -> String {
        format!("broke term {self:?}")
    }
}

impl Describe for Renewed {
    fn describe(&self) -> String {
        match self {
            Renewed::Renewed(g) => format!("renewed term {}", g.term),
            Renewed::Lost(o) => format!("lost: {}", describe_observation(o)),
        }
    }
}

impl Describe for Observation {
    fn describe(&self) -> String {
        describe_observation(self)
    }
}

impl Describe for () {
    fn describe(&self) -> String {
        "ok".into()
    }
}

pub(crate) fn describe_observation(o: &Observation) -> String {
    match &o.holder {
        Some(h) => format!("{} holds term {} (last term {})", h.id, h.term, o.last_term),
        None => format!("free (last term {}, {:?})", o.last_term, o.previous_end),
    }
}

/// One candidate's way to the shared store.
pub(crate) struct Net {
    pub(crate) me: usize,
    pub(crate) store: MemoryStore,
    pub(crate) faults: Faults,
    pub(crate) pauses: Arc<[(Instant, Instant)]>,
    pub(crate) outages: Arc<[(Instant, Instant)]>,
    /// From then on, every request is delivered promptly.
    pub(crate) calm_from: Instant,
    /// The chance that a `changes` call gives a working stream.
    pub(crate) notifications: f64,
    pub(crate) rng: Mutex<(Rng, u64)>,
    pub(crate) world: Shared,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").field("me", &self.me).finish_non_exhaustive()
    }
}

impl Net {
    /// One request through the network, guarded against a caller that polls it in a busy loop.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, apply: F) -> Result<T>
    where
        T: Describe + Send + 'static,
        F: FnOnce(MemoryStore) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let me = self.me;
        let mut request = std::pin::pin!(self.deliver(op, apply));
        let mut at = Instant::now();
        let mut polls = 0u32;
        let outcome = std::future::poll_fn(|cx| {
            let now = Instant::now();
            if now != at {
                (at, polls) = (now, 0);
            }
            polls += 1;
            if polls > SPIN_POLLS {
                return std::task::Poll::Ready(None);
            }
            request.as_mut().poll(cx).map(Some)
        })
        .await;
        match outcome {
            Some(result) => result,
            None => {
                lock(&self.world).violation(
                    Kind::Livelock,
                    format!(
                        "c{me}'s engine polled its {op} request {SPIN_POLLS} times at one simulated instant: a busy \
                         loop (simulated time cannot pass; in real time it burns a core until the reply); the \
                         simulation answers it as refused to break the loop"
                    ),
                );
                Err(Error::unreachable("sim", "busy loop broken by the simulation"))
            }
        }
    }

    pub(crate) async fn deliver<T, F, Fut>(&self, op: &'static str, apply: F) -> Result<T>
    where
        T: Describe + Send + 'static,
        F: FnOnce(MemoryStore) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let me = self.me;
        let sent = Instant::now();
        let outage = within(&self.outages, sent).is_some();
        let (id, fate) = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let (rng, next) = &mut *guard;
            *next += 1;
            let fate = draw(rng, &self.faults);
            let calm = Fate::Deliver {
                to_store: rng.ms(0, 5),
                to_caller: rng.ms(0, 5),
                lose_reply: false,
                late: false,
            };
            (*next, if sent >= self.calm_from { calm } else { fate })
        };
        {
            let mut w = lock(&self.world);
            w.stats.requests += 1;
            if outage {
                w.refused_in_outage[me].push(sent);
            }
            let how = match (&fate, outage) {
                (_, true) => "refused (outage)".to_string(),
                (Fate::Refuse, _) => "refused".to_string(),
                (
                    Fate::Deliver {
                        to_store,
                        to_caller,
                        lose_reply,
                        late,
                    },
                    _,
                ) => format!(
                    "to store {to_store:?}{}, reply {}",
                    if *late { " (late)" } else { "" },
                    if *lose_reply {
                        "lost".to_string()
                    } else {
                        format!("{to_caller:?}")
                    }
                ),
            };
            w.log(format!("c{me} #{id} {op}: {how}"));
        }
        let Fate::Deliver {
            to_store,
            to_caller,
            lose_reply,
            late,
        } = fate
        else {
            lock(&self.world).stats.refused += 1;
            sleep(REFUSED_AFTER).await;
            return Err(Error::unreachable("sim", "connection refused (not applied)"));
        };
        if outage {
            lock(&self.world).stats.refused += 1;
            sleep(REFUSED_AFTER).await;
            return Err(Error::unreachable("sim", "connection refused (outage, not applied)"));
        }
        let (tx, rx) = oneshot::channel();
        let store = self.store.clone();
        let pauses = self.pauses.clone();
        let world = self.world.clone();
        // The request is on the wire: it is applied whether or not the caller still waits.
        tokio::spawn(async move {
            sleep(to_store).await;
            wait_unpaused(&pauses).await;
            let result = apply(store).await;
            {
                let mut w = lock(&world);
                if late {
                    w.stats.late += 1;
                }
                if let Some(term) = result.as_ref().ok().and_then(Describe::granted) {
                    let applied = Instant::now();
                    // The engine bounds a call by the TTL from its send (`call_bound`): an acquire
                    // applied within it belongs to the election, which must still be there to
                    // give back what it grants.
                    // (Acquires of an earlier campaign, dropped before it, are its own driver's.)
                    if let Some((_, returned)) = w.returned[me]
                        .filter(|(started, returned)| sent >= *started && applied > *returned && applied < sent + TTL)
                    {
                        let detail = format!(
                            "c{me}'s acquire #{id} (sent {}) granted term {term} at {}, after its run returned at {}: \
                             a grant nobody renews or releases",
                            w.t(sent),
                            w.t(applied),
                            w.t(returned)
                        );
                        w.violation(Kind::LateGrant, detail);
                    }
                    let seq = w.trace.len();
                    w.grants.insert(
                        term,
                        StoreGrant {
                            c: me,
                            request: id,
                            sent,
                            applied,
                            seq,
                        },
                    );
                }
                let what = match &result {
                    Ok(v) => v.describe(),
                    Err(e) => format!("error: {e}"),
                };
                w.log(format!("c{me} #{id} {op} applied: {what}"));
                if lose_reply {
                    w.stats.lost_replies += 1;
                }
            }
            if lose_reply {
                return;
            }
            sleep(to_caller).await;
            wait_unpaused(&pauses).await;
            if tx.send(result).is_err() {
                lock(&world).log(format!("c{me} #{id} {op}: the reply came after the caller gave up"));
            }
        });
        match rx.await {
            Ok(result) => result,
            Err(_) => std::future::pending().await,
        }
    }
}

#[async_trait]
impl LeaseStore for Net {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let request = request.clone();
        let op = if request.takeover.is_some() {
            "acquire (takeover)"
        } else {
            "acquire"
        };
        self.call(op, move |s| async move { s.acquire(&request).await }).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let grant = grant.clone();
        self.call("renew", move |s| async move { s.renew(&grant).await }).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let grant = grant.clone();
        lock(&self.world).released.insert((self.me, grant.term));
        self.call("release", move |s| async move { s.release(&grant).await })
            .await
    }

    async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let grants = grants.to_vec();
        self.call("renew_many", move |s| async move { s.renew_many(&grants).await })
            .await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let (grant, to) = (grant.clone(), to.clone());
        lock(&self.world).released.insert((self.me, grant.term));
        let op = "hand_over";
        self.call(op, move |s| async move { s.hand_over(&grant, &to).await })
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let prefix = prefix.to_string();
        self.call("list", move |s| async move { s.list(&prefix).await }).await
    }

    fn can_break(&self) -> bool {
        self.store.can_break()
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let lease = lease.clone();
        self.call("break", move |s| async move { s.break_lease(&lease).await })
            .await
    }

    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        // Announcements come late, and some streams end after a while (as notifications do).
        let mut rng = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            guard.0.fork()
        };
        if !rng.chance(self.notifications) {
            return Ok(None);
        }
        let Some(inner) = self.store.announcements(lease).await? else {
            return Ok(None);
        };
        let items = if rng.chance(0.3) {
            1 + rng.below(30) as usize
        } else {
            usize::MAX
        };
        let delayed = inner.take(items).then(move |observation| {
            let delay = rng.ms(0, 50);
            async move {
                sleep(delay).await;
                observation
            }
        });
        Ok(Some(Box::pin(delayed)))
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let (lease, candidate) = (lease.clone(), candidate.clone());
        self.call("withdraw", move |s| async move { s.withdraw(&lease, &candidate).await })
            .await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let lease = lease.clone();
        self.call("inspect", move |s| async move { s.inspect(&lease).await })
            .await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.store.history(lease, limit).await
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let (choice, mut rng) = {
            let mut guard = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let (rng, _) = &mut *guard;
            let works = rng.chance(self.notifications);
            (if works { 2 } else { rng.below(2) }, rng.fork())
        };
        match choice {
            0 => Err(Error::unreachable("sim", "watch refused")),
            1 => Ok(None),
            _ => {
                let Some(inner) = self.store.changes(lease, candidate).await? else {
                    return Ok(None);
                };
                // Notifications arrive late, and some streams end after a while (polling then).
                let items = if rng.chance(0.3) {
                    1 + rng.below(30) as usize
                } else {
                    usize::MAX
                };
                let delayed = inner.take(items).then(move |change| {
                    let delay = rng.ms(0, 50);
                    async move {
                        sleep(delay).await;
                        change
                    }
                });
                Ok(Some(Box::pin(delayed)))
            }
        }
    }
}
