//! The metrics the election driver records (through the [`metrics`] facade), their
//! descriptions, and how a store reply is classified.
//!
//! Labels are bounded: `lease` (the lease name), `store` (the backend's short name), and small
//! fixed sets (`operation`, `outcome`, `reason`, `to`). No candidate ids and no error texts.
//! One process should run one candidate per lease: two electors of one lease in one process
//! write the same series.

use std::time::{Duration, Instant};

use metrics::Unit;

use crate::error::Error;
use crate::machine::{DeposedReason, Output, Reply, Request};
use crate::types::{Acquired, CandidateId, EndReason, Observation, Renewed, Term};

/// `1` while this candidate leads the lease, `0` otherwise (present from the elector's build).
pub(crate) const IS_LEADER: &str = "leasehold_is_leader";
/// The term this candidate last saw: its own while it leads, the holder's while it follows.
pub(crate) const TERM: &str = "leasehold_term";
/// How long this candidate's believed leadership lasts without another renewal; `0` when not leader.
pub(crate) const REMAINING: &str = "leasehold_lease_remaining_seconds";
/// Store requests by operation and outcome.
pub(crate) const REQUESTS: &str = "leasehold_store_requests_total";
/// Store trouble the election carried on through, by error kind.
pub(crate) const TROUBLE: &str = "leasehold_store_trouble_total";
/// Step-downs by reason.
pub(crate) const STEP_DOWNS: &str = "leasehold_step_downs_total";
/// Transitions to leader and to follower.
pub(crate) const TRANSITIONS: &str = "leasehold_transitions_total";
/// Renew round trips.
pub(crate) const RENEW_SECONDS: &str = "leasehold_renew_seconds";
/// From the start of a campaign to its election.
pub(crate) const CAMPAIGN_SECONDS: &str = "leasehold_campaign_seconds";
/// From the previous holder's last known renewal to this candidate's election, when its term
/// lapsed.
pub(crate) const FAILOVER_SECONDS: &str = "leasehold_failover_seconds";
/// From learning that the previous holder let go (released or handed over) to this candidate's
/// election.
pub(crate) const HANDOVER_SECONDS: &str = "leasehold_handover_seconds";

/// Every operation label of [`REQUESTS`].
pub(crate) const OPERATIONS: [&str; 6] = ["acquire", "renew", "release", "hand_over", "inspect", "withdraw"];
/// Every outcome label of [`REQUESTS`].
pub(crate) const OUTCOMES: [&str; 4] = ["ok", "lost_race", "transient", "permanent"];
/// Every reason label of [`STEP_DOWNS`].
pub(crate) const STEP_DOWN_REASONS: [&str; 8] = [
    "superseded",
    "renew_failed",
    "store_error",
    "stalled",
    "too_little_time",
    "resigned",
    "handed_over",
    "work_finished",
];
/// Every reason label of [`TROUBLE`].
pub(crate) const TROUBLE_REASONS: [&str; 7] = [
    "unreachable",
    "timeout",
    "corrupt_record",
    "unsupported",
    "refused",
    "engine",
    "store",
];

/// Describes every series (HELP text and unit). Cheap; called by every elector's build, so
/// that a recorder installed before any elector is built gets the descriptions.
pub(crate) fn describe() {
    metrics::describe_gauge!(
        IS_LEADER,
        "1 while this process's candidate leads the lease, 0 otherwise"
    );
    metrics::describe_gauge!(
        TERM,
        "The fencing term this candidate last saw: its own while it leads, the holder's while it follows (0 until one is seen)"
    );
    metrics::describe_gauge!(
        REMAINING,
        Unit::Seconds,
        "How long this candidate's believed leadership lasts without another renewal, as of the last grant or renewal; 0 when not leader"
    );
    metrics::describe_counter!(
        REQUESTS,
        "Store requests by operation (acquire, renew, release, hand_over, inspect, withdraw) and outcome (ok; lost_race: held by another or renewal lost; transient: unreachable, timed out or abandoned before a reply; permanent: any other error)"
    );
    metrics::describe_counter!(
        TROUBLE,
        "Store errors the election carried on through (retrying, reading back or stepping down), by kind"
    );
    metrics::describe_counter!(
        STEP_DOWNS,
        "Leaderships that ended, by reason (the DeposedReason variant)"
    );
    metrics::describe_counter!(TRANSITIONS, "Transitions of this candidate to leader and to follower");
    metrics::describe_histogram!(RENEW_SECONDS, Unit::Seconds, "Round trip of each renew request");
    metrics::describe_histogram!(
        CAMPAIGN_SECONDS,
        Unit::Seconds,
        "From the start of a campaign to its election"
    );
    metrics::describe_histogram!(
        FAILOVER_SECONDS,
        Unit::Seconds,
        "Elections after another holder's term lapsed (expiry, takeover, break): from that holder's last renewal this candidate knows of (the store's remaining time, a new record version seen, or a TTL before the store's expiry reached it) to the election"
    );
    metrics::describe_histogram!(
        HANDOVER_SECONDS,
        Unit::Seconds,
        "Elections after another holder let go (a release or a hand-over): from the moment this candidate learned of it (a notification, an announcement or a read) to the election"
    );
}

