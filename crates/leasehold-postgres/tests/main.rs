//! Every integration test of leasehold-postgres, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod announce;
mod common;
mod conformance;
mod group_cost;
mod group_crash;
mod left_lock;
mod list;
mod queue;
mod quiet_logs;
mod relock;
mod renew_cost;
mod renew_many;
mod restart;
mod secured;
mod store;
mod thousand;
