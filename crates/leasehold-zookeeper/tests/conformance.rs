//! The shared conformance suite against a real ZooKeeper server (`scripts/services up zookeeper`).
//! Every client is its own `ZookeeperStore` (its own sessions), as separate processes would be;
//! faulty clients reach the server through a `FaultProxy`.

mod common;

leasehold_conformance::conformance_tests!(zookeeper, async { common::single_server() });
