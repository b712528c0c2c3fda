//! `leasehold run` starts its command's guard before the election, with the command waiting to
//! be exec'd: it must never run before the grant, must end unrun when the campaign ends, and
//! once elected must run as if started then (the term's environment, `run`'s stdin).

mod support;

use std::time::Duration;

use nix::sys::signal::Signal;
use support::{Store, alive, ledger, wait_for};

/// The children of `parent`, by `/proc/*/stat`.
fn children(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|text| {
                let rest = &text[text.rfind(')').unwrap_or(0) + 1..];
                rest.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent)
            })
        })
        .collect()
}

fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The pre-started guard of `leasehold run` process `run`, and the process that waits in it for
/// the word to exec the command.
fn prestarted(run: i32) -> Option<(i32, i32)> {
    let guard = children(run)
        .into_iter()
        .find(|&pid| cmdline(pid).iter().any(|a| a == "--prestarted"))?;
    let waiting = children(guard)
        .into_iter()
        .find(|&pid| cmdline(pid).iter().any(|a| a == "__exec-when-elected"))?;
    Some((guard, waiting))
}

#[test]
fn a_prestarted_command_never_runs_before_the_grant_and_ends_unrun_when_the_campaign_does() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; sleep 30", path.display());
    let mut holder = store.spawn_run("h", &["--lease", "busy", "--ttl", "2s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || !ledger(&path).is_empty()).expect("the holder's command starts");
    let mut waiting = store.spawn_run("w", &["--lease", "busy", "--ttl", "2s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(5), || waiting.log_text().contains("waiting")).expect("the second one waits");
    let mut found = None;
    wait_for(Duration::from_secs(5), || {
        found = prestarted(waiting.pid());
        found.is_some()
    })
    .expect("a pre-started guard and its waiting process");
    let (guard, exec) = found.unwrap();
    // Several renewals of the holder's, and the follower's reads: nothing of it runs.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ledger(&path).len(), 1, "only the holder's command ran");
    assert!(
        cmdline(exec).iter().any(|a| a == "__exec-when-elected"),
        "the waiting process still waits: {:?}",
        cmdline(exec)
    );
    waiting.signal(Signal::SIGINT);
    assert_eq!(waiting.wait_exit(Duration::from_secs(5)), Some(130));
    assert_eq!(ledger(&path).len(), 1, "the campaign's end ran nothing");
    assert!(
        !alive(guard) && !alive(exec),
        "the pre-started guard and its waiting process are gone"
    );
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
}

#[test]
fn a_prestarted_command_runs_with_the_terms_environment_and_stdin_once_elected() {
    let store = Store::sqlite();
    let path = store.path("ledger");
    let seen = store.path("seen");
    let script = format!(
        "echo \"$LEASEHOLD_TERM $$\" >> '{ledger}'; echo \"$LEASEHOLD_LEASE $LEASEHOLD_HOLDER $(readlink /proc/$$/fd/0)\" \
         > '{seen}.tmp' && mv '{seen}.tmp' '{seen}'; sleep 30",
        ledger = path.display(),
        seen = seen.display()
    );
    let mut holder = store.spawn_run("h", &["--lease", "job", "--ttl", "2s", "--", "sh", "-c", &script]);
    wait_for(Duration::from_secs(10), || seen.exists()).expect("the holder's command starts");
    std::fs::remove_file(&seen).unwrap();
    let mut next = store.spawn_run(
        "n",
        &[
            "--lease", "job", "--id", "next", "--ttl", "2s", "--", "sh", "-c", &script,
        ],
    );
    wait_for(Duration::from_secs(5), || next.log_text().contains("waiting")).expect("the successor waits");
    let mut found = None;
    wait_for(Duration::from_secs(5), || {
        found = prestarted(next.pid());
        found.is_some()
    })
    .expect("a pre-started guard and its waiting process");
    let (_, exec) = found.unwrap();
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
    wait_for(Duration::from_secs(5), || seen.exists()).unwrap_or_else(|| {
        panic!(
            "the successor's command did not run: {:?}\n{}",
            ledger(&path),
            next.log_text()
        )
    });
    let entries = ledger(&path);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[1].term, entries[0].term + 1);
    assert_eq!(
        entries[1].pid, exec,
        "the waiting process became the command (exec'd in place)"
    );
    let text = std::fs::read_to_string(&seen).unwrap();
    // run's stdin (the test gives /dev/null), not the socket the word came through.
    assert_eq!(text.trim(), "job next /dev/null");
    next.signal(Signal::SIGTERM);
    assert_eq!(next.wait_exit(Duration::from_secs(5)), Some(143));
}

/// A directory with an executable script `name` that writes `text` to `seen` and sleeps.
fn script_dir(store: &Store, dir: &str, name: &str, text: &str, seen: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = store.path(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    let body = format!(
        "#!/bin/sh\necho {text} > '{seen}.tmp' && mv '{seen}.tmp' '{seen}'\nexec sleep 30\n",
        seen = seen.display()
    );
    std::fs::write(&file, body).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The waiting process looks the command up in PATH before the election (one exec once
/// elected); a file gone from there by then is looked up again, as a shell would.
#[test]
fn a_prestarted_command_gone_from_its_path_entry_runs_from_the_next_one() {
    let store = Store::sqlite();
    let seen = store.path("seen");
    let first = script_dir(&store, "bin1", "lh-test-cmd", "first", &seen);
    let second = script_dir(&store, "bin2", "lh-test-cmd", "second", &seen);
    let path = format!(
        "{}:{}:{}",
        first.display(),
        second.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut holder = store.spawn_run("h", &["--lease", "job", "--ttl", "2s", "--", "sleep", "30"]);
    wait_for(Duration::from_secs(10), || holder.log_text().contains("started")).expect("the holder's command starts");
    let mut next = store.spawn_with_env(
        "n",
        &["run", "--lease", "job", "--ttl", "2s", "--", "lh-test-cmd"],
        &[("PATH", &path)],
    );
    wait_for(Duration::from_secs(5), || next.log_text().contains("waiting")).expect("the successor waits");
    wait_for(Duration::from_secs(5), || prestarted(next.pid()).is_some()).expect("a pre-started guard");
    // The waiting process found bin1's at its start; now it is gone.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(first.join("lh-test-cmd")).unwrap();
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
    wait_for(Duration::from_secs(5), || seen.exists())
        .unwrap_or_else(|| panic!("the successor's command did not run:\n{}", next.log_text()));
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "second");
    next.signal(Signal::SIGTERM);
    assert_eq!(next.wait_exit(Duration::from_secs(5)), Some(143));
}

/// Found in PATH before the election, the command still gets its name as given in argv[0].
#[test]
fn a_prestarted_command_found_in_path_keeps_its_name_as_argv0() {
    let store = Store::sqlite();
    let seen = store.path("seen");
    let dir = store.path("bin");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("/bin/sh", dir.join("lh-test-sh")).unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let script = format!(
        "tr '\\0' ' ' < /proc/$$/cmdline > '{seen}.tmp' && mv '{seen}.tmp' '{seen}'; exec sleep 30",
        seen = seen.display()
    );
    let mut holder = store.spawn_run("h", &["--lease", "job", "--ttl", "2s", "--", "sleep", "30"]);
    wait_for(Duration::from_secs(10), || holder.log_text().contains("started")).expect("the holder's command starts");
    let mut next = store.spawn_with_env(
        "n",
        &[
            "run",
            "--lease",
            "job",
            "--ttl",
            "2s",
            "--",
            "lh-test-sh",
            "-c",
            &script,
        ],
        &[("PATH", &path)],
    );
    wait_for(Duration::from_secs(5), || prestarted(next.pid()).is_some()).expect("a pre-started guard");
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
    wait_for(Duration::from_secs(5), || seen.exists())
        .unwrap_or_else(|| panic!("the successor's command did not run:\n{}", next.log_text()));
    let argv = std::fs::read_to_string(&seen).unwrap();
    assert!(argv.starts_with("lh-test-sh -c "), "{argv:?}");
    next.signal(Signal::SIGTERM);
    assert_eq!(next.wait_exit(Duration::from_secs(5)), Some(143));
}

/// `run` started with stdin closed: the command gets /dev/null as its stdin, not one of `run`'s
/// own descriptors that took the free number 0 (the runtime's, the guard's control socket). Rust's
/// runtime start-up puts /dev/null on a closed fd 0, 1 or 2 before `main`; this keeps it so.
#[test]
fn a_run_started_with_stdin_closed_gives_its_command_dev_null() {
    let store = Store::sqlite();
    let seen = store.path("seen");
    let script = format!(
        "readlink /proc/$$/fd/0 > '{seen}.tmp' && mv '{seen}.tmp' '{seen}'; exec sleep 30",
        seen = seen.display()
    );
    let mut holder = store.spawn_run("h", &["--lease", "job", "--ttl", "2s", "--", "sleep", "30"]);
    wait_for(Duration::from_secs(10), || holder.log_text().contains("started")).expect("the holder's command starts");
    // The successor, pre-started, with fd 0 closed by the shell that execs it.
    let exec = format!(
        "exec 0<&- && exec '{}' --store '{}' run --lease job --ttl 2s -- sh -c \"$0\"",
        support::bin(),
        store.url
    );
    let mut next = store.spawn_shell("n", &["-c", &exec, &script]);
    wait_for(Duration::from_secs(5), || prestarted(next.pid()).is_some()).expect("a pre-started guard");
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_exit(Duration::from_secs(5)), Some(143));
    wait_for(Duration::from_secs(5), || seen.exists())
        .unwrap_or_else(|| panic!("the successor's command did not run:\n{}", next.log_text()));
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "/dev/null");
    next.signal(Signal::SIGTERM);
    assert_eq!(next.wait_exit(Duration::from_secs(5)), Some(143));
}
