//! `leasehold handover LEASE --to ID`: a planned handover to a named successor, asked through the
//! store.
//!
//! The holder is asked through the lease `LEASE.handover` (`LeaseName::hand_over_requests`):
//! this command campaigns for it as `ID` and holds it, renewed by an `Elector` like any lease, so
//! it is renewed properly on every backend (session stores included). A leader that watches
//! requests (every `Elector` by default, hence every `leasehold run`) reads it once per renewal,
//! steps down, and once its work has returned hands the lease to `ID` (`LeaseStore::hand_over`):
//! the store keeps it reserved for `ID`, which takes it at its next notification or poll with a
//! higher term. This command watches the lease until `ID` holds such a term, and gives the
//! request back however it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{CandidateId, Elector, HolderInfo, Leader, LeaseName, LeaseStore, Observation, Term};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{Failure, NOBODY_HOLDS, NOT_HANDED_OVER};
use crate::inspect::{connect, lease_name};
use crate::output::{line, millis, short};

/// How often the lease is looked at while waiting for the successor: well under any store's
/// notification or poll interval, so the figure printed is the successor's, not ours.
const POLL: Duration = Duration::from_millis(25);
/// The shortest wait for the request lease (a store's round trips, a first campaign).
const CAMPAIGN_AT_LEAST: Duration = Duration::from_secs(2);

/// `leasehold handover LEASE --to ID [--within D]`. Returns the exit code.
pub(crate) async fn handover(
    url: &str,
    lease: &str,
    to: &str,
    within: Option<Duration>,
    json: bool,
) -> Result<i32, Failure> {
    let lease = lease_name(lease)?;
    let requests = lease.hand_over_requests().map_err(|_| {
        Failure::usage(format!(
            "cannot hand over lease {lease}: its name is too long for the request lease {lease}.handover \
             (lease names have at most 128 characters)"
        ))
    })?;
    let to = CandidateId::new(to).map_err(Failure::usage)?;
    let store = connect(url).await?;
    let started = Instant::now();
    let seen = store
        .inspect(&lease)
        .await
        .map_err(|e| Failure::store(format!("cannot read lease {lease}"), &e))?;
    let Some(holder) = seen.holder else {
        return Err(Failure::new(
            NOBODY_HOLDS,
            format!("cannot hand over lease {lease}: nobody holds it ({to} takes it by campaigning)"),
        ));
    };
    if holder.id == to && !holder.reserved {
        report_already(&lease, &holder, json);
        return Ok(0);
    }
    // Already handed over (by the leader itself, or an earlier request): to `to`, the command
    // only waits; to someone else, that handover is in progress.
    if holder.reserved && holder.id != to {
        return Err(Failure::new(
            NOT_HANDED_OVER,
            format!(
                "cannot hand over lease {lease} to {to}: it is being handed over to {} (term {} ended; reserved \
                 for {} until it takes the lease or the reservation's TTL passes)",
                holder.id, holder.term, holder.id
            ),
        ));
    }
    let within = within.unwrap_or(holder.ttl.saturating_mul(3));
    let deadline = started + within;
    // From here on there is a request to give back: a signal ends the wait, not the process.
    let mut signals = Signals::listen()?;
    let request = if holder.reserved {
        None
    } else {
        let caps = store.capabilities();
        let ttl = holder.ttl.clamp(*caps.ttl.start(), *caps.ttl.end());
        let asking = ask(&store, &lease, &requests, &to, ttl);
        tokio::select! {
            asked = asking => Some(asked?),
            number = signals.recv() => return Err(interrupted(number, &lease, false)),
        }
    };
    let asked = Instant::now();
    let watching = Watch {
        store: store.as_ref(),
        lease: &lease,
        requests: &requests,
        to: &to,
        from: &holder,
        within,
        deadline,
    };
    let outcome = tokio::select! {
        outcome = watching.wait(request.as_ref()) => outcome,
        number = signals.recv() => Err(interrupted(number, &lease, request.is_some())),
    };
    let took = asked.elapsed();
    // The request is given back however this ends: a leader that campaigns again must not find
    // it and hand over once more.
    if let Some(request) = request {
        give_back(request).await;
    }
    let term = outcome?;
    report_handed_over(&lease, &to, &holder, term, took, json);
    Ok(0)
}

