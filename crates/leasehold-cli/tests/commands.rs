//! `status`, `history`, `watch`, `break`, `--help` and the errors, against a real lease.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use support::{Store, alive, bin, ledger, one_error_line, stdout, wait_for};

#[test]
fn every_subcommand_has_help() {
    for sub in ["run", "status", "history", "watch", "break", "handover"] {
        let output = Command::new(bin())
            .args([sub, "--help"])
            .env_remove("LEASEHOLD_STORE")
            .output()
            .unwrap();
        assert!(output.status.success(), "{sub}: {output:?}");
        let text = stdout(&output);
        assert!(text.contains(&format!("Usage: leasehold {sub}")), "{sub}: {text}");
        assert!(text.contains("--store <URL>"), "{sub}: {text}");
    }
    let output = Command::new(bin()).arg("--help").output().unwrap();
    assert!(stdout(&output).contains("Exit codes"), "{output:?}");
}

/// `completions SHELL` and `man` need no store and describe the real subcommands. (The hidden
/// internal `__child-guard` is offered too: clap_complete does not leave hidden subcommands out.)
#[test]
fn completions_and_manual_page() {
    for (shell, marker) in [
        ("bash", "_leasehold()"),
        ("zsh", "#compdef leasehold"),
        ("fish", "complete -c leasehold"),
    ] {
        let output = Command::new(bin())
            .args(["completions", shell])
            .env_remove("LEASEHOLD_STORE")
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = stdout(&output);
        assert!(script.contains(marker), "{shell}: no {marker:?} in\n{script}");
        for sub in ["run", "status", "handover", "shards", "completions", "man"] {
            assert!(script.contains(sub), "{shell}: subcommand {sub} missing");
        }
    }
    let output = Command::new(bin())
        .arg("man")
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let page = stdout(&output);
    assert!(
        page.starts_with(".ie") || page.contains(".TH leasehold"),
        "not a manual page:\n{page}"
    );
    assert!(page.contains("Exit codes"), "the exit codes are not in the manual page");
    let output = Command::new(bin()).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

fn fails(store: &str, args: &[&str], code: i32) -> String {
    let output = Command::new(bin())
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(code), "{store} {args:?}: {output:?}");
    one_error_line(&output)
}

#[test]
fn bad_stores_fail_with_one_clear_line() {
    let stderr = fails("not a url", &["status", "x"], 2);
    assert!(
        stderr.contains("cannot connect to not a url: invalid store URL"),
        "{stderr}"
    );

    let stderr = fails("nosuch://host/x", &["status", "x"], 2);
    assert!(stderr.contains("unsupported store scheme \"nosuch\""), "{stderr}");

    let stderr = fails(
        "sqlite:///nonexistent-leasehold-dir/sub/leases.db",
        &["history", "x"],
        3,
    );
    assert!(stderr.starts_with("leasehold: cannot connect to sqlite:///nonexistent-leasehold-dir/sub/leases.db: "));
    let stderr = fails(
        "sqlite:///nonexistent-leasehold-dir/sub/leases.db",
        &["run", "--lease", "x", "--", "true"],
        3,
    );
    assert!(stderr.contains("cannot connect"), "{stderr}");

    // Unsupported in this build (2) or unreachable (3), but never with the password shown.
    let output = Command::new(bin())
        .args(["--store", "postgres://app:hunter2@127.0.0.1:1/db", "status", "x"])
        .output()
        .unwrap();
    assert!(matches!(output.status.code(), Some(2 | 3)), "{output:?}");
    let stderr = one_error_line(&output);
    assert!(!stderr.contains("hunter2") && stderr.contains("app:***@"), "{stderr}");

    let output = Command::new(bin())
        .args(["status", "x"])
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(one_error_line(&output).contains("LEASEHOLD_STORE"));
}

