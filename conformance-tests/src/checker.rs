//! The safety checker: every candidate's believed leadership on one monotonic clock.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use leasehold_core::{CandidateId, DeposedReason, Elector, Event, LeaseName, Term};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::AbortHandle;

/// One event of one candidate, as the checker received it.
#[derive(Clone, Debug)]
pub struct Record {
    /// The lease.
    pub lease: LeaseName,
    /// The candidate.
    pub candidate: CandidateId,
    /// When the checker received the event.
    pub received: Instant,
    /// The event.
    pub event: Event,
}

/// A stretch of time during which one candidate believed it led one lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The lease.
    pub lease: LeaseName,
    /// The candidate.
    pub candidate: CandidateId,
    /// The term it held.
    pub term: Term,
    /// When it was elected ([`Event::Elected`]'s `at`).
    pub start: Instant,
    /// When it stopped believing it led ([`Event::Deposed`]'s `believed_until`), or `None` while
    /// it still leads.
    pub end: Option<Instant>,
    /// Why it ended, once it has.
    pub reason: Option<DeposedReason>,
}

impl Interval {
    /// The end, or `now` for an interval still open.
    pub fn end_or(&self, now: Instant) -> Instant {
        self.end.unwrap_or(now)
    }

    /// Whether the candidate believed it led at some instant of `[from, to)`.
    pub fn overlaps(&self, from: Instant, to: Instant, now: Instant) -> bool {
        self.start < to && from < self.end_or(now)
    }
}

/// Records every candidate's believed-leadership intervals on one monotonic clock
/// ([`std::time::Instant`]) and checks them:
///
/// - no two intervals of *different* candidates of the same lease overlap;
/// - terms strictly increase in order of election, across all candidates of a lease;
/// - no event was lost (a lagging event stream fails the check).
///
/// Call [`SafetyChecker::watch`] for every elector *before* it campaigns, and
/// [`SafetyChecker::assert_safe`] at the end of the scenario, once the electors have stopped
/// (an interval still open at check time ends "now").
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_conformance::SafetyChecker;
/// use leasehold_core::{Elector, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let checker = SafetyChecker::new();
/// let elector = Elector::builder(Arc::new(MemoryStore::new()), "demo").ttl(Duration::from_secs(1)).build()?;
/// checker.watch(&elector);
/// elector.campaign().await?.resign().await;
/// checker.assert_safe().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct SafetyChecker {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    recorders: Mutex<Vec<Recorder>>,
}

#[derive(Debug, Default)]
struct State {
    records: Vec<Record>,
    failures: Vec<String>,
}

#[derive(Debug)]
struct Recorder {
    flush: mpsc::UnboundedSender<oneshot::Sender<()>>,
    task: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for recorder in self.recorders.get_mut().expect("recorders lock").drain(..) {
            recorder.task.abort();
        }
    }
}

impl SafetyChecker {
    /// A checker with nothing recorded.
    pub fn new() -> Self {
        SafetyChecker::default()
    }

