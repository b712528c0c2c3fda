//! The Markdown report, its targets and verdicts, and the SVG chart.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::etcdctl::{ETCDCTL_SESSION_TTL, EtcdctlReport, Paired};
use leasehold::Operation;

use crate::groups::{Cost, GroupReport};
use crate::measures::{BackendReport, FAST_POLL, FastPoll, Idle, Outcome, Planned};
use crate::{Options, Stats, ms};

/// The heading of this runner's section; everything up to the next `## ` heading is ours.
const HEADING: &str = "## Backends side by side";
const SVG: &str = "benchmarks-latency.svg";

/// Backends whose store notifies waiting candidates (the issue's "backends with notification").
fn verdict(smoke: bool, met: bool) -> &'static str {
    match (smoke, met) {
        (true, _) => "n/a (smoke)",
        (false, true) => "met",
        (false, false) => "**not met**",
    }
}

fn cell<T>(outcome: &Outcome<T>, f: impl FnOnce(&T) -> String) -> String {
    match outcome {
        Ok(v) => f(v),
        Err(e) => short(e),
    }
}

/// A second or later cell of a failed phase: empty (the first shows the error).
fn once<T>(outcome: &Outcome<T>, f: impl FnOnce(&T) -> String) -> String {
    outcome.as_ref().map_or_else(|_| String::new(), f)
}

