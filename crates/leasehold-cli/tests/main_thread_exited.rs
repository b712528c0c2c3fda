//! On the cgroup-less path (`--no-cgroup`, or no writable cgroup2), a process of the command
//! whose main thread has exited while another of its threads keeps running shows state `Z` in
//! `/proc/PID/stat` (the thread-group leader is a zombie, the process is not: `wait` does not
//! reap it while a thread lives). It must count as live: signalled, waited for, and gone before
//! the lease is released (session 11 review: it counted as gone, and ran on after `run` exited).
//!
//! Needs `python3` (ctypes calls `pthread_exit` in the main thread; `scripts/test` installs it);
//! skipped without it.

mod support;

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::{Store, wait_for};

/// A process whose main thread exits while a second thread appends `PID TIME` to a file every
/// 20 ms, forever (SIGTERM ignored, as a program that finishes its work first would).
const LEADER_EXITS: &str = r#"
import ctypes, os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = sys.argv[1]
def work():
    while True:
        with open(path, "a") as f:
            f.write("%d %f\n" % (os.getpid(), time.time()))
        time.sleep(0.02)
threading.Thread(target=work, daemon=True).start()
time.sleep(0.1)
ctypes.CDLL(None).pthread_exit(None)
"#;

fn python_with_ctypes() -> bool {
    Command::new("python3")
        .args(["-c", "import ctypes, threading"])
        .status()
        .is_ok_and(|s| s.success())
}

/// The state letter in the `stat` file at `path` (`/proc/PID/stat`, or a thread's under `task/`).
fn state(path: &str) -> Option<char> {
    let text = std::fs::read_to_string(path).ok()?;
    text[text.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

/// The threads of `pid` that are not zombies (a process with one is alive).
fn live_threads(pid: i32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .filter(|tid| state(&format!("/proc/{pid}/task/{tid}/stat")).is_some_and(|s| s != 'Z' && s != 'X'))
        .collect()
}

#[test]
fn a_process_whose_main_thread_exited_is_gone_before_the_lease_is_released_without_a_cgroup() {
    if !python_with_ctypes() {
        eprintln!("skipped: no python3 with ctypes");
        return;
    }
    let store = Store::sqlite();
    let script = store.path("leader_exits.py");
    std::fs::write(&script, LEADER_EXITS).unwrap();
    let out = store.path("thread.out");
    let command = format!(
        "python3 '{}' '{}' & trap 'exit 0' TERM; while :; do sleep 0.05; done",
        script.display(),
        out.display()
    );
    let mut run = store.spawn_run(
        "run",
        &[
            "--lease",
            "review-s11",
            "--ttl",
            "3s",
            "--kill-grace",
            "500ms",
            "--no-cgroup",
            "--",
            "sh",
            "-c",
            &command,
        ],
    );
    let pid = || -> Option<i32> {
        let text = std::fs::read_to_string(&out).ok()?;
        text.lines().next()?.split_whitespace().next()?.parse().ok()
    };
    // Running, and its main thread gone (`Z` for the process, a thread still alive).
    let ready = wait_for(Duration::from_secs(15), || {
        pid().is_some_and(|p| state(&format!("/proc/{p}/stat")) == Some('Z') && !live_threads(p).is_empty())
    });
    assert!(ready.is_some(), "the command never got going: {}", run.log_text());
    let pid = pid().unwrap();

    run.signal(Signal::SIGTERM);
    let code = run.wait_exit(Duration::from_secs(10));
    let log = run.log_text();
    assert_eq!(code, Some(143), "{log}");
    assert!(log.contains("released review-s11"), "the lease was released: {log}");

    // `run` released the lease and exited: nothing of the command may still run.
    let lines_then = std::fs::read_to_string(&out).unwrap_or_default().lines().count();
    std::thread::sleep(Duration::from_millis(300));
    let lines_now = std::fs::read_to_string(&out).unwrap_or_default().lines().count();
    let threads = live_threads(pid);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL); // clean up
    assert!(
        threads.is_empty() && lines_now == lines_then,
        "lease released while process {pid} (main thread exited, state Z) still runs: live threads \
         {threads:?}, its file grew from {lines_then} to {lines_now} lines after `run` exited\n{log}"
    );
}
