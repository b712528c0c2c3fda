//! The data that flows between the engine and a store.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
pub use crate::ids::{CandidateId, LeaseName, Term};

/// The longest lease name, in bytes. Every backend accepts names up to this length.
pub const MAX_LEASE_NAME_LEN: usize = 128;

/// The longest candidate id, in bytes.
pub const MAX_CANDIDATE_ID_LEN: usize = 256;

impl LeaseName {
    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] saying what is wrong.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("must not be empty")
        } else if name.len() > MAX_LEASE_NAME_LEN {
            Some("must be at most 128 bytes")
        } else if name.starts_with(['.', '-']) {
            Some("must not start with '.' or '-'")
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            Some("may only contain ASCII letters, digits, '-', '_' and '.'")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidLeaseName { name, reason }),
            None => Ok(LeaseName(name)),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The lease through which anyone asks this lease's holder to hand it over
    /// (`{name}.handover`): whoever holds it names the successor by its own candidate id, and
    /// the leader (see [`ElectorBuilder::hand_over_requests`](crate::ElectorBuilder::hand_over_requests))
    /// steps down and hands the lease to it. `leasehold handover` holds it while it waits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLeaseName`] when the name is too long to add the suffix.
    ///
    /// ```
    /// use leasehold_core::LeaseName;
    ///
    /// let lease: LeaseName = "jobs".parse()?;
    /// assert_eq!(lease.hand_over_requests()?.as_str(), "jobs.handover");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn hand_over_requests(&self) -> Result<LeaseName> {
        LeaseName::new(format!("{}.handover", self.0))
    }
}

impl FromStr for LeaseName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LeaseName::new(s)
    }
}

impl TryFrom<String> for LeaseName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LeaseName::new(s)
    }
}

impl TryFrom<&str> for LeaseName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LeaseName::new(s)
    }
}

impl CandidateId {
    /// Validates `id`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCandidateId`] saying what is wrong.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("must not be empty")
        } else if id.len() > MAX_CANDIDATE_ID_LEN {
            Some("must be at most 256 bytes")
        } else if id.chars().any(char::is_control) {
            Some("must not contain control characters")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidCandidateId { id, reason }),
            None => Ok(CandidateId(id)),
        }
    }

    /// A fresh id, `host-pid-xxxxxx`, unique per call.
    pub fn generate() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && !h.chars().any(char::is_control))
            .unwrap_or_else(|| "host".to_string());
        CandidateId(format!(
            "{host}-{}-{:06x}",
            std::process::id(),
            random_u64() & 0xff_ffff
        ))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A non-cryptographic random number (for ids, record versions and jitter). Not part of the
/// API a user needs: for record versions use [`RecordVersion::random`](crate::RecordVersion::random),
/// for candidate ids [`CandidateId::generate`].
#[doc(hidden)]
pub fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

impl TryFrom<String> for CandidateId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        CandidateId::new(s)
    }
}

impl FromStr for CandidateId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CandidateId::new(s)
    }
}

/// The store's word that `holder` holds `lease` at `term`.
///
/// A grant says nothing about *how long* the local process may believe it: that is decided by
/// the engine, from when the request was sent (see [`Leader::valid_until`](crate::Leader::valid_until)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The lease.
    pub lease: LeaseName,
    /// The holder.
    pub holder: CandidateId,
    /// The fencing term of this grant.
    pub term: Term,
    /// The TTL the store keeps the lease for after each acquire or renew, counted from when the
    /// request was sent.
    pub ttl: Duration,
    /// Backend-specific proof of holding (a record version, a lease id, a znode path). Opaque to
    /// the engine.
    pub token: String,
}

