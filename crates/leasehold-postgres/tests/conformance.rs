//! The shared conformance suite against the Postgres test server (`leasehold_conformance::backends::postgres`).
leasehold_conformance::suite!(postgres);
