//! azure lease store (under construction).