/// The current holder of a lease, as a store reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HolderInfo {
    /// Who holds the lease.
    pub id: CandidateId,
    /// The holder's term.
    pub term: Term,
    /// The TTL the holder asked for.
    #[cfg_attr(feature = "serde", serde(with = "serde_time::seconds"))]
    pub ttl: Duration,
    /// The record version: it changes with every acquire and renew, so a contender that sees it
    /// unchanged for a full TTL knows the holder stopped renewing. Also the holder's grant token.
    pub version: String,
    /// How long the store itself will keep the lease from the moment it answered, where the
    /// store has a clock (Redis PTTL, Azure). `None` where expiry is observed by contenders.
    #[cfg_attr(feature = "serde", serde(with = "serde_time::seconds_opt"))]
    pub store_remaining: Option<Duration>,
    /// Nothing on the store's side will end this record any more: its holder's session is over
    /// but the record stays (Postgres: the row outlived its holder's connection, whose advisory
    /// lock is free). Like every record of an [`Expiry::ObservedByContenders`] store, it may be
    /// replaced (with [`AcquireRequest::takeover`]) once a contender has seen this version
    /// unchanged for its TTL on its own clock: the holder may still believe it until then.
    #[cfg_attr(feature = "serde", serde(default))]
    pub orphaned: bool,
    /// The previous holder handed the lease to this candidate
    /// ([`LeaseStore::hand_over`](crate::LeaseStore::hand_over)), which has not taken it yet:
    /// only this candidate's acquire is granted (with a new, higher term); the term shown is the
    /// previous holder's. If the candidate does not take it, the reservation ends like a holder
    /// that stopped renewing, after its TTL.
    #[cfg_attr(feature = "serde", serde(default))]
    pub reserved: bool,
}

/// How the previous term of a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum EndReason {
    /// The holder released it.
    Released,
    /// The holder stopped renewing and the lease expired or was taken over after its TTL.
    Expired,
    /// An operator broke the lease.
    Broken,
    /// The holder handed it to a named successor.
    HandedOver,
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Released => "released",
            EndReason::Expired => "expired",
            EndReason::Broken => "broken",
            EndReason::HandedOver => "handed_over",
        })
    }
}

impl FromStr for EndReason {
    type Err = String;

    /// Parses what [`Display`](fmt::Display) writes: `released`, `expired`, `broken` or
    /// `handed_over`. The
    /// error quotes at most 40 characters of what was found.
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "released" => Ok(EndReason::Released),
            "expired" => Ok(EndReason::Expired),
            "broken" => Ok(EndReason::Broken),
            "handed_over" => Ok(EndReason::HandedOver),
            other => {
                let shown: String = other.chars().take(40).collect();
                Err(format!(
                    "unknown end reason {shown:?} (expected released, expired, broken or handed_over)"
                ))
            }
        }
    }
}

/// What a store reports about a lease.
///
/// With the `serde` feature it serializes (durations as seconds, a number: `2.5`; the older
/// `{"secs":2,"nanos":500000000}` form is still read).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Observation {
    /// The lease.
    pub lease: LeaseName,
    /// The current holder, or `None` when the lease is free.
    pub holder: Option<HolderInfo>,
    /// The highest term ever granted for this lease (0 if never).
    pub last_term: Term,
    /// When the lease is free: how the last term ended, if the store knows.
    pub previous_end: Option<EndReason>,
}

impl Observation {
    /// An observation of a lease nobody holds.
    pub fn free(lease: LeaseName, last_term: Term, previous_end: Option<EndReason>) -> Self {
        Observation {
            lease,
            holder: None,
            last_term,
            previous_end,
        }
    }
}

/// A request to acquire a lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AcquireRequest {
    /// The lease.
    pub lease: LeaseName,
    /// The candidate asking.
    pub candidate: CandidateId,
    /// The TTL to hold it for.
    pub ttl: Duration,
    /// `Some(version)`: the caller has seen this record version unchanged for a full TTL on its
    /// own monotonic clock, so the holder is gone: replace it if (and only if) the record still
    /// has this version. Only stores whose expiry is [`Expiry::ObservedByContenders`] use it.
    pub takeover: Option<String>,
}

/// The answer to [`LeaseStore::acquire`](crate::LeaseStore::acquire).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Acquired {
    /// The lease is ours.
    Granted(Grant),
    /// Someone else holds it (or, for FIFO stores, is ahead of us in the queue).
    Held(Observation),
}