/// Registers the series of `lease` with zero values, so an alert sees them from the start
/// (`leasehold_is_leader 0` for a candidate never elected). Values already recorded (another
/// elector of the lease in this process) are left as they are.
pub(crate) fn register(lease: &str, store: &'static str) {
    metrics::gauge!(IS_LEADER, "lease" => lease.to_string()).increment(0.0);
    metrics::gauge!(TERM, "lease" => lease.to_string()).increment(0.0);
    metrics::gauge!(REMAINING, "lease" => lease.to_string()).increment(0.0);
    for operation in OPERATIONS {
        for outcome in OUTCOMES {
            request_counter(lease, store, operation, outcome).increment(0);
        }
    }
    for reason in STEP_DOWN_REASONS {
        metrics::counter!(STEP_DOWNS, "lease" => lease.to_string(), "reason" => reason).increment(0);
    }
    for reason in TROUBLE_REASONS {
        trouble_counter(lease, store, reason).increment(0);
    }
}

pub(crate) fn request_counter(
    lease: &str,
    store: &'static str,
    operation: &'static str,
    outcome: &'static str,
) -> metrics::Counter {
    metrics::counter!(
        REQUESTS,
        "lease" => lease.to_string(),
        "store" => store,
        "operation" => operation,
        "outcome" => outcome,
    )
}

/// Records what one output of the machine changes in the metrics: the one place the engine's
/// transitions reach them (requests are counted by [`RequestGuard`], hand-overs by
/// [`PreviousHolder`]).
pub(crate) fn record_output(
    lease: &str,
    store: &'static str,
    output: &Output,
    now: Instant,
    campaign_started: Instant,
) {
    let lease = || lease.to_string();
    match output {
        Output::Elected { grant, valid_until } => {
            metrics::gauge!(TERM, "lease" => lease()).set(grant.term.0 as f64);
            metrics::counter!(TRANSITIONS, "lease" => lease(), "to" => "leader").increment(1);
            metrics::histogram!(CAMPAIGN_SECONDS, "lease" => lease()).record((now - campaign_started).as_secs_f64());
            metrics::gauge!(REMAINING, "lease" => lease())
                .set(valid_until.saturating_duration_since(now).as_secs_f64());
            // Last: a scrape begun after one that shows this candidate leading shows the rest of
            // its election (one rendered meanwhile can show part: the exporter renders kind by kind).
            metrics::gauge!(IS_LEADER, "lease" => lease()).set(1.0);
        }
        Output::Extended { valid_until } => {
            metrics::gauge!(REMAINING, "lease" => lease())
                .set(valid_until.saturating_duration_since(now).as_secs_f64());
        }
        Output::Deposed { reason, .. } => {
            metrics::gauge!(IS_LEADER, "lease" => lease()).set(0.0);
            metrics::gauge!(REMAINING, "lease" => lease()).set(0.0);
            metrics::counter!(STEP_DOWNS, "lease" => lease(), "reason" => step_down_reason(reason)).increment(1);
            metrics::counter!(TRANSITIONS, "lease" => lease(), "to" => "follower").increment(1);
        }
        Output::LeaderChanged(Some((_, term))) => metrics::gauge!(TERM, "lease" => lease()).set(term.0 as f64),
        Output::StoreTrouble(error) => trouble_counter(&lease(), store, trouble_reason(error)).increment(1),
        Output::Send(..)
        | Output::AbortWork
        | Output::SteppedDown { .. }
        | Output::LeaderChanged(None)
        | Output::Stopped => {}
    }
}

