//! `leasehold run` contains its command's whole process tree: no process of a term is alive
//! when the next term's command starts, whatever the command does to get away.
//!
//! Each scenario starts a leader A whose command misbehaves, then a candidate B for the same
//! lease, then ends A's leadership in the way the scenario names. Two independent checks:
//!
//! - B's command, first thing, lists every process of the lease with another term that is alive
//!   at that instant (from `/proc/*/environ`, which every process of a term inherits) and writes
//!   the list to the ledger: it must be empty.
//! - A thread of the test scans `/proc` all along and records, on the test's monotonic clock,
//!   when the command processes of each term were first and last seen alive: A's last sighting
//!   must come before B's first, and the gap between them is printed (it is how long after the
//!   last old-term process died the successor's command started, to within one scan).
//!
//! Before the whole-tree containment, every scenario but `ForkingIgnoresSigterm` failed (the
//! successor started next to 2-3 old-term processes); that one passed, as a SIGKILL to a process
//! group is atomic for the group.
//!
//! The scenarios run on SQLite, and on Redis when `LEASEHOLD_REDIS_URL` is set (CI sets it),
//! with the cgroup v2 leaf where this machine allows one, and on SQLite with `--no-cgroup` too
//! (child subreapers only).

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{
    Candidate, LeaderProcesses, Start, Store, TermWatch, fresh_lease, start_check, starts, term_processes, wait_for,
};

/// The scenarios measure time and count processes: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How the first leader misbehaves, and how its leadership ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// The child guard is SIGKILLed while the command (and a child of it) runs.
    GuardKilled,
    /// The command ignores SIGTERM and forks a `sleep` every 5 ms; `leasehold run` gets SIGTERM.
    ForkingIgnoresSigterm,
    /// The command leaves a loop behind that ignores SIGTERM and forks a `sleep` every few ms,
    /// then exits 0 (when the test creates the file `go`): the sweep after the command's exit
    /// races the forks.
    ForkingLeftBehind,
    /// The command starts a grandchild in a new session (`setsid`) that ignores SIGTERM, then
    /// exits 0 (when the test creates the file `go`).
    SetsidGrandchild,
    /// A graceful stop (SIGTERM to `leasehold run`) of a command that exits on SIGTERM at once,
    /// leaving behind a child that ignores it: the child guard exits first, while the child still
    /// lives (then the grace, SIGKILL). The path a handover takes when the command stops
    /// promptly: `run` waits for the guard's exit, then for the tree to be empty.
    LeftoverIgnoresSigterm,
    /// The command's grandchild double-forks into a new session (a daemon, reparented away from
    /// the command); `leasehold run` itself is SIGKILLed.
    DoubleForkDaemon,
}

impl Scenario {
    /// The first leader's command, after the start check.
    fn script(self, go: &std::path::Path) -> String {
        match self {
            Scenario::GuardKilled => "sleep 30 & sleep 30".into(),
            Scenario::ForkingIgnoresSigterm => "trap '' TERM; while true; do sleep 30 & sleep 0.005; done".into(),
            Scenario::ForkingLeftBehind => format!(
                "trap '' TERM; (while true; do sleep 30 & sleep 0.002; done) & while [ ! -e '{}' ]; do sleep \
                 0.01; done; exit 0",
                go.display()
            ),
            Scenario::SetsidGrandchild => format!(
                "setsid sh -c 'trap \"\" TERM; sleep 30' & while [ ! -e '{}' ]; do sleep 0.01; done; exit 0",
                go.display()
            ),
            Scenario::LeftoverIgnoresSigterm => "(trap '' TERM; exec sleep 30) & exec sleep 30".into(),
            Scenario::DoubleForkDaemon => {
                "(setsid sh -c 'trap \"\" TERM; sleep 30 & sleep 30' > /dev/null 2>&1 &); sleep 30".into()
            }
        }
    }
}

/// What a scenario measured.
#[derive(Debug)]
struct Outcome {
    old_term: u64,
    successor: Start,
    /// From the last sighting of an old-term command process to the first of the successor's.
    gap: Duration,
    scan: Duration,
}

