//! `leasehold run` in normal operation: exit statuses, restarts, signals, and refused settings.

mod support;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{Store, alive, ledger, one_error_line, wait_for};

fn history_json(store: &Store, lease: &str) -> Vec<serde_json::Value> {
    let output = store.leasehold(&["--json", "history", lease]);
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice::<serde_json::Value>(&output.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn exits_with_the_commands_status_and_releases() {
    let store = Store::sqlite();
    let output = store.leasehold(&[
        "run",
        "--lease",
        "job",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        "test \"$LEASEHOLD_LEASE\" = job && test \"$LEASEHOLD_TERM\" = 1 && test -n \"$LEASEHOLD_HOLDER\" && exit 7",
    ]);
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    let history = history_json(&store, "job");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["end_reason"], "released");

    let output = store.leasehold(&["run", "--lease", "job", "--ttl", "2s", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(output.status.code(), Some(137), "killed by SIGKILL: 128 + 9");
    assert_eq!(history_json(&store, "job")[1]["term"], 2);
}

#[test]
fn keep_running_restarts_the_command_with_a_new_term() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'", path.display());
    let mut run = store.spawn_run(
        "k",
        &[
            "--lease",
            "again",
            "--ttl",
            "1s",
            "--keep-running",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for(Duration::from_secs(15), || ledger(&path).len() >= 3).expect("three runs of the command");
    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143));
    let terms: Vec<u64> = ledger(&path).iter().map(|e| e.term).collect();
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "each run has its own, higher term: {terms:?}"
    );
}

#[test]
fn sigterm_stops_the_command_gracefully_and_releases() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!(
        "trap 'echo \"0 $$\" >> {0}; exit 0' TERM; echo \"$LEASEHOLD_TERM $$\" >> {0}; while true; do sleep 0.05; done",
        path.display()
    );
    let mut run = store.spawn_run("g", &["--lease", "graceful", "--ttl", "2s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143), "{}", run.log_text());
    let entries = ledger(&path);
    assert_eq!(
        entries.last().map(|e| e.term),
        Some(0),
        "the command saw SIGTERM: {entries:?}"
    );
    assert!(run.log_text().contains("after SIGTERM"), "{}", run.log_text());
    assert_eq!(history_json(&store, "graceful")[0]["end_reason"], "released");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!(
        "trap '' TERM; echo \"$LEASEHOLD_TERM $$\" >> {}; while true; do sleep 0.05; done",
        path.display()
    );
    let mut run = store.spawn_run(
        "s",
        &[
            "--lease",
            "stubborn",
            "--ttl",
            "2s",
            "--kill-grace",
            "300ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    let shell = ledger(&path)[0].pid;
    run.signal(Signal::SIGINT);
    let started = Instant::now();
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(130));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "SIGKILL came before the grace: {took:?}"
    );
    assert!(!alive(shell));
    assert!(run.log_text().contains("with SIGKILL"), "{}", run.log_text());
}

#[test]
fn what_the_command_leaves_behind_is_ended_before_the_release() {
    let store = Store::sqlite();
    let pidfile = store.path("background");
    let script = format!("sleep 30 & echo $! > '{}'; exit 0", pidfile.display());
    let output = store.leasehold(&["run", "--lease", "bg", "--ttl", "1s", "--", "sh", "-c", &script]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let background: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(!alive(background), "the background job outlived the leadership");
}

#[test]
fn a_signal_while_campaigning_exits_without_starting_anything() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; sleep 30", path.display());
    let mut holder = store.spawn_run("h", &["--lease", "busy", "--ttl", "1s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the first command starts");
    let mut waiting = store.spawn_run("w", &["--lease", "busy", "--ttl", "1s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(5), || waiting.log_text().contains("waiting")).expect("the second one waits");
    waiting.signal(Signal::SIGINT);
    assert_eq!(waiting.wait_exit(Duration::from_secs(5)), Some(130));
    assert_eq!(ledger(&path).len(), 1);
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
}

#[test]
fn wait_gives_up_when_another_holds_the_lease() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; sleep 30", path.display());
    let _holder = store.spawn_run("h", &["--lease", "nightly", "--ttl", "1s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the first command starts");
    let started = Instant::now();
    let output = store.leasehold(&[
        "run", "--lease", "nightly", "--ttl", "1s", "--wait", "500ms", "--", "sh", "-c", &script,
    ]);
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not elected for lease nightly within --wait 500ms"),
        "{stderr}"
    );
    assert_eq!(ledger(&path).len(), 1, "the second command never ran");

    // Elected in time: --wait changes nothing.
    let output = store.leasehold(&["run", "--lease", "free", "--wait", "5s", "--", "true"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[test]
fn a_grace_that_does_not_fit_in_the_lease_is_refused() {
    let store = Store::sqlite();
    let output = store.leasehold(&["run", "--lease", "x", "--ttl", "1s", "--kill-grace", "1s", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = one_error_line(&output);
    assert!(stderr.contains("--kill-grace 1s does not fit in --ttl 1s"), "{stderr}");
}

#[test]
fn a_missing_command_fails_before_campaigning() {
    let store = Store::sqlite();
    let output = store.leasehold(&["run", "--lease", "x", "--", "no-such-command-leasehold"]);
    assert_eq!(output.status.code(), Some(127));
    assert!(one_error_line(&output).contains("command not found: no-such-command-leasehold"));
    assert!(history_json(&store, "x").is_empty(), "nothing was acquired");
}

#[test]
fn keep_running_backs_off_while_the_command_fails() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exit 3", path.display());
    let args = |quiet: bool| {
        let mut args = vec!["--lease", "failing", "--ttl", "1s", "--keep-running"];
        if quiet {
            args.push("-q");
        }
        args.extend(["--", "sh", "-c", &script]);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let loud = args(false);
    let mut run = store.spawn_run("loud", &loud.iter().map(String::as_str).collect::<Vec<_>>());
    // Without back-off it restarted every ~0.8 s: 5 runs in 4 s. With 1 s, 2 s, 4 s: 3 runs.
    std::thread::sleep(Duration::from_secs(4));
    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143));
    let runs = ledger(&path).len();
    assert!((2..=3).contains(&runs), "{runs} runs in 4 s: {}", run.log_text());
    let log = run.log_text();
    assert!(log.contains("sh exited with status 3"), "{log}");
    assert!(log.contains("sh failed 1 time in a row; restarting it in 1s"), "{log}");
    assert!(log.contains("sh failed 2 times in a row; restarting it in 2s"), "{log}");

    let quiet = args(true);
    let mut run = store.spawn_run("quiet", &quiet.iter().map(String::as_str).collect::<Vec<_>>());
    wait_for(Duration::from_secs(10), || ledger(&path).len() > runs).expect("the quiet one runs");
    std::thread::sleep(Duration::from_millis(1500));
    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143));
    assert_eq!(run.log_text(), "", "-q prints nothing");
}

#[test]
fn timestamps_when_asked_or_when_stderr_is_not_a_terminal() {
    let store = Store::sqlite();
    let stamped = |line: &str| {
        let (time, rest) = line.split_once(' ').unwrap_or_default();
        time.len() == 24 && time.ends_with('Z') && rest.starts_with("leasehold: ")
    };
    // stderr is a pipe here: stamped by default.
    let output = store.leasehold(&["run", "--lease", "t", "--ttl", "1s", "--", "true"]);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!stderr.is_empty() && stderr.lines().all(stamped), "{stderr}");
    let output = store.leasehold(&["run", "--lease", "t", "--ttl", "1s", "--timestamps=never", "--", "true"]);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        !stderr.is_empty() && stderr.lines().all(|l| l.starts_with("leasehold: ")),
        "{stderr}"
    );
    let output = store.leasehold(&["run", "--lease", "t", "--ttl", "1s", "--timestamps", "--", "true"]);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(stderr.lines().all(stamped), "{stderr}");
}

#[test]
fn a_lost_lease_says_why_first_and_once() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exec sleep 30", path.display());
    let run = store.spawn_run("b", &["--lease", "broken", "--ttl", "3s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    let output = store.leasehold(&["break", "broken"]);
    assert!(output.status.success(), "{output:?}");
    wait_for(Duration::from_secs(5), || run.log_text().contains("after SIGTERM"))
        .unwrap_or_else(|| panic!("{}", run.log_text()));
    let log = run.log_text();
    let lines: Vec<&str> = log.lines().map(support::untimed).collect();
    let lost = lines
        .iter()
        .position(|l| l.starts_with("leasehold: lost broken (term 1): "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(lines[lost].contains("; stopping sh: SIGTERM now, SIGKILL in "), "{log}");
    assert!(lines[lost + 1].contains("sh ended after SIGTERM in "), "{log}");
    assert_eq!(log.matches("lost broken").count(), 1, "said once: {log}");
    // No duration at full precision (e.g. 667.920197ms).
    assert!(
        !log.split_whitespace()
            .any(|w| w.trim_end_matches([',', ')', ';']).ends_with("ms") && w.contains('.') && w.len() > 8),
        "{log}"
    );
}

/// A Redis user that may read but not write: the store's scripts fail with a permission error
/// on every acquire (after `connect` succeeded).
fn redis_user_without_write(url: &str) -> Option<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("redis://")?;
    if rest.contains('@') {
        return None; // a server with credentials: this test does not manage its users
    }
    let host = rest.split(['/', '?']).next()?;
    let mut stream = std::net::TcpStream::connect(host).ok()?;
    let args = [
        "ACL",
        "SETUSER",
        "leasehold-cli-readonly",
        "reset",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-@write",
    ];
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(command.as_bytes()).ok()?;
    let mut reply = [0u8; 64];
    let n = stream.read(&mut reply).ok()?;
    assert!(
        reply[..n].starts_with(b"+OK"),
        "{:?}",
        String::from_utf8_lossy(&reply[..n])
    );
    Some(format!("redis://leasehold-cli-readonly:secret@{host}"))
}

#[test]
fn authentication_and_permission_failures_exit_6_even_when_quiet() {
    // A wrong password for the file... SQLite has none; Redis shows both kinds.
    let Ok(url) = std::env::var("LEASEHOLD_REDIS_URL") else {
        eprintln!("SKIPPED: set LEASEHOLD_REDIS_URL to check exit 6 against Redis");
        return;
    };
    let host = url
        .strip_prefix("redis://")
        .unwrap()
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_string();
    // Refused at connect: at once.
    let wrong = Store::at(&format!("redis://nobody:s3cret-pw@{host}"));
    let output = wrong.leasehold(&["run", "--lease", "auth", "--wait", "5s", "-q", "--", "true"]);
    assert_eq!(output.status.code(), Some(6), "{output:?}");
    let stderr = one_error_line(&output);
    assert!(
        stderr.contains("refused connect: authentication failed") && !stderr.contains("s3cret-pw"),
        "{stderr}"
    );

    // Refused on every acquire, with --wait: exit 6 (not 5) when the wait ends, said under -q.
    let Some(readonly) = redis_user_without_write(&url) else {
        eprintln!("SKIPPED: the Redis at LEASEHOLD_REDIS_URL has credentials");
        return;
    };
    let store = Store::at(&readonly);
    let started = Instant::now();
    let output = store.leasehold(&["run", "--lease", "auth", "--wait", "1500ms", "-q", "--", "true"]);
    assert_eq!(output.status.code(), Some(6), "{output:?}");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the store refused our credentials or permissions"),
        "{stderr}"
    );
    assert!(stderr.contains("giving up on lease auth after"), "{stderr}");
    assert_eq!(
        stderr.matches("refused our credentials").count(),
        1,
        "said once: {stderr}"
    );

    // Without --wait: after --auth-retry.
    let started = Instant::now();
    let output = store.leasehold(&["run", "--lease", "auth", "--auth-retry", "1s", "-q", "--", "true"]);
    assert_eq!(output.status.code(), Some(6), "{output:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

/// A cgroup v1 freezer group: a frozen process is in state D and does not die of SIGKILL until
/// it is thawed, like a process stuck in an uninterruptible system call.
struct Freezer {
    dir: std::path::PathBuf,
}

impl Freezer {
    fn new() -> Option<Self> {
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/freezer/leasehold-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Freezer { dir })
    }

    fn freeze(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        std::fs::write(self.dir.join("freezer.state"), "FROZEN").unwrap();
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        std::thread::sleep(Duration::from_millis(100));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_process_that_cannot_be_killed_keeps_the_lease_until_it_runs_out() {
    let Some(freezer) = Freezer::new() else {
        eprintln!("SKIPPED: no writable cgroup v1 freezer to make an unkillable process with");
        return;
    };
    let store = Store::sqlite();
    let (pidfile, go, path) = (store.path("pid"), store.path("go"), store.path("ledger"));
    let script = format!(
        "sleep 60 & echo $! > '{}'; while [ ! -e '{}' ]; do sleep 0.01; done; exit 0",
        pidfile.display(),
        go.display()
    );
    let mut a = store.spawn_run(
        "a",
        &[
            "--lease",
            "stuck",
            "--ttl",
            "2s",
            "--kill-grace",
            "300ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(&pidfile).is_ok_and(|t| t.ends_with('\n'))
    })
    .expect("the command starts");
    let stuck: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    freezer.freeze(stuck);
    let next = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exec sleep 30", path.display());
    let b = store.spawn_run("b", &["--lease", "stuck", "--ttl", "2s", "--", "sh", "-c", &next]);
    wait_for(Duration::from_secs(5), || b.log_text().contains("waiting")).expect("B campaigns");

    std::fs::write(&go, "").unwrap();
    let exited = Instant::now();
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).unwrap_or_else(|| panic!("{}", a.log_text()));
    let successor_after = exited.elapsed();
    assert_eq!(a.wait_exit(Duration::from_secs(5)), Some(0), "{}", a.log_text());
    let log = a.log_text();
    println!("[sqlite] stuck process: the successor started {successor_after:?} after the command exited\n{log}");
    // `sleep`, or still `sh` if it was frozen before it could execute `sleep`.
    assert!(
        log.contains(&format!("{stuck} (")) && log.contains(", state D: uninterruptible sleep)"),
        "{log}"
    );
    assert!(log.contains("lease stuck is not released: it runs out"), "{log}");
    assert!(!log.contains("released stuck"), "released early: {log}");
    let history = history_json(&store, "stuck");
    assert_eq!(history[0]["end_reason"], "expired", "{history:?}");
    // Not released: the successor waited for the lease to run out (a release lets it in at once).
    assert!(
        successor_after >= Duration::from_millis(1500),
        "{successor_after:?}\n{log}"
    );
    drop(freezer); // thawed: the SIGKILL it has pending ends it
    wait_for(Duration::from_secs(5), || !alive(stuck)).expect("the thawed process dies of its pending SIGKILL");
}

/// The command's process group gets SIGTERM in one step; what left the group (here a child in
/// a new session) gets it from the walk of the tree, not only SIGKILL after the grace. (The
/// command ignores SIGTERM: its guard, which ends what an exited command leaves behind, does not
/// step in.)
#[test]
fn sigterm_reaches_what_left_the_commands_process_group() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let got = store.path("got");
    let script = format!(
        "setsid sh -c 'trap \"echo left >> {got}; exit 0\" TERM; while true; do sleep 0.05; done' & \
         trap '' TERM; echo \"$LEASEHOLD_TERM $$\" >> {ledger}; while true; do sleep 0.05; done",
        got = got.display(),
        ledger = path.display()
    );
    let mut run = store.spawn_run(
        "g",
        &[
            "--lease",
            "groups",
            "--ttl",
            "4s",
            "--kill-grace",
            "500ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    // The setsid child has started its loop.
    std::thread::sleep(Duration::from_millis(300));
    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143), "{}", run.log_text());
    let text = std::fs::read_to_string(&got).unwrap_or_default();
    assert_eq!(
        text.trim(),
        "left",
        "SIGTERM once to the child that left the group\n{}",
        run.log_text()
    );
    assert!(run.log_text().contains("with SIGKILL"), "{}", run.log_text());
}