/// Takes the request lease as `to`: a campaign with a timeout. Someone else's request there is
/// another handover in progress.
async fn ask(
    store: &Arc<dyn LeaseStore>,
    lease: &LeaseName,
    requests: &LeaseName,
    to: &CandidateId,
    ttl: Duration,
) -> Result<Leader, Failure> {
    let asking = format!("cannot ask for a handover of lease {lease}");
    let before = store
        .inspect(requests)
        .await
        .map_err(|e| Failure::store(format!("{asking}: cannot read {requests}"), &e))?;
    if let Some(other) = before.holder {
        return Err(in_progress(lease, requests, to, &other));
    }
    let elector = Elector::builder(store.clone(), requests.as_str())
        .ttl(ttl)
        .candidate_id(to.as_str())
        .build()
        .map_err(|e| Failure::store(format!("{asking}: invalid settings for {requests}"), &e))?;
    let limit = ttl.max(CAMPAIGN_AT_LEAST);
    match tokio::time::timeout(limit, elector.campaign()).await {
        Ok(Ok(leader)) => Ok(leader),
        Ok(Err(e)) => Err(Failure::store(format!("{asking}: campaigning for {requests}"), &e)),
        Err(_) => match store.inspect(requests).await {
            Ok(Observation {
                holder: Some(other), ..
            }) => Err(in_progress(lease, requests, to, &other)),
            Ok(_) => Err(Failure::runtime(format!(
                "{asking}: {requests} was not granted within {}",
                short(limit)
            ))),
            Err(e) => Err(Failure::store(
                format!("{asking}: {requests} was not granted within {}", short(limit)),
                &e,
            )),
        },
    }
}

fn in_progress(lease: &LeaseName, requests: &LeaseName, to: &CandidateId, other: &HolderInfo) -> Failure {
    Failure::new(
        NOT_HANDED_OVER,
        format!(
            "cannot hand over lease {lease} to {to}: another handover, to {}, is in progress ({requests} is held \
             at term {}; a request whose `leasehold handover` died lapses after its TTL, {})",
            other.id,
            other.term,
            short(other.ttl)
        ),
    )
}

/// Resigns the request lease, within a bound: a store that does not answer must not keep the
/// command from exiting (the request then lapses after its TTL).
async fn give_back(request: Leader) {
    let bound = request.remaining().max(CAMPAIGN_AT_LEAST);
    let _ = tokio::time::timeout(bound, request.resign()).await;
}

/// What the command waits for, and from what.
struct Watch<'a> {
    store: &'a dyn LeaseStore,
    lease: &'a LeaseName,
    requests: &'a LeaseName,
    to: &'a CandidateId,
    /// The holder when the command started.
    from: &'a HolderInfo,
    within: Duration,
    deadline: Instant,
}

/// Where the lease stands while the successor has not taken it.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    /// The successor holds a term above the one the command started from.
    Done(Term),
    /// Still on the way: the holder has not stepped down, or the lease is reserved or free.
    Waiting,
    /// Someone else took it, or it was handed to someone else.
    Failed(String),
}

