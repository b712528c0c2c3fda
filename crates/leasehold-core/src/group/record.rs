//! What a shard record says ([`Claim`]) and how it is written in the store's value
//! ([`ShardRecord::value`](crate::ShardRecord)).
//!
//! - `leasehold1 owned {term} {member_term} {owner}`: `owner` owns the shard at fencing term
//!   `term` for as long as it leads its member lease at `member_term` (the owner id last: it may
//!   hold spaces);
//! - `leasehold1 free {term}`: released by its last owner at `term`; anyone may claim it.
//!
//! Every write of a new owner (a claim, a move, a re-claim under a new member term) writes a
//! term one higher than the record's: the shard's fencing term strictly increases on every change
//! of owner.

use crate::error::{Error, Result};
use crate::shard_record::ShardRecord;
use crate::types::{CandidateId, Term};

const PREFIX: &str = "leasehold1 ";

/// What a shard record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Owned by `owner` at `term`, while `owner` leads its member lease at `member_term`.
    Owned {
        term: Term,
        member_term: Term,
        owner: CandidateId,
    },
    /// Released at `term`.
    Free { term: Term },
}

impl Claim {
    /// The shard's fencing term as the record has it.
    pub(crate) fn term(&self) -> Term {
        match self {
            Claim::Owned { term, .. } | Claim::Free { term } => *term,
        }
    }

    /// The record's value.
    pub(crate) fn value(&self) -> String {
        match self {
            Claim::Owned {
                term,
                member_term,
                owner,
            } => format!("{PREFIX}owned {} {} {owner}", term.0, member_term.0),
            Claim::Free { term } => format!("{PREFIX}free {}", term.0),
        }
    }

    /// Reads a record's value.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptRecord`] naming the record when the value is not one of leasehold's.
    pub(crate) fn parse(store: &'static str, record: &ShardRecord) -> Result<Claim> {
        let bad = |detail: &str| Error::corrupt(store, &record.name, format!("shard record: {detail}"));
        let rest = record
            .value
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("not a leasehold shard record"))?;
        let number = |text: Option<&str>, what: &str| {
            text.and_then(|t| t.parse::<u64>().ok())
                .map(Term)
                .ok_or_else(|| bad(what))
        };
        if let Some(rest) = rest.strip_prefix("owned ") {
            let mut fields = rest.splitn(3, ' ');
            let term = number(fields.next(), "no term")?;
            let member_term = number(fields.next(), "no member term")?;
            let owner = fields
                .next()
                .and_then(|o| CandidateId::new(o).ok())
                .ok_or_else(|| bad("no owner"))?;
            Ok(Claim::Owned {
                term,
                member_term,
                owner,
            })
        } else if let Some(rest) = rest.strip_prefix("free ") {
            Ok(Claim::Free {
                term: number(Some(rest), "no term")?,
            })
        } else {
            Err(bad("neither owned nor free"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LeaseName;

    fn record(value: &str) -> ShardRecord {
        ShardRecord {
            name: LeaseName::new("g.s.1").unwrap(),
            version: "1".into(),
            value: value.into(),
        }
    }

    #[test]
    fn values_read_back_as_written() {
        let owned = Claim::Owned {
            term: Term(7),
            member_term: Term(3),
            owner: CandidateId::new("host 1 (eu)").unwrap(),
        };
        assert_eq!(owned.value(), "leasehold1 owned 7 3 host 1 (eu)");
        assert_eq!(Claim::parse("m", &record(&owned.value())).unwrap(), owned);
        let free = Claim::Free { term: Term(8) };
        assert_eq!(Claim::parse("m", &record(&free.value())).unwrap(), free);
        assert!(crate::check_shard_value(&owned.value()).is_ok());
    }

    #[test]
    fn other_values_are_corrupt_records() {
        for bad in [
            "",
            "leasehold1 owned 7",
            "leasehold1 owned x 3 a",
            "leasehold1 gone 1",
            "other",
        ] {
            let err = Claim::parse("m", &record(bad)).unwrap_err();
            assert!(matches!(err, Error::CorruptRecord { .. }), "{bad:?}: {err}");
            assert!(err.to_string().contains("g.s.1"), "{err}");
        }
    }
}
