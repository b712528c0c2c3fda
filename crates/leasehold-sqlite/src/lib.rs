//! SQLite lease store (under construction).