fn run_scenario(store: &Store, scenario: Scenario, extra: &[&str]) -> Outcome {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lease = fresh_lease("contain");
    let path = store.path("ledger");
    let check = start_check(&path);
    let go = store.path("go");
    let first = format!("{check}{}", scenario.script(&go));
    let second = format!("{check}exec sleep 30");
    let mut args = vec!["--lease", lease.as_str(), "--ttl", "2s", "--kill-grace", "300ms"];
    args.extend_from_slice(extra);
    let with = |script: &str| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["--".into(), "sh".into(), "-c".into(), script.to_string()]);
        all
    };
    let first_args = with(&first);
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut a = store.spawn_run("a", &first_args);
    wait_for(Duration::from_secs(15), || !starts(&path).is_empty())
        .unwrap_or_else(|| panic!("A's command did not start: {}", a.log_text()));
    let old = starts(&path)[0].clone();
    // Let the command get going (fork, detach) before its leadership ends.
    std::thread::sleep(Duration::from_millis(400));
    let old_processes = term_processes(&lease);
    assert!(
        old_processes.iter().filter(|p| p.is_command()).count() >= 2,
        "{scenario:?}: A's command should have started more processes: {old_processes:?}"
    );

    let watch = TermWatch::start(&lease);
    let second_args = with(&second);
    let second_args: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let b = store.spawn_run("b", &second_args);
    wait_for(Duration::from_secs(10), || b.log_text().contains("waiting"))
        .unwrap_or_else(|| panic!("B does not campaign: {}", b.log_text()));

    let leader = LeaderProcesses::of(ledger_entry(&old));
    match scenario {
        Scenario::GuardKilled => kill(Pid::from_raw(leader.group), Signal::SIGKILL).unwrap(),
        Scenario::ForkingIgnoresSigterm | Scenario::LeftoverIgnoresSigterm => a.signal(Signal::SIGTERM),
        Scenario::SetsidGrandchild | Scenario::ForkingLeftBehind => std::fs::write(&go, "").unwrap(), // the command exits
        Scenario::DoubleForkDaemon => kill(Pid::from_raw(leader.leasehold), Signal::SIGKILL).unwrap(),
    }
    let expected_exit = match scenario {
        Scenario::GuardKilled => Some(137),
        Scenario::ForkingIgnoresSigterm | Scenario::LeftoverIgnoresSigterm => Some(143),
        Scenario::SetsidGrandchild | Scenario::ForkingLeftBehind => Some(0),
        Scenario::DoubleForkDaemon => None, // SIGKILLed
    };
    // A exits right after it released the lease (this test sees it within 1 ms): nothing of its
    // tree may be seen alive after that.
    let a_exited = expected_exit.map(|code| {
        assert_eq!(
            a.wait_exit(Duration::from_secs(10)),
            Some(code),
            "{scenario:?}: {}",
            a.log_text()
        );
        Instant::now()
    });
    wait_for(Duration::from_secs(10), || {
        starts(&path).iter().any(|s| s.term > old.term)
    })
    .unwrap_or_else(|| panic!("{scenario:?}: no successor; A: {}\nB: {}", a.log_text(), b.log_text()));
    std::thread::sleep(Duration::from_millis(50));
    let (seen, scan) = watch.finish();
    let successor = starts(&path).into_iter().find(|s| s.term > old.term).unwrap();
    let left: Vec<_> = term_processes(&lease)
        .into_iter()
        .filter(|p| p.term == old.term)
        .collect();
    let logs = format!("A: {}\nB: {}", a.log_text(), b.log_text());
    cleanup(&lease, a, b);

    assert!(
        successor.others.is_empty(),
        "{scenario:?}: the successor's command (term {}) started while these old-term processes \
         were alive: {:?}\n{logs}",
        successor.term,
        successor.others
    );
    assert!(
        left.is_empty(),
        "{scenario:?}: old-term processes outlived the handover: {left:?}\n{logs}"
    );
    let old_seen = seen.get(&old.term).copied();
    let new_seen = seen
        .get(&successor.term)
        .copied()
        .expect("the watcher saw the successor");
    if let (Some(exited), Some(old_seen)) = (a_exited, old_seen) {
        assert!(
            old_seen.last < exited,
            "{scenario:?}: an old-term process was seen alive {:?} after A exited (having released)\n{logs}",
            old_seen.last - exited
        );
    }
    let gap = match old_seen {
        Some(old_seen) => {
            assert!(
                old_seen.last < new_seen.first,
                "{scenario:?}: an old-term process was seen alive {:?} after the successor's command \
                 was\n{logs}",
                old_seen.last - new_seen.first
            );
            new_seen.first - old_seen.last
        }
        None => panic!("{scenario:?}: the watcher never saw the old term's processes"),
    };
    Outcome {
        old_term: old.term,
        successor,
        gap,
        scan,
    }
}

