//! `leasehold run --http ADDR` without a command (a sidecar), with real HTTP requests: an
//! election, a takeover after SIGTERM, a loss by `leasehold break`, and a store that stops
//! answering (a SQLite file locked by another process).
//!
//! Each sidecar listens on 127.0.0.1:0 and the test reads the port from its log line.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use support::{Candidate, Store, one_error_line, wait_for};

/// The lease's ttl in these tests: renewals every 667 ms, follower polls every 400 ms (+20 %
/// jitter), leadership ends 600 ms (kill grace 400 ms + slack 200 ms) before its deadline.
const TTL: &str = "2s";
const TTL_DURATION: Duration = Duration::from_secs(2);

/// The scenarios measure time: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A sidecar and the address it serves on.
struct Sidecar {
    process: Candidate,
    addr: String,
}

impl Sidecar {
    fn start(store: &Store, name: &str, lease: &str) -> Self {
        let process = store.spawn_run(
            name,
            &["--lease", lease, "--id", name, "--ttl", TTL, "--http", "127.0.0.1:0"],
        );
        let mut addr = None;
        wait_for(Duration::from_secs(10), || {
            addr = process.log_text().lines().find_map(|line| {
                let (_, rest) = line.split_once("on http://")?;
                Some(rest.trim().to_string())
            });
            addr.is_some()
        })
        .unwrap_or_else(|| panic!("{name} does not say where it serves: {}", process.log_text()));
        Sidecar {
            process,
            addr: addr.unwrap(),
        }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        get(&self.addr, path)
    }

    fn status(&self, path: &str) -> u16 {
        self.get(path).map_or(0, |(status, _)| status)
    }

    fn leader(&self) -> serde_json::Value {
        let (status, body) = self.get("/leader").expect("/leader answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/leader is not JSON ({e}): {body}"))
    }

    /// Waits until `/leader` names `holder`; its term.
    fn wait_leader(&self, holder: &str, limit: Duration) -> u64 {
        let mut term = None;
        wait_for(limit, || {
            let leader = self.leader();
            term = (leader["holder"] == holder).then(|| leader["term"].as_u64().unwrap());
            term.is_some()
        })
        .unwrap_or_else(|| panic!("/leader does not name {holder}: {}", self.leader()));
        term.unwrap()
    }
}

/// One HTTP/1.1 request on a fresh connection: the status and the body (`None`: no answer).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

fn rfc3339(value: &serde_json::Value) -> SystemTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("since is not a string: {value}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("since {text:?} is not RFC 3339: {e}"))
}

/// A leads: A ready, B not, both name A; SIGTERM A: B ready within about a poll, naming itself
/// at a higher term; A exits 143 having released.
#[test]
fn sidecar_election_and_takeover() {
    let _serial = serial();
    let store = Store::sqlite();
    let mut a = Sidecar::start(&store, "A", "web");
    let term_a = a.wait_leader("A", Duration::from_secs(10));
    wait_for(Duration::from_secs(5), || a.status("/readyz") == 200).expect("A never ready");
    let mut b = Sidecar::start(&store, "B", "web");
    assert_eq!(b.wait_leader("A", Duration::from_secs(5)), term_a);

    let (status, body) = a.get("/readyz").unwrap();
    assert_eq!(status, 200, "A leads: {body}");
    assert!(body.contains(&format!("term {term_a}")), "{body}");
    let (status, body) = b.get("/readyz").unwrap();
    assert_eq!(status, 503, "B follows: {body}");
    for (sidecar, me) in [(&a, true), (&b, false)] {
        let leader = sidecar.leader();
        assert_eq!(leader["lease"], "web");
        assert_eq!(leader["holder"], "A");
        assert_eq!(leader["term"], term_a);
        assert_eq!(leader["this_instance"], me, "{leader}");
        let since = rfc3339(&leader["since"]);
        let age = SystemTime::now().duration_since(since).expect("since is in the past");
        assert!(age < Duration::from_secs(30), "since {leader}");
        assert_eq!(sidecar.status("/healthz"), 200);
    }
    let (status, metrics) = a.get("/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("leasehold_is_leader{lease=\"web\"} 1"),
        "A's /metrics:\n{metrics}"
    );
    assert_eq!(a.status("/nope"), 404);

    a.process.signal(Signal::SIGTERM);
    let termed = Instant::now();
    let took = wait_for(Duration::from_secs(5), || b.status("/readyz") == 200).expect("B never ready");
    // A releases at once; B learns it at its next poll (400 ms + 20 % jitter), or sooner from
    // the store's notification; plus scheduling on a busy machine.
    assert!(
        took < Duration::from_millis(1500),
        "B ready {took:?} after SIGTERM to A"
    );
    assert_eq!(
        a.process.wait_exit(Duration::from_secs(5)),
        Some(143),
        "{}",
        a.process.log_text()
    );
    assert!(
        a.process.log_text().contains("released web"),
        "{}",
        a.process.log_text()
    );
    let leader = b.leader();
    assert_eq!(leader["holder"], "B", "{leader}");
    assert_eq!(leader["this_instance"], true);
    assert!(
        leader["term"].as_u64().unwrap() > term_a,
        "{leader} after term {term_a}"
    );
    eprintln!(
        "B ready {took:?} after SIGTERM to A ({:?} until checked)",
        termed.elapsed()
    );

    b.process.signal(Signal::SIGTERM);
    assert_eq!(b.process.wait_exit(Duration::from_secs(5)), Some(143));
}