pub(crate) fn trouble_counter(lease: &str, store: &'static str, reason: &'static str) -> metrics::Counter {
    metrics::counter!(TROUBLE, "lease" => lease.to_string(), "store" => store, "reason" => reason)
}

/// The `operation` label of a request.
pub(crate) fn operation(request: &Request) -> &'static str {
    match request {
        Request::Acquire(_) => "acquire",
        Request::Renew(_) => "renew",
        Request::Release(_) => "release",
        Request::HandOver(..) => "hand_over",
        Request::Inspect => "inspect",
        Request::Withdraw => "withdraw",
    }
}

/// The `outcome` label of a reply.
pub(crate) fn outcome(reply: &Reply) -> &'static str {
    fn of<T>(result: &Result<T, Error>, lost: impl FnOnce(&T) -> bool) -> &'static str {
        match result {
            Ok(value) if lost(value) => "lost_race",
            Ok(_) => "ok",
            Err(e) if e.is_transient() => "transient",
            Err(_) => "permanent",
        }
    }
    match reply {
        Reply::Acquire(r) => of(r, |a| matches!(a, Acquired::Held(_))),
        Reply::Renew(r) => of(r, |r| matches!(r, Renewed::Lost(_))),
        Reply::Release(r) | Reply::Withdraw(r) => of(r, |()| false),
        Reply::Inspect(r) => of(r, |_| false),
    }
}

/// The `reason` label of [`STEP_DOWNS`]: the variant's name in snake case.
pub(crate) fn step_down_reason(reason: &DeposedReason) -> &'static str {
    match reason {
        DeposedReason::Superseded { .. } => "superseded",
        DeposedReason::RenewFailed { .. } => "renew_failed",
        DeposedReason::StoreError { .. } => "store_error",
        DeposedReason::Stalled => "stalled",
        DeposedReason::TooLittleTime { .. } => "too_little_time",
        DeposedReason::Resigned => "resigned",
        DeposedReason::HandedOver { .. } => "handed_over",
        DeposedReason::WorkFinished => "work_finished",
    }
}

/// The `reason` label of [`TROUBLE`]. Errors a store should not return while campaigning
/// (configuration, not-leader) count as `store`.
pub(crate) fn trouble_reason(error: &Error) -> &'static str {
    match error {
        Error::Unreachable { .. } => "unreachable",
        Error::Timeout { .. } => "timeout",
        Error::CorruptRecord { .. } => "corrupt_record",
        Error::Unsupported { .. } => "unsupported",
        Error::Refused { .. } => "refused",
        Error::Engine { .. } => "engine",
        _ => "store",
    }
}

/// Counts a store request once: with its reply's outcome, or as `transient` when it is dropped
/// before a reply (timed out, or the campaign ended while it was under way).
pub(crate) struct RequestGuard {
    pub(crate) lease: String,
    pub(crate) store: &'static str,
    pub(crate) operation: &'static str,
    pub(crate) done: bool,
}

impl RequestGuard {
    pub(crate) fn finish(mut self, reply: &Reply) {
        self.done = true;
        request_counter(&self.lease, self.store, self.operation, outcome(reply)).increment(1);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.done {
            request_counter(&self.lease, self.store, self.operation, "transient").increment(1);
        }
    }
}

/// How the term before this candidate's election ended, as far as this candidate can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The holder let go: a release, or a hand-over ([`HANDOVER_SECONDS`]).
    LetGo,
    /// The holder stopped renewing (crash, hang, partition) and its lease expired or was taken
    /// over, or an operator broke it ([`FAILOVER_SECONDS`]).
    Lapsed,
}

/// What one campaign saw of the holder before it, for the failover and handover histograms.
///
/// Only facts count for how a term ended: the lease read free with the store's word on how its
/// last term ended, a reservation for this candidate (a hand-over), an orphaned record (its
/// holder's session is gone). A bare change notification is not one: stores notify renewals,
/// new candidates and expiries too. Without such a fact, the end counts as a let-go when this
/// candidate learned of it (a notification, or the acquire that won) before the store would
/// have expired the holder by what it last showed (its remaining time, or a new record version
/// seen), and as a lapse otherwise.
///
/// The values: a let-go counts from the moment this candidate learned of it (the first
/// notification after the holder was last seen, else the read or acquire that showed it) to
/// the election; what came before (the release's own trip to the store) this candidate cannot
/// see. A lapse counts from the holder's last sign of life this candidate knows of: its last
/// renewal by the store's remaining time, a new record version seen, or, where the store says
/// neither, a TTL before this candidate learned the lease was gone (the store expired it then).
#[derive(Debug, Default)]
pub(crate) struct PreviousHolder {
    /// Boxed: every idle leader keeps one in its driver (thousands of leases in one process).
    holder: Option<Box<Sighting>>,
}

