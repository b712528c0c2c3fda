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
