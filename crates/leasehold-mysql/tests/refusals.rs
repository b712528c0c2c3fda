//! What `connect` refuses, and the exact one-line errors it answers (printed with
//! `--nocapture`): a wrong password, a user without the privileges leasehold needs, a port that
//! serves another protocol (one that speaks first, and one that waits for the client).

use std::time::Duration;

use leasehold_core::{Error, random_u64};
use leasehold_mysql::MysqlStore;
use sqlx::{Connection, MySqlConnection};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

fn server() -> Option<String> {
    leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL")
}

fn with_user(url: &str, user: &str, password: &str) -> String {
    let mut url = url::Url::parse(url).expect("LEASEHOLD_MYSQL_URL is a URL");
    url.set_username(user).expect("a URL with a host");
    url.set_password(Some(password)).expect("a URL with a host");
    url.to_string()
}

async fn refusal(url: &str) -> Error {
    let err = MysqlStore::connect(url).await.expect_err("connect must fail");
    println!("{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    err
}

#[tokio::test]
async fn a_wrong_password_is_refused() {
    let Some(url) = server() else { return };
    let user = url::Url::parse(&url).unwrap().username().to_string();
    let err = refusal(&with_user(&url, &user, "not-the-password")).await;
    assert!(
        matches!(
            err,
            Error::Refused {
                operation: "connect",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("Access denied") && text.contains("(error 1045)"),
        "{text}"
    );
    assert!(text.contains("check the URL's user and password"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
}

#[tokio::test]
async fn missing_privileges_are_refused_naming_them() {
    let Some(url) = server() else { return };
    // The test server's user may create users and grant what it has on the database.
    let database = url::Url::parse(&url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_string();
    let user = format!("lh_ro_{:08x}", random_u64() as u32);
    let mut admin = MySqlConnection::connect(&url).await.expect("the test server");
    MysqlStore::connect(&url).await.expect("the tables exist");
    for statement in [
        format!("CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'"),
        format!("GRANT SELECT ON `{database}`.* TO '{user}'@'127.0.0.1'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .expect("creating a read-only user");
    }
    let err = refusal(&with_user(&url, &user, "pw")).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP USER '{user}'@'127.0.0.1'")))
        .execute(&mut admin)
        .await
        .expect("dropping the user");
    assert!(
        matches!(
            err,
            Error::Refused {
                operation: "connect",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("INSERT, UPDATE command denied") && text.contains("(error 1142)"),
        "{text}"
    );
    assert!(
        text.contains("leasehold needs SELECT, INSERT, UPDATE and DELETE on the leasehold_* tables"),
        "{text}"
    );
}

#[tokio::test]
async fn a_port_serving_another_protocol_is_refused() {
    // An HTTP server: it answers first, and not with a MySQL greeting.
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = http.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = http.accept().await {
            let _ = socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        }
    });
    let err = refusal(&format!("mysql://app:pw@127.0.0.1:{port}/db")).await;
    assert!(err.is_permanent(), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "mysql store refused connect: the server at 127.0.0.1:{port} closed the connection without a MySQL greeting: \
             it does not speak the MySQL protocol (or refuses this client at once): check the host and port"
        )
    );
}

#[tokio::test]
async fn a_port_that_waits_for_the_client_times_out_naming_it() {
    // Redis, Postgres, etcd and ZooKeeper all wait for the client to speak first.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let err = refusal(&format!("mysql://app:pw@127.0.0.1:{port}/db?connect_timeout=500ms")).await;
    held.abort();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "mysql store unreachable: no MySQL greeting from 127.0.0.1:{port} within {:?} while connecting: check that a \
             MySQL or MariaDB server listens there (a server of another protocol waits for the client to speak first)",
            Duration::from_millis(500)
        )
    );
}

/// A MySQL greeting (protocol 10, `mysql_native_password`) whose capabilities lack SSL: a
/// server without TLS.
fn greeting_without_tls() -> Vec<u8> {
    let mut payload = vec![10];
    payload.extend_from_slice(b"5.5.5-10.11.0-MariaDB\0");
    payload.extend_from_slice(&1u32.to_le_bytes()); // connection id
    payload.extend_from_slice(b"abcdefgh\0"); // scramble, part 1, and a filler
    // LONG_PASSWORD | PROTOCOL_41 | SECURE_CONNECTION; no SSL (0x0800)
    payload.extend_from_slice(&0x8201u16.to_le_bytes());
    payload.push(33); // utf8_general_ci
    payload.extend_from_slice(&2u16.to_le_bytes()); // autocommit
    payload.extend_from_slice(&0x0008u16.to_le_bytes()); // PLUGIN_AUTH
    payload.push(21); // scramble length
    payload.extend_from_slice(&[0; 10]); // reserved
    payload.extend_from_slice(b"ijklmnopqrst\0"); // scramble, part 2
    payload.extend_from_slice(b"mysql_native_password\0");
    let mut packet = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    packet.push(0); // sequence
    packet.extend_from_slice(&payload);
    packet
}

#[tokio::test]
async fn a_server_without_tls_is_refused_when_the_url_asks_for_it() {
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = plain.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut socket, _)) = plain.accept().await {
            let _ = socket.write_all(&greeting_without_tls()).await;
            open.push(socket);
        }
    });
    for options in ["ssl-mode=REQUIRED", "ca=/nonexistent/ca.pem"] {
        let err = refusal(&format!("mysql://app:pw@127.0.0.1:{port}/db?{options}")).await;
        assert!(err.is_permanent(), "{options}: {err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "mysql store refused connect: TLS: the server does not offer TLS, which the URL's ssl-mode (or ca=) \
                 requires; check the host and port, or the server's ssl-cert and ssl-key settings (server 127.0.0.1:{port})"
            ),
            "{options}"
        );
    }
    held.abort();
}
