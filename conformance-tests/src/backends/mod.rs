//! The in-memory backends of the suite. Each store's own backend (how to reach its test server,
//! how to vandalise a record, which URLs carry secrets) is in that store's `tests/conformance.rs`,
//! named in [`suite!`](crate::suite): `leasehold_conformance::suite!(postgres, postgres());`.
//! Kept out of this crate so that a backend's tests link that backend only (a workspace build
//! unifies the features of this crate: with a factory per feature, every test binary linked every
//! backend).

pub use crate::backend::{MemoryBackend, memory, memory_observed};