/// `leasehold break` deposes A: A's /readyz turns 503 by its next renewal, and the lease goes
/// to a later term.
#[test]
fn sidecar_loss_by_break() {
    let _serial = serial();
    let store = Store::sqlite();
    let a = Sidecar::start(&store, "A", "jobs");
    let term = a.wait_leader("A", Duration::from_secs(10));
    wait_for(Duration::from_secs(5), || a.status("/readyz") == 200).expect("A never ready");

    let output = store.leasehold(&["break", "jobs"]);
    assert!(output.status.success(), "{output:?}");
    let broken = Instant::now();
    // A learns it at its next renewal (every 667 ms), and is then not ready until it is elected
    // again: poll often to see the gap.
    let took = wait_for(Duration::from_secs(3), || a.status("/readyz") == 503)
        .unwrap_or_else(|| panic!("A stayed ready after the break: {}", a.process.log_text()));
    assert!(
        took < Duration::from_millis(1500),
        "A still ready {took:?} after the break"
    );
    let log = a.process.log_text();
    assert!(log.contains("lost jobs (term"), "{log}");
    // It campaigns again (nobody else does), at a later term.
    let again = {
        let mut again = 0;
        wait_for(Duration::from_secs(5), || {
            let leader = a.leader();
            again = leader["term"].as_u64().unwrap_or(0);
            leader["holder"] == "A" && again > term && a.status("/readyz") == 200
        })
        .unwrap_or_else(|| panic!("A not ready again: {}", a.process.log_text()));
        again
    };
    eprintln!(
        "A not ready {took:?} after the break; ready again at term {again} {:?} after it",
        broken.elapsed()
    );
}

