//! Wall-clock times as stores keep them: Unix milliseconds. For the audit trail only (history,
//! `acquired_at`): no safety decision ever compares wall-clock times. The engine's own
//! monotonic clock (tokio's, crate-private) is read here too.

use std::time::{Duration, SystemTime};

/// Milliseconds since the Unix epoch of `time`: 0 for a time before the epoch, `u64::MAX` for
/// one too far ahead to count.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use leasehold_core::time::unix_millis;
///
/// assert_eq!(unix_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(1_500)), 1_500);
/// assert_eq!(unix_millis(SystemTime::UNIX_EPOCH - Duration::from_secs(1)), 0);
/// ```
#[must_use]
pub fn unix_millis(time: SystemTime) -> u64 {
    let millis = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// The time `millis` milliseconds after the Unix epoch (the inverse of [`unix_millis`]).
///
/// A store that keeps times as signed integers converts first and treats a negative value as
/// a corrupt record: `u64::try_from(value).ok().map(from_unix_millis)`.
///
/// # Examples
///
/// ```
/// use std::time::SystemTime;
/// use leasehold_core::time::{from_unix_millis, unix_millis};
///
/// let now = SystemTime::now();
/// assert_eq!(unix_millis(from_unix_millis(unix_millis(now))), unix_millis(now));
/// assert_eq!(from_unix_millis(0), SystemTime::UNIX_EPOCH);
/// ```
#[must_use]
pub fn from_unix_millis(millis: u64) -> SystemTime {
    // Cannot overflow where `SystemTime` has 64-bit seconds (u64::MAX ms is 584 million years).
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A duration in whole milliseconds, saturating at `u64::MAX`: how stores keep TTLs (`ttl_ms`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::time::duration_millis;
///
/// assert_eq!(duration_millis(Duration::from_secs(2)), 2_000);
/// assert_eq!(duration_millis(Duration::MAX), u64::MAX);
/// ```
#[must_use]
pub fn duration_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A duration as people read it in an error or a log line, rounded to what matters: `0.4ms`,
/// `668ms`, `4.215s`, `12.3s`, `2m 5s`, `3h 20m` (Debug's `668.174553ms` says more than anyone
/// measured). The `leasehold` CLI prints durations the same way.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::time::Human;
///
/// assert_eq!(Human(Duration::from_nanos(668_174_553)).to_string(), "668ms");
/// assert_eq!(Human(Duration::from_micros(400)).to_string(), "0.4ms");
/// assert_eq!(Human(Duration::from_millis(4_215)).to_string(), "4.215s");
/// assert_eq!(Human(Duration::from_millis(12_340)).to_string(), "12.3s");
/// assert_eq!(Human(Duration::from_secs(125)).to_string(), "2m 5s");
/// assert_eq!(Human(Duration::from_secs(3 * 3600 + 1200)).to_string(), "3h 20m");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Human(pub Duration);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        let micros = d.as_micros();
        // Rounded, not truncated: 667.92 ms is 668 ms.
        let ms = (micros + 500) / 1000;
        let secs = d.as_secs();
        if micros < 1000 {
            return match micros {
                0 if d.is_zero() => f.write_str("0ms"),
                0..100 => f.write_str("<0.1ms"),
                _ => write!(f, "{}ms", trim(format!("{:.1}", micros as f64 / 1000.0))),
            };
        }
        if ms < 1000 {
            write!(f, "{ms}ms")
        } else if ms < 10_000 {
            write!(f, "{}s", trim(format!("{:.3}", ms as f64 / 1000.0)))
        } else if secs < 60 {
            write!(f, "{}s", trim(format!("{:.1}", d.as_secs_f64())))
        } else if secs < 3600 {
            match secs % 60 {
                0 => write!(f, "{}m", secs / 60),
                s => write!(f, "{}m {s}s", secs / 60),
            }
        } else {
            match (secs % 3600) / 60 {
                0 => write!(f, "{}h", secs / 3600),
                m => write!(f, "{}h {m}m", secs / 3600),
            }
        }
    }
}

/// `4.200` -> `4.2`, `5.000` -> `5`.
fn trim(number: String) -> String {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        number
    }
}

/// The current instant on tokio's clock, so that the engine runs under `tokio::time::pause`.
pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
