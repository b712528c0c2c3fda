//! The shared conformance suite against the etcd test server (`leasehold_conformance::backends::etcd`).
leasehold_conformance::suite!(etcd);