fn ledger_entry(start: &Start) -> support::Entry {
    support::Entry {
        term: start.term,
        pid: start.pid,
    }
}

/// Ends both candidates and anything of the lease still alive (after a failure).
fn cleanup(lease: &str, a: Candidate, b: Candidate) {
    drop(a);
    drop(b);
    for _ in 0..3 {
        for process in term_processes(lease) {
            let _ = kill(Pid::from_raw(process.pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn report(store: &Store, scenario: Scenario, extra: &[&str], outcome: &Outcome) {
    println!(
        "[{}{}] {scenario:?}: successor's command (term {}) started {:?} after the last old-term \
         (term {}) process was last seen alive (one /proc scan: {:?})",
        store.url.split(':').next().unwrap(),
        if extra.is_empty() {
            String::new()
        } else {
            format!(" {}", extra.join(" "))
        },
        outcome.successor.term,
        outcome.gap,
        outcome.old_term,
        outcome.scan,
    );
}

fn on_sqlite(scenario: Scenario, extra: &[&str]) {
    let store = Store::sqlite();
    let outcome = run_scenario(&store, scenario, extra);
    report(&store, scenario, extra, &outcome);
}

/// The scenario on Redis, when `LEASEHOLD_REDIS_URL` is set.
fn on_redis(scenario: Scenario) {
    let Ok(url) = std::env::var("LEASEHOLD_REDIS_URL") else {
        eprintln!("SKIPPED: set LEASEHOLD_REDIS_URL to run {scenario:?} on Redis");
        return;
    };
    let store = Store::at(&url);
    let outcome = run_scenario(&store, scenario, &[]);
    report(&store, scenario, &[], &outcome);
}

#[test]
fn guard_sigkilled_while_leading_sqlite() {
    on_sqlite(Scenario::GuardKilled, &[]);
}

#[test]
fn guard_sigkilled_while_leading_redis() {
    on_redis(Scenario::GuardKilled);
}

#[test]
fn command_ignoring_sigterm_and_forking_sqlite() {
    on_sqlite(Scenario::ForkingIgnoresSigterm, &[]);
}

#[test]
fn command_ignoring_sigterm_and_forking_sqlite_without_cgroup() {
    on_sqlite(Scenario::ForkingIgnoresSigterm, &["--no-cgroup"]);
}

#[test]
fn command_ignoring_sigterm_and_forking_redis() {
    on_redis(Scenario::ForkingIgnoresSigterm);
}

#[test]
fn graceful_stop_with_a_leftover_ignoring_sigterm_sqlite() {
    on_sqlite(Scenario::LeftoverIgnoresSigterm, &[]);
}

#[test]
fn graceful_stop_with_a_leftover_ignoring_sigterm_sqlite_without_cgroup() {
    on_sqlite(Scenario::LeftoverIgnoresSigterm, &["--no-cgroup"]);
}

#[test]
fn graceful_stop_with_a_leftover_ignoring_sigterm_redis() {
    on_redis(Scenario::LeftoverIgnoresSigterm);
}

#[test]
fn forking_loop_left_behind_sqlite() {
    on_sqlite(Scenario::ForkingLeftBehind, &[]);
}

#[test]
fn forking_loop_left_behind_sqlite_without_cgroup() {
    on_sqlite(Scenario::ForkingLeftBehind, &["--no-cgroup"]);
}

#[test]
fn forking_loop_left_behind_redis() {
    on_redis(Scenario::ForkingLeftBehind);
}

#[test]
fn setsid_grandchild_sqlite() {
    on_sqlite(Scenario::SetsidGrandchild, &[]);
}

#[test]
fn setsid_grandchild_sqlite_without_cgroup() {
    on_sqlite(Scenario::SetsidGrandchild, &["--no-cgroup"]);
}

#[test]
fn setsid_grandchild_redis() {
    on_redis(Scenario::SetsidGrandchild);
}

#[test]
fn double_forked_daemon_sqlite() {
    on_sqlite(Scenario::DoubleForkDaemon, &[]);
}

#[test]
fn double_forked_daemon_sqlite_without_cgroup() {
    on_sqlite(Scenario::DoubleForkDaemon, &["--no-cgroup"]);
}

#[test]
fn double_forked_daemon_redis() {
    on_redis(Scenario::DoubleForkDaemon);
}

#[test]
fn guard_sigkilled_while_leading_sqlite_without_cgroup() {
    on_sqlite(Scenario::GuardKilled, &["--no-cgroup"]);
}
