//! The concurrent mode of [`suite!`](crate::suite): every scenario at once on one runtime.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::backend::Backend;
use crate::scenarios;

/// Runs every scenario of a backend at once, for `suite!(name, expr, concurrent)`.
///
/// The first test to ask starts, on a runtime of its own (four workers), every scenario that the
/// test binary's name filters select (`cargo test -- renew` starts only those whose test name
/// contains `renew`; `--skip` and `--exact` are honoured), then each test waits for its own
/// scenario and fails with that scenario's panic message. A test whose scenario was not started
/// (a filter this runner did not understand) starts it. After the last started scenario, the
/// backend's [`finish`](Backend::finish) runs, and the test that sees it waits for it.
#[derive(Debug)]
pub struct Concurrent {
    module: &'static str,
    shared: OnceLock<Shared>,
}

#[derive(Debug)]
struct Shared {
    runtime: Runtime,
    backend: Option<Arc<dyn Backend>>,
    state: Arc<(Mutex<State>, Condvar)>,
}

#[derive(Debug, Default)]
struct State {
    started: HashSet<&'static str>,
    done: HashMap<&'static str, Result<Duration, String>>,
    finishing: bool,
    finished: bool,
}

impl std::fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.name())
    }
}

impl Concurrent {
    /// A runner for the tests of module `module` (the `suite!` name).
    pub const fn new(module: &'static str) -> Self {
        Concurrent {
            module,
            shared: OnceLock::new(),
        }
    }

    /// Runs (or joins) scenario `name` against the backend `backend` makes, and panics with the
    /// scenario's message if it failed.
    ///
    /// # Panics
    ///
    /// When the scenario failed, or `name` is no scenario.
    pub fn scenario(&'static self, name: &'static str, backend: fn() -> Option<Arc<dyn Backend>>) {
        let shared = self.shared.get_or_init(|| self.start(backend));
        if shared.backend.is_none() {
            eprintln!("SKIPPED: {}::{name}", self.module);
            return;
        }
        self.spawn(shared, name);
        let (lock, changed) = &*shared.state;
        let mut state = lock.lock().expect("state lock");
        while !state.done.contains_key(name) {
            state = changed.wait(state).expect("state lock");
        }
        let outcome = state.done[name].clone();
        // The test that sees every started scenario done waits for the clean-up, so that it
        // finishes before the process exits.
        if state.done.len() == state.started.len() {
            while !state.finished {
                state = changed.wait(state).expect("state lock");
            }
        }
        drop(state);
        if let Err(why) = outcome {
            panic!("{why}");
        }
    }

    fn start(&'static self, backend: fn() -> Option<Arc<dyn Backend>>) -> Shared {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let backend = {
            let _entered = runtime.enter();
            backend()
        };
        let shared = Shared {
            runtime,
            backend,
            state: Arc::default(),
        };
        if shared.backend.is_some() {
            for (name, _) in scenarios::ALL {
                if selected(&format!("{}::{name}", self.module)) {
                    self.spawn(&shared, name);
                }
            }
        }
        shared
    }

    /// Starts scenario `name` unless it has been started.
    fn spawn(&'static self, shared: &Shared, name: &'static str) {
        let Some(backend) = shared.backend.clone() else { return };
        let scenario = scenarios::by_name(name).unwrap_or_else(|| panic!("no scenario {name}"));
        {
            let mut state = shared.state.0.lock().expect("state lock");
            if !state.started.insert(name) {
                return;
            }
        }
        let state = shared.state.clone();
        let module = self.module;
        shared.runtime.spawn(async move {
            let began = Instant::now();
            let outcome = tokio::spawn(scenario(backend.clone())).await;
            let took = began.elapsed();
            let outcome = match outcome {
                Ok(()) => {
                    eprintln!("{module}::{name} ... ok ({:.1}s)", took.as_secs_f64());
                    Ok(took)
                }
                Err(e) => {
                    eprintln!("{module}::{name} ... FAILED ({:.1}s)", took.as_secs_f64());
                    Err(panic_message(e))
                }
            };
            let finish = {
                let mut s = state.0.lock().expect("state lock");
                s.done.insert(name, outcome);
                let all = s.done.len() == s.started.len() && !s.finishing;
                s.finishing |= all;
                state.1.notify_all();
                all
            };
            if finish {
                let (passed, total) = {
                    let s = state.0.lock().expect("state lock");
                    (s.done.values().filter(|o| o.is_ok()).count(), s.done.len())
                };
                eprintln!("{module}: {passed} of {total} scenarios passed");
                backend.finish().await;
                let mut s = state.0.lock().expect("state lock");
                s.finished = true;
                state.1.notify_all();
            }
        });
    }
}

fn panic_message(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string()),
        Err(e) => e.to_string(),
    }
}

/// Whether the test binary's arguments select the test `name` (libtest's rules: a test runs when
/// no filter is given or one is part of its name, `--exact` for whole names, `--skip` to leave
/// out).
fn selected(name: &str) -> bool {
    selected_by(name, &std::env::args().skip(1).collect::<Vec<_>>())
}

fn selected_by(name: &str, args: &[String]) -> bool {
    /// libtest options that take a value as the next argument.
    const WITH_VALUE: &[&str] = &[
        "--test-threads",
        "--logfile",
        "--format",
        "--color",
        "-Z",
        "--shuffle-seed",
    ];
    let (mut filters, mut skips, mut exact) = (Vec::new(), Vec::new(), false);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exact" => exact = true,
            "--skip" => skips.extend(args.next().cloned()),
            option if WITH_VALUE.contains(&option) => {
                args.next();
            }
            option if option.starts_with("--skip=") => skips.push(option["--skip=".len()..].to_string()),
            option if option.starts_with('-') => {}
            filter => filters.push(filter.to_string()),
        }
    }
    let matches = |pattern: &String| {
        if exact {
            name == pattern
        } else {
            name.contains(pattern.as_str())
        }
    };
    (filters.is_empty() || filters.iter().any(matches)) && !skips.iter().any(matches)
}

#[cfg(test)]
mod tests {
    use super::selected_by;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn name_filters_follow_libtest() {
        let name = "azure::renew_keeps_lease";
        assert!(selected_by(name, &args("")));
        assert!(selected_by(name, &args("--nocapture --test-threads 1")));
        assert!(selected_by(name, &args("renew")));
        assert!(!selected_by(name, &args("thousand")));
        assert!(selected_by(name, &args("thousand renew")));
        assert!(!selected_by(name, &args("renew --skip keeps")));
        assert!(!selected_by(name, &args("--skip=azure")));
        assert!(!selected_by(name, &args("--exact renew_keeps_lease")));
        assert!(selected_by(name, &args("--exact azure::renew_keeps_lease")));
        // A value of an option is no filter.
        assert!(selected_by(name, &args("--test-threads 4 --format pretty")));
    }
}
