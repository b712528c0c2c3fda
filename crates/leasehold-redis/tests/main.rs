//! Every integration test of leasehold-redis, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod common;
mod conformance;
mod expiry;
mod group_cost;
mod herd;
mod left_state;
mod list;
mod queue;
mod renew_many;
mod restart;
mod secured;
mod shards;
mod store;
mod thousand;
