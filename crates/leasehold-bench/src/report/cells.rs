//! Table cells and verdicts, as every section of the report writes them.

use std::time::Duration;

use crate::plan::Outcome;

/// Backends whose store notifies waiting candidates (the "backends with notification").
pub(super) fn verdict(smoke: bool, met: bool) -> &'static str {
    match (smoke, met) {
        (true, _) => "n/a (smoke)",
        (false, true) => "met",
        (false, false) => "**not met**",
    }
}

pub(super) fn cell<T>(outcome: &Outcome<T>, f: impl FnOnce(&T) -> String) -> String {
    match outcome {
        Ok(v) => f(v),
        Err(e) => short(e),
    }
}

/// A second or later cell of a failed phase: empty (the first shows the error).
pub(super) fn once<T>(outcome: &Outcome<T>, f: impl FnOnce(&T) -> String) -> String {
    outcome.as_ref().map_or_else(|_| String::new(), f)
}

/// An error in a table cell: one line, no pipes, not too long.
pub(super) fn short(e: &str) -> String {
    let e = e.replace('|', "/").replace('\n', " ");
    if e.chars().count() > 110 {
        format!("{}…", e.chars().take(110).collect::<String>())
    } else {
        e
    }
}

pub(super) fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

pub(super) fn floor_cell(f: &Outcome<crate::floor::Floor>) -> String {
    match f {
        Ok(f) => format!("{:.2} / {:.2} x TTL", f.p50_ttl(), f.max_ttl()),
        Err(e) if e.starts_with("n/a") => "n/a".into(),
        Err(e) => short(e),
    }
}

/// The target of the `observe()` measure: one notification on loopback is a few ms; the next
/// poll would be `retry_every` (400 ms at TTL 2 s).
pub(super) const OBSERVE_TARGET: Duration = Duration::from_millis(50);

/// Met (`Some(true)`), not met, or not measured in this run (`None`).
pub(super) fn verdict_of(smoke: bool, met: Option<bool>) -> &'static str {
    match met {
        None => "not measured",
        Some(m) => verdict(smoke, m),
    }
}

pub(super) fn counts(c: &[usize]) -> String {
    c.iter().map(ToString::to_string).collect::<Vec<_>>().join("/")
}
