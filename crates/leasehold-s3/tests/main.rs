//! Every integration test of leasehold-s3, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod conformance;
mod probe;
mod shard_listing;
