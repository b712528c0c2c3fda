//! The whole conformance suite against `MemoryStore`, with server-side expiry and with expiry
//! observed by contenders.

use leasehold_conformance::{MemoryBackend, conformance_tests};

conformance_tests!(memory, async { MemoryBackend::server_clock() });
conformance_tests!(memory_observed, async { MemoryBackend::observed_expiry() });
