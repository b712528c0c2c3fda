//! `connect` refuses a store that answers conditional writes without honouring them, against a
//! tiny in-process S3 server that does just enough of `PutObject`, `GetObject` and
//! `DeleteObject` for the probe, in three manners: honouring `If-None-Match` and `If-Match`
//! (connect succeeds), ignoring them (as the fake-gcs-server bundled on PyPI ignores
//! `ifGenerationMatch`), and checking them without a lock before writing (as `s3s-fs` does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::Error;
use leasehold_s3::{ConnectError, S3Store};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Manner {
    Honours,
    Ignores,
    ChecksThenWrites,
}

#[derive(Default)]
struct Objects {
    etags: HashMap<String, u64>,
    next: u64,
}

/// Serves until the test ends; the URL of a store on it.
async fn serve(manner: Manner) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let objects = Arc::new(Mutex::new(Objects::default()));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(connection(stream, manner, objects.clone()));
        }
    });
    format!("s3://bucket/leases?endpoint=http://127.0.0.1:{port}&access_key_id=AKIDPROBE&secret_access_key=SECRETPROBE")
}

async fn connection(stream: TcpStream, manner: Manner, objects: Arc<Mutex<Objects>>) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or(""));
        let key = target.split('?').next().unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if stream.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        if headers
            .get("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        {
            stream
                .get_mut()
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .unwrap();
        }
        let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        let reply = answer(&method, &key, &headers, manner, &objects).await;
        stream.get_mut().write_all(reply.as_bytes()).await.unwrap();
    }
}

async fn answer(
    method: &str,
    key: &str,
    headers: &HashMap<String, String>,
    manner: Manner,
    objects: &Mutex<Objects>,
) -> String {
    let refused = |objects: &Objects| {
        let current = objects.etags.get(key).map(|n| format!("\"{n}\""));
        match (headers.get("if-none-match"), headers.get("if-match")) {
            (Some(_), _) => current.is_some(),
            (_, Some(etag)) => current.as_ref() != Some(etag),
            _ => false,
        }
    };
    let write = |objects: &mut Objects| {
        objects.next += 1;
        objects.etags.insert(key.to_string(), objects.next);
        reply("200 OK", "", Some(objects.next))
    };
    let precondition_failed = || {
        reply(
            "412 Precondition Failed",
            "<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>",
            None,
        )
    };
    match (method, manner) {
        ("PUT", Manner::Honours) => {
            let mut objects = objects.lock().unwrap();
            if refused(&objects) {
                precondition_failed()
            } else {
                write(&mut objects)
            }
        }
        ("PUT", Manner::Ignores) => write(&mut objects.lock().unwrap()),
        ("PUT", Manner::ChecksThenWrites) => {
            let was_refused = refused(&objects.lock().unwrap());
            // The time between a server's check and its write: long enough for the client to
            // open a connection for each of the racers.
            tokio::time::sleep(Duration::from_millis(200)).await;
            if was_refused {
                precondition_failed()
            } else {
                write(&mut objects.lock().unwrap())
            }
        }
        ("DELETE", _) => {
            objects.lock().unwrap().etags.remove(key);
            reply("204 No Content", "", None)
        }
        _ => reply(
            "404 Not Found",
            "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>",
            None,
        ),
    }
}

fn reply(status: &str, body: &str, etag: Option<u64>) -> String {
    let etag = etag.map(|n| format!("ETag: \"{n}\"\r\n")).unwrap_or_default();
    format!(
        "HTTP/1.1 {status}\r\n{etag}Content-Type: application/xml\r\nx-amz-request-id: probe\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// What `connect` says, also checked to keep the keys out.
async fn refusal(manner: Manner) -> (Error, String) {
    let err = S3Store::connect(&serve(manner).await).await.unwrap_err();
    let text = err.to_string();
    eprintln!("{manner:?}: {text}");
    for secret in ["AKIDPROBE", "SECRETPROBE"] {
        assert!(!format!("{text} {err:?}").contains(secret), "{text}");
    }
    assert_eq!(text.lines().count(), 1, "{text}");
    (err, text)
}

fn is_ignored(err: &Error) -> bool {
    use std::error::Error as _;
    err.source()
        .and_then(|s| s.downcast_ref::<ConnectError>())
        .is_some_and(|e| matches!(e, ConnectError::ConditionalWritesIgnored { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_honouring_conditional_writes_is_accepted() {
    S3Store::connect(&serve(Manner::Honours).await).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_ignoring_conditional_writes_is_refused() {
    let (err, text) = refusal(Manner::Ignores).await;
    assert!(
        matches!(
            err,
            Error::Refused {
                store: "s3",
                operation: "connect",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(is_ignored(&err), "{err:?}");
    assert!(
        text.contains("does not honour conditional writes")
            && text.contains("a second create-if-absent (If-None-Match: *) of the same key succeeded"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_checking_then_writing_is_refused() {
    let (err, text) = refusal(Manner::ChecksThenWrites).await;
    assert!(is_ignored(&err), "{err:?}");
    assert!(
        text.contains("of 8 concurrent create-if-absent writes of one key succeeded"),
        "{text}"
    );
}