    /// Records the events of `elector` from now on. Call it before the elector campaigns.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn watch(&self, elector: &Elector) {
        let events = elector.events();
        let (flush, flushes) = mpsc::unbounded_channel();
        let task = tokio::spawn(record(
            Arc::downgrade(&self.inner),
            elector.lease().clone(),
            elector.id().clone(),
            events,
            flushes,
        ));
        self.inner.recorders.lock().expect("recorders lock").push(Recorder {
            flush,
            task: task.abort_handle(),
        });
    }

    /// Waits until every event emitted so far has been recorded.
    pub async fn flush(&self) {
        let flushes: Vec<_> = {
            let recorders = self.inner.recorders.lock().expect("recorders lock");
            recorders
                .iter()
                .filter_map(|recorder| {
                    let (ack, done) = oneshot::channel();
                    recorder.flush.send(ack).ok().map(|()| done)
                })
                .collect()
        };
        for done in flushes {
            // A recorder whose elector is gone has recorded everything already.
            let _ = done.await;
        }
    }

    /// Every event recorded so far, in the order received per candidate.
    pub async fn records(&self) -> Vec<Record> {
        self.flush().await;
        self.inner.state.lock().expect("checker lock").records.clone()
    }

    /// Every believed-leadership interval so far, ordered by start.
    pub async fn intervals(&self) -> Vec<Interval> {
        self.flush().await;
        self.intervals_now().0
    }

    /// The intervals of `lease`, ordered by start.
    pub async fn intervals_of(&self, lease: &LeaseName) -> Vec<Interval> {
        self.intervals()
            .await
            .into_iter()
            .filter(|i| &i.lease == lease)
            .collect()
    }

    /// The intervals of `lease` during which someone believed it led at some instant of
    /// `[from, to)` (open intervals last until now).
    pub async fn believed_between(&self, lease: &LeaseName, from: Instant, to: Instant) -> Vec<Interval> {
        let now = Instant::now();
        self.intervals_of(lease)
            .await
            .into_iter()
            .filter(|i| i.overlaps(from, to, now))
            .collect()
    }

    /// Checks everything recorded so far; `Ok` with a one-line summary, `Err` with a readable
    /// report of every violation.
    ///
    /// # Errors
    ///
    /// A report naming both candidates, their terms and instants for each overlap, each term that
    /// did not increase, and each lost event.
    pub async fn check(&self) -> Result<String, String> {
        self.flush().await;
        let now = Instant::now();
        let (intervals, mut failures) = self.intervals_now();
        let epoch = intervals.first().map_or(now, |i| i.start);
        let at = |t: Instant| format!("+{:.3}s", t.saturating_duration_since(epoch).as_secs_f64());
        let show = |i: &Interval| match i.end {
            Some(end) => format!("{} term {} [{} .. {}]", i.candidate, i.term, at(i.start), at(end)),
            None => format!(
                "{} term {} [{} .. still leading at {}]",
                i.candidate,
                i.term,
                at(i.start),
                at(now)
            ),
        };
        let mut by_lease: BTreeMap<&LeaseName, Vec<&Interval>> = BTreeMap::new();
        for interval in &intervals {
            by_lease.entry(&interval.lease).or_default().push(interval);
        }
        for (lease, list) in &by_lease {
            for (n, a) in list.iter().enumerate() {
                for b in &list[n + 1..] {
                    if a.candidate != b.candidate && b.start < a.end_or(now) && a.start < b.end_or(now) {
                        failures.push(format!(
                            "lease {lease}: two candidates believed they led at once: {} and {}",
                            show(a),
                            show(b)
                        ));
                    }
                }
            }
            for pair in list.windows(2) {
                if pair[1].term <= pair[0].term {
                    failures.push(format!(
                        "lease {lease}: terms did not increase in order of election: {} then {}",
                        show(pair[0]),
                        show(pair[1])
                    ));
                }
            }
        }
        if failures.is_empty() {
            let candidates: std::collections::BTreeSet<_> =
                intervals.iter().map(|i| (&i.lease, &i.candidate)).collect();
            Ok(format!(
                "safe: {} leadership intervals of {} candidates on {} leases",
                intervals.len(),
                candidates.len(),
                by_lease.len()
            ))
        } else {
            let mut report = format!("SAFETY VIOLATION ({} problems):\n", failures.len());
            for failure in &failures {
                let _ = writeln!(report, "  - {failure}");
            }
            let _ = writeln!(report, "all intervals (times after the first election):");
            for interval in &intervals {
                let _ = writeln!(report, "  {}: {}", interval.lease, show(interval));
            }
            Err(report)
        }
    }

    /// Checks everything recorded so far and panics with a readable report on any violation.
    ///
    /// # Panics
    ///
    /// On an overlap of two candidates' believed leadership, a term that did not increase, or a
    /// lost event.
    pub async fn assert_safe(&self) {
        match self.check().await {
            Ok(summary) => eprintln!("{summary}"),
            Err(report) => panic!("{report}"),
        }
    }

    /// Builds the intervals from the records; also returns the failures found on the way.
    fn intervals_now(&self) -> (Vec<Interval>, Vec<String>) {
        let state = self.inner.state.lock().expect("checker lock");
        let mut failures = state.failures.clone();
        let mut open: BTreeMap<(LeaseName, CandidateId), usize> = BTreeMap::new();
        let mut intervals: Vec<Interval> = Vec::new();
        for record in &state.records {
            let key = (record.lease.clone(), record.candidate.clone());
            match &record.event {
                Event::Elected { term, at, .. } => {
                    if let Some(previous) = open.get(&key) {
                        failures.push(format!(
                            "lease {}: {} was elected at term {term} while still leading at term {}",
                            record.lease, record.candidate, intervals[*previous].term
                        ));
                    }
                    open.insert(key, intervals.len());
                    intervals.push(Interval {
                        lease: record.lease.clone(),
                        candidate: record.candidate.clone(),
                        term: *term,
                        start: *at,
                        end: None,
                        reason: None,
                    });
                }
                Event::Deposed {
                    term,
                    reason,
                    believed_until,
                    ..
                } => match open.remove(&key) {
                    Some(n) if intervals[n].term == *term => {
                        intervals[n].end = Some(*believed_until);
                        intervals[n].reason = Some(reason.clone());
                    }
                    other => failures.push(format!(
                        "lease {}: {} was deposed at term {term} but led at {:?}",
                        record.lease,
                        record.candidate,
                        other.map(|n| intervals[n].term)
                    )),
                },
                _ => {}
            }
        }
        intervals.sort_by_key(|i| i.start);
        (intervals, failures)
    }

    #[cfg(test)]
    fn push(&self, lease: &str, candidate: &str, event: Event) {
        self.inner.state.lock().unwrap().records.push(Record {
            lease: LeaseName::new(lease).unwrap(),
            candidate: CandidateId::new(candidate).unwrap(),
            received: Instant::now(),
            event,
        });
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} led {} at term {}", self.candidate, self.lease, self.term)
    }
}

