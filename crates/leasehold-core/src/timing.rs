//! The election's timing, with its invariants.

use std::time::Duration;

use crate::error::{Error, Result};

/// Every timing rule of an election, in one validated place.
///
/// Build it with [`Timing::new`] (defaults derived from the TTL) and adjust fields; the engine
/// calls [`Timing::validate`] before it uses it.
///
/// The invariants, each a typed [`Error::InvalidConfig`] naming the field when violated:
///
/// - `ttl > 0`
/// - `0 <= drift < 0.5`
/// - `0 <= step_down_margin < ttl * (1 - drift)`
/// - `0 < renew_every` and `renew_every + step_down_margin < ttl * (1 - drift)`: at least one
///   renewal is attempted before the leader must step down
/// - `0 < retry_every <= ttl`, `0 <= jitter <= 1`
/// - `0 < request_timeout <= ttl`
/// - `stall_timeout`, when set, `> 0`; `lock_delay`, when set, `<= 60 s`
/// - `ttl` and `stall_timeout` at most [`Timing::MAX_DURATION`] (30 days), so no deadline
///   computed from them can overflow an `Instant`
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::Timing;
///
/// let timing = Timing::new(Duration::from_secs(9));
/// assert_eq!(timing.renew_every, Duration::from_secs(3));
/// timing.validate()?;
///
/// let bad = Timing { renew_every: Duration::from_secs(9), ..timing };
/// assert!(bad.validate().unwrap_err().to_string().contains("renew_every"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timing {
    /// How long the store keeps the lease after each acquire or renew. Default 10 s.
    pub ttl: Duration,
    /// How often the leader renews. Default `ttl / 3`.
    pub renew_every: Duration,
    /// How often a follower retries (polls) and how soon a failed request is retried.
    /// Default `ttl / 5`.
    pub retry_every: Duration,
    /// The fraction of `retry_every` added at random to each retry, so candidates do not move in
    /// lockstep. Default 0.2.
    pub jitter: PerMille,
    /// The bound on how much clock *rates* may differ between the holder, the store and the
    /// contenders. A grant is believed until `sent + ttl * (1 - drift)`. Default 1%.
    pub drift: PerMille,
    /// How long before `valid_until` the leader's work is cancelled when renewals fail.
    /// Default `ttl / 10`.
    pub step_down_margin: Duration,
    /// How long a store request may take before its outcome counts as unknown and is settled by
    /// reading the record back. Default `renew_every`.
    pub request_timeout: Duration,
    /// With a value: a leader whose work has not called
    /// [`Leader::heartbeat`](crate::Leader::heartbeat) for this long stops renewing and steps
    /// down. Default none.
    pub stall_timeout: Option<Duration>,
    /// With a value: after the previous holder ended uncleanly (expired, not released), wait
    /// this long before taking over, as Chubby does. Default none.
    pub lock_delay: Option<Duration>,
}

/// A fraction in thousandths (so [`Timing`] can be `Eq` and `Hash`): `PerMille(10)` is 1%.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PerMille(pub u32);

impl PerMille {
    /// The fraction as a float.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// Rounds a fraction to thousandths.
    pub fn from_f64(fraction: f64) -> Self {
        PerMille((fraction.clamp(0.0, 4_000_000.0) * 1000.0).round() as u32)
    }
}

impl Timing {
    /// The longest `ttl` and `stall_timeout` accepted: 30 days. Every other duration is bounded
    /// by the TTL (or by 60 s for `lock_delay`), so no deadline the engine computes overflows.
    pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

    /// Defaults derived from `ttl`.
    pub fn new(ttl: Duration) -> Self {
        let renew_every = ttl / 3;
        Timing {
            ttl,
            renew_every,
            retry_every: ttl / 5,
            jitter: PerMille(200),
            drift: PerMille(10),
            step_down_margin: ttl / 10,
            request_timeout: renew_every,
            stall_timeout: None,
            lock_delay: None,
        }
    }

    /// `ttl * (1 - drift)`: how long after sending a request the grant may be believed.
    pub fn believed_ttl(&self) -> Duration {
        self.ttl.mul_f64(1.0 - self.drift.as_f64())
    }

    /// The shortest pause before any retry, also a leader's last renewals before its step-down
    /// point: `retry_every / 4`. It bounds the requests an election sends to a store that fails
    /// at once (see docs/guarantees.md).
    pub fn retry_floor(&self) -> Duration {
        self.retry_every / 4
    }

    /// How long a candidate that just stepped down waits before campaigning again:
    /// `retry_every × (2 + jitter)`, longer than any follower's poll interval, so that a healthy
    /// follower takes over rather than the candidate that just failed.
    pub fn step_down_backoff(&self) -> Duration {
        self.retry_every.mul_f64(2.0 + self.jitter.as_f64())
    }

