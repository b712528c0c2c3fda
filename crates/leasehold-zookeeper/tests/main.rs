//! Every integration test of leasehold-zookeeper, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod announcements;
mod common;
mod conformance;
mod cost;
mod ensemble;
mod group_cost;
mod handover;
mod list;
mod list_many;
mod queue;
mod renew_many;
mod secured;
mod session_expiry;
mod turn;
