//! The secured section of the suite against mariadb-tls (`scripts/services up mariadb-tls`):
//! `ssl-mode=VERIFY_IDENTITY` with a client certificate (`REQUIRE X509`), a password, a user with
//! only the privileges the docs list.
leasehold_conformance::secured!(mysql_tls);