/// An error in a table cell: one line, no pipes, not too long.
fn short(e: &str) -> String {
    let e = e.replace('|', "/").replace('\n', " ");
    if e.chars().count() > 110 {
        format!("{}…", e.chars().take(110).collect::<String>())
    } else {
        e
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

pub(crate) fn render(
    reports: &[BackendReport],
    etcdctl: Option<&EtcdctlReport>,
    options: &Options,
    elapsed: Duration,
) -> String {
    let smoke = options.smoke;
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "{HEADING}\n");
    let _ = writeln!(
        w,
        "Every backend on the loopback servers that `scripts/services` starts, measured in one run by \
         `crates/leasehold-bench`{}. Command:\n\n```sh\n{}\n```\n",
        if smoke {
            " in **smoke mode** (tiny counts, no verdicts)"
        } else {
            ""
        },
        options.command
    );
    let _ = writeln!(
        w,
        "Measured {} on {}; the run took {:.0} s. A backend that is not compiled into the `leasehold` facade \
         or whose server is down is listed as not available; a target is `met` or **not met**, never left \
         out.\n",
        crate::backends::iso8601(SystemTime::now()),
        machine(),
        elapsed.as_secs_f64()
    );
    let _ = writeln!(w, "![handover and failover latency per backend]({SVG})\n");

    let _ = writeln!(w, "### Backends and timing\n");
    let _ = writeln!(
        w,
        "TTL is max(the backend's minimum, {}); `renew_every` = TTL/3 and `retry_every` (the poll interval, \
         plus up to 20% jitter) = TTL/5 are the engine's defaults.\n",
        if smoke { "1 s" } else { "2 s" }
    );
    let _ = writeln!(
        w,
        "| backend | status | TTL | renew_every | retry_every | notification |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for r in reports {
        match &r.unavailable {
            Some(why) => {
                let _ = writeln!(w, "| {} | {} | | | | |", r.name, short(why));
            }
            None => {
                let _ = writeln!(
                    w,
                    "| {} | measured | {} | {} | {} | {} |",
                    r.name,
                    secs(r.ttl),
                    ms(r.renew_every),
                    ms(r.retry_every),
                    r.notifications
                );
            }
        }
    }

    let _ = writeln!(w, "\n### Acquire and renew latency\n");
    let _ = writeln!(
        w,
        "One client calling the store directly: `acquire` of a free lease, then `renew` of the grant, then \
         `release`.\n"
    );
    let _ = writeln!(
        w,
        "| backend | acquire p50 | acquire p99 | renew p50 | renew p99 | samples |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for r in reports {
        let n = cell(&r.acquire, |s| s.n.to_string());
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {n} |",
            r.name,
            cell(&r.acquire, |s| ms(s.p50)),
            cell(&r.acquire, |s| ms(s.p99)),
            cell(&r.renew, |s| ms(s.p50)),
            cell(&r.renew, |s| ms(s.p99)),
        );
    }

    let _ = writeln!(w, "\n### Graceful handover\n");
    let _ = writeln!(
        w,
        "From the leader's `resign()` returning to the successor's `Elected` event (`at`); leader and \
         successor on separate clients. Target: p50 at most 5 ms on backends with notification (etcd, \
         ZooKeeper, Postgres, Redis), at most the poll interval (`retry_every` x 1.2 with jitter) + 5 ms on \
         polling backends.\n"
    );
    let _ = writeln!(
        w,
        "| backend | p50 | p99 | samples | from `resign()` called, p50 | target (p50) | verdict |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|");
    for r in reports {
        let target = if r.notifies {
            Duration::from_millis(5)
        } else {
            r.retry_every.mul_f64(1.2) + Duration::from_millis(5)
        };
        let v = match (&r.unavailable, &r.handover) {
            (None, Ok(s)) => verdict(smoke, s.p50 <= target),
            (None, Err(_)) => verdict(smoke, false),
            _ => "n/a",
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {v} |",
            r.name,
            cell(&r.handover, |s| ms(s.p50)),
            cell(&r.handover, |s| ms(s.p99)),
            cell(&r.handover, |s| s.n.to_string()),
            cell(&r.handover_from_call, |s| ms(s.p50)),
            if r.unavailable.is_some() {
                String::new()
            } else {
                ms(target)
            },
        );
    }

    planned_handover(w, reports);

    let _ = writeln!(w, "\n### Crash failover\n");
    let _ = writeln!(
        w,
        "From the instant the leader's last successful renew request was sent (its `valid_until` minus \
         TTL x (1 - drift)) to the successor's `Elected` event. The leader is a separate process killed \
         with SIGKILL (the in-memory store cannot be shared with another process: there the leader's store \
         is blackholed in both directions), after a random pause of up to 500 ms so that samples do not keep \
         one phase against the store's expiry timers. Target: every sample at most 1.1 x TTL + `retry_every`. \
         \"Store expiry floor\" is the store's own expiry with no leasehold code (table below): p50 / max \
         as multiples of its TTL.\n"
    );
    let _ = writeln!(
        w,
        "| backend | method | p50 | p99 | p50 / TTL | max / TTL | samples | target | verdict | store expiry floor (p50 / max) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let target = r.ttl.mul_f64(1.1) + r.retry_every;
        let ratio = |d: Duration| format!("{:.2}", d.as_secs_f64() / r.ttl.as_secs_f64().max(1e-9));
        let v = match (&r.unavailable, &r.failover) {
            (None, Ok(s)) => verdict(smoke, s.max <= target),
            (None, Err(_)) => verdict(smoke, false),
            _ => "n/a",
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {v} | {} |",
            r.name,
            r.failover_method,
            cell(&r.failover, |s| ms(s.p50)),
            cell(&r.failover, |s| ms(s.p99)),
            cell(&r.failover, |s| ratio(s.p50)),
            cell(&r.failover, |s| ratio(s.max)),
            cell(&r.failover, |s| s.n.to_string()),
            if r.unavailable.is_some() {
                String::new()
            } else {
                ms(target)
            },
            floor_cell(&r.expiry_floor),
        );
    }

    fast_poll(w, reports, smoke);
    expiry_floor(w, reports);
    observe_after_crash(w, reports, smoke);

    let sizes: Vec<usize> =
        reports
            .iter()
            .flat_map(|r| r.transitions.iter().map(|(n, _)| *n))
            .fold(Vec::new(), |mut v, n| {
                if !v.contains(&n) {
                    v.push(n);
                }
                v
            });
    let _ = writeln!(w, "\n### Store requests per leadership transition\n");
    let _ = writeln!(
        w,
        "All candidates on one lease, each on its own client; counted by a `FaultyStore` around every \
         client from the leader's `resign()` to the successor's election plus 50 ms (so the release, the \
         successor's acquire, any herd of acquires and any polls in that window count). The resigned \
         candidate campaigns again so the number of candidates stays the same. Mean (max) over the \
         repetitions. Target: at most 3 with 100 candidates on etcd and ZooKeeper.\n"
    );
    let _ = write!(w, "| backend |");
    for n in &sizes {
        let _ = write!(w, " {n} candidate{} |", if *n == 1 { "" } else { "s" });
    }
    let _ = writeln!(w, " verdict |");
    let _ = writeln!(w, "|---|{}---|", "---|".repeat(sizes.len()));
    let largest = sizes.iter().copied().max().unwrap_or(0);
    for r in reports {
        let _ = write!(w, "| {} |", r.name);
        for n in &sizes {
            let c = r.transitions.iter().find(|(m, _)| m == n).map_or_else(
                || "n/a".to_string(),
                |(_, t)| cell(t, |t| format!("{:.1} ({})", t.mean(), t.max())),
            );
            let _ = write!(w, " {c} |");
        }
        let v = if matches!(r.name, "etcd" | "zookeeper") && r.unavailable.is_none() {
            match r.transitions.iter().find(|(m, _)| *m == largest) {
                Some((_, Ok(t))) => verdict(smoke, largest >= 100 && t.max() <= 3),
                _ => verdict(smoke, false),
            }
        } else {
            "n/a"
        };
        let _ = writeln!(w, " {v} |");
    }

    let _ = writeln!(w, "\n### Store requests while idle\n");
    let _ = writeln!(
        w,
        "One leader and idle followers, each on its own client, after they settled; requests per second \
         over the window. Targets: idle followers on notification backends 0 requests per second; a leader \
         one renew per `renew_every` (at most window / `renew_every` + 1 requests in the window).\n"
    );
    let _ = writeln!(
        w,
        "| backend | window | per follower | leader | leader expected | followers verdict | leader verdict |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|");
    for r in reports {
        match (&r.unavailable, &r.idle) {
            (None, Ok(i)) => {
                let secs = i.window.as_secs_f64();
                let per_follower = i.per_follower();
                let allowed = (secs / r.renew_every.as_secs_f64()).floor() as u64 + 1;
                let fv = if r.notifies {
                    verdict(smoke, i.follower_requests == 0)
                } else {
                    "n/a (polling)"
                };
                let _ = writeln!(
                    w,
                    "| {} | {:.1} s | {per_follower:.2} /s | {:.2} /s | {:.2} /s | {fv} | {} |",
                    r.name,
                    secs,
                    i.leader_requests as f64 / secs,
                    1.0 / r.renew_every.as_secs_f64(),
                    verdict(smoke, i.leader_requests <= allowed),
                );
            }
            (None, Err(e)) => {
                let _ = writeln!(
                    w,
                    "| {} | | {} | | | {} | {} |",
                    r.name,
                    short(e),
                    verdict(smoke, false),
                    verdict(smoke, false)
                );
            }
            (Some(why), _) => {
                let _ = writeln!(w, "| {} | | {} | | | n/a | n/a |", r.name, short(why));
            }
        }
    }

    let _ = writeln!(w, "\n### Many leases in one process\n");
    let _ = writeln!(
        w,
        "A fresh child process of the benchmark (so its memory and CPU are its own), one client, one \
         elector per lease (campaigns 256 at a time), TTL max(minimum, {}), held for {}. A lease counts as \
         renewed on time when its remaining validity never fell below TTL/3 (sampled every 100 ms), i.e. no \
         renewal was missed or late by more than `renew_every`. CPU is user + system time of the whole \
         process over the window, in cores; RSS is the process's VmRSS at the end of the window (and its \
         increase over building the electors and campaigning). Target for 10,000 leases on etcd, Postgres \
         and Redis: every renewal on time, under one core, under 100 MB (95.4 MiB) resident.\n",
        if smoke { "1 s" } else { "5 s" },
        if smoke { "one TTL" } else { "two TTLs" }
    );
    let _ = writeln!(
        w,
        "| backend | leases | TTL | all elected after | renewed on time | CPU (cores) | RSS | of which after start | verdict |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.unavailable {
            let _ = writeln!(w, "| {} | | | {} | | | | | n/a |", r.name, short(why));
            continue;
        }
        for (n, s) in &r.scale {
            let targeted = *n >= 10_000 && matches!(r.name, "etcd" | "postgres" | "redis");
            match s {
                Ok(s) => {
                    let met = s.on_time == s.n && s.cores < 1.0 && s.rss_mib < 100.0 / 1.048_576;
                    let _ = writeln!(
                        w,
                        "| {} | {n} | {} | {:.1} s | {} / {} | {:.2} | {:.1} MiB | {:.1} MiB | {} |",
                        r.name,
                        secs(r.scale_ttl),
                        s.campaign_time.as_secs_f64(),
                        s.on_time,
                        s.n,
                        s.cores,
                        s.rss_mib,
                        s.rss_delta_mib,
                        if targeted { verdict(smoke, met) } else { "n/a" },
                    );
                    let _ = s.window;
                }
                Err(e) => {
                    let _ = writeln!(
                        w,
                        "| {} | {n} | {} | {} | | | | | {} |",
                        r.name,
                        secs(r.scale_ttl),
                        short(e),
                        if targeted { verdict(smoke, false) } else { "n/a" },
                    );
                }
            }
        }
    }

    groups(w, reports, smoke);
    group_cost(w, reports, smoke);

    if let Some(e) = etcdctl {
        let ours = reports.iter().find(|r| r.name == "etcd" && r.unavailable.is_none());
        let _ = writeln!(w, "\n### etcdctl elect on the same etcd\n");
        let _ = writeln!(
            w,
            "`etcdctl elect NAME PROPOSAL` processes (etcdctl {}), timed by when the successor prints its \
             proposal. Handover: SIGINT to the leader's etcdctl (it resigns and exits), timed from the signal, \
             so it includes the resign round trip: compare with leasehold's \"from `resign()` called\". Crash: \
             SIGKILL, timed from the kill; etcdctl's session lease is {} s and cannot be changed from the \
             command line, while leasehold's etcd backend here uses a {} TTL and is timed from its last renew.\n",
            etcdctl_version(),
            ETCDCTL_SESSION_TTL.as_secs(),
            ours.map_or_else(|| "(not available in this run)".to_string(), |r| secs(r.ttl)),
        );
        let _ = writeln!(
            w,
            "The library is also compared with etcd-client 0.21's `Election` (etcd's server-side \
             campaign/resign, each candidate with an etcd lease of its own on a client of its own): A \
             campaigns and wins, B's campaign waits on the server for {settle}, A resigns; timed to B's \
             `campaign` returning. Its samples are interleaved, in one loop, with the library's graceful \
             handover on the same etcd (TTL 10 s, as `Election`'s leases: at 2 s a renewal or keepalive round \
             under way when A resigns delays the handover by its round trip, which `Election`'s leases, never \
             kept alive here, do not have; B settled {settle} after it has seen A lead), and with the \
             library's release protocol without the library: the transaction the etcd backend sends to \
             release (the holder's key deleted, the term's end and the release marker written, on two \
             compares) sent with etcd-client, timed from its send to the delete event of a watch of the key \
             on another client (the store's part of the library's handover, its floor). {pairs} repetitions, \
             each running all three (which goes first rotates). The verdict is taken on the paired \
             differences (the library's sample minus `Election`'s in the same repetition): their median, \
             with a 95% percentile-bootstrap interval (2,000 resamples). The CLI: two `leasehold run --store {{etcd}} --lease L --ttl 2s -- sh -c \
             'echo up NAME; exec sleep 1000'` processes (release build), SIGTERM to the leader's leasehold \
             (it stops its command, releases and exits), timed to the successor's command's first line, \
             against `etcdctl elect` as above, and against the like-for-like floor: `etcdctl elect` run \
             by a shell wrapper that starts the same command once elected and, on SIGTERM, stops it \
             (SIGTERM, waits for it) before making etcdctl resign (SIGINT), without leasehold's \
             containment. Same repetitions as the graceful handover.\n",
            settle = ms(crate::etcdctl::SETTLE),
            pairs = e
                .election
                .as_ref()
                .map_or(crate::etcdctl::PAIRED_REPS, |p| p.difference.n),
        );
        let _ = writeln!(
            w,
            "| measure | etcdctl elect (CLI) | etcd-client `Election` (library) | leasehold etcd backend |"
        );
        let _ = writeln!(w, "|---|---|---|---|");
        let stat = |o: &Outcome<Stats>| cell(o, |s| format!("p50 {}, p99 {} (n = {})", ms(s.p50), ms(s.p99), s.n));
        let na: Outcome<Stats> = Err("n/a".into());
        let theirs_ratio = |o: &Outcome<Stats>, ttl: Duration| {
            cell(o, |s| {
                format!("{:.2} x TTL", s.p50.as_secs_f64() / ttl.as_secs_f64().max(1e-9))
            })
        };
        let paired = |f: fn(&Paired) -> Stats| -> Outcome<Stats> { e.election.as_ref().map(f).map_err(Clone::clone) };
        let _ = writeln!(
            w,
            "| library graceful handover, from `resign()` called (interleaved) | | {} | {} |",
            stat(&paired(|p| p.election.1)),
            stat(&paired(|p| p.leasehold.1))
        );
        let _ = writeln!(
            w,
            "| library graceful handover, from `resign()` called, paired difference (leasehold minus `Election`, same \
             repetition) | | | {} |",
            cell(&e.election, |p| p.difference.to_string())
        );
        let _ = writeln!(
            w,
            "| the library's release protocol without the library: its transaction's send to the successor's watch \
             event (interleaved) | | | {}; minus `Election`: {} |",
            stat(&paired(|p| p.protocol)),
            cell(&e.election, |p| p.protocol_difference.to_string())
        );
        let _ = writeln!(
            w,
            "| library graceful handover, from `resign()` returning (interleaved) | | {} | {} |",
            stat(&paired(|p| p.election.0)),
            stat(&paired(|p| p.leasehold.0))
        );
        let _ = writeln!(
            w,
            "| library graceful handover, from `resign()` called (the graceful handover measure above, \
             successor settled 20 ms) | | | {} |",
            stat(ours.map_or(&na, |r| &r.handover_from_call))
        );
        let _ = writeln!(
            w,
            "| CLI graceful handover, from the signal to the successor's output (`leasehold run`: SIGTERM) | {} | | {} |",
            stat(&e.handover),
            stat(&e.cli)
        );
        let _ = writeln!(
            w,
            "| the same, like for like: `etcdctl elect` with the same command started and stopped around it by a \
             shell wrapper (SIGTERM) | {} | | |",
            stat(&e.wrapped)
        );
        let _ = writeln!(
            w,
            "| the command alone (`sh -c 'echo up C; exec sleep 1000'`): stopped (SIGTERM to its exit reaped), started \
             (forked beforehand and waiting, as `leasehold run` starts a successor's: from the word to exec to its \
             first line) | {} | | |",
            cell(&e.command, |k| format!(
                "p50 {} / {} (n = {})",
                ms(k.stop.p50),
                ms(k.start.p50),
                k.stop.n
            ))
        );
        let _ = writeln!(
            w,
            "| crash failover | {} | | {} |",
            stat(&e.failover),
            stat(ours.map_or(&na, |r| &r.failover))
        );
        let _ = writeln!(
            w,
            "| crash failover, p50 as a multiple of TTL | {} | | {} |",
            theirs_ratio(&e.failover, ETCDCTL_SESSION_TTL),
            ours.map_or_else(|| "n/a".to_string(), |r| theirs_ratio(&r.failover, r.ttl))
        );
    }
    issue17(w, reports, etcdctl, smoke);
    o
}

