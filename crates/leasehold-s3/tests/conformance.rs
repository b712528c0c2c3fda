//! The shared conformance suite against moto.
//!
//! The backend: S3 on moto (`scripts/services up moto`): every client is its own `S3Store` (its own SDK
//! client and connections), on one bucket and prefix.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use leasehold_core::{Error, LeaseStore};
use leasehold_s3::S3Store;

use leasehold_conformance::SecretUrls;
use leasehold_conformance::ServerBackend;
use leasehold_conformance::with_option;
use leasehold_conformance::{Backend, host_port, require_server};

const BUCKET: &str = "leasehold-tests";
const PREFIX: &str = "conformance";

/// The S3 server named by `LEASEHOLD_S3_URL` (an `http://` endpoint), with the dummy keys local
/// servers accept, creating the bucket when missing.
fn s3() -> Option<Arc<dyn Backend>> {
    let endpoint = require_server("moto", "LEASEHOLD_S3_URL")?;
    let endpoint = endpoint.trim_end_matches('/').to_string();
    let upstream = host_port(&endpoint)?;
    let url = format!(
        "s3://{BUCKET}/{PREFIX}?endpoint={endpoint}&region=us-east-1&access_key_id=local\
         &secret_access_key=local-secret&create_bucket=true"
    );
    let (raw, for_remove) = (endpoint.clone(), endpoint.clone());
    let backend = ServerBackend::new(
        "s3",
        url.clone(),
        upstream,
        |url| Box::pin(async move { Ok(Arc::new(S3Store::connect(&url).await?) as Arc<dyn LeaseStore>) }),
        // JSON of another program where the lease object belongs, as a foreign writer would.
        move |lease| {
            let endpoint = raw.clone();
            Box::pin(async move {
                raw_client(endpoint)
                    .put_object()
                    .bucket(BUCKET)
                    .key(format!("{PREFIX}/{lease}"))
                    .body(ByteStream::from_static(b"{\"holder\":\"vandal\",\"term\":\"garbage\"}"))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| Error::store("s3", e))
            })
        },
    )
    .remove_with(move |lease| {
        let endpoint = for_remove.clone();
        Box::pin(async move {
            raw_client(endpoint)
                .delete_object()
                .bucket(BUCKET)
                .key(format!("{PREFIX}/{lease}"))
                .send()
                .await
                .map(drop)
                .map_err(|e| Error::store("s3", e))
        })
    })
    // moto is one Python process: 150-200 requests a second on a loaded 2-core machine. A
    // renewal is one request (3,000 / TTL a second for 1,000 leases), but the 1,000 first
    // acquires are two each (a read, then the create), all at once: 10 to 13 s of work, which
    // must fit in the request timeout (TTL / 4). At 20 s they did not, and the retries of the
    // acquires that timed out kept moto busy for the rest of the scenario.
    .many_leases_ttl(Duration::from_secs(60))
    // An acquire reads the object for the ETag its conditional write names.
    .acquire_reads_first()
    .secret_urls(move |secret| {
        let keys = format!("access_key_id={secret}&secret_access_key={secret}&session_token={secret}");
        let server = format!("s3://{BUCKET}/{PREFIX}?endpoint={endpoint}&region=us-east-1&{keys}");
        let closed =
            format!("s3://{BUCKET}/{PREFIX}?endpoint=http://127.0.0.1:1&region=us-east-1&{keys}&timeout=500ms");
        // moto accepts any keys.
        SecretUrls {
            malformed: vec![with_option(&server, "nonsense=1")],
            accepted: Some(server),
            refused: None,
            closed: Some(closed),
        }
    });
    Some(Arc::new(backend))
}

/// A client of the local server with the dummy keys it accepts.
fn raw_client(endpoint: String) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .force_path_style(true)
        .credentials_provider(Credentials::new("local", "local-secret", None, None, "conformance"))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

leasehold_conformance::suite!(s3, s3());
