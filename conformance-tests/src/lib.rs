//! The shared conformance suite (under construction).
