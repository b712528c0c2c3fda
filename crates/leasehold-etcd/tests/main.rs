//! Every integration test of leasehold-etcd, in one binary (one link instead of one per file);
//! each module was a test target of its own. cargo-nextest runs each test in its own process,
//! so a module's tests are as isolated as before; filter by module: `test(/^restart::/)`.

mod announce;
mod common;
mod conformance;
mod ensemble;
mod footprint;
mod handover;
mod list;
mod lost_replies;
mod rate;
mod review_release;
mod secured;
mod shards;
mod turn;
mod wakeup;
