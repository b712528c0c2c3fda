//! Shard records: the small compare-and-set records through which a lease group's members own
//! shards ([`LeaseStore::write_shard`](crate::LeaseStore::write_shard)).

use crate::error::{Error, Result};
use crate::types::LeaseName;

/// The longest value of a shard record, in bytes.
pub const MAX_SHARD_VALUE_LEN: usize = 512;

/// A shard record as a store keeps it: a name, the store's version of it, and the engine's
/// value. The store keeps shard records apart from lease records: [`list`](crate::LeaseStore::list)
/// and [`inspect`](crate::LeaseStore::inspect) never show one, and
/// [`shard_records`](crate::LeaseStore::shard_records) never shows a lease.
///
/// The value is the engine's own (a member of a lease group names itself, the term of its
/// member lease and the shard's fencing term in it); the store keeps it as it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardRecord {
    /// The record's name (a lease name: `{group}.s.{shard}`).
    pub name: LeaseName,
    /// The store's version of the record: it changes on every write and never comes back for
    /// the same name (a revision, a counter, a random token, an `ETag`).
    pub version: String,
    /// The value last written.
    pub value: String,
}

/// The answer to [`LeaseStore::write_shard`](crate::LeaseStore::write_shard).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShardWrite {
    /// Written: the record as it is now, with its new version.
    Written(ShardRecord),
    /// Not written, because the record did not have the expected version (or existed when none
    /// was expected): what the store holds instead (`None`: no record of that name).
    Conflict(Option<ShardRecord>),
}

/// Checks a shard record's value: 1 to [`MAX_SHARD_VALUE_LEN`] bytes, no control character.
/// The engine writes only such values; a store may check them with this before it writes.
///
/// ```
/// use leasehold_core::check_shard_value;
///
/// assert!(check_shard_value("leasehold1 7 12 worker-1").is_ok());
/// assert!(check_shard_value("two\nlines").is_err());
/// assert!(check_shard_value("").is_err());
/// ```
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming what is wrong.
pub fn check_shard_value(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_SHARD_VALUE_LEN {
        return Err(Error::InvalidConfig {
            field: "shard record value",
            value: format!("{} bytes", value.len()),
            allowed: format!("1 to {MAX_SHARD_VALUE_LEN} bytes"),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(Error::config("shard record value", value, "no control characters"));
    }
    Ok(())
}

/// A column of a store's row as read back: `Ok(None)` a NULL, `Err` what was found instead of
/// text (for [`ShardRecord::from_columns`]).
pub type ShardColumn = std::result::Result<Option<String>, String>;

impl ShardRecord {
    /// A shard record from the text columns of a row (`name`, `version`, `value`, as the SQL
    /// stores keep them), each checked: a lease name, a [`RecordVersion`](crate::RecordVersion)
    /// (16 hex digits), a value [`check_shard_value`] accepts.
    ///
    /// ```
    /// use leasehold_core::ShardRecord;
    ///
    /// let text = |s: &str| Ok(Some(s.to_string()));
    /// let record = ShardRecord::from_columns("sql", text("g.s.7"), text("00000000000000ff"), text("leasehold1 free 3"));
    /// assert_eq!(record.unwrap().version, "00000000000000ff");
    /// let nulled = ShardRecord::from_columns("sql", text("g.s.7"), Ok(None), text("leasehold1 free 3"));
    /// assert!(nulled.unwrap_err().to_string().contains("version is NULL"));
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::CorruptRecord`] naming the record and what is wrong with it.
    pub fn from_columns(
        store: &'static str,
        name: ShardColumn,
        version: ShardColumn,
        value: ShardColumn,
    ) -> Result<ShardRecord> {
        let name = name
            .map_err(|e| Error::corrupt(store, "(a shard record's name)", e))?
            .unwrap_or_default();
        let name = LeaseName::new(name.as_str()).map_err(|e| {
            Error::corrupt(
                store,
                &name,
                format!("the shard record's name is not a lease name: {e}"),
            )
        })?;
        let corrupt = |detail: String| Error::corrupt(store, &name, format!("shard record: {detail}"));
        let version = version
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("version is NULL".into()))?;
        if crate::RecordVersion::parse(&version).is_none() {
            return Err(corrupt(format!(
                "version {:?} is not 16 hex digits",
                version.chars().take(40).collect::<String>()
            )));
        }
        let value = value.map_err(corrupt)?.ok_or_else(|| corrupt("value is NULL".into()))?;
        check_shard_value(&value).map_err(|e| corrupt(format!("value: {e}")))?;
        Ok(ShardRecord { name, version, value })
    }
}

/// The least string above every string that starts with `prefix`, in code point order (the
/// order of UTF-8 bytes, and of SQL's binary collations): `prefix` with its last character that
/// can grow raised by one and the rest dropped. `None` when there is none (an empty prefix, or one
/// of `char::MAX` only): every string at or above `prefix` then starts with it. A store lists the
/// names with a prefix as the range `prefix..end`.
///
/// ```
/// use leasehold_core::prefix_end;
///
/// assert_eq!(prefix_end("g.s."), Some("g.s/".to_string()));
/// assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".to_string()));
/// assert_eq!(prefix_end(""), None);
/// ```
pub fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// `prefix` as a SQL `LIKE` pattern escaped with `!` (`... LIKE ? ESCAPE '!'`): it matches every
/// name that starts with `prefix`, and nothing else.
///
/// ```
/// assert_eq!(leasehold_core::like_prefix("a_b%c!"), "a!_b!%c!!%");
/// ```
pub fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '!') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

#[cfg(test)]
mod tests {
    use super::{ShardRecord, prefix_end};

    #[test]
    fn the_end_of_a_prefix_is_above_every_name_with_it() {
        assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        for name in ["g.s.", "g.s.00", "g.s.zz", "g.s.~"] {
            assert!(name >= "g.s." && name < prefix_end("g.s.").unwrap().as_str(), "{name}");
        }
        assert!("g.t" >= prefix_end("g.s.").unwrap().as_str());
    }

    #[test]
    fn columns_that_are_not_a_record_are_corrupt() {
        let text = |s: &str| Ok(Some(s.to_string()));
        let version = "00000000000000ff";
        let value = "leasehold1 free 3";
        for (name, version, value, says) in [
            (text("not a name!"), text(version), text(value), "not a lease name"),
            (Err("an INTEGER".into()), text(version), text(value), "an INTEGER"),
            (text("g.s.1"), text("12"), text(value), "not 16 hex digits"),
            (text("g.s.1"), text(version), Ok(None), "value is NULL"),
            (text("g.s.1"), text(version), text("two\nlines"), "control"),
        ] {
            let error = ShardRecord::from_columns("sql", name, version, value).unwrap_err();
            assert!(error.to_string().contains(says), "{error} should say {says}");
        }
    }
}
