//! `leasehold run` under failure, with real processes: the leader's `leasehold` is SIGKILLed, or
//! its whole process tree is paused past its lease and resumed.
//!
//! Each leader's command appends `TERM PID` to a ledger every 100 ms. Liveness bounds are
//! generous (a busy 2-core machine); the safety checks are exact: the terms in the ledger never
//! go back, and a deposed command writes nothing once it had to be gone.
//!
//! To run the crash scenario against a networked store too, set `LEASEHOLD_REDIS_URL` or
//! `LEASEHOLD_POSTGRES_URL`; it runs when this build of leasehold supports the URL's scheme.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use support::{Candidate, Entry, LeaderProcesses, Store, alive, appender, fresh_lease, ledger, wait_for};

const TTL: Duration = Duration::from_secs(1);
/// The engine's default `retry_every` (ttl / 5) plus its 20 % jitter.
const RETRY: Duration = Duration::from_millis(240);
/// Scheduling on a busy machine, the new command's start, the ledger polling.
const SLACK: Duration = Duration::from_millis(1500);
/// How soon after its `leasehold` dies, or resumes past its deadline, the old command is gone.
const KILL_BOUND: Duration = Duration::from_millis(500);

/// The scenarios measure time: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn candidates(store: &Store, lease: &str, n: usize) -> Vec<Candidate> {
    let script = appender(&store.path("ledger"));
    (0..n)
        .map(|i| {
            store.spawn_run(
                &format!("c{i}"),
                &["--lease", lease, "--ttl", "1s", "--", "sh", "-c", &script],
            )
        })
        .collect()
}

fn first_leader(store: &Store) -> Entry {
    let path = store.path("ledger");
    wait_for(Duration::from_secs(15), || !ledger(&path).is_empty()).expect("no leader's command started");
    *ledger(&path).last().unwrap()
}

/// Exact safety: appends are ordered, so a deposed command that wrote after its successor
/// started would show up as a term going back.
fn assert_terms_never_go_back(entries: &[Entry]) {
    for pair in entries.windows(2) {
        assert!(
            pair[0].term <= pair[1].term,
            "term went back in the ledger: {pair:?} (ledger {entries:?})"
        );
    }
}

/// SIGKILL the leader's `leasehold`, twice: its command dies at once, and a successor's command
/// starts within `ttl + retry + slack` with a higher term.
fn crash_failover(store: &Store, lease: &str) -> Vec<Duration> {
    let path = store.path("ledger");
    let mut running = candidates(store, lease, 3);
    first_leader(store);
    let mut takeovers = Vec::new();
    for round in 1..=2 {
        let last = *ledger(&path).last().unwrap();
        let leader = LeaderProcesses::of(last);
        let index = running
            .iter()
            .position(|c| c.pid() == leader.leasehold)
            .expect("the leader is one of ours");
        kill(Pid::from_raw(leader.leasehold), Signal::SIGKILL).unwrap();
        let killed = Instant::now();
        let died = wait_for(KILL_BOUND, || !alive(leader.shell) && !alive(leader.group)).unwrap_or_else(|| {
            panic!(
                "round {round}: the command outlived its leasehold (pid {})",
                leader.shell
            )
        });
        wait_for(TTL + RETRY + SLACK, || ledger(&path).iter().any(|e| e.term > last.term)).unwrap_or_else(|| {
            let logs: Vec<String> = running.iter().map(Candidate::log_text).collect();
            panic!(
                "round {round}: no successor within {:?}; logs: {logs:#?}",
                TTL + RETRY + SLACK
            )
        });
        let takeover = killed.elapsed();
        let successor = ledger(&path).into_iter().find(|e| e.term > last.term).unwrap();
        println!(
            "[{}] round {round}: SIGKILL of leader (term {}): its command was gone after {died:?}; \
             successor's command (term {}) started after {takeover:?} (ttl {TTL:?})",
            store.url.split(':').next().unwrap(),
            last.term,
            successor.term,
        );
        takeovers.push(takeover);
        drop(running.remove(index));
    }
    assert_terms_never_go_back(&ledger(&path));
    takeovers
}