#[test]
fn bad_arguments_are_usage_errors() {
    let store = Store::sqlite();
    let output = store.leasehold(&["status", "no/slashes"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(one_error_line(&output).contains("invalid lease name"));
    let output = store.leasehold(&["run", "--lease", "x", "--ttl", "10", "--", "true"]);
    assert_eq!(output.status.code(), Some(2), "a duration needs a unit");
    let output = store.leasehold(&["run", "--lease", "x", "true"]);
    assert_eq!(output.status.code(), Some(2), "the command comes after --");
    let output = store.leasehold(&["status", "--prefix", "jobs.", "jobs.a"]);
    assert_eq!(output.status.code(), Some(2), "leases are named or listed, not both");
}

/// `status` without a name lists every lease of the store, sorted, as `status NAME` shows each;
/// `--prefix` keeps those whose name starts with it.
#[test]
fn status_without_a_name_lists_every_lease() {
    let store = Store::sqlite();
    let output = store.leasehold(&["status"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "no leases in the store");
    assert_eq!(stdout(&store.leasehold(&["--json", "status"])).trim(), "[]");

    // Two leases held once and released, one held now.
    for lease in ["jobs.b", "other"] {
        let output = store.leasehold(&["run", "--lease", lease, "--id", "once", "--", "true"]);
        assert!(output.status.success(), "{output:?}");
    }
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exec sleep 60", path.display());
    let _holder = store.spawn_run(
        "holder",
        &[
            "--lease", "jobs.a", "--id", "holder-1", "--ttl", "5s", "--", "sh", "-c", &script,
        ],
    );
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    let term = ledger(&path)[0].term.to_string();

    let output = store.leasehold(&["status"]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        [
            vec!["LEASE", "STATE", "HOLDER", "TERM", "TTL", "TIME", "LEFT"],
            vec!["jobs.a", "held", "holder-1", &term, "5s", "unknown"],
            vec!["jobs.b", "free", "(released)", "-", "1", "-", "-"],
            vec!["other", "free", "(released)", "-", "1", "-", "-"],
        ],
        "{text}"
    );
    // The same rows as naming the leases.
    assert_eq!(stdout(&store.leasehold(&["status", "jobs.a", "jobs.b", "other"])), text);

    let output = store.leasehold(&["status", "--prefix", "jobs."]);
    let text = stdout(&output);
    let leases: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(leases, ["jobs.a", "jobs.b"], "{text}");

    let output = store.leasehold(&["--json", "status", "--prefix", "jobs."]);
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["lease"], "jobs.a");
    assert_eq!(listed[0]["holder"], "holder-1");
    assert_eq!(listed[0]["ttl_ms"], 5000);
    assert_eq!(listed[1]["lease"], "jobs.b");
    assert_eq!(listed[1]["state"], "free");
    assert_eq!(listed[1]["last_term"], 1);
    assert_eq!(listed[1]["previous_end"], "released");

    let output = store.leasehold(&["status", "--prefix", "nothing-"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "no leases starting with \"nothing-\"");
}

#[test]
fn status_history_watch_and_break_on_a_real_lease() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exec sleep 60", path.display());
    let mut run = store.spawn_run(
        "holder",
        &[
            "--lease",
            "reports",
            "--id",
            "test-holder",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the command starts");
    let first = ledger(&path)[0];

    // The store's env var works as well as --store.
    let output = Command::new(bin())
        .env("LEASEHOLD_STORE", &store.url)
        .args(["status", "reports", "unused"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let table = stdout(&output);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("LEASE") && lines[0].contains("TIME LEFT"),
        "{table}"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "reports",
            "held",
            "test-holder",
            &first.term.to_string(),
            "1s",
            "unknown"
        ],
        "{table}"
    );
    assert!(
        lines[2].starts_with("unused") && lines[2].contains("free (never held)"),
        "{table}"
    );

    let output = store.leasehold(&["status", "--json", "reports"]);
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status[0]["holder"], "test-holder");
    assert_eq!(status[0]["term"], first.term);
    assert_eq!(status[0]["state"], "held");
    assert_eq!(status[0]["ttl_ms"], 1000);
    assert_eq!(status[0]["store_remaining_ms"], Value::Null);

    let mut watch = Command::new(bin())
        .args([
            "--store",
            &store.url,
            "--json",
            "watch",
            "reports",
            "--interval",
            "50ms",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, watched) = mpsc::channel::<Value>();
    let watch_out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(watch_out).lines() {
            let _ = lines_tx.send(serde_json::from_str(&line.unwrap()).unwrap());
        }
    });
    let current = watched
        .recv_timeout(Duration::from_secs(5))
        .expect("watch prints the current leader");
    assert_eq!(current["term"], first.term);
    assert_eq!(current["holder"], "test-holder");

    let output = store.leasehold(&["break", "reports"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout(&output).trim(),
        format!("broke lease reports: term {} of test-holder ended", first.term)
    );

    // The holder learns at its next renewal, stops its command, and (alone) wins again.
    wait_for(Duration::from_secs(5), || !alive(first.pid)).expect("the broken leader's command is stopped");
    wait_for(Duration::from_secs(10), || ledger(&path).len() >= 2).expect("the command runs again");
    let second = ledger(&path)[1];
    assert!(second.term > first.term);
    let mut ended = None;
    while let Ok(line) = watched.recv_timeout(Duration::from_secs(5)) {
        if line["previous"]["term"] == first.term {
            ended = Some(line["previous"]["ended"].clone());
        }
        if line["term"] == second.term {
            break;
        }
    }
    assert_eq!(
        ended,
        Some(Value::from("broken")),
        "watch reports how the broken term ended"
    );

    let output = store.leasehold(&["history", "reports"]);
    let text = stdout(&output);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .eq(["TERM", "HOLDER", "ACQUIRED", "ENDED", "HOW"]),
        "{text}"
    );
    assert!(text.contains("broken") && text.contains("holding"), "{text}");
    let output = store.leasehold(&["--json", "history", "reports", "--limit", "1"]);
    let history: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1);
    assert_eq!(history[0]["term"], second.term);
    assert_eq!(history[0]["end_reason"], Value::Null);

    run.signal(Signal::SIGTERM);
    assert_eq!(run.wait_exit(Duration::from_secs(5)), Some(143));
    let output = store.leasehold(&["--json", "status", "reports"]);
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status[0]["state"], "free");
    assert_eq!(status[0]["previous_end"], "released");
    assert_eq!(status[0]["last_term"], second.term);

    let output = store.leasehold(&["break", "reports", "--json"]);
    let broken: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        broken,
        serde_json::json!({"lease": "reports", "broken_term": null, "holder": null})
    );
    assert_eq!(
        stdout(&store.leasehold(&["break", "reports"])).trim(),
        "lease reports is free: nothing to break"
    );

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(watch.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(watch.wait().unwrap().code(), Some(0));
}

