//! The shared conformance suite (`leasehold_conformance::backends::sqlite`: one lease file, every client its own store).
leasehold_conformance::suite!(sqlite);
