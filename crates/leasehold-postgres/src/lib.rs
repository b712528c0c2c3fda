//! postgres lease store (under construction).
