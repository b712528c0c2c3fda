//! The secured section of the suite against redis-tls (`scripts/services up redis-tls`): TLS with
//! a private CA and client certificates, an ACL user with exactly the documented commands, keys
//! and channels.
leasehold_conformance::secured!(redis_tls);
