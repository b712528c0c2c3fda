//! The shared conformance suite against a Postgres server (`LEASEHOLD_POSTGRES_URL`, or the
//! `target/services/env` file that `scripts/services up postgres` writes). Every client is its
//! own `PostgresStore` (its own lock session, pool and listener), as separate processes would be;
//! faulty clients reach the server through a TCP `FaultProxy`, so that faults hit the lock
//! session itself at the TCP level.

mod common;

use std::sync::Arc;

use leasehold_conformance::{Backend, require_server};

use common::PostgresBackend;

leasehold_conformance::conformance_tests!(postgres, async {
    let url = require_server("postgres", "LEASEHOLD_POSTGRES_URL")?;
    Some(Arc::new(PostgresBackend::new(url)) as Arc<dyn Backend>)
});
