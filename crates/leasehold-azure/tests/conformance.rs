//! The shared conformance suite against the Azurite emulator (`scripts/services up azurite`).
//! Every client is its own `AzureBlobStore`, as separate processes would be; faulty clients reach
//! the emulator through a `FaultProxy`. The minimum TTL is 15 s, so run the scenarios side by
//! side: `cargo test -p leasehold-azure --test conformance -- --test-threads 16`.

mod common;

use common::AzureBackend;

leasehold_conformance::conformance_tests!(azure, async { common::azurite().map(AzureBackend::shared) });