impl Watch<'_> {
    /// Looks at the lease every [`POLL`] until the successor holds it at a higher term; the term.
    async fn wait(&self, request: Option<&Leader>) -> Result<Term, Failure> {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Observation> = None;
        let mut last_error: Option<leasehold::Error> = None;
        // Once the holder has been seen stepping down, the request has served its purpose.
        let mut acted = false;
        loop {
            let lost = async {
                match request {
                    Some(leader) if !acted => leader.cancelled().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = lost => return Err(self.request_lost(request)),
                () = tokio::time::sleep_until(self.deadline.into()) => {
                    return Err(self.timed_out(last.as_ref(), last_error.as_ref()));
                }
            }
            let read = tokio::time::timeout_at(self.deadline.into(), self.store.inspect(self.lease)).await;
            let Ok(read) = read else {
                return Err(self.timed_out(last.as_ref(), last_error.as_ref()));
            };
            match read {
                Ok(now) => {
                    last_error = None;
                    match self.progress(&now) {
                        Progress::Done(term) => return Ok(term),
                        Progress::Failed(why) => return Err(Failure::new(NOT_HANDED_OVER, why)),
                        Progress::Waiting => {}
                    }
                    acted |= !self.still_the_first_term(&now);
                    last = Some(now);
                }
                Err(e) => last_error = Some(e),
            }
        }
    }

    fn still_the_first_term(&self, now: &Observation) -> bool {
        now.holder
            .as_ref()
            .is_some_and(|h| h.id == self.from.id && h.term == self.from.term && !h.reserved)
    }

    /// Judges one look at the lease.
    fn progress(&self, now: &Observation) -> Progress {
        let (lease, to, from) = (self.lease, self.to, self.from);
        let Some(h) = &now.holder else {
            return Progress::Waiting; // released (a store that cannot reserve): `to` campaigns
        };
        if h.reserved {
            return if h.id == *to {
                Progress::Waiting
            } else {
                Progress::Failed(format!(
                    "lease {lease} was handed over to {} (term {} ended), not to {to}",
                    h.id, h.term
                ))
            };
        }
        if h.term <= from.term {
            return Progress::Waiting;
        }
        if h.id == *to {
            Progress::Done(h.term)
        } else if h.id == from.id {
            Progress::Failed(format!(
                "{} leads lease {lease} again at term {}: {to} did not take it",
                h.id, h.term
            ))
        } else {
            Progress::Failed(format!("{} took lease {lease} at term {}, not {to}", h.id, h.term))
        }
    }

    fn timed_out(&self, last: Option<&Observation>, error: Option<&leasehold::Error>) -> Failure {
        let (lease, to, from) = (self.lease, self.to, self.from);
        let within = short(self.within);
        if let Some(error) = error {
            return Failure::new(
                NOT_HANDED_OVER,
                format!("{to} did not take lease {lease} within {within}; the last look at it failed: {error}"),
            );
        }
        let message = match last.and_then(|o| o.holder.as_ref()) {
            Some(h) if h.id == from.id && h.term == from.term && !h.reserved => format!(
                "{} still leads lease {lease} at term {} after {within}: it did not act on the request in {} (a \
                 leader watches it once per renewal: `leasehold run` does, and an Elector built with \
                 hand_over_requests(true))",
                h.id, h.term, self.requests
            ),
            Some(h) if h.reserved => format!(
                "{to} did not take lease {lease} within {within}; the lease opens to everyone once the \
                 reservation's TTL ({}) has passed",
                short(h.ttl)
            ),
            _ => format!("{to} did not take lease {lease} within {within}; the lease opens to everyone"),
        };
        Failure::new(NOT_HANDED_OVER, message)
    }

    fn request_lost(&self, request: Option<&Leader>) -> Failure {
        let why = match request.map(|r| r.ensure_valid(Duration::ZERO)) {
            Some(Err(leasehold::Error::NotLeader { reason, .. })) => {
                format!(": {}", reason.strip_prefix("deposed: ").unwrap_or(&reason))
            }
            _ => String::new(),
        };
        Failure::runtime(format!(
            "lost the handover request {}{why} before {} stepped down from lease {}; nothing was handed over",
            self.requests, self.from.id, self.lease
        ))
    }
}

fn report_already(lease: &LeaseName, holder: &HolderInfo, json: bool) {
    if json {
        line(
            &json!({
                "lease": lease.as_str(),
                "to": holder.id.as_str(),
                "term": holder.term.0,
                "previous": null,
                "took_ms": 0,
                "already_leading": true,
            })
            .to_string(),
        );
    } else {
        line(&format!(
            "{} already leads {lease} at term {}: nothing to hand over",
            holder.id, holder.term
        ));
    }
}

fn report_handed_over(lease: &LeaseName, to: &CandidateId, from: &HolderInfo, term: Term, took: Duration, json: bool) {
    if json {
        line(
            &json!({
                "lease": lease.as_str(),
                "to": to.as_str(),
                "term": term.0,
                "previous": {"holder": from.id.as_str(), "term": from.term.0},
                "took_ms": millis(took),
                "already_leading": false,
            })
            .to_string(),
        );
    } else {
        line(&format!("{to} leads {lease} at term {term} after {}", short(took)));
    }
}