#[test]
fn sigkilled_leader_takes_its_command_along_and_a_successor_takes_over() {
    let _serial = serial();
    let store = Store::sqlite();
    let takeovers = crash_failover(&store, "nightly");
    for takeover in takeovers {
        // Expiry is observed by contenders on SQLite: not before ttl - renew_every.
        assert!(
            takeover >= TTL - TTL / 3 - Duration::from_millis(50),
            "{takeover:?} is too early"
        );
    }
}

#[test]
fn paused_leader_kills_its_command_at_once_when_resumed() {
    let _serial = serial();
    let store = Store::sqlite();
    let path = store.path("ledger");
    let running = candidates(&store, "paused", 2);
    let old = first_leader(&store);
    let leader = LeaderProcesses::of(old);

    // A machine pause: `leasehold` and its command stop together.
    killpg(Pid::from_raw(leader.leasehold), Signal::SIGSTOP).unwrap();
    killpg(Pid::from_raw(leader.group), Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let old_lines = |entries: &[Entry]| entries.iter().filter(|e| e.term == old.term).count();
    wait_for(TTL + RETRY + SLACK, || ledger(&path).iter().any(|e| e.term > old.term)).unwrap_or_else(|| {
        let logs: Vec<String> = running.iter().map(Candidate::log_text).collect();
        panic!("no successor while the leader was paused; logs: {logs:#?}")
    });
    let successor_after = stopped.elapsed();
    // Stay paused well past the old lease.
    std::thread::sleep((stopped + 2 * TTL + Duration::from_millis(500)).saturating_duration_since(Instant::now()));
    let before_resume = old_lines(&ledger(&path));

    killpg(Pid::from_raw(leader.leasehold), Signal::SIGCONT).unwrap();
    killpg(Pid::from_raw(leader.group), Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    let gone = wait_for(KILL_BOUND, || !alive(leader.shell) && !alive(leader.group)).unwrap_or_else(|| {
        panic!(
            "the old command (pid {}) still runs {KILL_BOUND:?} after resuming",
            leader.shell
        )
    });
    std::thread::sleep((resumed + KILL_BOUND).saturating_duration_since(Instant::now()));
    let at_bound = ledger(&path);
    let new_at_bound = at_bound.len() - old_lines(&at_bound);
    std::thread::sleep(Duration::from_secs(1));
    let later = ledger(&path);

    println!(
        "[sqlite] paused leader (term {}) for {:?}: successor's command started {successor_after:?} into the \
         pause; on resume the old command was gone after {gone:?}, having written {} line(s) in between",
        old.term,
        resumed - stopped,
        old_lines(&at_bound) - before_resume,
    );
    assert_eq!(
        old_lines(&later),
        old_lines(&at_bound),
        "the old command wrote after resume + {KILL_BOUND:?}"
    );
    assert!(
        later.len() - old_lines(&later) > new_at_bound,
        "the successor's command stopped writing"
    );
    assert!(
        later
            .iter()
            .filter(|e| e.term > old.term)
            .all(|e| e.term == later.last().unwrap().term)
    );
    assert!(
        alive(leader.leasehold),
        "the resumed leasehold should campaign again, not exit"
    );
    let log = std::fs::read_to_string(&running.iter().find(|c| c.pid() == leader.leasehold).unwrap().log).unwrap();
    assert!(log.contains("lost paused"), "{log}");
    assert!(
        log.contains("SIGKILL"),
        "the old command should have been killed, not asked to stop: {log}"
    );
}

/// The crash scenario on a networked store named by `var`, if set and supported by this build.
fn networked(var: &str) {
    let Ok(url) = std::env::var(var) else {
        eprintln!("SKIPPED: set {var} to run the crash fail-over of `leasehold run` against that store");
        return;
    };
    let store = Store::at(&url);
    let probe = store.leasehold(&["status", "leasehold-cli-probe"]);
    let stderr = String::from_utf8_lossy(&probe.stderr);
    if stderr.contains("unsupported store scheme") {
        eprintln!(
            "SKIPPED: {var} is set, but this build of leasehold cannot use it yet: {}",
            stderr.trim()
        );
        return;
    }
    assert!(probe.status.success(), "{var}: `leasehold status` failed: {stderr}");
    let _serial = serial();
    crash_failover(&store, &fresh_lease("cli-failover"));
}

#[test]
fn sigkilled_leader_on_redis() {
    networked("LEASEHOLD_REDIS_URL");
}

#[test]
fn sigkilled_leader_on_postgres() {
    networked("LEASEHOLD_POSTGRES_URL");
}