fn floor_cell(f: &Outcome<crate::floor::Floor>) -> String {
    match f {
        Ok(f) => format!("{:.2} / {:.2} x TTL", f.p50_ttl(), f.max_ttl()),
        Err(e) if e.starts_with("n/a") => "n/a".into(),
        Err(e) => short(e),
    }
}

fn expiry_floor(w: &mut String, reports: &[BackendReport]) {
    let _ = writeln!(w, "\n### Store expiry floor\n");
    let _ = writeln!(
        w,
        "The store's own expiry, with no leasehold code: the floor of crash failover on stores with \
         server-side expiry. etcd: an etcd lease of TTL {} granted with etcd-client, a key put on it, one \
         keepalive, then none; from the keepalive's send to the delete event of a watch on another client. \
         ZooKeeper: a session of {} timeout (through a loopback relay in the benchmark) with an ephemeral \
         node; after the random pause the client sends a read, which the relay forwards, then cuts the \
         connection; from that read to the deletion watch of another client. Redis: `PEXPIRE key {}`, from its send to the \
         `expired` keyspace event on another client. 5 samples each (1 in smoke mode), each after a random \
         pause of up to 500 ms so that they do not keep one phase against the store's timers. Where the \
         floor's max is above 1.05 x TTL, no failover that waits for the store's expiry can meet 1.05 x TTL \
         every sample: etcd's leader looks for expired leases every 500 ms, ZooKeeper expires sessions in \
         buckets of its `tickTime` (50 ms in `scripts/services`), and Redis's active expiry samples keys \
         `hz` (10) times a second, besides looking up an expired key when it is read.\n",
        ms(crate::floor::FLOOR_TTL),
        ms(crate::floor::FLOOR_TTL),
        crate::floor::FLOOR_TTL.as_millis()
    );
    let _ = writeln!(
        w,
        "| backend | TTL | p50 | max | p50 / TTL | max / TTL | samples | what |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for r in reports {
        match &r.expiry_floor {
            Ok(f) => {
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | {} | {:.3} | {:.3} | {} | {} |",
                    r.name,
                    ms(f.ttl),
                    ms(f.stats.p50),
                    ms(f.stats.max),
                    f.p50_ttl(),
                    f.max_ttl(),
                    f.stats.n,
                    f.what
                );
            }
            Err(e) => {
                let _ = writeln!(w, "| {} | | {} | | | | | |", r.name, short(e));
            }
        }
    }
}

