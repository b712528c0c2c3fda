//! Every integration test of leasehold-fence, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod common;
mod postgres;
mod recipes;
mod sqlite;
