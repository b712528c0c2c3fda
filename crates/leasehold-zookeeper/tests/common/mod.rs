//! Helpers of the tests on one lease (`jobs`), and counting the ZooKeeper requests of this test
//! process, as the server counts them: the `stat` four-letter word lists each client connection
//! with the packets it received from it (`recved`, pings and handshakes included), and `/proc`
//! tells which of those connections are this process's (by their local port). Other clients of the same server do not count.
//! (Each test binary uses some of these helpers.)
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasehold_core::{AcquireRequest, CandidateId, LeaseName};

/// The TTL of the tests on one lease, `jobs`.
pub(crate) const TTL: Duration = Duration::from_secs(4);

pub(crate) fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid candidate id")
}

pub(crate) fn lease() -> LeaseName {
    LeaseName::new("jobs").expect("valid lease name")
}

/// `candidate`'s acquire of `jobs` with [`TTL`].
pub(crate) fn request(candidate: &str) -> AcquireRequest {
    AcquireRequest {
        lease: lease(),
        candidate: id(candidate),
        ttl: TTL,
        takeover: None,
    }
}

/// `host:port` of a `zk://host:port[/chroot]` URL with one host.
pub(crate) fn address(url: &str) -> String {
    let rest = url.trim_start_matches("zk://");
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// The packets the server at `addr` received on each of this process's connections to it, by
/// local port; `None` when the server does not answer `stat` (not in its 4lw whitelist).
pub(crate) fn requests_by_connection(addr: &str) -> Option<HashMap<u16, u64>> {
    let server_port: u16 = addr.rsplit(':').next()?.parse().ok()?;
    let ours = own_ports(server_port);
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"stat").ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    if !out.contains("Clients:") {
        return None;
    }
    // " /127.0.0.1:50028[1](queued=0,recved=12,sent=12)"
    let counts = out
        .lines()
        .filter_map(|line| {
            let line = line.trim().strip_prefix('/')?;
            let (peer, rest) = line.split_once('[')?;
            let port: u16 = peer.rsplit(':').next()?.parse().ok()?;
            let recved = rest.split("recved=").nth(1)?.split([',', ')']).next()?.parse().ok()?;
            ours.contains(&port).then_some((port, recved))
        })
        .collect();
    Some(counts)
}

/// The packets received on this process's connections between two counts (a connection that
/// is new in `after` counts in full; one that closed meanwhile is not counted).
pub(crate) fn since(before: &HashMap<u16, u64>, after: &HashMap<u16, u64>) -> u64 {
    after
        .iter()
        .map(|(port, n)| n.saturating_sub(before.get(port).copied().unwrap_or(0)))
        .sum()
}

/// The local ports of this process's connections to the server at `addr` now.
pub(crate) fn connections(addr: &str) -> HashSet<u16> {
    addr.rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .map(own_ports)
        .unwrap_or_default()
}

/// The local ports of this process's TCP connections to `server_port` on loopback.
fn own_ports(server_port: u16) -> HashSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) = (fields.get(1), fields.get(2), fields.get(9)) else {
                continue;
            };
            let port = |address: &str| {
                address
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            };
            if port(remote) == Some(server_port) && inodes.contains(*inode) {
                ports.extend(port(local));
            }
        }
    }
    ports
}