/// The target of the `observe()` measure: one notification on loopback is a few ms; the next
/// poll would be `retry_every` (400 ms at TTL 2 s).
const OBSERVE_TARGET: Duration = Duration::from_millis(50);

fn observe_after_crash(w: &mut String, reports: &[BackendReport], smoke: bool) {
    let _ = writeln!(w, "\n### `observe()` after a crash, a follower not next in line\n");
    let _ = writeln!(
        w,
        "Leader L (the crash-failover leader: a process killed with SIGKILL, or a blackholed store in \
         process), then N and T campaign in that order, each on its own client, so N is next and T third \
         (on a FIFO store). From the `Elected` event of whichever takes over (N on FIFO stores; either \
         where an expiry wakes everyone) to the `since` of the other's `observe()` value showing it \
         (when it first saw the new leader lead); the new leader holds on until then. Target on backends with notification: every sample within one \
         notification, taken as at most {} (a poll would be `retry_every`).\n",
        ms(OBSERVE_TARGET)
    );
    let _ = writeln!(w, "| backend | p50 | p99 | max | samples | target | verdict |");
    let _ = writeln!(w, "|---|---|---|---|---|---|---|");
    for r in reports {
        let v = match (&r.unavailable, &r.observe) {
            _ if !r.notifies => "n/a (polling)",
            (None, Ok(s)) => verdict(smoke, s.max <= OBSERVE_TARGET),
            (None, Err(_)) => verdict(smoke, false),
            _ => "n/a",
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {v} |",
            r.name,
            cell(&r.observe, |s| ms(s.p50)),
            cell(&r.observe, |s| ms(s.p99)),
            cell(&r.observe, |s| ms(s.max)),
            cell(&r.observe, |s| s.n.to_string()),
            ms(OBSERVE_TARGET),
        );
    }
}

/// Stores that expire holders themselves but do not notify: the crash failover and idle cost
/// again with followers polling every [`FAST_POLL`] x TTL.
fn fast_poll(w: &mut String, reports: &[BackendReport], smoke: bool) {
    let measured: Vec<(&BackendReport, &FastPoll)> = reports
        .iter()
        .filter_map(|r| r.fast_poll.as_ref().map(|f| (r, f)))
        .collect();
    if measured.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\nOn a store that expires holders itself but does not notify, followers learn of an expiry only \
         by polling, so a crash failover takes the TTL plus up to one `retry_every` (default TTL/5) and its \
         jitter. The same measure again with followers polling every TTL/{:.0} (`retry_every`), and what \
         each idle follower then asks of the store (measured as in \"Idle cost\"):\n",
        1.0 / FAST_POLL
    );
    let _ = writeln!(
        w,
        "| backend | retry_every | p50 / TTL | max / TTL | samples | verdict (<= 1.05 x TTL) | idle follower requests, default | with this retry_every |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for (r, f) in measured {
        let ttl = r.ttl.as_secs_f64().max(1e-9);
        let ratio = |d: Duration| format!("{:.2}", d.as_secs_f64() / ttl);
        let rate = |i: &Outcome<Idle>| cell(i, |i| format!("{:.2} /s", i.per_follower()));
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            ms(f.retry_every),
            cell(&f.failover, |s| ratio(s.p50)),
            cell(&f.failover, |s| ratio(s.max)),
            cell(&f.failover, |s| s.n.to_string()),
            verdict(
                smoke,
                f.failover.as_ref().is_ok_and(|s| s.max.as_secs_f64() / ttl <= 1.05)
            ),
            rate(&r.idle),
            rate(&f.idle),
        );
    }
}

