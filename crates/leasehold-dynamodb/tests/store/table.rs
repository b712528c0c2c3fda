//! The table and the endpoint: foreign items, the key schema, unreachable endpoints, other
//! protocols, credentials.

use std::error::Error as _;
use std::time::Duration;

use leasehold_core::{CandidateId, Error, LeaseStore, random_u64};
use leasehold_dynamodb::aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use leasehold_dynamodb::{DynamoDbConfig, DynamoDbStore, TableError};

use super::{expect_corrupt, fresh_lease, granted, request};
use crate::common::{self, DynamoBackend, TABLE, config};

/// Garbage written into the lease item by someone else: every operation fails with
/// CorruptRecord naming the lease and the attribute, and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_items_are_typed_errors() {
    let Some(endpoint) = common::endpoint() else { return };
    let backend = DynamoBackend::with_table(endpoint, TABLE);
    let store = backend.store().await.unwrap();
    let ttl = Duration::from_secs(2);
    let s = |v: &str| AttributeValue::S(v.into());
    let n = |v: &str| AttributeValue::N(v.into());
    let cases: Vec<(&str, Vec<(&str, AttributeValue)>)> = vec![
        ("term", vec![("term", s("garbage")), ("holder", s("vandal"))]),
        (
            "term",
            vec![
                ("holder", s("vandal")),
                ("version", s("0123456789abcdef")),
                ("ttl_ms", n("1000")),
            ],
        ),
        ("term", vec![("term", n("-3")), ("last_holder", s("x"))]),
        ("term", vec![("term", n("1.5")), ("last_holder", s("x"))]),
        (
            "version",
            vec![
                ("term", n("4")),
                ("last_holder", s("x")),
                ("holder", s("x")),
                ("ttl_ms", n("1000")),
            ],
        ),
        (
            "ttl_ms",
            vec![
                ("term", n("4")),
                ("last_holder", s("x")),
                ("holder", s("x")),
                ("ttl_ms", s("soon")),
                ("version", s("0123456789abcdef")),
            ],
        ),
        (
            "holder",
            vec![
                ("term", n("4")),
                ("last_holder", s("x")),
                ("holder", AttributeValue::Bool(true)),
            ],
        ),
        (
            "reserved_term",
            vec![
                ("term", n("4")),
                ("last_holder", s("x")),
                ("holder", s("y")),
                ("ttl_ms", n("1000")),
                ("version", s("0123456789abcdef")),
                ("reserved_term", AttributeValue::Bool(true)),
                ("handed_over_at", n("1700000000000")),
            ],
        ),
    ];
    for (field, attributes) in cases {
        let lease = fresh_lease("garbage");
        let first = granted(&store, &request(&lease, "owner", ttl, None)).await;
        backend.put_raw(&lease, &attributes).await.unwrap();
        expect_corrupt("inspect", &lease, store.inspect(&lease).await, field);
        expect_corrupt(
            "acquire",
            &lease,
            store.acquire(&request(&lease, "intruder", ttl, None)).await,
            field,
        );
        expect_corrupt("renew", &lease, store.renew(&first).await, field);
        expect_corrupt(
            "hand_over",
            &lease,
            store.hand_over(&first, &CandidateId::new("heir").unwrap()).await,
            field,
        );
        expect_corrupt("history", &lease, store.history(&lease, 10).await, field);
        expect_corrupt("break", &lease, store.break_lease(&lease).await, field);
    }
}