/// Moves the events of one elector into the checker until the elector is gone.
async fn record(
    checker: std::sync::Weak<Inner>,
    lease: LeaseName,
    candidate: CandidateId,
    mut events: broadcast::Receiver<Event>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
) {
    let store = |result: Result<Event, String>| {
        let Some(inner) = checker.upgrade() else {
            return;
        };
        let mut state = inner.state.lock().expect("checker lock");
        match result {
            Ok(event) => state.records.push(Record {
                lease: lease.clone(),
                candidate: candidate.clone(),
                received: Instant::now(),
                event,
            }),
            Err(failure) => state.failures.push(failure),
        }
    };
    let lagged = |n: u64| format!("lease {lease}: the checker lost {n} events of {candidate} (broadcast lag)");
    let mut closed = false;
    loop {
        tokio::select! {
            biased;
            event = events.recv(), if !closed => match event {
                Ok(event) => store(Ok(event)),
                Err(RecvError::Lagged(n)) => store(Err(lagged(n))),
                Err(RecvError::Closed) => closed = true,
            },
            ack = flushes.recv() => {
                let Some(ack) = ack else { return };
                loop {
                    match events.try_recv() {
                        Ok(event) => store(Ok(event)),
                        Err(TryRecvError::Lagged(n)) => store(Err(lagged(n))),
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                    }
                }
                let _ = ack.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn elected(term: u64, at: Instant) -> Event {
        Event::Elected {
            term: Term(term),
            at,
            valid_until: at + Duration::from_secs(1),
        }
    }

    fn deposed(term: u64, until: Instant) -> Event {
        Event::Deposed {
            term: Term(term),
            reason: DeposedReason::Resigned,
            believed_until: until,
            work_stopped_after: None,
            aborted: false,
        }
    }

    #[tokio::test]
    async fn back_to_back_leadership_is_safe() {
        let checker = SafetyChecker::new();
        let t = Instant::now();
        let ms = Duration::from_millis;
        checker.push("l", "a", elected(1, t));
        checker.push("l", "a", deposed(1, t + ms(10)));
        checker.push("l", "b", elected(2, t + ms(10)));
        checker.push("l", "b", deposed(2, t + ms(20)));
        // Another lease may be led by anyone at the same time.
        checker.push("m", "a", elected(1, t + ms(15)));
        checker.push("m", "a", deposed(1, t + ms(30)));
        let summary = checker.check().await.unwrap();
        assert!(summary.contains("3 leadership intervals"), "{summary}");
    }

    #[tokio::test]
    async fn overlap_is_reported_with_both_candidates() {
        let checker = SafetyChecker::new();
        let t = Instant::now();
        let ms = Duration::from_millis;
        checker.push("l", "alice", elected(1, t));
        checker.push("l", "alice", deposed(1, t + ms(20)));
        checker.push("l", "bob", elected(2, t + ms(10)));
        let report = checker.check().await.unwrap_err();
        assert!(
            report.contains("alice term 1") && report.contains("bob term 2"),
            "{report}"
        );
        assert!(report.contains("still leading"), "{report}");
    }

    #[tokio::test]
    async fn terms_must_increase() {
        let checker = SafetyChecker::new();
        let t = Instant::now();
        let ms = Duration::from_millis;
        checker.push("l", "a", elected(5, t));
        checker.push("l", "a", deposed(5, t + ms(10)));
        checker.push("l", "b", elected(5, t + ms(20)));
        checker.push("l", "b", deposed(5, t + ms(30)));
        let report = checker.check().await.unwrap_err();
        assert!(report.contains("terms did not increase"), "{report}");
    }

    #[tokio::test]
    #[should_panic(expected = "SAFETY VIOLATION")]
    async fn assert_safe_panics() {
        let checker = SafetyChecker::new();
        checker.push("l", "a", deposed(1, Instant::now()));
        checker.assert_safe().await;
    }
}