/// Why a crash failover whose max is `max_ttl` x TTL is over 1.05 x TTL, where the store bounds it:
/// its own expiry's max (the floor, measured in the same run) is within 0.05 x TTL of it, or
/// followers learn of the expiry only by polling every `retry_every`. Empty otherwise.
fn failover_bound(r: &BackendReport, max_ttl: f64) -> String {
    if max_ttl <= 1.05 {
        return String::new();
    }
    let ttl = r.ttl.as_secs_f64().max(1e-9);
    match &r.expiry_floor {
        Ok(f) if max_ttl <= f.max_ttl() + 0.05 => " (at the store's own expiry floor)".to_string(),
        _ if !r.notifies && max_ttl <= 1.05 + r.retry_every.as_secs_f64() * 1.5 / ttl => {
            let faster = match &r.fast_poll {
                Some(FastPoll {
                    retry_every,
                    failover: Ok(s),
                    idle,
                }) => format!(
                    "; polling every {} instead: {:.2} / {:.2} x TTL, {} requests/s per idle follower",
                    ms(*retry_every),
                    s.p50.as_secs_f64() / ttl,
                    s.max.as_secs_f64() / ttl,
                    cell(idle, |i| format!("{:.2}", i.per_follower())),
                ),
                _ => String::new(),
            };
            format!(
                " (no notification: followers poll every {}, {:.2} x TTL{faster})",
                ms(r.retry_every),
                r.retry_every.as_secs_f64() / ttl
            )
        }
        _ => String::new(),
    }
}

/// Met (`Some(true)`), not met, or not measured in this run (`None`).
fn verdict_of(smoke: bool, met: Option<bool>) -> &'static str {
    match met {
        None => "not measured",
        Some(m) => verdict(smoke, m),
    }
}