#[test]
fn history_of_an_unknown_lease_is_empty() {
    let store = Store::sqlite();
    let output = store.leasehold(&["history", "never"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "no recorded terms for lease never");
}

/// The exit codes that `leasehold --help` lists, that docs/cli.md lists, and that the tests
/// check (`run.rs`, `commands.rs`, `containment.rs`) are the same.
#[test]
fn exit_code_tables_agree() {
    let help = stdout(&Command::new(bin()).arg("--help").output().unwrap());
    let table = help.split("Exit codes:").nth(1).expect("an exit-code table in --help");
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let docs = docs
        .split("## Exit codes")
        .nth(1)
        .expect("an exit-code section in docs/cli.md");
    let doc_rows: Vec<&str> = docs.lines().filter(|l| l.starts_with("| ")).collect();
    for (code, words) in [
        ("0", "success"),
        ("1", "runtime error"),
        ("2", "usage or configuration error"),
        ("3", "unreachable"),
        ("4", "does not support"),
        ("5", "not elected"),
        ("6", "credentials or permissions"),
        ("7", "cannot be listened on"),
        ("8", "nobody holds the lease"),
        ("9", "the successor did not take the lease"),
        ("126", "not executable"),
        ("127", "not found"),
        ("129", "SIGHUP"),
        ("130", "SIGINT"),
        ("143", "SIGTERM"),
    ] {
        let in_help = table.lines().enumerate().any(|(i, line)| {
            let codes = line
                .split_whitespace()
                .take_while(|w| w.trim_end_matches(',').parse::<u32>().is_ok());
            codes.map(|w| w.trim_end_matches(',')).any(|c| c == code)
                && (line.contains(words) || table.lines().nth(i + 1).is_some_and(|next| next.contains(words)))
        });
        assert!(in_help, "--help lacks exit code {code} ({words}):\n{table}");
        let in_docs = doc_rows.iter().any(|row| {
            let first = row.split('|').nth(1).unwrap_or_default();
            first.split(|c: char| !c.is_ascii_digit()).any(|c| c == code) && row.contains(words)
        });
        assert!(in_docs, "docs/cli.md lacks exit code {code} ({words})");
    }
}

/// A port that serves another protocol (here: an HTTP server that answers 400 and hangs up)
/// gives the same exit code on every command for the same URL, whatever the backend concludes
/// (3: cannot reach a store there; 6: something else answers there). Before, the same address
/// gave exit 3 on one command and exit 6 on another.
#[test]
fn a_port_serving_another_protocol_exits_alike_on_every_command() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(200)));
            let _ = stream.read(&mut [0; 512]);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let commands: [&[&str]; 8] = [
        &["status", "jobs"],
        &["status", "--prefix", "j"],
        &["history", "jobs"],
        &["break", "jobs"],
        &["watch", "jobs"],
        &["handover", "jobs", "--to", "b"],
        &["run", "--lease", "jobs", "--wait", "2s", "--", "true"],
        &["shards", "status", "g"],
    ];
    for (scheme, path) in [("redis", "/0"), ("etcd", "/app"), ("zk", "/app"), ("postgres", "/db")] {
        let url = format!("{scheme}://127.0.0.1:{port}{path}");
        let mut codes = Vec::new();
        for args in commands {
            let output = Command::new(bin())
                .arg("--store")
                .arg(&url)
                .args(args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stderr.contains("unsupported store scheme") {
                break; // not in this build
            }
            codes.push((args[0], output.status.code()));
        }
        let Some(&(_, first)) = codes.first() else { continue };
        assert!(matches!(first, Some(3 | 6)), "{url}: {codes:?}");
        assert!(codes.iter().all(|&(_, code)| code == first), "{url}: {codes:?}");
    }
}
