//! What every backend's records share: the record version, and the checks of a holder or a
//! history row read back from a store (garbage becomes [`Error::CorruptRecord`] naming the field).

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::types::{CandidateId, EndReason, HolderInfo, LeaseName, Term, Transition, random_u64};

/// A record version: 16 hex digits, new with every acquire and renew. A contender that sees the
/// same version for a full TTL knows the holder stopped renewing
/// ([`AcquireRequest::takeover`](crate::AcquireRequest::takeover)).
///
/// [`HolderInfo::version`] and [`Grant::token`](crate::Grant::token) stay `String`s (some
/// backends' tokens are not record versions); a backend writes `RecordVersion::random()` and
/// checks what it reads back with [`RecordVersion::parse`].
///
/// # Examples
///
/// ```
/// use leasehold_core::RecordVersion;
///
/// let version = RecordVersion::random();
/// assert_eq!(version.as_str().len(), 16);
/// assert_eq!(RecordVersion::parse(version.as_str()), Some(version.clone()));
/// assert_ne!(version, RecordVersion::random());
/// assert_eq!(RecordVersion::parse("00ff00ff00ff00ff").unwrap().to_string(), "00ff00ff00ff00ff");
/// assert_eq!(RecordVersion::parse("garbage"), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordVersion(String);

impl RecordVersion {
    /// A fresh random version.
    #[must_use]
    pub fn random() -> Self {
        RecordVersion(format!("{:016x}", random_u64()))
    }

    /// `text` if it is exactly 16 hex digits (kept as written: stores compare versions as text).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| RecordVersion(text.to_string()))
    }

    /// The version as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RecordVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RecordVersion {
    type Err = String;

    /// Like [`RecordVersion::parse`]; the error quotes at most 40 characters.
    fn from_str(text: &str) -> Result<Self, String> {
        RecordVersion::parse(text).ok_or_else(|| format!("{} is not 16 hex digits", quoted(text)))
    }
}

impl From<RecordVersion> for String {
    fn from(version: RecordVersion) -> String {
        version.0
    }
}

/// A number as a store keeps it: an integer column or attribute, or text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordNumber<'a> {
    /// An integer (SQL columns, decoded JSON).
    Integer(i128),
    /// Text that should hold a decimal integer (DynamoDB `N`, metadata, Redis hashes).
    Text(&'a str),
}

impl RecordNumber<'_> {
    /// The number, or what is wrong with it (quoting at most 40 characters).
    fn value(self) -> Result<i128, String> {
        match self {
            RecordNumber::Integer(value) => Ok(value),
            RecordNumber::Text(text) => text
                .parse::<i128>()
                .ok()
                .filter(|_| !text.starts_with('+'))
                .ok_or_else(|| format!("{} is not a number", quoted(text))),
        }
    }
}

macro_rules! record_number_from {
    ($($int:ty),*) => {$(
        impl From<$int> for RecordNumber<'_> {
            fn from(value: $int) -> Self {
                RecordNumber::Integer(i128::from(value))
            }
        }
    )*};
}
record_number_from!(i32, i64, u32, u64);

impl<'a> From<&'a str> for RecordNumber<'a> {
    fn from(text: &'a str) -> Self {
        RecordNumber::Text(text)
    }
}

impl<'a> From<&'a String> for RecordNumber<'a> {
    fn from(text: &'a String) -> Self {
        RecordNumber::Text(text)
    }
}

/// The holder fields of a record as read from a store, before any check: see
/// [`HolderInfo::from_record`].
#[derive(Clone, Copy, Debug)]
pub struct HolderFields<'a> {
    /// The holder's candidate id (`holder`).
    pub id: &'a str,
    /// The holder's term (`term`): at least 1.
    pub term: RecordNumber<'a>,
    /// The TTL in milliseconds (`ttl_ms`): within the store's TTL range.
    pub ttl_ms: RecordNumber<'a>,
    /// The record version (`version`): 16 hex digits ([`RecordVersion`]).
    pub version: &'a str,
    /// What [`HolderInfo::store_remaining`] should say.
    pub store_remaining: Option<Duration>,
}