#[derive(Debug)]
struct Sighting {
    id: CandidateId,
    term: Term,
    version: String,
    ttl: Duration,
    first_seen: Instant,
    /// The holder's latest renewal this candidate knows of (a new version seen, or the store's
    /// remaining time counted back from a TTL).
    alive_at: Option<Instant>,
    /// When the store would expire the holder by what it last said.
    deadline: Option<Instant>,
    /// The record outlived its holder's session.
    orphaned: bool,
    /// The first change notification since the holder was last seen in place.
    notified: Option<Instant>,
    /// How the term ended and when this candidate learned it, once a fact said so.
    ended: Option<(Ending, Instant)>,
}

impl PreviousHolder {
    /// A read, reply or announcement showed the lease as `observation`. `asked`: when the
    /// request that read it was sent (the store answered after), or when the announcement came.
    pub(crate) fn seen(&mut self, asked: Instant, now: Instant, observation: &Observation, me: &CandidateId) {
        match &observation.holder {
            Some(h) if h.id == *me => {
                if h.reserved
                    && let Some(s) = &mut self.holder
                {
                    s.ended.get_or_insert((Ending::LetGo, s.notified.unwrap_or(asked)));
                }
            }
            Some(h) => {
                let same = self
                    .holder
                    .as_ref()
                    .is_some_and(|s| s.id == h.id && s.term == h.term && s.ended.is_none());
                if !same {
                    self.holder = Some(Box::new(Sighting {
                        id: h.id.clone(),
                        term: h.term,
                        version: h.version.clone(),
                        ttl: h.ttl,
                        first_seen: now,
                        alive_at: None,
                        deadline: None,
                        orphaned: false,
                        notified: None,
                        ended: None,
                    }));
                }
                let s = self.holder.as_mut().expect("set above");
                if s.version != h.version {
                    s.version = h.version.clone();
                    s.alive_at = s.alive_at.max(Some(asked));
                }
                if let Some(remaining) = h.store_remaining {
                    let deadline = asked + remaining;
                    s.deadline = Some(deadline);
                    s.alive_at = s.alive_at.max(deadline.checked_sub(h.ttl));
                }
                s.orphaned |= h.orphaned;
                s.notified = None;
            }
            None => {
                // About the term seen (an older one's end may be announced late).
                let Some(s) = self.holder.as_mut().filter(|s| observation.last_term >= s.term) else {
                    return;
                };
                if s.ended.is_some() {
                    return;
                }
                let ending = match observation.previous_end {
                    Some(EndReason::Released | EndReason::HandedOver) => Some(Ending::LetGo),
                    Some(EndReason::Expired | EndReason::Broken) => Some(Ending::Lapsed),
                    _ => None,
                };
                let learned = s.notified.unwrap_or(asked);
                match ending {
                    Some(ending) => s.ended = Some((ending, learned)),
                    None => {
                        s.notified.get_or_insert(learned);
                    }
                }
            }
        }
    }

    /// The store notified a change of the lease.
    pub(crate) fn notified(&mut self, now: Instant) {
        if let Some(s) = &mut self.holder
            && s.ended.is_none()
        {
            s.notified.get_or_insert(now);
        }
    }

    /// How the previous term ended and the histogram value, at this candidate's election at
    /// `now`; `won_at`: when the acquire that won was sent. `None` when this candidate saw no
    /// holder before it.
    pub(crate) fn ending(&self, now: Instant, won_at: Instant) -> Option<(Ending, Duration)> {
        let s = self.holder.as_ref()?;
        let (ending, learned) = match s.ended {
            Some(ended) => ended,
            None => {
                let learned = s.notified.unwrap_or(won_at);
                let deadline = s.deadline.or(s.alive_at.map(|a| a + s.ttl));
                let let_go = !s.orphaned && learned < deadline.unwrap_or(s.first_seen + s.ttl);
                (if let_go { Ending::LetGo } else { Ending::Lapsed }, learned)
            }
        };
        let since = match ending {
            Ending::LetGo => learned,
            Ending::Lapsed => s.alive_at.max(learned.checked_sub(s.ttl)).unwrap_or(s.first_seen),
        };
        Some((ending, now.saturating_duration_since(since)))
    }

