//! `leasehold handover LEASE --to ID` with real processes on SQLite: two `leasehold run`s (which
//! watch hand-over requests by default), the command asks through the store, the holder stops its
//! command and hands over, the named successor starts its command at a higher term.
//!
//! Each candidate's command appends `TERM PID ID` to a ledger every 20 ms, so the order of the
//! lines is the order of the writes: a line of the old holder after the successor's first line
//! would be an overlap.

mod support;

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Candidate, Store, alive, bin, fresh_lease, one_error_line, stdout, wait_for};

/// The scenarios measure time: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One ledger line: the term, the shell's pid, the candidate id.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    term: u64,
    pid: i32,
    id: String,
}

fn ledger(store: &Store) -> Vec<Line> {
    let text = std::fs::read_to_string(store.path("ledger")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some(Line {
                term: parts.next()?.parse().ok()?,
                pid: parts.next()?.parse().ok()?,
                id: parts.next()?.to_string(),
            })
        })
        .collect()
}

/// `leasehold run --lease LEASE --id ID --ttl TTL -- sh -c '<append to the ledger every 20 ms>'`.
fn candidate(store: &Store, lease: &str, id: &str, ttl: &str) -> Candidate {
    let script = format!(
        "while true; do echo \"$LEASEHOLD_TERM $$ $LEASEHOLD_HOLDER\" >> '{}'; sleep 0.02; done",
        store.path("ledger").display()
    );
    store.spawn_run(
        id,
        &["--lease", lease, "--id", id, "--ttl", ttl, "--", "sh", "-c", &script],
    )
}

/// The first line `id` wrote, waiting up to `limit` for it.
fn first_line_of(store: &Store, id: &str, limit: Duration) -> Option<Line> {
    wait_for(limit, || ledger(store).iter().any(|l| l.id == id))?;
    ledger(store).into_iter().find(|l| l.id == id)
}

fn status(store: &Store, lease: &str) -> Value {
    let output = store.leasehold(&["--json", "status", lease]);
    assert!(output.status.success(), "{output:?}");
    let rows: Value = serde_json::from_str(&stdout(&output)).unwrap();
    rows[0].clone()
}

/// Waits until `id`'s `leasehold run` has seen the leader and is waiting (its log says so).
fn waiting(candidate: &Candidate, limit: Duration) {
    wait_for(limit, || candidate.log_text().contains("; waiting"))
        .unwrap_or_else(|| panic!("the candidate never saw the leader: {}", candidate.log_text()));
}

