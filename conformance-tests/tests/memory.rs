//! The whole conformance suite against `MemoryStore`, with server-side expiry and with expiry
//! observed by contenders.

leasehold_conformance::suite!(memory);
leasehold_conformance::suite!(memory_observed);
