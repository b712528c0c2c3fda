//! How ZooKeeper's failures become leasehold errors, in one line that says what to check.
//! A session that cannot be opened is diagnosed host by host: a name that does not resolve, a
//! port that refuses connections, and a port that answers another protocol are told apart
//! (the client reports each as "no available hosts").

use std::fmt;
use std::time::Duration;

use leasehold_core::{BoxError, Error, Operation};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client as zk;

pub(crate) use crate::config::STORE;
use crate::config::ZookeeperConfig;

/// A failure in one line, keeping the client's error (if any) as its source.
#[derive(Debug)]
pub(crate) struct Failed {
    text: String,
    source: Option<BoxError>,
}

impl Failed {
    pub(crate) fn new(text: impl Into<String>) -> Self {
        Failed {
            text: text.into(),
            source: None,
        }
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Maps a client error: the server's definite answers are [`Error::Store`]; everything about the
/// connection or session (the request may or may not have been applied) is transient. The text
/// says what to check; [`during`] adds the operation and lease at the store's surface.
pub(crate) fn map(error: zk::Error) -> Error {
    use zk::Error as E;
    let with = |hint: &str| Failed {
        text: format!("{error}{hint}"),
        source: Some(Box::new(error.clone())),
    };
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
        | E::MarshallingError => Error::store(STORE, with(" (the server's definite answer: nothing was applied)")),
        E::SessionExpired | E::ClientClosed => Error::unreachable(
            STORE,
            with(" (a new session is opened on the next request; the leases of the old one are gone)"),
        ),
        E::Throttled => Error::unreachable(STORE, with(" (the server is overloaded)")),
        _ => Error::unreachable(
            STORE,
            with(" (check that the ensemble is up, has a quorum and is reachable)"),
        ),
    }
}

/// Names the operation (and lease) that failed in an error past connect: `acquire of lease
/// jobs failed: connection to server has lost (...)`. Errors that already name their lease
/// or are not about a request (an invalid TTL, a corrupt record) are kept as they are.
pub(crate) fn during(error: Error, operation: Operation, subject: &dyn fmt::Display) -> Error {
    let what = format!("{operation} of {subject} failed");
    match error {
        Error::Unreachable { store, source } => Error::Unreachable {
            store,
            source: Box::new(Failed {
                text: format!("{what}: {source}"),
                source: Some(source),
            }),
        },
        Error::Store { store, source } => Error::Store {
            store,
            source: Box::new(Failed {
                text: format!("{what}: {source}"),
                source: Some(source),
            }),
        },
        Error::Refused {
            store,
            operation: inner,
            reason,
            source,
        } => Error::Refused {
            store,
            operation: operation.as_str(),
            reason: if inner == "request" {
                format!("{subject}: {reason}")
            } else {
                format!("{inner} for {subject}: {reason}")
            },
            source,
        },
        other => other,
    }
}

pub(crate) fn disconnected(state: zk::SessionState) -> Error {
    Error::unreachable(
        STORE,
        Failed::new(format!(
            "the ZooKeeper session is {state}: not confirmed alive (the client reconnects by itself)"
        )),
    )
}

/// A failure that retrying will not mend.
fn permanent(operation: &'static str, reason: String) -> Error {
    Error::refused(STORE, operation, reason)
}

/// Why opening a session failed. The client says "no available hosts" for every kind of
/// trouble; each host is then looked at once (`limit` bounds each look).
pub(crate) async fn map_connect(error: zk::Error, config: &ZookeeperConfig, limit: Duration) -> Error {
    match error {
        zk::Error::AuthFailed | zk::Error::NoAuth => {
            return permanent(
                "connect",
                "ZooKeeper refused the digest credentials; check ?auth=digest:user:pass".into(),
            );
        }
        zk::Error::NoHosts | zk::Error::Timeout | zk::Error::ConnectionLoss => {}
        other => return map(other),
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
        Failed::new(format!(
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use leasehold_core::LeaseName;

    use super::*;

    /// Issue 14: an error past connect names the operation and the lease, in one line, keeps
    /// its kind (what the engine does with it), and keeps the client's error as its source.
    #[test]
    fn errors_name_the_operation_and_lease() {
        let lease = LeaseName::new("jobs").unwrap();
        let subject = format_args!("lease {lease}").to_string();
        let lost = during(map(zk::Error::ConnectionLoss), Operation::Acquire, &subject);
        assert!(lost.is_transient());
        assert_eq!(
            lost.to_string(),
            "zookeeper store unreachable: acquire of lease jobs failed: connection to server has lost \
             (check that the ensemble is up, has a quorum and is reachable)"
        );
        let client =
            std::iter::successors(lost.source(), |e| (*e).source()).find_map(|e| e.downcast_ref::<zk::Error>());
        assert_eq!(client, Some(&zk::Error::ConnectionLoss));

        let definite = during(map(zk::Error::NotEmpty), Operation::Release, &subject);
        assert!(!definite.is_transient() && !definite.is_permanent());
        assert!(
            definite
                .to_string()
                .starts_with("zookeeper store error: release of lease jobs failed: node has not empty children"),
            "{definite}"
        );

        let refused = during(map(zk::Error::NoAuth), Operation::Renew, &subject);
        assert!(refused.is_permanent());
        assert!(
            refused
                .to_string()
                .starts_with("zookeeper store refused renew: lease jobs: not authorized: check the digest"),
            "{refused}"
        );

        // Errors that name their lease already, or are not about a request, stay as they are.
        let corrupt = Error::corrupt(STORE, &lease, "garbage");
        let kept = during(Error::corrupt(STORE, &lease, "garbage"), Operation::Inspect, &subject);
        assert_eq!(kept.to_string(), corrupt.to_string());

        for error in [lost, definite, refused] {
            assert!(!error.to_string().contains('\n'), "{error}");
            assert!(!error.to_string().contains("ConnectionLoss"), "no Debug dumps: {error}");
        }
    }
}
