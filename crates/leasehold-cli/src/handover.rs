//! `leasehold handover LEASE --to ID`: a planned handover to a named successor, asked through the
//! store with the library's [`HandOverRequest`] (which any service can use the same way).
//!
//! The holder is asked through the lease `LEASE.handover` (`LeaseName::hand_over_requests`):
//! this command campaigns for it as `ID` and holds it, renewed by an `Elector` like any lease, so
//! it is renewed properly on every backend (session stores included). A leader that watches
//! requests (every `leasehold run`; an `Elector` only when built with `hand_over_requests(true)`)
//! reads it once per renewal, steps down, and once its work has returned hands the lease to `ID`
//! (`LeaseStore::hand_over`): the store keeps it reserved for `ID`, which takes it at its next
//! notification or poll with a higher term. Where the store lists its candidates (etcd,
//! ZooKeeper, Redis), `ID` must be among them before anything is asked. This command watches the
//! lease until `ID` holds such a term, and gives the request back however it ends.

use std::time::Duration;

use leasehold::{Asked, CandidateId, HandOverError, HandOverRequest, HolderInfo, LeaseName, TargetCheck, Term};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{Failure, NOBODY_HOLDS, NOT_HANDED_OVER, RUNTIME, USAGE, code_of};
use crate::inspect::{connect, lease_name};
use crate::output::{line, millis, short};

/// `leasehold handover LEASE --to ID [--within D]`. Returns the exit code.
pub(crate) async fn handover(
    url: &str,
    lease: &str,
    to: &str,
    within: Option<Duration>,
    json: bool,
) -> Result<i32, Failure> {
    let lease = lease_name(lease)?;
    let to = CandidateId::new(to).map_err(Failure::usage)?;
    let store = connect(url).await?;
    let mut request = HandOverRequest::new(store, lease.clone(), to.clone());
    if let Some(within) = within {
        request = request.within(within);
    }
    // From here on there may be a request to give back: a signal ends the wait, not the process.
    let mut signals = Signals::listen()?;
    let asked = tokio::select! {
        asked = request.ask() => asked.map_err(failure)?,
        number = signals.recv() => return Err(interrupted(number, &lease, false)),
    };
    let pending = match asked {
        Asked::AlreadyLeading(holder) => {
            report_already(&lease, &holder, json);
            return Ok(0);
        }
        Asked::Pending(pending) => pending,
    };
    let asked_at = std::time::Instant::now();
    let holds_request = pending.holds_request();
    let outcome = tokio::select! {
        outcome = pending.wait() => outcome.map_err(failure),
        number = signals.recv() => Err(interrupted(number, &lease, holds_request)),
    };
    let took = asked_at.elapsed();
    let (from, target) = (pending.from().clone(), pending.target());
    // The request is given back however this ends: a leader that campaigns again must not find
    // it and hand over once more.
    pending.finish().await;
    let term = outcome?;
    report_handed_over(&lease, &to, &from, term, took, target, json);
    Ok(0)
}

/// The exit code and line of a failed request.
fn failure(error: HandOverError) -> Failure {
    let code = match &error {
        HandOverError::NameTooLong { .. } => USAGE,
        HandOverError::NobodyHolds { .. } => NOBODY_HOLDS,
        HandOverError::Store { source, .. } => code_of(source),
        HandOverError::RequestNotGranted { .. } | HandOverError::RequestLost { .. } => RUNTIME,
        _ => NOT_HANDED_OVER,
    };
    Failure::new(code, error)
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
                "target_checked": true,
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

fn report_handed_over(
    lease: &LeaseName,
    to: &CandidateId,
    from: &HolderInfo,
    term: Term,
    took: Duration,
    target: TargetCheck,
    json: bool,
) {
    if json {
        line(
            &json!({
                "lease": lease.as_str(),
                "to": to.as_str(),
                "term": term.0,
                "previous": {"holder": from.id.as_str(), "term": from.term.0},
                "took_ms": millis(took),
                "already_leading": false,
                "target_checked": target == TargetCheck::Campaigning,
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
