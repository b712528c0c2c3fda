//! Every integration test of leasehold-sqlite, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod changes;
mod conformance;
mod group_cost;
mod list;
mod multiprocess;
mod open;
mod renew_many;
mod shared_watch;
mod store;
mod transitions;
mod unconfirmed_renewal;
