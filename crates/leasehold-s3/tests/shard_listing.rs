//! What a listing of shard records costs on S3, where `ListObjectsV2` shows keys and ETags but
//! no content: the HTTP requests of `shard_records`, counted. One `ListObjectsV2` per 1,000
//! records, and a `GetObject` only of the records this store has not read or written at the
//! ETag listed. Needs moto (`scripts/services up moto`). By default 300 records (about 650
//! requests, two seconds of moto, which serves one request at a time for every test beside
//! this one); `LEASEHOLD_S3_SHARD_RECORDS=10000` measures 10,000 (10 pages).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents};
use aws_sdk_s3::error::BoxError;
use futures::StreamExt;
use leasehold_core::{LeaseName, LeaseStore, ShardRecord, ShardWrite, random_u64};
use leasehold_s3::S3Store;

const BUCKET: &str = "leasehold-tests";

/// `ListObjectsV2` and `GetObject` requests sent.
#[derive(Debug, Default)]
struct Counts {
    lists: AtomicUsize,
    gets: AtomicUsize,
}

impl Counts {
    /// (lists, gets) since the last call.
    fn take(&self) -> (usize, usize) {
        (
            self.lists.swap(0, Ordering::SeqCst),
            self.gets.swap(0, Ordering::SeqCst),
        )
    }
}

#[derive(Debug)]
struct Counter(Arc<Counts>);

impl Intercept for Counter {
    fn name(&self) -> &'static str {
        "request counter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        if request.method() == "GET" {
            let counter = if request.uri().contains("list-type=2") {
                &self.0.lists
            } else {
                &self.0.gets
            };
            counter.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn counted_client(endpoint: &str, counts: Arc<Counts>) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .force_path_style(true)
        .credentials_provider(Credentials::new("local", "local-secret", None, None, "test"))
        .retry_config(RetryConfig::disabled())
        .interceptor(Counter(counts))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

fn written(answer: ShardWrite) -> ShardRecord {
    match answer {
        ShardWrite::Written(record) => record,
        conflict => panic!("must be written: {conflict:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reads_only_the_records_it_has_not_seen() {
    let Some(endpoint) = leasehold_conformance::require_server("moto", "LEASEHOLD_S3_URL") else {
        return;
    };
    let endpoint = endpoint.trim_end_matches('/').to_string();
    let records: usize = std::env::var("LEASEHOLD_S3_SHARD_RECORDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let pages = records.div_ceil(1_000);
    let prefix = format!("shard-listing-{:x}", random_u64());
    let writer = S3Store::connect(&format!(
        "s3://{BUCKET}/{prefix}?endpoint={endpoint}&region=us-east-1&access_key_id=local\
         &secret_access_key=local-secret&create_bucket=true"
    ))
    .await
    .unwrap();
    let names: Vec<LeaseName> = (0..records)
        .map(|i| LeaseName::new(format!("g.s.{i:05}")).unwrap())
        .collect();
    let started = Instant::now();
    let writes = futures::stream::iter(&names)
        .map(|name| writer.write_shard(name, None, "leasehold1 1 1 writer"))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for write in writes {
        written(write.unwrap());
    }
    eprintln!("{records} records written in {:?}", started.elapsed());

    let counts = Arc::new(Counts::default());
    let reader = S3Store::from_client(counted_client(&endpoint, counts.clone()), BUCKET, &prefix).unwrap();
    let started = Instant::now();
    let cold = reader.shard_records("").await.unwrap();
    let took = started.elapsed();
    assert_eq!(cold.len(), records);
    let cold_requests = counts.take();
    eprintln!("first listing of {records}: {cold_requests:?} (lists, gets) in {took:?}");
    assert_eq!(
        cold_requests,
        (pages, records),
        "a store that has seen no record reads each"
    );

    let started = Instant::now();
    let warm = reader.shard_records("").await.unwrap();
    let took = started.elapsed();
    let warm_requests = counts.take();
    eprintln!("second listing: {warm_requests:?} in {took:?}");
    assert_eq!(warm, cold);
    assert_eq!(warm_requests, (pages, 0), "records unchanged since are not read again");

    // Rewritten by another store (the same value: a new nonce, so a new ETag): read again.
    let changed = written(
        writer
            .write_shard(&names[7], Some(&cold[7].version), &cold[7].value)
            .await
            .unwrap(),
    );
    let after = reader.shard_records("").await.unwrap();
    assert_eq!(after[7], changed);
    assert_eq!(counts.take(), (pages, 1), "one record changed: one read");

    // The reader's own write needs no read; a listing by prefix lists only that prefix.
    let own = written(
        reader
            .write_shard(&names[8], Some(&after[8].version), "leasehold1 2 2 reader")
            .await
            .unwrap(),
    );
    counts.take();
    let prefixed = reader.shard_records(names[8].as_str()).await.unwrap();
    assert_eq!(prefixed, vec![own]);
    assert_eq!(counts.take(), (1, 0));
}