impl HolderInfo {
    /// Checks the holder fields of a record a store returned, the same way on every backend.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptRecord`] naming the store, the lease and the field (`holder`, `term`,
    /// `ttl_ms` or `version`), quoting at most 40 characters of what was found.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{HolderFields, HolderInfo, LeaseName, Term};
    ///
    /// let lease: LeaseName = "jobs".parse()?;
    /// let ttls = Duration::from_millis(1)..=Duration::from_secs(3600);
    /// let fields = HolderFields {
    ///     id: "worker-1",
    ///     term: 7u64.into(),
    ///     ttl_ms: "2000".into(),
    ///     version: "00000000000000a1",
    ///     store_remaining: None,
    /// };
    /// let holder = HolderInfo::from_record("sqlite", &lease, fields, &ttls)?;
    /// assert_eq!((holder.term, holder.ttl), (Term(7), Duration::from_secs(2)));
    ///
    /// let err = HolderInfo::from_record("sqlite", &lease, HolderFields { term: (-1i64).into(), ..fields }, &ttls);
    /// assert_eq!(
    ///     err.unwrap_err().to_string(),
    ///     "sqlite store: corrupt or foreign record for lease jobs: term -1 is not a term (1 or more)"
    /// );
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn from_record(
        store: &'static str,
        lease: &LeaseName,
        fields: HolderFields<'_>,
        ttl_range: &RangeInclusive<Duration>,
    ) -> Result<HolderInfo> {
        let corrupt = |detail: String| Error::corrupt(store, lease, detail);
        let id = CandidateId::new(fields.id).map_err(|err| match err {
            Error::InvalidCandidateId { reason, .. } => corrupt(format!("holder {}: {reason}", quoted(fields.id))),
            other => corrupt(format!("holder: {other}")),
        })?;
        let term = fields.term.value().map_err(|why| corrupt(format!("term {why}")))?;
        let term = u64::try_from(term)
            .ok()
            .filter(|&term| term >= 1)
            .ok_or_else(|| corrupt(format!("term {term} is not a term (1 or more)")))?;
        let ttl_ms = fields.ttl_ms.value().map_err(|why| corrupt(format!("ttl_ms {why}")))?;
        let ttl = u64::try_from(ttl_ms)
            .ok()
            .map(Duration::from_millis)
            .filter(|ttl| ttl_range.contains(ttl))
            .ok_or_else(|| corrupt(format!("ttl_ms {ttl_ms} is outside {ttl_range:?}")))?;
        let version = RecordVersion::parse(fields.version)
            .ok_or_else(|| corrupt(format!("version {} is not 16 hex digits", quoted(fields.version))))?;
        Ok(HolderInfo {
            id,
            term: Term(term),
            ttl,
            version: version.into(),
            orphaned: false,
            reserved: false,
            store_remaining: fields.store_remaining,
        })
    }
}

/// `text` in quotes, at most 40 characters of it.
fn quoted(text: &str) -> String {
    let shown: String = text.chars().take(40).collect();
    if shown.len() < text.len() {
        format!("{shown:?}...")
    } else {
        format!("{shown:?}")
    }
}

/// The columns of one history row (a term) as read from a store, before any check: see
/// [`Transition::from_record`]. Times are Unix milliseconds; `None` is a NULL.
#[derive(Clone, Debug, Default)]
pub struct TransitionFields {
    /// `term`: 1 or more.
    pub term: Option<i64>,
    /// `holder`: a candidate id.
    pub holder: Option<String>,
    /// `acquired_at`, required.
    pub acquired_at_ms: Option<i64>,
    /// `ended_at`: set together with `end_reason`, or both NULL (the term has not ended).
    pub ended_at_ms: Option<i64>,
    /// `end_reason`: an [`EndReason`] as it displays.
    pub end_reason: Option<String>,
}

