//! The shared conformance suite against moto (`leasehold_conformance::backends::s3`).
leasehold_conformance::suite!(s3);
