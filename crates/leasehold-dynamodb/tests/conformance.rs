//! The shared conformance suite against a DynamoDB server (dynalite from
//! `scripts/services up dynalite`). Every client is its own `DynamoDbStore` (its own SDK client
//! and connections), as separate processes would be; faulty clients reach the server through a
//! `FaultProxy`.

mod common;

use common::DynamoBackend;

leasehold_conformance::conformance_tests!(dynamodb, async {
    leasehold_conformance::require_server("dynalite", "LEASEHOLD_DYNAMODB_URL").map(DynamoBackend::shared)
});
