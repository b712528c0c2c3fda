//! The shared conformance suite against the MySQL/MariaDB test server (`leasehold_conformance::backends::mysql`).
leasehold_conformance::suite!(mysql);
