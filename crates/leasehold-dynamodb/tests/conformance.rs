//! The shared conformance suite against dynalite (`leasehold_conformance::backends::dynamodb`).
leasehold_conformance::suite!(dynamodb);
