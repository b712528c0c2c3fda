//! `status`, `history`, `watch` and `break`: looking at leases without campaigning.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use leasehold::{CandidateId, LeaseName, LeaseStore, Notifications, Observation, Term, Transition};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::Failure;
use crate::output::{line, millis, short, table, unix_ms, wall};

/// Validates a lease name (exit 2 before anything is connected).
pub(crate) fn lease_name(name: &str) -> Result<LeaseName, Failure> {
    LeaseName::new(name).map_err(Failure::usage)
}

/// Connects to the store at `url`.
pub(crate) async fn connect(url: &str) -> Result<Arc<dyn LeaseStore>, Failure> {
    leasehold::connect(url).await.map_err(|e| Failure::connect(url, &e))
}

/// `leasehold status LEASE...`, or `leasehold status [--prefix P]`: every lease of the store (whose
/// name starts with `P`).
pub(crate) async fn status(url: &str, leases: &[String], prefix: Option<&str>, json: bool) -> Result<i32, Failure> {
    let leases = leases.iter().map(|l| lease_name(l)).collect::<Result<Vec<_>, _>>()?;
    let store = connect(url).await?;
    let seen = if leases.is_empty() {
        let prefix = prefix.unwrap_or_default();
        let listed = store.list(prefix).await.map_err(|e| list_failure(prefix, &e))?;
        if listed.is_empty() && !json {
            match prefix {
                "" => line("no leases in the store"),
                prefix => line(&format!("no leases starting with {prefix:?}")),
            }
            return Ok(0);
        }
        listed
    } else {
        let mut seen = Vec::new();
        for lease in &leases {
            let observation = store
                .inspect(lease)
                .await
                .map_err(|e| Failure::store(format!("cannot read lease {lease}"), &e))?;
            seen.push(observation);
        }
        seen
    };
    if json {
        let rows: Vec<Value> = seen.iter().map(status_json).collect();
        line(&Value::Array(rows).to_string());
    } else {
        let rows: Vec<Vec<String>> = seen.iter().map(status_row).collect();
        line(&table(&["LEASE", "STATE", "HOLDER", "TERM", "TTL", "TIME LEFT"], &rows));
    }
    Ok(0)
}

/// A failed listing: one line, exit 4 for a store that cannot list (with what to do instead).
fn list_failure(prefix: &str, error: &leasehold::Error) -> Failure {
    let what = if prefix.is_empty() {
        "cannot list the leases".to_string()
    } else {
        format!("cannot list the leases starting with {prefix:?}")
    };
    match error {
        leasehold::Error::Unsupported { .. } => {
            Failure::store(format!("{what} (name them instead: leasehold status LEASE...)"), error)
        }
        _ => Failure::store(what, error),
    }
}

pub(crate) fn status_row(o: &Observation) -> Vec<String> {
    match &o.holder {
        Some(h) => vec![
            o.lease.to_string(),
            if h.reserved { "reserved" } else { "held" }.into(),
            h.id.to_string(),
            h.term.to_string(),
            short(h.ttl),
            h.store_remaining.map_or_else(|| "unknown".into(), short),
        ],
        None => vec![
            o.lease.to_string(),
            match o.previous_end {
                Some(end) => format!("free ({end})"),
                None if o.last_term == Term(0) => "free (never held)".into(),
                None => "free".into(),
            },
            "-".into(),
            if o.last_term == Term(0) {
                "-".into()
            } else {
                o.last_term.to_string()
            },
            "-".into(),
            "-".into(),
        ],
    }
}

pub(crate) fn status_json(o: &Observation) -> Value {
    let holder = o.holder.as_ref();
    json!({
        "lease": o.lease.as_str(),
        "state": match holder {
            Some(h) if h.reserved => "reserved",
            Some(_) => "held",
            None => "free",
        },
        "reserved": holder.is_some_and(|h| h.reserved),
        "holder": holder.map(|h| h.id.as_str()),
        "term": holder.map(|h| h.term.0),
        "last_term": o.last_term.0.max(holder.map_or(0, |h| h.term.0)),
        "ttl_ms": holder.map(|h| millis(h.ttl)),
        "store_remaining_ms": holder.and_then(|h| h.store_remaining).map(millis),
        "previous_end": o.previous_end.map(|e| e.to_string()),
    })
}