/// A runs the command, B waits; `handover LEASE --to B` exits 0 once B leads at a higher term;
/// B's command runs, and A's command was gone before B's started (no line of A's after B's first,
/// A's shell dead when B's first line appeared). The history says A's term was handed over (the
/// store reserved the lease for B, not a plain release), and the request lease is free again.
/// Then back to A, with `--json`. Returns the time from starting `leasehold handover` to B's
/// first line.
fn hand_over_and_back(store: &Store, lease: &str, ttl: &str) -> Duration {
    let backend = store.url.split(':').next().unwrap();
    let a = candidate(store, lease, "A", ttl);
    let first = first_line_of(store, "A", Duration::from_secs(15)).expect("A's command never started");
    let b = candidate(store, lease, "B", ttl);
    waiting(&b, Duration::from_secs(10));

    let asked = Instant::now();
    let handover = Command::new(bin())
        .args(["--store", &store.url, "handover", lease, "--to", "B", "--within", "15s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b_first = first_line_of(store, "B", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("B's command never started; A: {}\nB: {}", a.log_text(), b.log_text()));
    let b_started = asked.elapsed();
    let a_shell_alive = alive(first.pid);
    let output = handover.wait_with_output().unwrap();
    let exited = asked.elapsed();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{output:?}\nA: {}\nB: {}",
        a.log_text(),
        b.log_text()
    );
    assert!(!a_shell_alive, "A's command still ran when B's started");
    assert!(
        b_first.term > first.term,
        "B's term {} after A's {}",
        b_first.term,
        first.term
    );
    let said = stdout(&output);
    assert_eq!(
        said.split(" after ").next(),
        Some(format!("B leads {lease} at term {}", b_first.term).as_str()),
        "{said}"
    );

    // No overlap: every line of A's term comes before B's first.
    std::thread::sleep(Duration::from_millis(300));
    let lines = ledger(store);
    let b_at = lines.iter().position(|l| l.id == "B").unwrap();
    assert!(
        lines[b_at..].iter().all(|l| l.id == "B" && l.term == b_first.term),
        "A wrote after B started: {lines:?}"
    );
    let history = store.leasehold(&["--json", "history", lease]);
    let history: Value = serde_json::from_str(&stdout(&history)).unwrap();
    let a_term = history
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["term"] == first.term)
        .unwrap_or_else(|| panic!("no term {} in {history}", first.term));
    assert_eq!(a_term["end_reason"], "handed_over", "{history}");
    let requests = format!("{lease}.handover");
    assert_eq!(
        status(store, &requests)["state"],
        "free",
        "the request was not given back"
    );
    let a_log = a.log_text();
    let handing = format!("handing {lease} (term {}) over to B, as asked", first.term);
    assert!(a_log.contains(&handing), "{a_log}");
    println!(
        "[{backend}] handover A (term {}) -> B (term {}): B's command wrote its first line {b_started:?} after \
         `leasehold handover` started; the command exited after {exited:?} ({})",
        first.term,
        b_first.term,
        said.trim()
    );

    // And back, with --json.
    let back = store.leasehold(&["--json", "handover", lease, "--to", "A", "--within", "15s"]);
    assert!(
        back.status.success(),
        "{back:?}\nA: {}\nB: {}",
        a.log_text(),
        b.log_text()
    );
    let json: Value = serde_json::from_str(&stdout(&back)).unwrap();
    assert_eq!(json["lease"], lease);
    assert_eq!(json["to"], "A");
    assert_eq!(json["previous"]["holder"], "B");
    assert_eq!(json["previous"]["term"], b_first.term);
    assert!(json["term"].as_u64().unwrap() > b_first.term, "{json}");
    assert!(json["took_ms"].is_u64(), "{json}");
    assert_eq!(json["already_leading"], false);
    let seen = status(store, lease);
    assert_eq!((&seen["holder"], &seen["term"]), (&json!("A"), &json["term"]), "{seen}");
    b_started
}

#[test]
fn handover_moves_the_command_to_the_named_successor() {
    let _serial = serial();
    hand_over_and_back(&Store::sqlite(), "jobs", "2s");
}

/// The handover on a networked store named by `var`, if set and supported by this build.
fn networked(var: &str) {
    let Ok(url) = std::env::var(var) else {
        eprintln!("SKIPPED: set {var} to run `leasehold handover` against that store");
        return;
    };
    let store = Store::at(&url);
    let probe = store.leasehold(&["status", "leasehold-cli-probe"]);
    let stderr = String::from_utf8_lossy(&probe.stderr);
    if stderr.contains("unsupported store scheme") {
        eprintln!(
            "SKIPPED: {var} is set, but this build of leasehold cannot use it: {}",
            stderr.trim()
        );
        return;
    }
    assert!(probe.status.success(), "{var}: `leasehold status` failed: {stderr}");
    let _serial = serial();
    hand_over_and_back(&store, &fresh_lease("cli-handover"), "2s");
}

#[test]
fn handover_on_redis() {
    networked("LEASEHOLD_REDIS_URL");
}

#[test]
fn handover_on_postgres() {
    networked("LEASEHOLD_POSTGRES_URL");
}

#[test]
fn handover_on_etcd() {
    networked("LEASEHOLD_ETCD_URL");
}

#[test]
fn handover_on_zookeeper() {
    networked("LEASEHOLD_ZOOKEEPER_URL");
}

