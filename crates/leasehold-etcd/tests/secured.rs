//! The secured section of the suite against etcd-tls (`scripts/services up etcd-tls`): TLS with
//! client certificates, RBAC with a role limited to the key prefix.
leasehold_conformance::secured!(etcd_tls);