/// SIGINT, SIGTERM and SIGHUP end the wait (the request is given back first).
struct Signals(Vec<(i32, Signal)>);

impl Signals {
    fn listen() -> Result<Self, Failure> {
        let mut streams = Vec::new();
        for kind in [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()] {
            let stream = signal(kind).map_err(|e| Failure::runtime(format!("cannot handle signals: {e}")))?;
            streams.push((kind.as_raw_value(), stream));
        }
        Ok(Signals(streams))
    }

    /// The number of the next signal.
    async fn recv(&mut self) -> i32 {
        let arrivals = self.0.iter_mut().map(|(number, stream)| {
            let number = *number;
            Box::pin(async move {
                stream.recv().await;
                number
            })
        });
        futures::future::select_all(arrivals).await.0
    }
}

fn interrupted(number: i32, lease: &LeaseName, asked: bool) -> Failure {
    let name =
        nix::sys::signal::Signal::try_from(number).map_or_else(|_| format!("signal {number}"), |s| s.to_string());
    let after = if asked {
        "; the request was given back (a leader that already acted on it still hands the lease over)"
    } else {
        ""
    };
    Failure::new(
        128 + number,
        format!("received {name}: stopped waiting for lease {lease}{after}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(id: &str, term: u64, reserved: bool) -> HolderInfo {
        HolderInfo {
            id: CandidateId::new(id).unwrap(),
            term: Term(term),
            ttl: Duration::from_secs(2),
            version: "v".into(),
            orphaned: false,
            reserved,
            store_remaining: None,
        }
    }

    fn seen(holder: Option<HolderInfo>) -> Observation {
        let lease = LeaseName::new("jobs").unwrap();
        match holder {
            Some(h) => Observation {
                lease,
                last_term: h.term,
                holder: Some(h),
                previous_end: None,
            },
            None => Observation::free(lease, Term(4), None),
        }
    }

    #[test]
    fn only_the_successor_at_a_higher_term_ends_the_wait() {
        let store = leasehold::MemoryStore::new();
        let lease = LeaseName::new("jobs").unwrap();
        let requests = lease.hand_over_requests().unwrap();
        let to = CandidateId::new("web-2").unwrap();
        let from = holder("web-1", 4, false);
        let watch = Watch {
            store: &store,
            lease: &lease,
            requests: &requests,
            to: &to,
            from: &from,
            within: Duration::from_secs(6),
            deadline: Instant::now(),
        };
        let progress = |h| watch.progress(&seen(h));
        assert_eq!(progress(Some(holder("web-1", 4, false))), Progress::Waiting);
        assert_eq!(progress(Some(holder("web-2", 4, true))), Progress::Waiting);
        assert_eq!(progress(None), Progress::Waiting);
        assert_eq!(progress(Some(holder("web-2", 5, false))), Progress::Done(Term(5)));
        let Progress::Failed(why) = progress(Some(holder("web-3", 5, false))) else {
            panic!("another candidate took it")
        };
        assert_eq!(why, "web-3 took lease jobs at term 5, not web-2");
        let Progress::Failed(why) = progress(Some(holder("web-1", 6, false))) else {
            panic!("the old holder took it back")
        };
        assert_eq!(why, "web-1 leads lease jobs again at term 6: web-2 did not take it");
        let Progress::Failed(why) = progress(Some(holder("web-3", 4, true))) else {
            panic!("reserved for someone else")
        };
        assert!(why.contains("handed over to web-3"), "{why}");

        let timed_out = watch.timed_out(Some(&seen(Some(holder("web-2", 4, true)))), None);
        assert_eq!(timed_out.code, NOT_HANDED_OVER);
        assert!(
            timed_out
                .message()
                .starts_with("web-2 did not take lease jobs within 6s; the lease opens to everyone"),
            "{}",
            timed_out.message()
        );
        let ignored = watch.timed_out(Some(&seen(Some(holder("web-1", 4, false)))), None);
        assert!(
            ignored
                .message()
                .starts_with("web-1 still leads lease jobs at term 4 after 6s"),
            "{}",
            ignored.message()
        );
    }
}
