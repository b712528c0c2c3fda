//! The secured section of the suite against postgres-tls (`scripts/services up postgres-tls`):
//! `sslmode=verify-full` with a client certificate, scram-sha-256, a role owning only its schema.
leasehold_conformance::secured!(postgres_tls);