impl Transition {
    /// Checks the columns of a history row a store returned, the same way on every backend.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptRecord`] naming the store, the lease and the column (`history: term 7:
    /// holder is NULL`).
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::{EndReason, LeaseName, Term, Transition, TransitionFields};
    ///
    /// let lease: LeaseName = "jobs".parse()?;
    /// let fields = TransitionFields {
    ///     term: Some(7),
    ///     holder: Some("worker-1".into()),
    ///     acquired_at_ms: Some(1_700_000_000_000),
    ///     ended_at_ms: Some(1_700_000_002_000),
    ///     end_reason: Some("released".into()),
    /// };
    /// let transition = Transition::from_record("postgres", &lease, fields.clone())?;
    /// assert_eq!((transition.term, transition.ended.map(|e| e.1)), (Term(7), Some(EndReason::Released)));
    ///
    /// let err = Transition::from_record("postgres", &lease, TransitionFields { end_reason: None, ..fields });
    /// assert!(err.unwrap_err().to_string().ends_with("history: term 7: ended_at and end_reason must be both set or both NULL"));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn from_record(store: &'static str, lease: &LeaseName, fields: TransitionFields) -> Result<Transition> {
        let corrupt = |detail: String| Error::corrupt(store, lease, format!("history: {detail}"));
        let time = |millis: i64| u64::try_from(millis).ok().map(crate::time::from_unix_millis);
        let term = fields.term.ok_or_else(|| corrupt("term is NULL".into()))?;
        let term = u64::try_from(term)
            .ok()
            .filter(|&t| t > 0)
            .map(Term)
            .ok_or_else(|| corrupt(format!("term {term} is not a term")))?;
        let holder = fields
            .holder
            .ok_or_else(|| corrupt(format!("term {term}: holder is NULL")))?;
        let holder = CandidateId::new(holder).map_err(|e| corrupt(format!("term {term}: holder: {e}")))?;
        let acquired_at = fields
            .acquired_at_ms
            .ok_or_else(|| corrupt("acquired_at is NULL".into()))?;
        let acquired_at =
            time(acquired_at).ok_or_else(|| corrupt(format!("term {term}: acquired_at is before 1970")))?;
        let ended = match (fields.ended_at_ms, fields.end_reason) {
            (None, None) => None,
            (Some(at), Some(reason)) => {
                let at = time(at).ok_or_else(|| corrupt(format!("term {term}: ended_at is before 1970")))?;
                let reason = reason
                    .parse::<EndReason>()
                    .map_err(|e| corrupt(format!("term {term}: end_reason: {e}")))?;
                Some((at, reason))
            }
            _ => {
                return Err(corrupt(format!(
                    "term {term}: ended_at and end_reason must be both set or both NULL"
                )));
            }
        };
        Ok(Transition {
            term,
            holder,
            acquired_at,
            ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> HolderFields<'static> {
        HolderFields {
            id: "w-1",
            term: 3u64.into(),
            ttl_ms: 1000i64.into(),
            version: "0123456789abcdef",
            store_remaining: Some(Duration::from_millis(900)),
        }
    }

    fn check(fields: HolderFields<'_>) -> Result<HolderInfo> {
        let lease = LeaseName::new("l").unwrap();
        HolderInfo::from_record(
            "test",
            &lease,
            fields,
            &(Duration::from_millis(1)..=Duration::from_secs(60)),
        )
    }

    #[test]
    fn a_good_holder_is_read() {
        let holder = check(fields()).unwrap();
        assert_eq!(holder.id.as_str(), "w-1");
        assert_eq!(holder.term, Term(3));
        assert_eq!(holder.ttl, Duration::from_secs(1));
        assert_eq!(holder.version, "0123456789abcdef");
        assert_eq!(holder.store_remaining, Some(Duration::from_millis(900)));
        let text = HolderFields {
            term: "3".into(),
            ttl_ms: "1000".into(),
            ..fields()
        };
        assert_eq!(check(text).unwrap(), holder);
    }

    #[test]
    fn each_bad_field_is_named() {
        let long = "x".repeat(300);
        for (bad, expected) in [
            (HolderFields { id: "", ..fields() }, "holder \"\": must not be empty"),
            (
                HolderFields { id: &long, ..fields() },
                "holder \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"...: must be at most 256 bytes",
            ),
            (
                HolderFields {
                    term: 0u64.into(),
                    ..fields()
                },
                "term 0 is not a term (1 or more)",
            ),
            (
                HolderFields {
                    term: (-5i64).into(),
                    ..fields()
                },
                "term -5 is not a term (1 or more)",
            ),
            (
                HolderFields {
                    term: "x1".into(),
                    ..fields()
                },
                "term \"x1\" is not a number",
            ),
            (
                HolderFields {
                    term: "+1".into(),
                    ..fields()
                },
                "term \"+1\" is not a number",
            ),
            (
                HolderFields {
                    ttl_ms: 0i64.into(),
                    ..fields()
                },
                "ttl_ms 0 is outside 1ms..=60s",
            ),
            (
                HolderFields {
                    ttl_ms: (-1i64).into(),
                    ..fields()
                },
                "ttl_ms -1 is outside",
            ),
            (
                HolderFields {
                    ttl_ms: 60_001u64.into(),
                    ..fields()
                },
                "ttl_ms 60001 is outside",
            ),
            (
                HolderFields {
                    version: "abc",
                    ..fields()
                },
                "version \"abc\" is not 16 hex digits",
            ),
            (
                HolderFields {
                    version: "0123456789abcdeg",
                    ..fields()
                },
                "version \"0123456789abcdeg\" is not 16 hex digits",
            ),
        ] {
            let err = check(bad).unwrap_err();
            assert!(matches!(err, Error::CorruptRecord { store: "test", .. }), "{err}");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn record_versions_are_16_hex_digits() {
        let a = RecordVersion::random();
        assert!(a.as_str().bytes().all(|b| b.is_ascii_hexdigit()) && a.as_str().len() == 16);
        assert_eq!(a.to_string().parse::<RecordVersion>(), Ok(a.clone()));
        assert_eq!(
            RecordVersion::parse("ABCDEF0123456789").unwrap().as_str(),
            "ABCDEF0123456789"
        );
        for bad in [
            "",
            "0123456789abcde",
            "0123456789abcdef0",
            "0123456789abcdeZ",
            " 123456789abcdef",
        ] {
            assert_eq!(RecordVersion::parse(bad), None, "{bad:?}");
        }
        assert!(
            "nope"
                .parse::<RecordVersion>()
                .unwrap_err()
                .contains("not 16 hex digits")
        );
    }
}
