//! Every integration test of leasehold-azure, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod azurite_rate;
mod common;
mod conformance;
mod renewal_stall;
mod secured;
mod store;