/// The issue's table (issue 17), each row with its figure from before the work (text from the
/// issue, historical), this run's figure, the target and the verdict computed from this run.
fn issue17(w: &mut String, reports: &[BackendReport], etcdctl: Option<&EtcdctlReport>, smoke: bool) {
    let by = |name: &str| reports.iter().find(|r| r.name == name && r.unavailable.is_none());
    let p50 = |o: &Outcome<Stats>| o.as_ref().ok().map(|s| s.p50);
    let _ = writeln!(w, "\n### Issue 17 targets\n");
    let _ = writeln!(
        w,
        "One row per row of issue 17's table. \"Before\" is the issue's text (measured before the work, \
         not re-measured); \"this run\" and the verdict come from the measures above, in this run. A row \
         whose measure did not run (or failed) is **not met** or \"not measured\".\n"
    );
    let _ = writeln!(w, "| measure | before (issue 17) | this run | target | verdict |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    let mut row = |what: &str, before: &str, now: String, target: &str, v: &str| {
        let _ = writeln!(w, "| {what} | {before} | {now} | {target} | {v} |");
    };

    // 1. etcd library handover against etcd-client's Election, same run.
    let (now, met) = match etcdctl.map(|e| &e.election) {
        Some(Ok(p)) => (
            format!(
                "paired difference from `resign()` called (leasehold minus `Election`): {}; p50 leasehold {} \
                 from `resign()` returning, {} from called; `Election` {} / {} (interleaved); the library's \
                 release protocol without the library p50 {} ({} against `Election`)",
                p.difference,
                ms(p.leasehold.0.p50),
                ms(p.leasehold.1.p50),
                ms(p.election.0.p50),
                ms(p.election.1.p50),
                ms(p.protocol.p50),
                p.protocol_difference,
            ),
            Some(p.difference.median <= 0.0),
        ),
        Some(Err(e)) => (format!("not measured: {}", short(e)), None),
        None => ("not measured".into(), None),
    };
    row(
        "graceful handover p50, etcd (library)",
        "4.4 ms; etcd-client `Election`: 1.3 ms",
        now,
        "<= `Election`, from `resign()` called, same run, samples interleaved: the median of the paired \
         differences <= 0 (from returning is shown too, but `Election`'s successor is told within the \
         resign request itself, so its figure is about 0)",
        verdict_of(smoke, met),
    );

    // 2-3, 5. Handover p50 of one backend against a fixed bound.
    let fixed = |name: &str, bound_ms: u64| {
        let h = by(name).and_then(|r| p50(&r.handover));
        (
            h.map_or_else(|| "not measured".to_string(), |d| format!("p50 {}", ms(d))),
            h.map(|d| d <= Duration::from_millis(bound_ms)),
        )
    };
    let (now, met) = fixed("zookeeper", 2);
    row(
        "graceful handover p50, ZooKeeper",
        "4.5 ms (a client-side lock recipe: 2.8 ms)",
        now,
        "<= 2 ms",
        verdict_of(smoke, met),
    );
    let (now, met) = fixed("postgres", 2);
    row(
        "graceful handover p50, Postgres",
        "5.8 ms",
        now,
        "<= 2 ms",
        verdict_of(smoke, met),
    );

    // 4. CLI against etcdctl elect, same run; with the floor of what `leasehold run` does more.
    let cli = etcdctl.and_then(|e| p50(&e.cli));
    let etcdctl_p50 = etcdctl.and_then(|e| p50(&e.handover));
    let command = etcdctl.and_then(|e| e.command.as_ref().ok());
    let wrapped = etcdctl.and_then(|e| p50(&e.wrapped));
    let (now, met, floor_note) = match (cli, etcdctl_p50) {
        (Some(c), Some(e)) => {
            let (floor, note) = match command {
                Some(k) => {
                    let floor = e + k.stop.p50 + k.start.p50;
                    let above = c.as_secs_f64() - floor.as_secs_f64();
                    (
                        format!(
                            "; the floor of what `leasehold run` does more than `etcdctl elect` (stop the old \
                             command before the release, start the new one after the election): `etcdctl \
                             elect` + stopping the command alone (p50 {}) + starting it alone (p50 {}) = {}, \
                             `leasehold run` {:+.2} ms from it{}",
                            ms(k.stop.p50),
                            ms(k.start.p50),
                            ms(floor),
                            above * 1000.0,
                            wrapped.map_or(String::new(), |w| format!(
                                "; the same steps by a shell wrapper around `etcdctl elect`: {}",
                                ms(w)
                            ))
                        ),
                        format!(
                            " (measured floor {} is above the target; `leasehold run` {:+.2} ms from it)",
                            ms(floor),
                            above * 1000.0
                        ),
                    )
                }
                None => (String::new(), String::new()),
            };
            (
                format!(
                    "`leasehold run` p50 {}; `etcdctl elect` p50 {}{floor} (interleaved)",
                    ms(c),
                    ms(e)
                ),
                Some(c <= e),
                note,
            )
        }
        (c, e) => (
            format!(
                "`leasehold run`: {}; `etcdctl elect`: {}",
                c.map_or("not measured".into(), ms),
                e.map_or("not measured".into(), ms)
            ),
            None,
            String::new(),
        ),
    };
    let v = verdict_of(smoke, met);
    row(
        "graceful handover p50, CLI `leasehold run` on etcd (signal -> new command's first line)",
        "12 ms; `etcdctl elect`: 3.3 ms",
        now,
        "<= `etcdctl elect`, same run",
        &if met == Some(false) {
            format!("{v}{floor_note}")
        } else {
            v.to_string()
        },
    );
    let (now, met) = fixed("sqlite", 5);
    row(
        "graceful handover p50, SQLite",
        "404 ms (poll)",
        now,
        "<= 5 ms",
        verdict_of(smoke, met),
    );

    // 6-9: every store with notification (its capabilities say so), per store.
    let notifying: Vec<&BackendReport> = reports
        .iter()
        .filter(|r| r.unavailable.is_none() && r.notifies)
        .collect();
    let per_store = |f: &dyn Fn(&BackendReport) -> Option<(String, bool)>, among: &[&BackendReport]| {
        let mut parts = Vec::new();
        let mut met = Some(true);
        for r in among {
            match f(r) {
                Some((text, ok)) => {
                    parts.push(format!("{} {text}", r.name));
                    met = met.map(|m| m && ok);
                }
                None => {
                    parts.push(format!("{} not measured", r.name));
                    met = None;
                }
            }
        }
        if among.is_empty() {
            met = None;
        }
        let text = if parts.is_empty() {
            "not measured".to_string()
        } else {
            parts.join(", ")
        };
        (text, met)
    };
    let (now, met) = per_store(
        &|r| {
            let (n, t) = r.transitions.iter().max_by_key(|(n, _)| *n)?;
            let t = t.as_ref().ok()?;
            (*n >= 100).then(|| (format!("{:.1} (max {})", t.mean(), t.max()), t.max() <= 3))
        },
        &notifying,
    );
    row(
        "store requests per transition, 100 candidates (mean, max)",
        "Postgres 101, Redis 99 (herd), memory 99; etcd, ZooKeeper 3",
        now,
        "<= 3 on every store with notification",
        verdict_of(smoke, met),
    );
    let (now, met) = per_store(
        &|r| {
            let i = r.idle.as_ref().ok()?;
            Some((format!("{:.2} /s", i.per_follower()), i.follower_requests == 0))
        },
        &notifying,
    );
    row(
        "idle follower requests/s",
        "Postgres 2.2; etcd, ZooKeeper, Redis 0",
        now,
        "0 on every store with notification",
        verdict_of(smoke, met),
    );
    let (now, met) = per_store(
        &|r| {
            let s = r.observe.as_ref().ok()?;
            Some((format!("max {}", ms(s.max)), s.max <= OBSERVE_TARGET))
        },
        &notifying,
    );
    row(
        "`observe()` of a follower not next in line, after a crash (from the new leader's election)",
        "etcd 13.6 s, ZooKeeper 18.1 s; Postgres, Redis 0.25 s",
        now,
        &format!(
            "within one notification (<= {}) on every backend with notification",
            ms(OBSERVE_TARGET)
        ),
        verdict_of(smoke, met),
    );
    let expiring: Vec<&BackendReport> = reports
        .iter()
        .filter(|r| r.unavailable.is_none() && r.server_expiry && r.name != "memory")
        .collect();
    let (now, met) = per_store(
        &|r| {
            let s = r.failover.as_ref().ok()?;
            let ttl = r.ttl.as_secs_f64().max(1e-9);
            let (p, m) = (s.p50.as_secs_f64() / ttl, s.max.as_secs_f64() / ttl);
            let floor = match &r.expiry_floor {
                Ok(f) => format!(" (store expiry floor {:.2} / {:.2})", f.p50_ttl(), f.max_ttl()),
                Err(_) => String::new(),
            };
            Some((
                format!("{p:.2} / {m:.2} x TTL{floor}{}", failover_bound(r, m)),
                m <= 1.05,
            ))
        },
        &expiring,
    );
    // Not met only where a store's own expiry (its floor) or a poll bounds every failover.
    let bounded = expiring.iter().all(|r| {
        r.failover.as_ref().is_ok_and(|s| {
            let m = s.max.as_secs_f64() / r.ttl.as_secs_f64().max(1e-9);
            m <= 1.05 || !failover_bound(r, m).is_empty()
        })
    });
    let v = match met {
        Some(false) if bounded && !smoke => {
            "**not met** (each store over the target is at its own expiry floor, or polls every \
             `retry_every`: see the faster poll measured in \"Crash failover\")"
        }
        _ => verdict_of(smoke, met),
    };
    row(
        "crash failover, p50 / max (stores with server-side expiry)",
        "etcd, ZooKeeper 1.16 x TTL (once 1.9 x on ZooKeeper after a restart); Redis 1.00 x TTL",
        now,
        "<= 1.05 x TTL, every sample",
        v,
    );

    // 10. 10,000 leases on etcd.
    let scale = by("etcd")
        .and_then(|r| r.scale.iter().find(|(n, _)| *n == 10_000))
        .and_then(|(_, s)| s.as_ref().ok());
    let (now, met) = match scale {
        Some(s) => (
            format!(
                "{:.1} MiB, {:.2} cores, {} / {} renewed on time",
                s.rss_mib, s.cores, s.on_time, s.n
            ),
            Some(s.rss_mib < 100.0 / 1.048_576 && s.cores < 1.0 && s.on_time == s.n),
        ),
        None => ("not measured".to_string(), None),
    };
    row(
        "10,000 leases in one process, etcd",
        "122.5 MiB",
        now,
        "< 100 MB (95.4 MiB) resident, < 1 core",
        verdict_of(smoke, met),
    );
}