/// The store stops answering (another process holds the SQLite file's write lock): A's
/// /readyz turns 503 before the lease could pass on (less than a ttl after the last renewal
/// that could have been written), /healthz turns 503; once the store answers again, both are
/// 200 again.
#[test]
fn sidecar_store_blocked() {
    if Command::new("sqlite3").arg("-version").output().is_err() {
        eprintln!("skipped: no sqlite3 command to lock the store with");
        return;
    }
    let _serial = serial();
    let store = Store::sqlite();
    let a = Sidecar::start(&store, "A", "blocked");
    let term = a.wait_leader("A", Duration::from_secs(10));
    wait_for(Duration::from_secs(5), || a.status("/readyz") == 200).expect("A never ready");

    let mut locker = Command::new("sqlite3")
        .arg(store.dir.path().join("leases.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut input = locker.stdin.take().unwrap();
    writeln!(input, ".timeout 5000\nBEGIN EXCLUSIVE;\nSELECT 'locked';").unwrap();
    let mut line = String::new();
    BufReader::new(locker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    // No write of A's can have been made after this instant, so the lease can pass on no
    // earlier than a ttl after it.
    let locked = Instant::now();
    let not_ready = wait_for(TTL_DURATION * 2, || a.status("/readyz") == 503)
        .unwrap_or_else(|| panic!("A stayed ready with the store locked: {}", a.process.log_text()));
    assert!(
        not_ready < TTL_DURATION,
        "A ready until {not_ready:?} after the store stopped answering (ttl {TTL_DURATION:?})"
    );
    let unhealthy = wait_for(TTL_DURATION * 2, || a.status("/healthz") == 503)
        .unwrap_or_else(|| panic!("A healthy with the store locked: {}", a.process.log_text()));
    let (_, body) = a.get("/healthz").unwrap();
    assert!(body.contains("store trouble"), "{body}");

    writeln!(input, "COMMIT;").unwrap();
    drop(input);
    locker.wait().unwrap();
    let unlocked = Instant::now();
    wait_for(Duration::from_secs(10), || {
        a.status("/readyz") == 200 && a.leader()["term"].as_u64().unwrap_or(0) > term
    })
    .unwrap_or_else(|| panic!("A not ready again: {}", a.process.log_text()));
    wait_for(Duration::from_secs(5), || a.status("/healthz") == 200).expect("A not healthy again");
    eprintln!(
        "store locked: A not ready after {not_ready:?}, then unhealthy {unhealthy:?} later; unlocked: \
         ready and healthy again after {:?} ({:?} since locked)",
        unlocked.elapsed(),
        locked.elapsed()
    );
}

/// With a command: /readyz is 200 while the command runs, at the term in its environment;
/// SIGTERM stops it, releases and exits 143.
#[test]
fn http_beside_a_command() {
    let _serial = serial();
    let store = Store::sqlite();
    let term_file = store.path("term");
    let script = format!("echo $LEASEHOLD_TERM > '{}'; exec sleep 30", term_file.display());
    let process = store.spawn_run(
        "C",
        &[
            "--lease",
            "cmd",
            "--id",
            "C",
            "--ttl",
            TTL,
            "--http",
            "127.0.0.1:0",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let mut addr = None;
    wait_for(Duration::from_secs(10), || {
        addr = process
            .log_text()
            .lines()
            .find_map(|line| Some(line.split_once("on http://")?.1.trim().to_string()));
        addr.is_some()
    })
    .unwrap_or_else(|| panic!("no address: {}", process.log_text()));
    let mut c = Sidecar {
        process,
        addr: addr.unwrap(),
    };
    wait_for(Duration::from_secs(10), || c.status("/readyz") == 200).expect("never ready");
    let mut term = 0;
    wait_for(Duration::from_secs(5), || {
        term = std::fs::read_to_string(&term_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        term > 0
    })
    .expect("the command never wrote its term");
    let (_, body) = c.get("/readyz").unwrap();
    assert!(body.contains(&format!("term {term}")), "{body}");
    assert_eq!(c.leader()["term"], term);
    c.process.signal(Signal::SIGTERM);
    assert_eq!(
        c.process.wait_exit(Duration::from_secs(5)),
        Some(143),
        "{}",
        c.process.log_text()
    );
}

/// An address that cannot be listened on: exit 7, one line, before the store is touched.
#[test]
fn http_address_in_use_exits_7() {
    let store = Store::sqlite();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = store.leasehold(&["run", "--lease", "x", "--http", &addr]);
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    let line = one_error_line(&output);
    assert!(line.contains(&format!("cannot listen on --http {addr}")), "{line}");
    assert!(!store.dir.path().join("leases.db").exists(), "the store was opened");
}

/// No command needs --http; --keep-running needs a command.
#[test]
fn no_command_needs_http() {
    let store = Store::sqlite();
    let output = store.leasehold(&["run", "--lease", "x"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let output = store.leasehold(&["run", "--lease", "x", "--http", "127.0.0.1:0", "--keep-running"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(one_error_line(&output).contains("--keep-running needs a command"));
}
