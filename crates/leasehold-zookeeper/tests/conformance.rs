//! The shared conformance suite against the ZooKeeper test server (`leasehold_conformance::backends::zookeeper`).
leasehold_conformance::suite!(zookeeper);
