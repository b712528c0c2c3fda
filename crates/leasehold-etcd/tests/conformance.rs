//! The shared conformance suite against etcd (`scripts/services up etcd`). Every client is its
//! own `EtcdStore`, as separate processes would be; faulty clients go through a `FaultProxy`.

mod common;

use common::EtcdBackend;

leasehold_conformance::conformance_tests!(etcd, async {
    leasehold_conformance::require_server("etcd", "LEASEHOLD_ETCD_URL").map(|url| EtcdBackend::new(&url))
});
