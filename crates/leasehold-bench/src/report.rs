//! The Markdown report, its targets and verdicts, and the SVG chart.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::etcdctl::{ETCDCTL_SESSION_TTL, EtcdctlReport, Paired};

use crate::measures::BackendReport;
use crate::plan::Outcome;
use crate::{Options, Stats, ms};

mod cells;
mod issue17;
mod sections;
mod svg;

use cells::{cell, floor_cell, secs, short, verdict};
use issue17::issue17;
use sections::{expiry_floor, fast_poll, group_cost, group_scale, groups, observe_after_crash, planned_handover};
use svg::svg;

/// The heading of this runner's section; everything up to the next `## ` heading is ours.
const HEADING: &str = "## Backends side by side";
const SVG: &str = "benchmarks-latency.svg";

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
    group_scale(w, reports);

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
    write_section(dir, HEADING, section)?;
    std::fs::write(dir.join(SVG), svg(reports))
}

/// Replaces the section of `benchmarks.md` under `heading` (a `## ` line, up to the next one) with
/// `section`, or appends it, keeping every other section.
pub(crate) fn write_section(dir: &Path, heading: &str, section: &str) -> std::io::Result<()> {
    let path = dir.join("benchmarks.md");
    let old = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_string(),
        Err(e) => return Err(e),
    };
    let new = match old.find(heading) {
        Some(start) => {
            let after = start + heading.len();
            let end = old[after..].find("\n## ").map_or(old.len(), |i| after + i + 1);
            let tail = &old[end..];
            let gap = if tail.is_empty() { "" } else { "\n" };
            format!("{}{section}{gap}{tail}", &old[..start])
        }
        None => format!("{}\n\n{section}", old.trim_end()),
    };
    std::fs::write(&path, new)
}
