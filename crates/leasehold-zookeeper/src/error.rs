//! How ZooKeeper's failures become leasehold errors, in one line that says what to check.
//! A session that cannot be opened is diagnosed host by host: a name that does not resolve, a
//! port that refuses connections, and a port that answers another protocol are told apart
//! (the client reports each as "no available hosts").

use std::fmt;
use std::time::Duration;

use leasehold_core::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client as zk;

use crate::config::ZookeeperConfig;

/// The store's name in errors and metrics.
pub(crate) const STORE: &str = "zookeeper";

/// A failure of the store's own making, in one line.
#[derive(Debug)]
pub(crate) struct Failed(pub(crate) String);

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

/// Maps a client error: the server's definite answers are [`Error::Store`]; everything about the
/// connection or session (the request may or may not have been applied) is transient.
pub(crate) fn zk_error(error: zk::Error) -> Error {
    use zk::Error as E;
    match error {
        E::NoAuth | E::AuthFailed => permanent(
            "request",
            format!("{error}: check the digest credentials (?auth=digest:user:pass) and the ACLs of the chroot"),
        ),
        E::NoNode
        | E::BadVersion
        | E::NoChildrenForEphemerals
        | E::NodeExists
        | E::NotEmpty
        | E::InvalidAcl
        | E::BadArguments(_)
        | E::Unimplemented
        | E::QuotaExceeded
        | E::NoWatcher
        | E::ReconfigDisabled
        | E::UnmarshalError { .. }
        | E::MarshallingError => Error::store(STORE, error),
        other => Error::unreachable(STORE, other),
    }
}

pub(crate) fn disconnected(state: zk::SessionState) -> Error {
    Error::unreachable(
        STORE,
        Failed(format!("the ZooKeeper session is {state}: not confirmed alive")),
    )
}

/// A failure that retrying will not mend.
fn permanent(operation: &'static str, reason: String) -> Error {
    Error::refused(STORE, operation, reason)
}

/// Why opening a session failed. The client says "no available hosts" for every kind of
/// trouble; each host is then looked at once (`limit` bounds each look).
pub(crate) async fn connect_error(config: &ZookeeperConfig, error: zk::Error, limit: Duration) -> Error {
    match error {
        zk::Error::AuthFailed | zk::Error::NoAuth => {
            return permanent(
                "connect",
                "ZooKeeper refused the digest credentials; check ?auth=digest:user:pass".into(),
            );
        }
        zk::Error::NoHosts | zk::Error::Timeout | zk::Error::ConnectionLoss => {}
        other => return zk_error(other),
    }
    let looks = config.hosts().iter().map(|host| look(host, limit));
    let found = futures::future::join_all(looks).await;
    if let Some((host, _)) = config.hosts().iter().zip(&found).find(|(_, f)| **f == Host::Foreign) {
        return permanent(
            "connect",
            format!("{host} answers, but not as ZooKeeper; check that the URL names a ZooKeeper client port (2181)"),
        );
    }
    let each: Vec<String> = config
        .hosts()
        .iter()
        .zip(&found)
        .map(|(host, found)| format!("{host} {}", found.describe()))
        .collect();
    let check = if found.iter().all(|f| *f == Host::Unresolvable) {
        "check the host names in the URL"
    } else {
        "check that ZooKeeper runs there and has a quorum"
    };
    Error::unreachable(
        STORE,
        Failed(format!(
            "connect: no server opened a session ({}); {check}",
            each.join(", ")
        )),
    )
}

/// What one host does when spoken to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Host {
    Unresolvable,
    Refused,
    /// No connection, or no answer, within the limit.
    Silent,
    /// It accepted the connection and closed it without an answer (a ZooKeeper server that is
    /// not serving, e.g. without a quorum).
    Closed,
    /// It answered with something that is not a ZooKeeper handshake.
    Foreign,
    /// It answered as ZooKeeper (the session failed for another reason).
    ZooKeeper,
}

impl Host {
    fn describe(self) -> &'static str {
        match self {
            Host::Unresolvable => "does not resolve",
            Host::Refused => "refused the connection",
            Host::Silent => "did not answer in time",
            Host::Closed => "closed the connection without a session (not serving?)",
            Host::Foreign => "answers another protocol",
            Host::ZooKeeper => "is ZooKeeper but gave no session",
        }
    }
}

/// Connects to `host` and asks it who it is.
async fn look(host: &str, limit: Duration) -> Host {
    let Ok(mut addresses) = tokio::net::lookup_host(host).await else {
        return Host::Unresolvable;
    };
    let Some(address) = addresses.next() else {
        return Host::Unresolvable;
    };
    let spoken = async {
        let mut stream = match tokio::net::TcpStream::connect(address).await {
            Ok(stream) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Host::Refused,
            Err(_) => return Host::Silent,
        };
        // ZooKeeper's `srvr` four-letter word (allowed by default): a ZooKeeper server answers
        // it (or says it is not allowed) naming itself; a line-based protocol answers an error.
        if stream.write_all(b"srvr\r\n").await.is_err() {
            return Host::Closed;
        }
        // The first bytes tell: ZooKeeper names itself in its answer's first line.
        let mut chunk = [0u8; 256];
        let answer = match stream.read(&mut chunk).await {
            Ok(n) => &chunk[..n],
            Err(_) => &[][..],
        };
        let text = String::from_utf8_lossy(answer).to_ascii_lowercase();
        if answer.is_empty() {
            Host::Closed
        } else if text.contains("zookeeper") || text.contains("whitelist") {
            Host::ZooKeeper
        } else {
            Host::Foreign
        }
    };
    tokio::time::timeout(limit, spoken).await.unwrap_or(Host::Silent)
}
