//! The secured section of the suite against azurite-tls (`scripts/services up azurite-tls`):
//! HTTPS only, the emulator's certificate trusted through `ca=`; the account key, and a SAS that
//! may only read and list.
leasehold_conformance::secured!(azure_tls);
