//! Deprecated: use [`config`](crate::config). Kept only while backends migrate; it goes away
//! once nothing uses it.

use std::time::Duration;

pub use crate::config::{percent_decode, redact_url, redact_url_and_user};

/// The old duration grammar (a bare number is milliseconds). Deprecated: use
/// [`config::parse_duration`](crate::config::parse_duration), which requires a unit.
pub fn parse_duration(value: &str) -> Option<Duration> {
    match crate::config::parse_duration(value) {
        Ok(duration) => Some(duration),
        Err(_) => value.parse::<u64>().ok().map(Duration::from_millis),
    }
}
