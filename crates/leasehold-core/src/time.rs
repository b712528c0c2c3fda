//! Wall-clock times as stores keep them: Unix milliseconds. For the audit trail only (history,
//! `acquired_at`): no safety decision ever compares wall-clock times.

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