/// A table of the same name with another key schema: a typed error naming the table; the table
/// is left as it was. A missing table without create_table: a typed error saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_shape_is_checked() {
    let Some(endpoint) = common::endpoint() else { return };
    let store = DynamoBackend::with_table(endpoint.clone(), TABLE)
        .store()
        .await
        .unwrap();
    let foreign = format!("leasehold-foreign-{:x}", random_u64());
    store
        .client()
        .create_table()
        .table_name(&foreign)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    for create_table in [true, false] {
        let mut config = config(&endpoint, &foreign);
        config.create_table = create_table;
        match DynamoDbStore::from_config(config).await {
            Err(Error::CorruptRecord { lease, detail, .. }) => {
                assert!(lease.contains(&foreign), "{lease}");
                assert!(
                    detail.contains("id (S) HASH") && detail.contains("lease (S) HASH"),
                    "{detail}"
                );
            }
            other => panic!("a foreign table must be refused, got {other:?}"),
        }
    }
    let described = store
        .client()
        .describe_table()
        .table_name(&foreign)
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = described
        .table()
        .unwrap()
        .key_schema()
        .iter()
        .map(|k| k.attribute_name())
        .collect();
    assert_eq!(keys, ["id"], "the foreign table is unchanged");
    // Local servers keep a new table CREATING for a moment; only an active one can be deleted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.client().delete_table().table_name(&foreign).send().await.unwrap();

    let missing = format!("leasehold-missing-{:x}", random_u64());
    let mut config = config(&endpoint, &missing);
    config.create_table = false;
    let err = DynamoDbStore::from_config(config.clone()).await.unwrap_err();
    let source = err.source().and_then(|s| s.downcast_ref::<TableError>());
    assert!(matches!(source, Some(TableError::Missing { .. })), "{err:?}");
    assert!(err.is_permanent(), "a missing table is refused, not retried: {err:?}");
    assert!(err.to_string().contains("create_table=true"), "{err}");
    // And with create_table the same URL works, and a second client finds it.
    config.create_table = true;
    let created = DynamoDbStore::from_config(config.clone()).await.unwrap();
    config.create_table = false;
    DynamoDbStore::from_config(config).await.unwrap();
    created
        .client()
        .delete_table()
        .table_name(&missing)
        .send()
        .await
        .unwrap();
}

/// An endpoint nobody listens on: a transient error, and no secret in any error or debug output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoint_is_transient_and_redacted() {
    let url = "dynamodb://leases?endpoint=http://127.0.0.1:1&access_key_id=AKIDVISIBLE\
               &secret_access_key=TOPSECRETKEY&session_token=SESSIONSECRET&timeout=500ms";
    let err = DynamoDbStore::connect(url).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("describe_table: ")
            && text.contains("Connection refused")
            && text.contains("check the endpoint")
            && !text.contains("DispatchFailure")
            && !text.contains('\n'),
        "one line that says what to check: {text}"
    );
    let mut texts = vec![err.to_string(), format!("{err:?}")];
    let mut source = err.source();
    while let Some(s) = source {
        texts.push(s.to_string());
        source = s.source();
    }
    let config: DynamoDbConfig = url.parse().unwrap();
    texts.push(format!("{config:?}"));
    texts.push(config.to_string());
    for text in texts {
        for secret in ["TOPSECRETKEY", "SESSIONSECRET", "AKIDVISIBLE"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }
}

/// A port where something else than DynamoDB listens (here: a server that answers every request
/// with a line of text and hangs up, as Redis does to HTTP): a permanent refusal at connect that
/// says to check the endpoint, not a transient error retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_protocol_on_the_port_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buffer = [0u8; 1024];
            let _ = socket.read(&mut buffer).await;
            let _ = socket.write_all(b"-ERR unknown command\r\n").await;
        }
    });
    let url =
        format!("dynamodb://leases?endpoint=http://127.0.0.1:{port}&access_key_id=AK&secret_access_key=SK&timeout=2s");
    let err = DynamoDbStore::connect(&url).await.unwrap_err();
    assert!(err.is_permanent(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("dynamodb store refused connect: the endpoint answered, but not as DynamoDB")
            && !text.contains('\n'),
        "{text}"
    );
}

/// Without credentials in the URL (and without the `aws-config` feature) the error says what
/// to do.
#[cfg(not(feature = "aws-config"))]
#[tokio::test]
async fn no_credentials_without_the_aws_chain() {
    let err = DynamoDbStore::connect("dynamodb://leases?region=eu-west-1")
        .await
        .unwrap_err();
    let source = err.source().and_then(|s| s.downcast_ref::<TableError>());
    assert_eq!(source, Some(&TableError::NoCredentials), "{err:?}");
    assert!(err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("aws-config"), "{err}");
}