fn planned_handover(w: &mut String, reports: &[BackendReport]) {
    let _ = writeln!(w, "\n### Planned handover to a named successor\n");
    let _ = writeln!(
        w,
        "A leads; B, then C campaign (B is queued first), each on its own client; A calls \
         `leader.hand_over(C)`. From that call to C's `elected_at`, and C (not B) must win with a higher term \
         (a rep where B wins fails the row). Same repetitions as the graceful handover. Where a raw \
         `LeaseStore::hand_over` answers `Unsupported` at the time of the run, the engine releases to \
         everyone instead (whoever is first takes it): no figure.\n"
    );
    let _ = writeln!(w, "| backend | p50 | p99 | max | samples |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    for r in reports {
        match (&r.unavailable, &r.planned) {
            (Some(why), _) => {
                let _ = writeln!(w, "| {} | {} | | | |", r.name, short(why));
            }
            (None, Ok(Planned::Unsupported)) => {
                let _ = writeln!(w, "| {} | unsupported (released to everyone) | | | |", r.name);
            }
            (None, Ok(Planned::Measured(s))) => {
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | {} | {} |",
                    r.name,
                    ms(s.p50),
                    ms(s.p99),
                    ms(s.max),
                    s.n
                );
            }
            (None, Err(e)) => {
                let _ = writeln!(w, "| {} | {} | | | |", r.name, short(e));
            }
        }
    }
}

fn counts(c: &[usize]) -> String {
    c.iter().map(ToString::to_string).collect::<Vec<_>>().join("/")
}

fn groups(w: &mut String, reports: &[BackendReport], smoke: bool) {
    let shards = reports
        .iter()
        .find_map(|r| r.group.as_ref().ok().map(|g| g.shards))
        .unwrap_or(if smoke { 16 } else { 64 });
    let three = shards.div_ceil(3);
    let _ = writeln!(w, "\n### Lease groups: 3 members, {shards} shards\n");
    let _ = writeln!(
        w,
        "`LeaseGroup` members a, b and c (each on its own client, the TTL of the table above, default \
         `rebalance_every` = TTL/4) start together; \"balanced\" is every shard led by exactly one member \
         (`LeaseGroup::owned`) with counts floor/ceil of {shards}/members. Then c crashes: time from the crash until every shard is led by a or b \
         again, and their counts then (\"how\": c is a child process killed with SIGKILL, or, for the in-memory \
         store, c's store is blackholed and its run future dropped). Then d joins: time to balanced again, and the moves (shard tasks \
         started meanwhile: each is one shard changing owner; target at most ceil({shards}/3) = {three}). Then \
         {} of stable membership: moves (target 0). Overlaps: a shard task started while another member's \
         still ran on that shard (in one process, so it is visible; must be 0). The verdict is met when c's \
         shards end up spread (a's and b's counts differ by at most one), d's moves are at most {three}, nothing \
         moves while stable and nothing overlaps. For the times, `LeaseGroup` states: balanced after a join in \
         ceil(moves / max_moves_per_round) rounds of about two `rebalance_every` each; a dead member's shards \
         led again within its last renewal + one TTL + one round + the retry interval on stores with a clock \
         or a session, about two TTLs plus rounds on stores where contenders time records.\n",
        if smoke { "1 TTL (smoke)" } else { "10 TTLs" }
    );
    let _ = writeln!(
        w,
        "| backend | TTL | balanced from cold | c crashes: how | its shards | led again after | counts | d joins: balanced after | moves | counts | stable: moves | overlaps | verdict |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.unavailable {
            let _ = writeln!(w, "| {} | | {} | | | | | | | | | | n/a |", r.name, short(why));
            continue;
        }
        let g: &GroupReport = match &r.group {
            Ok(g) => g,
            Err(e) => {
                let skipped = e.starts_with("skipped");
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | | | | | | | | | | {} |",
                    r.name,
                    secs(r.ttl),
                    short(e),
                    if skipped { "n/a" } else { verdict(smoke, false) }
                );
                continue;
            }
        };
        let met = g
            .crash
            .as_ref()
            .is_ok_and(|c| c.counts.first().copied().unwrap_or(0) - c.counts.last().copied().unwrap_or(0) <= 1)
            && g.join.as_ref().is_ok_and(|j| j.moves <= three as usize)
            && g.stable.as_ref().is_ok_and(|s| s.moves == 0)
            && g.overlaps == 0;
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            secs(g.ttl),
            cell(&g.cold, |d| ms(*d)),
            g.crash_method,
            cell(&g.crash, |c| c.lost.to_string()),
            once(&g.crash, |c| ms(c.took)),
            once(&g.crash, |c| counts(&c.counts)),
            cell(&g.join, |j| ms(j.took)),
            once(&g.join, |j| j.moves.to_string()),
            once(&g.join, |j| counts(&j.counts)),
            cell(&g.stable, |s| format!("{} in {:.0} s", s.moves, s.window.as_secs_f64())),
            g.overlaps,
            verdict(smoke, met),
        );
    }
}