/// The answer to [`LeaseStore::renew`](crate::LeaseStore::renew).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Renewed {
    /// Still ours, with the (possibly updated) grant.
    Renewed(Grant),
    /// The store proves we no longer hold it.
    Lost(Observation),
}

/// Where the expiry of a silent holder is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Expiry {
    /// The store's own clock expires the lease (Redis PX, Azure blob leases, etcd leases).
    ServerClock,
    /// The store ends the holder's session when the client goes silent (ZooKeeper sessions,
    /// Postgres connections).
    ServerSession,
    /// The store has no clock: a contender takes over after it has seen the same record version
    /// unchanged for a full TTL on its own monotonic clock (DynamoDB, SQLite).
    ObservedByContenders,
}

/// Which changes a store notifies candidates of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Notifications {
    /// None: candidates poll.
    None,
    /// Releases (and takeovers), but not expiry: candidates poll for expiry.
    Release,
    /// Releases and expiry: idle candidates need not poll at all.
    ReleaseAndExpiry,
}

/// What a store's [announcements](crate::LeaseStore::announcements) cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Announces {
    /// The store does not announce.
    None,
    /// New holders: every grant.
    Grants,
    /// Every grant and every renewal (a new record version of the same holder and term): a
    /// follower sees each version as it is written without reading the lease, so it needs no
    /// polls to time an expiry it observes itself, nor to have seen a holder's last renewal when
    /// the holder's session ends.
    GrantsAndRenewals,
}

/// What a store can do. The engine and the conformance suite read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The TTLs the store accepts.
    pub ttl: RangeInclusive<Duration>,
    /// Where expiry is enforced.
    pub expiry: Expiry,
    /// Which changes are notified.
    pub notifications: Notifications,
    /// What [announcements](crate::LeaseStore::announcements) cover.
    pub announces: Announces,
    /// Whether candidates queue in FIFO order (the longest waiter is next).
    pub fifo: bool,
}

impl Capabilities {
    /// Checks `ttl` against [`Capabilities::ttl`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] naming the store and the range.
    pub fn check_ttl(&self, store: &'static str, ttl: Duration) -> Result<()> {
        if self.ttl.contains(&ttl) {
            Ok(())
        } else {
            Err(Error::InvalidTtl {
                store,
                ttl,
                min: *self.ttl.start(),
                max: *self.ttl.end(),
            })
        }
    }
}

/// One term in a lease's history: who led, from when, and how it ended.
///
/// Times are wall-clock times for the audit trail only; no safety decision ever compares them.
/// With the `serde` feature they serialize as RFC 3339 strings, `ended` as
/// `["2026-11-23T21:50:01Z", "released"]` or `null`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Transition {
    /// The term.
    pub term: Term,
    /// Who held it.
    pub holder: CandidateId,
    /// When it was granted, by the clock of whoever wrote the record.
    #[cfg_attr(feature = "serde", serde(with = "serde_time::system"))]
    pub acquired_at: SystemTime,
    /// When and how it ended, if it has.
    #[cfg_attr(feature = "serde", serde(with = "serde_time::ended"))]
    pub ended: Option<(SystemTime, EndReason)>,
}

/// The wall-clock time of an `Instant` of this process: the wall clock now, minus how long ago
/// the instant was (plus, for an instant in the future). For logs only.
pub(crate) fn wall_clock(instant: std::time::Instant) -> SystemTime {
    let (now, wall) = (crate::time::now(), SystemTime::now());
    match now.checked_duration_since(instant) {
        Some(ago) => wall.checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH),
        None => wall + instant.duration_since(now),
    }
}

/// The serde forms of times: RFC 3339 strings (UTC, nanoseconds).
#[cfg(feature = "serde")]
pub(crate) mod serde_time {
    use std::time::{Instant, SystemTime};

    use serde::{Deserialize, Deserializer, Serializer};