/// Nobody holds the lease: exit 8, one line saying so (never held, and after a release). The
/// holder is the one named: exit 0, "already leads". An empty id is a usage error (exit 2).
#[test]
fn handover_of_a_free_lease_or_to_the_holder() {
    let _serial = serial();
    let store = Store::sqlite();
    let output = store.leasehold(&["handover", "jobs", "--to", ""]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(one_error_line(&output).contains("must not be empty"));
    let output = store.leasehold(&["handover", "jobs", "--to", "B"]);
    assert_eq!(output.status.code(), Some(8), "{output:?}");
    let stderr = one_error_line(&output);
    assert_eq!(
        stderr.trim_end(),
        "leasehold: cannot hand over lease jobs: nobody holds it (B takes it by campaigning)"
    );

    let done = store.leasehold(&["run", "--lease", "jobs", "--id", "A", "--ttl", "1s", "--", "true"]);
    assert!(done.status.success(), "{done:?}");
    let output = store.leasehold(&["handover", "jobs", "--to", "B"]);
    assert_eq!(output.status.code(), Some(8), "{output:?}");
    assert!(one_error_line(&output).contains("nobody holds it"));

    let _a = candidate(&store, "jobs", "A", "1s");
    wait_for(Duration::from_secs(10), || status(&store, "jobs")["holder"] == "A").expect("A never led");
    let output = store.leasehold(&["handover", "jobs", "--to", "A"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout(&output).trim(),
        "A already leads jobs at term 2: nothing to hand over"
    );
    let output = store.leasehold(&["--json", "handover", "jobs", "--to", "A"]);
    let json: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(
        (json["already_leading"].as_bool(), json["term"].as_u64()),
        (Some(true), Some(2))
    );
}

/// The successor is not running: the holder hands over all the same, nobody takes the
/// reservation, and the command gives up after `--within` with exit 9 ("did not take ... the
/// lease opens to everyone"); a second handover meanwhile is refused (exit 9: another is in
/// progress). Afterwards the request lease is free, and once the reservation's TTL has passed one
/// of the running candidates leads at a higher term.
#[test]
fn handover_to_a_candidate_that_is_not_running_times_out_and_the_lease_opens() {
    let _serial = serial();
    let store = Store::sqlite();
    let _a = candidate(&store, "jobs", "A", "4s");
    let first = first_line_of(&store, "A", Duration::from_secs(15)).expect("A's command never started");
    let c = candidate(&store, "jobs", "C", "4s");
    waiting(&c, Duration::from_secs(10));

    let asked = Instant::now();
    let handover = Command::new(bin())
        .args(["--store", &store.url, "handover", "jobs", "--to", "B", "--within", "3s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(2), || {
        status(&store, "jobs.handover")["holder"] == "B"
    })
    .expect("the request lease was never taken");
    let other = store.leasehold(&["handover", "jobs", "--to", "C"]);
    assert_eq!(other.status.code(), Some(9), "{other:?}");
    let refused = one_error_line(&other);
    assert!(
        refused.contains("another handover, to B, is in progress") || refused.contains("being handed over to B"),
        "{refused}"
    );

    let output = handover.wait_with_output().unwrap();
    let gave_up = asked.elapsed();
    assert_eq!(output.status.code(), Some(9), "{output:?}");
    let stderr = one_error_line(&output);
    assert!(
        stderr.starts_with("leasehold: B did not take lease jobs within 3s; the lease opens to everyone"),
        "{stderr}"
    );
    assert!(gave_up >= Duration::from_secs(3), "gave up after {gave_up:?}");
    assert_eq!(
        status(&store, "jobs.handover")["state"],
        "free",
        "the request was not given back"
    );

    let next = wait_for(Duration::from_secs(20), || {
        let seen = status(&store, "jobs");
        seen["term"].as_u64().is_some_and(|t| t > first.term) && seen["reserved"] == false
    })
    .map(|_| status(&store, "jobs"))
    .expect("nobody took the lease after the reservation lapsed");
    assert!(next["holder"] == "A" || next["holder"] == "C", "{next}");
    println!(
        "[sqlite] handover to a candidate that does not run: gave up after {gave_up:?}; then {} led at term {} \
         ({:?} after the command started)",
        next["holder"],
        next["term"],
        asked.elapsed()
    );
}

/// SIGTERM while waiting: exit 143, one line, and the request lease is given back first (a
/// leader that leads again must not find it and hand over once more).
#[test]
fn an_interrupted_handover_gives_the_request_back() {
    let _serial = serial();
    let store = Store::sqlite();
    let _a = candidate(&store, "jobs", "A", "3s");
    first_line_of(&store, "A", Duration::from_secs(15)).expect("A's command never started");
    let handover = Command::new(bin())
        .args([
            "--store", &store.url, "handover", "jobs", "--to", "B", "--within", "30s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(5), || {
        status(&store, "jobs.handover")["holder"] == "B"
    })
    .expect("the request lease was never taken");
    let pid = nix::unistd::Pid::from_raw(handover.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = handover.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(143), "{output:?}");
    let stderr = one_error_line(&output);
    assert!(
        stderr.starts_with("leasehold: received SIGTERM: stopped waiting for lease jobs"),
        "{stderr}"
    );
    assert_eq!(
        status(&store, "jobs.handover")["state"],
        "free",
        "the request was not given back"
    );
}
