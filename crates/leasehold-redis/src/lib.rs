//! redis lease store (under construction).
