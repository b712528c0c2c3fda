//! The secured section of the suite against azurite-tls (`scripts/services up azurite-tls`):
//! HTTPS only, the emulator's certificate trusted through `ca=`; the account key, and a SAS that
//! may only read and list.

use std::sync::Arc;

use leasehold_azure::AzureBlobStore;
use leasehold_core::LeaseStore;

use leasehold_conformance::secured::{Refusal, Secured, secured_backend};
use leasehold_conformance::{configured_url, require_server};

/// The azurite-tls server (`LEASEHOLD_AZURE_TLS_URL`, container `leasehold-tests`).
fn azure_tls() -> Option<Secured> {
    let url = require_server("azurite-tls", "LEASEHOLD_AZURE_TLS_URL")?;
    let pki = configured_url("LEASEHOLD_PKI_DIR")?;
    let key = configured_url("LEASEHOLD_AZURE_TLS_PASSWORD")?;
    let readonly = configured_url("LEASEHOLD_AZURE_TLS_READONLY_URL")?;
    let escaped_key: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
    // The read-only SAS's signature is a secret too, as the URL escapes it and decoded.
    let sig = readonly
        .split(['?', '&'])
        .find_map(|pair| pair.strip_prefix("sig="))
        .expect("the read-only URL carries a SAS")
        .to_string();
    let decoded_sig = url::form_urlencoded::parse(format!("sig={sig}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    // Another key of the same length, well-formed: the emulator refuses its signatures.
    let wrong_key: String = url::form_urlencoded::byte_serialize("d3Jvbmcta2V5".repeat(8).as_bytes()).collect();
    let refusals = vec![
        Refusal {
            what: "wrong CA",
            url: url.replace(&format!("{pki}/ca.pem"), &format!("{pki}/other-ca.pem")),
            says: "check ca=",
        },
        Refusal {
            what: "wrong host",
            // The server's certificate names 127.0.0.1 only; localhost is the same server.
            url: url.replacen("127.0.0.1:", "localhost:", 1),
            says: "not valid for the host",
        },
        Refusal {
            what: "wrong account key",
            url: url.replacen(&escaped_key, &wrong_key, 1),
            says: "check the credential",
        },
        Refusal {
            what: "missing privilege (read-only SAS)",
            url: readonly,
            says: "permissions sp=racwl",
        },
    ];
    let backend = secured_backend("azure", &url, |url| {
        Box::pin(async move { Ok(Arc::new(AzureBlobStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    Some(Secured {
        backend,
        secrets: vec![key, escaped_key, sig, decoded_sig],
        refusals,
    })
}

leasehold_conformance::secured!(azure_tls, azure_tls());
