use leasehold_core::Term;

/// Why a fenced write was refused, or why the fence could not be checked.
///
/// Every variant means: roll the transaction back (dropping it does), so that the write it
/// guards is not committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer leader has already written under `key`: `term` is lower than the highest term
    /// accepted so far. The writer has been deposed; its write must not happen.
    #[error("stale term {term} under fence key {key:?}: term {highest} has already been accepted there")]
    Stale {
        /// The fence key.
        key: String,
        /// The term the write was made under.
        term: Term,
        /// The highest term accepted under `key`.
        highest: Term,
    },

    /// `term` does not fit the table's signed 64-bit column (it is above `i64::MAX`). No lease
    /// store of leasehold hands out such terms (see the crate docs); the write is refused
    /// rather than stored wrapped around or rounded.
    #[error(
        "term {term} under fence key {key:?} is above {}, the largest term a fence table stores",
        i64::MAX
    )]
    TermOutOfRange {
        /// The fence key.
        key: String,
        /// The term.
        term: Term,
    },

    /// The table holds a value under `key` that is not a term (negative): something other than
    /// this crate wrote it. Reported when reading the stored term.
    #[error("the fence table holds {stored} under fence key {key:?}, which is not a term")]
    CorruptRecord {
        /// The fence key.
        key: String,
        /// What the table holds.
        stored: i64,
    },

    /// The fence row changed under the transaction's snapshot between the upsert and the
    /// read-back (only possible at isolation levels the database did not already refuse the
    /// upsert at). Retry the transaction.
    #[error("the fence row under {key:?} changed during the check of term {term}; retry the transaction")]
    Conflict {
        /// The fence key.
        key: String,
        /// The term.
        term: Term,
    },

    /// The table name given to `Fence::new` is not a plain (optionally schema-qualified)
    /// identifier.
    #[error("invalid fence table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// [`FenceKey::from_url`](crate::FenceKey::from_url) could not find a store identity in the
    /// URL. The URL itself is not quoted: it may hold a password.
    #[error("cannot build a fence key from the store URL: {reason}")]
    InvalidStoreUrl {
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The database failed (connection, lock timeout, serialization failure, missing table).
    /// Its `Display` names the database's message and SQLSTATE (code), on one line, without
    /// the server's source position that sqlx appends (`at line 664`).
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    #[error("fence database error: {}", describe(.0))]
    Database(#[from] sqlx::Error),
}

/// What a person reads about a database error: its message and code, one line.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn describe(error: &sqlx::Error) -> String {
    let text = match error {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_string(),
        },
        other => other.to_string(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
