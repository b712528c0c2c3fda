//! The names every other module speaks of: [`LeaseName`], [`CandidateId`] and [`Term`], below
//! the error type that carries them. Their methods and fallible conversions (the constructors
//! validate, and answer that error) are in `types.rs`, hence the `pub(crate)` fields.

use std::fmt;

/// A validated lease name: 1 to 128 ASCII letters, digits, `-`, `_` or `.`, not starting with
/// `.` or `-`.
///
/// The same rule holds on every backend, so a name that works on SQLite works on etcd, ZooKeeper,
/// DynamoDB and Azure (where it becomes a key, a znode, a partition key or a blob name).
///
/// # Examples
///
/// ```
/// use leasehold_core::LeaseName;
///
/// let name: LeaseName = "invoice-scheduler".parse()?;
/// assert_eq!(name.as_str(), "invoice-scheduler");
/// assert!("".parse::<LeaseName>().is_err());
/// assert!("a/b".parse::<LeaseName>().is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "String", into = "String")
)]
pub struct LeaseName(pub(crate) String);

impl From<LeaseName> for String {
    fn from(name: LeaseName) -> String {
        name.0
    }
}

impl fmt::Display for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Who is campaigning: a validated id of 1 to 256 bytes without control characters.
///
/// Every candidate of one lease must have its own id. [`CandidateId::generate`] makes one from
/// the host name, the process id and a random suffix.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "String", into = "String")
)]
pub struct CandidateId(pub(crate) String);

impl From<CandidateId> for String {
    fn from(id: CandidateId) -> String {
        id.0
    }
}

impl fmt::Display for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A fencing token: every grant of a lease has a term strictly greater than every earlier grant
/// of the same lease, never reused, also across store restarts.
///
/// Pass it to downstream systems with every write so that they can reject a deposed leader's
/// late writes (`reject if term < highest term seen`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Term(pub u64);

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