    /// Records the previous term's end in its histogram (see [`PreviousHolder::ending`]).
    pub(crate) fn record(&self, lease: &str, now: Instant, won_at: Instant) {
        match self.ending(now, won_at) {
            Some((Ending::LetGo, took)) => {
                metrics::histogram!(HANDOVER_SECONDS, "lease" => lease.to_string()).record(took.as_secs_f64());
            }
            Some((Ending::Lapsed, took)) => {
                metrics::histogram!(FAILOVER_SECONDS, "lease" => lease.to_string()).record(took.as_secs_f64());
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CandidateId, Grant, LeaseName, Observation, Term};

    /// The repository README's metrics table names every label value each series can carry
    /// (it once missed `operation="hand_over"`).
    #[test]
    fn the_readme_table_lists_every_label() {
        let readme = include_str!("../../../README.md");
        let row = |series: &str| {
            readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{series}` |")))
                .unwrap_or_else(|| panic!("README has no row for {series}"))
        };
        for (series, labels) in [
            (REQUESTS, &OPERATIONS[..]),
            (REQUESTS, &OUTCOMES[..]),
            (STEP_DOWNS, &STEP_DOWN_REASONS[..]),
            (TROUBLE, &TROUBLE_REASONS[..]),
        ] {
            for label in labels {
                assert!(
                    row(series).contains(&format!("`{label}`")),
                    "{series}: `{label}` missing"
                );
            }
        }
    }

    #[test]
    fn outcomes_by_reply() {
        let lease = LeaseName::new("l").unwrap();
        let grant = Grant {
            lease: lease.clone(),
            holder: CandidateId::new("a").unwrap(),
            term: Term(1),
            ttl: std::time::Duration::from_secs(1),
            token: "v".into(),
        };
        let free = || Observation::free(lease.clone(), Term(1), None);
        let cases = [
            (Reply::Acquire(Ok(Acquired::Granted(grant.clone()))), "ok"),
            (Reply::Acquire(Ok(Acquired::Held(free()))), "lost_race"),
            (Reply::Renew(Ok(Renewed::Renewed(grant))), "ok"),
            (Reply::Renew(Ok(Renewed::Lost(free()))), "lost_race"),
            (Reply::Renew(Err(Error::unreachable("s", "down"))), "transient"),
            (Reply::Release(Ok(())), "ok"),
            (Reply::Release(Err(Error::corrupt("s", "l", "bad"))), "permanent"),
            (Reply::Inspect(Ok(free())), "ok"),
            (Reply::Withdraw(Err(Error::store("s", "denied"))), "permanent"),
            (
                Reply::Acquire(Err(Error::Timeout {
                    store: "s",
                    operation: "acquire",
                    after: std::time::Duration::from_secs(1),
                })),
                "transient",
            ),
        ];
        for (reply, expected) in cases {
            assert_eq!(outcome(&reply), expected, "{reply:?}");
            assert!(OUTCOMES.contains(&expected));
        }
        assert_eq!(trouble_reason(&Error::corrupt("s", "l", "bad")), "corrupt_record");
        assert_eq!(trouble_reason(&Error::unreachable("s", "down")), "unreachable");
    }

    #[test]
    fn step_down_reasons_are_the_variant_names() {
        let reasons = [
            DeposedReason::Superseded { by: None, term: None },
            DeposedReason::RenewFailed { last_error: None },
            DeposedReason::StoreError { error: "x".into() },
            DeposedReason::Stalled,
            DeposedReason::TooLittleTime {
                remaining: std::time::Duration::ZERO,
                required: std::time::Duration::ZERO,
            },
            DeposedReason::Resigned,
            DeposedReason::HandedOver {
                to: "b".parse().unwrap(),
            },
            DeposedReason::WorkFinished,
        ];
        let labels: Vec<&str> = reasons.iter().map(step_down_reason).collect();
        assert_eq!(labels, STEP_DOWN_REASONS);
        for (reason, label) in reasons.iter().zip(labels) {
            let variant = format!("{reason:?}");
            let camel: String = label.split('_').map(|w| w[..1].to_uppercase() + &w[1..]).collect();
            assert!(variant.starts_with(&camel), "{variant} vs {label}");
        }
    }
}