/// `leasehold history LEASE [--limit N]`.
pub(crate) async fn history(url: &str, lease: &str, limit: usize, json: bool) -> Result<i32, Failure> {
    let lease = lease_name(lease)?;
    let store = connect(url).await?;
    let terms = store
        .history(&lease, limit)
        .await
        .map_err(|e| Failure::store(format!("cannot read the history of lease {lease}"), &e))?;
    if json {
        line(&Value::Array(terms.iter().map(transition_json).collect()).to_string());
    } else if terms.is_empty() {
        line(&format!("no recorded terms for lease {lease}"));
    } else {
        let rows: Vec<Vec<String>> = terms
            .iter()
            .map(|t| {
                let (ended, how) = match t.ended {
                    Some((at, how)) => (wall(at), how.to_string()),
                    None => ("-".into(), "holding".into()),
                };
                vec![
                    t.term.to_string(),
                    t.holder.to_string(),
                    wall(t.acquired_at),
                    ended,
                    how,
                ]
            })
            .collect();
        line(&table(&["TERM", "HOLDER", "ACQUIRED", "ENDED", "HOW"], &rows));
    }
    Ok(0)
}

fn transition_json(t: &Transition) -> Value {
    json!({
        "term": t.term.0,
        "holder": t.holder.as_str(),
        "acquired_at": wall(t.acquired_at),
        "acquired_at_ms": unix_ms(t.acquired_at),
        "ended_at": t.ended.map(|(at, _)| wall(at)),
        "ended_at_ms": t.ended.map(|(at, _)| unix_ms(at)),
        "end_reason": t.ended.map(|(_, how)| how.to_string()),
    })
}

/// `leasehold break LEASE`.
pub(crate) async fn break_lease(url: &str, lease: &str, json: bool) -> Result<i32, Failure> {
    let lease = lease_name(lease)?;
    let store = connect(url).await?;
    // Only to say whom it concerned; the break itself is one conditional write in the store.
    let holder = store.inspect(&lease).await.ok().and_then(|o| o.holder);
    let broken = store
        .break_lease(&lease)
        .await
        .map_err(|e| Failure::store(format!("cannot break lease {lease}"), &e))?;
    let holder = holder.filter(|h| Some(h.term) == broken).map(|h| h.id);
    if json {
        line(
            &json!({
                "lease": lease.as_str(),
                "broken_term": broken.map(|t| t.0),
                "holder": holder.as_ref().map(CandidateId::as_str),
            })
            .to_string(),
        );
    } else {
        match (broken, holder) {
            (Some(term), Some(holder)) => line(&format!("broke lease {lease}: term {term} of {holder} ended")),
            (Some(term), None) => line(&format!("broke lease {lease}: term {term} ended")),
            (None, _) => line(&format!("lease {lease} is free: nothing to break")),
        }
    }
    Ok(0)
}

/// `leasehold watch LEASE`: a line whenever the holder or term changes, until SIGINT/SIGTERM.
pub(crate) async fn watch(url: &str, lease: &str, interval: Option<Duration>, json: bool) -> Result<i32, Failure> {
    let lease = lease_name(lease)?;
    let store = connect(url).await?;
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return Err(Failure::runtime("cannot handle signals"));
    };
    let watcher = CandidateId::new(format!("leasehold-watch-{}", std::process::id()))
        .map_err(|e| Failure::runtime(format!("cannot name the watcher: {e}")))?;
    let mut changes = match store.capabilities().notifications {
        Notifications::None => None,
        _ => store.changes(&lease, &watcher).await.ok().flatten(),
    };
    let mut last: Option<Observation> = None;
    let mut last_error: Option<String> = None;
    loop {
        match store.inspect(&lease).await {
            Ok(now) => {
                if last_error.take().is_some() {
                    eprintln!("leasehold: watch {lease}: the store answers again");
                }
                if last.as_ref().is_none_or(|before| key(before) != key(&now)) {
                    let ended = match &last {
                        Some(before) => how_it_ended(store.as_ref(), before, &now).await,
                        None => None,
                    };
                    report_change(&now, last.as_ref(), ended, json);
                    last = Some(now);
                }
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("leasehold: watch {lease}: {text}");
                    last_error = Some(text);
                }
            }
        }
        let every = interval.unwrap_or_else(|| match last.as_ref().and_then(|o| o.holder.as_ref()) {
            Some(h) => (h.ttl / 5).clamp(Duration::from_millis(100), Duration::from_secs(2)),
            None => Duration::from_secs(1),
        });
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            change = async { changes.as_mut().expect("guarded").next().await }, if changes.is_some() => {
                if change.is_none() {
                    changes = None; // notifications ended: keep polling
                }
            }
            _ = interrupt.recv() => return Ok(0),
            _ = terminate.recv() => return Ok(0),
        }
    }
}

/// What identifies a leadership: the holder and its term (the last term while free), and
/// whether it is only reserved for that holder.
fn key(o: &Observation) -> (Option<&CandidateId>, Term, bool) {
    match &o.holder {
        Some(h) => (Some(&h.id), h.term, h.reserved),
        None => (None, o.last_term, false),
    }
}