    /// Checks every invariant.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field that breaks one, with the allowed range.
    pub fn validate(&self) -> Result<()> {
        let zero = Duration::ZERO;
        if self.ttl == zero || self.ttl > Self::MAX_DURATION {
            return Err(Error::config("ttl", self.ttl, "greater than zero and at most 30 days"));
        }
        if self.drift >= PerMille(500) {
            return Err(Error::config("drift", self.drift.as_f64(), "0 <= drift < 0.5"));
        }
        let believed = self.believed_ttl();
        if self.step_down_margin >= believed {
            return Err(Error::config(
                "step_down_margin",
                self.step_down_margin,
                format!("less than ttl * (1 - drift) = {believed:?}"),
            ));
        }
        if self.renew_every == zero || self.renew_every.saturating_add(self.step_down_margin) >= believed {
            return Err(Error::config(
                "renew_every",
                self.renew_every,
                format!(
                    "greater than zero and less than ttl * (1 - drift) - step_down_margin = {:?}",
                    believed - self.step_down_margin
                ),
            ));
        }
        if self.retry_every == zero || self.retry_every > self.ttl {
            return Err(Error::config(
                "retry_every",
                self.retry_every,
                format!("0 < retry_every <= ttl ({:?})", self.ttl),
            ));
        }
        if self.jitter > PerMille(1000) {
            return Err(Error::config("jitter", self.jitter.as_f64(), "0 <= jitter <= 1"));
        }
        if self.request_timeout == zero || self.request_timeout > self.ttl {
            return Err(Error::config(
                "request_timeout",
                self.request_timeout,
                format!("0 < request_timeout <= ttl ({:?})", self.ttl),
            ));
        }
        if let Some(stall) = self.stall_timeout.filter(|s| *s == zero || *s > Self::MAX_DURATION) {
            return Err(Error::config(
                "stall_timeout",
                stall,
                "greater than zero and at most 30 days",
            ));
        }
        if let Some(delay) = self.lock_delay
            && delay > Duration::from_secs(60)
        {
            return Err(Error::config("lock_delay", delay, "at most 60s"));
        }
        Ok(())
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing::new(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(t: Timing) -> &'static str {
        match t.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_for_many_ttls() {
        for ms in [30, 100, 1_000, 10_000, 60_000, 3_600_000] {
            let t = Timing::new(Duration::from_millis(ms));
            t.validate().unwrap_or_else(|e| panic!("{ms}ms: {e}"));
            assert_eq!(t.renew_every, Duration::from_millis(ms) / 3);
        }
    }

    #[test]
    fn every_invariant_names_its_field() {
        let ok = Timing::new(Duration::from_secs(10));
        let s = Duration::from_secs;
        assert_eq!(
            field_of(Timing {
                ttl: Duration::ZERO,
                ..ok
            }),
            "ttl"
        );
        assert_eq!(
            field_of(Timing {
                drift: PerMille(500),
                ..ok
            }),
            "drift"
        );
        assert_eq!(
            field_of(Timing {
                step_down_margin: s(10),
                ..ok
            }),
            "step_down_margin"
        );
        assert_eq!(
            field_of(Timing {
                renew_every: s(10),
                ..ok
            }),
            "renew_every"
        );
        assert_eq!(
            field_of(Timing {
                renew_every: s(9),
                ..ok
            }),
            "renew_every"
        );
        assert_eq!(
            field_of(Timing {
                renew_every: Duration::ZERO,
                ..ok
            }),
            "renew_every"
        );
        assert_eq!(
            field_of(Timing {
                retry_every: Duration::ZERO,
                ..ok
            }),
            "retry_every"
        );
        assert_eq!(
            field_of(Timing {
                retry_every: s(11),
                ..ok
            }),
            "retry_every"
        );
        assert_eq!(
            field_of(Timing {
                jitter: PerMille(1001),
                ..ok
            }),
            "jitter"
        );
        assert_eq!(
            field_of(Timing {
                request_timeout: Duration::ZERO,
                ..ok
            }),
            "request_timeout"
        );
        assert_eq!(
            field_of(Timing {
                request_timeout: s(11),
                ..ok
            }),
            "request_timeout"
        );
        assert_eq!(
            field_of(Timing {
                stall_timeout: Some(Duration::ZERO),
                ..ok
            }),
            "stall_timeout"
        );
        assert_eq!(
            field_of(Timing {
                lock_delay: Some(s(61)),
                ..ok
            }),
            "lock_delay"
        );
        // Boundaries that are allowed.
        Timing {
            drift: PerMille(499),
            step_down_margin: Duration::ZERO,
            renew_every: s(4),
            ..ok
        }
        .validate()
        .unwrap();
        Timing {
            drift: PerMille(0),
            ..ok
        }
        .validate()
        .unwrap();
        Timing {
            retry_every: s(10),
            jitter: PerMille(1000),
            request_timeout: s(10),
            ..ok
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn error_message_states_the_range() {
        let t = Timing {
            drift: PerMille(700),
            ..Timing::default()
        };
        let msg = t.validate().unwrap_err().to_string();
        assert!(msg.contains("drift") && msg.contains("0.5"), "{msg}");
    }
}
