//! dynamodb lease store (under construction).