fn group_cost(w: &mut String, reports: &[BackendReport], smoke: bool) {
    let shards = reports
        .iter()
        .find_map(|r| r.group_cost.as_ref().ok().map(|c| c.shards))
        .unwrap_or(if smoke { 16 } else { 1_000 });
    let _ = writeln!(w, "\n### Lease groups: store requests per member, {shards} shards\n");
    let _ = writeln!(
        w,
        "One member alone in a group of {shards} shards, TTL as in \"Many leases in one process\" (renew_every = \
         TTL/3, `rebalance_every` = TTL/4); its store is wrapped in core's `CountingStore`. Once it leads every \
         shard and one more renewal round has passed, its calls are counted over three renewal rounds (per second). The \
         shard electors renew through the group's `RenewBatcher` (one `renew_many` per batch window); the member \
         lease renews on its own (`renew`); each round lists the group (`list`; rounds are spaced out when a listing is slow). \"Requests\" counts a \
         `renew_many` call as one request where the backend implements it in one request ({}), and as one \
         `renew` per grant elsewhere (the trait's default). Every other call counts as one request, though a \
         `list` of a big group is several on the wire on some backends (pages, scan steps, multi-reads: each \
         backend's docs.md gives server-counted figures).\n",
        crate::groups::NATIVE_RENEW_MANY.join(", ")
    );
    let _ = writeln!(
        w,
        "| backend | TTL | all led after | renew_many /s | grants renewed /s | renew /s | list /s | inspect /s | other /s | calls /s | requests /s |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.unavailable {
            let _ = writeln!(w, "| {} | | {} | | | | | | | | |", r.name, short(why));
            continue;
        }
        let c: &Cost = match &r.group_cost {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | | | | | | | | |",
                    r.name,
                    secs(r.scale_ttl),
                    short(e)
                );
                continue;
            }
        };
        let get = |op| c.calls.get(op);
        let named = get(Operation::RenewMany) + get(Operation::Renew) + get(Operation::List) + get(Operation::Inspect);
        let _ = writeln!(
            w,
            "| {} | {} | {:.1} s | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {} |",
            r.name,
            secs(c.ttl),
            c.all_owned_after.as_secs_f64(),
            c.per_second(get(Operation::RenewMany)),
            c.per_second(c.grants),
            c.per_second(get(Operation::Renew)),
            c.per_second(get(Operation::List)),
            c.per_second(get(Operation::Inspect)),
            c.per_second(c.calls.total() - named),
            c.calls_per_second(),
            if r.name == "memory" {
                "n/a (in process)".to_string()
            } else {
                format!("{:.1}", c.requests_per_second())
            },
        );
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default();
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{cores} cores of `{cpu}` ({mem} RAM), {rustc}, servers and benchmark on the same machine")
}

fn etcdctl_version() -> String {
    std::process::Command::new("etcdctl")
        .arg("version")
        .env("ETCDCTL_API", "3")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim_start_matches("etcdctl version:").trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// Replaces this runner's section of `benchmarks.md` (or appends it), keeping every other section,
/// and writes the chart.
pub(crate) fn write_docs(dir: &Path, section: &str, reports: &[BackendReport]) -> std::io::Result<()> {
    let path = dir.join("benchmarks.md");
    let old = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_string(),
        Err(e) => return Err(e),
    };
    let new = match old.find(HEADING) {
        Some(start) => {
            let after = start + HEADING.len();
            let end = old[after..].find("\n## ").map_or(old.len(), |i| after + i + 1);
            let tail = &old[end..];
            let gap = if tail.is_empty() { "" } else { "\n" };
            format!("{}{section}{gap}{tail}", &old[..start])
        }
        None => format!("{}\n\n{section}", old.trim_end()),
    };
    std::fs::write(&path, new)?;
    std::fs::write(dir.join(SVG), svg(reports))
}

/// A chart's title and its bars (backend, value; `Err(why)`: no bar, `why` written instead).
type Panel<'a> = (&'static str, Vec<(&'a str, Result<Duration, &'static str>)>);

/// Bar charts, each on its own linear scale: graceful handover p50, planned handover p50 and
/// crash failover p50.
pub(crate) fn svg(reports: &[BackendReport]) -> String {
    let stat = |o: &Outcome<Stats>| o.as_ref().map(|s| s.p50).map_err(|_| "not available");
    let panels: [Panel<'_>; 3] = [
        (
            "Graceful handover p50 (resign() returned -> successor Elected), ms",
            reports.iter().map(|r| (r.name, stat(&r.handover))).collect(),
        ),
        (
            "Planned handover p50 (hand_over(C) called -> C elected, B queued first), ms",
            reports
                .iter()
                .map(|r| {
                    let v = match &r.planned {
                        Ok(Planned::Measured(s)) => Ok(s.p50),
                        Ok(Planned::Unsupported) => Err("unsupported (released to everyone)"),
                        Err(_) => Err("not available"),
                    };
                    (r.name, v)
                })
                .collect(),
        ),
        (
            "Crash failover p50 (last renew -> successor Elected), ms",
            reports.iter().map(|r| (r.name, stat(&r.failover))).collect(),
        ),
    ];
    let (width, label_w, bar_h, gap) = (760.0, 110.0, 18.0, 6.0);
    let panel_h = |n: usize| 34.0 + n as f64 * (bar_h + gap);
    let height: f64 = panels.iter().map(|(_, rows)| panel_h(rows.len()) + 16.0).sum::<f64>() + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y = 10.0;
    for (title, rows) in &panels {
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
            y + 14.0,
            escape(title)
        );
        let max = rows
            .iter()
            .filter_map(|(_, d)| d.ok())
            .map(|d| d.as_secs_f64() * 1000.0)
            .fold(0.0_f64, f64::max)
            .max(1e-3);
        let scale = (width - label_w - 120.0) / max;
        let mut by = y + 26.0;
        for (name, d) in rows {
            let _ = writeln!(s, r#"<text x="10" y="{}">{}</text>"#, by + 13.0, escape(name));
            match d {
                Ok(d) => {
                    let v = d.as_secs_f64() * 1000.0;
                    let w = (v * scale).max(1.0);
                    let _ = writeln!(
                        s,
                        r##"<rect x="{label_w}" y="{by}" width="{w:.1}" height="{bar_h}" fill="#4a7bb7"/><text x="{:.1}" y="{}">{}</text>"##,
                        label_w + w + 4.0,
                        by + 13.0,
                        ms(*d)
                    );
                }
                Err(why) => {
                    let _ = writeln!(s, r##"<text x="{label_w}" y="{}" fill="#888">{why}</text>"##, by + 13.0);
                }
            }
            by += bar_h + gap;
        }
        y += panel_h(rows.len()) + 16.0;
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