    fn parse<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)
    }

    /// A `SystemTime` as an RFC 3339 string.
    pub(crate) mod system {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(time: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(&humantime::format_rfc3339_nanos(*time))
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
            parse(deserializer)
        }
    }

    /// An `Instant` of this process as the RFC 3339 wall-clock time it corresponds to; read back
    /// onto this process's monotonic clock (a time before the clock's origin reads as the origin).
    pub(crate) mod instant {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(instant: &Instant, serializer: S) -> Result<S::Ok, S::Error> {
            system::serialize(&crate::types::wall_clock(*instant), serializer)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Instant, D::Error> {
            let time = parse(deserializer)?;
            let (now, wall) = (crate::time::now(), SystemTime::now());
            Ok(match wall.duration_since(time) {
                Ok(ago) => now.checked_sub(ago).unwrap_or(now),
                Err(ahead) => now + ahead.duration(),
            })
        }
    }

    /// A `Duration` as seconds, a JSON number (`0.006927537`), as Prometheus and most tools
    /// count them; serde's own `{"secs":..,"nanos":..}` form is read too.
    pub(crate) mod seconds {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        #[derive(Deserialize)]
        #[serde(untagged)]
        pub(super) enum Secs {
            Number(f64),
            Parts { secs: u64, nanos: u32 },
        }

        impl Secs {
            pub(super) fn duration<E: serde::de::Error>(self) -> Result<Duration, E> {
                match self {
                    Secs::Number(s) => Duration::try_from_secs_f64(s).map_err(E::custom),
                    Secs::Parts { secs, nanos } => Ok(Duration::new(secs, nanos)),
                }
            }
        }

        pub(crate) fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_f64(duration.as_secs_f64())
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
            Secs::deserialize(deserializer)?.duration()
        }
    }

    /// An `Option<Duration>` as seconds or `null` (see [`seconds`]).
    pub(crate) mod seconds_opt {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
            match duration {
                Some(d) => serializer.serialize_some(&d.as_secs_f64()),
                None => serializer.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
            Option::<super::seconds::Secs>::deserialize(deserializer)?
                .map(super::seconds::Secs::duration)
                .transpose()
        }
    }

    /// [`Transition::ended`](crate::Transition::ended): `[time, reason]` or `null`.
    pub(crate) mod ended {
        use serde::Serialize;

        use super::*;
        use crate::types::EndReason;

        #[derive(Serialize, Deserialize)]
        struct Ended(#[serde(with = "system")] SystemTime, EndReason);

        pub(crate) fn serialize<S: Serializer>(
            ended: &Option<(SystemTime, EndReason)>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            ended.map(|(at, reason)| Ended(at, reason)).serialize(serializer)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<(SystemTime, EndReason)>, D::Error> {
            Ok(Option::<Ended>::deserialize(deserializer)?.map(|Ended(at, reason)| (at, reason)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names() {
        for ok in ["a", "invoice-scheduler", "A.b_c-9", &"x".repeat(128)] {
            assert!(LeaseName::new(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            (&"x".repeat(129) as &str, "128"),
            ("a/b", "letters"),
            ("a\nb", "letters"),
            (".hidden", "start"),
            ("-x", "start"),
            ("é", "letters"),
        ] {
            let err = LeaseName::new(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn candidate_ids() {
        assert!(CandidateId::new("host-1 (eu)").is_ok());
        assert!(CandidateId::new("").is_err());
        assert!(CandidateId::new("a\u{7}").is_err());
        assert!(CandidateId::new("x".repeat(257)).is_err());
        let (a, b) = (CandidateId::generate(), CandidateId::generate());
        assert_ne!(a, b);
        assert!(CandidateId::new(a.as_str()).is_ok());
    }

    #[test]
    fn ttl_range() {
        let caps = Capabilities {
            ttl: Duration::from_secs(15)..=Duration::from_secs(60),
            expiry: Expiry::ServerClock,
            notifications: Notifications::None,
            announces: Announces::None,
            fifo: false,
        };
        assert!(caps.check_ttl("azure", Duration::from_secs(15)).is_ok());
        let err = caps.check_ttl("azure", Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }));
        assert!(err.to_string().contains("15s..=60s"), "{err}");
    }
}
