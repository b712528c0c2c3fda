//! Table names, validated once and quoted for SQL.

use crate::FenceError;

/// `name` or `schema.name`, each part a plain identifier, as a quoted SQL name.
pub(crate) fn quoted_table_name(name: &str) -> Result<String, FenceError> {
    let invalid = |reason| FenceError::InvalidTableName {
        name: name.to_string(),
        reason,
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(invalid("at most one '.' (schema.table)"));
    }
    for part in &parts {
        if part.is_empty() {
            return Err(invalid("an empty identifier"));
        }
        if part.len() > 63 {
            return Err(invalid("an identifier longer than 63 bytes"));
        }
        if !part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            || !part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(invalid(
                "identifiers may only hold ASCII letters, digits and '_', and start with a letter or '_'",
            ));
        }
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_schema_qualified_names_are_quoted() {
        assert_eq!(quoted_table_name("leasehold_fence").unwrap(), "\"leasehold_fence\"");
        assert_eq!(quoted_table_name("app.Fence_2").unwrap(), "\"app\".\"Fence_2\"");
    }

    #[test]
    fn names_that_could_inject_sql_are_refused() {
        for name in [
            "",
            "a.b.c",
            ".a",
            "a.",
            "1a",
            "a b",
            "a\"; DROP TABLE x; --",
            "a-b",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(quoted_table_name(name), Err(FenceError::InvalidTableName { .. })),
                "{name:?} was accepted"
            );
        }
    }
}