/// How the term that `before` showed ended, looked up in the history (`None` if unknown).
async fn how_it_ended(store: &dyn LeaseStore, before: &Observation, now: &Observation) -> Option<String> {
    let term = before.holder.as_ref()?.term;
    if now.holder.is_none()
        && let Some(end) = now.previous_end
    {
        return Some(end.to_string());
    }
    let recent = store.history(&now.lease, 16).await.ok()?;
    let (_, how) = recent.iter().find(|t| t.term == term)?.ended?;
    Some(how.to_string())
}

fn report_change(now: &Observation, before: Option<&Observation>, ended: Option<String>, json: bool) {
    let at = SystemTime::now();
    // A reservation's term is the previous holder's, whose end the line about it already told.
    let previous = before.and_then(|b| b.holder.as_ref()).filter(|p| !p.reserved);
    if json {
        line(
            &json!({
                "at": wall(at),
                "at_ms": unix_ms(at),
                "lease": now.lease.as_str(),
                "holder": now.holder.as_ref().map(|h| h.id.as_str()),
                "term": now.holder.as_ref().map(|h| h.term.0),
                "reserved": now.holder.as_ref().is_some_and(|h| h.reserved),
                "last_term": now.last_term.0.max(now.holder.as_ref().map_or(0, |h| h.term.0)),
                "previous": previous.map(|p| json!({
                    "holder": p.id.as_str(),
                    "term": p.term.0,
                    "ended": ended,
                })),
            })
            .to_string(),
        );
        return;
    }
    let state = match &now.holder {
        Some(h) if h.reserved => format!("term {} handed over: reserved for {}", h.term, h.id),
        Some(h) => format!("term {} held by {}", h.term, h.id),
        None if now.last_term == Term(0) => "free (never held)".to_string(),
        None => "free".to_string(),
    };
    let previous = match (previous, ended) {
        (Some(p), Some(how)) => format!(" (term {} of {} {how})", p.term, p.id),
        (Some(p), None) => format!(" (term {} of {} ended)", p.term, p.id),
        (None, _) => String::new(),
    };
    line(&format!("{}  {}  {state}{previous}", wall(at), now.lease));
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{EndReason, HolderInfo};

    fn held(term: u64) -> Observation {
        Observation {
            lease: LeaseName::new("jobs").unwrap(),
            holder: Some(HolderInfo {
                id: CandidateId::new("host-1").unwrap(),
                term: Term(term),
                ttl: Duration::from_secs(10),
                version: "v".into(),
                orphaned: false,
                reserved: false,
                store_remaining: None,
            }),
            last_term: Term(term),
            previous_end: None,
        }
    }

    #[test]
    fn status_shows_unknown_time_left_without_a_store_clock() {
        let row = status_row(&held(7));
        assert_eq!(row, ["jobs", "held", "host-1", "7", "10s", "unknown"]);
        let free = Observation::free(LeaseName::new("jobs").unwrap(), Term(7), Some(EndReason::Released));
        assert_eq!(status_row(&free)[1], "free (released)");
        let v = status_json(&free);
        assert_eq!(v["state"], "free");
        assert_eq!(v["holder"], Value::Null);
        assert_eq!(v["last_term"], 7);
    }

    #[test]
    fn a_reserved_lease_says_so() {
        let mut reserved = held(7);
        if let Some(h) = reserved.holder.as_mut() {
            h.reserved = true;
        }
        assert_eq!(status_row(&reserved)[1], "reserved");
        let v = status_json(&reserved);
        assert_eq!(
            (v["state"].as_str(), v["reserved"].as_bool()),
            (Some("reserved"), Some(true))
        );
        assert_eq!(status_json(&held(7))["reserved"], false);
        assert_ne!(key(&held(7)), key(&reserved));
    }

    #[test]
    fn a_store_that_cannot_list_says_so_in_one_line() {
        let unsupported = leasehold::Error::Unsupported {
            store: "sqlite",
            operation: "list",
        };
        let failure = list_failure("", &unsupported);
        assert_eq!(failure.code, crate::exit::UNSUPPORTED);
        assert_eq!(
            failure.message(),
            "cannot list the leases (name them instead: leasehold status LEASE...): sqlite store does \
             not support list"
        );
        let failure = list_failure("jobs.", &leasehold::Error::unreachable("redis", "connection refused"));
        assert_eq!(failure.code, crate::exit::UNREACHABLE);
        assert!(
            failure
                .message()
                .starts_with("cannot list the leases starting with \"jobs.\": "),
            "{}",
            failure.message()
        );
    }

    #[test]
    fn a_change_is_a_new_holder_or_term() {
        assert_eq!(key(&held(3)), key(&held(3)));
        assert_ne!(key(&held(3)), key(&held(4)));
    }
}
