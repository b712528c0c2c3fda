//! The shared conformance suite against Azurite, every scenario at once: Azure's 15 s minimum
//! lease makes each take minutes (`leasehold_conformance::backends::azure`).
leasehold_conformance::suite!(azure, concurrent);
