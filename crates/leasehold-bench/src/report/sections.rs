//! The report's sections on expiry floors, fast polling, crash observation, planned handover
//! and shard groups.

use std::fmt::Write as _;
use std::time::Duration;

use leasehold::Operation;

use super::cells::{OBSERVE_TARGET, cell, counts, once, secs, short, verdict};
use crate::groups::{Cost, GroupReport};
use crate::measures::{BackendReport, FAST_POLL, FastPoll, Idle, Planned};
use crate::ms;
use crate::plan::Outcome;

pub(super) fn expiry_floor(w: &mut String, reports: &[BackendReport]) {
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

pub(super) fn observe_after_crash(w: &mut String, reports: &[BackendReport], smoke: bool) {
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
pub(super) fn fast_poll(w: &mut String, reports: &[BackendReport], smoke: bool) {
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

pub(super) fn planned_handover(w: &mut String, reports: &[BackendReport]) {
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

pub(super) fn groups(w: &mut String, reports: &[BackendReport], smoke: bool) {
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

pub(super) fn group_cost(w: &mut String, reports: &[BackendReport], smoke: bool) {
    let _ = writeln!(w, "\n### Lease groups: store requests per member\n");
    let _ = writeln!(
        w,
        "One member alone in a group, at each shard count ({}), TTL as in \"Many leases in one process\" \
         (renew_every = TTL/3, `rebalance_every` = TTL/4); its store is wrapped in core's `CountingStore`. Once it \
         runs every shard and two more renewal rounds have passed, its calls are counted over three renewal rounds \
         (per second). A member renews its member lease only (`renew`) and lists the member leases once a round \
         (`list`); it reads the shard records (`shard_records`) and writes them (`write_shard`) only while something \
         changes. Every call is one request but a read of many records (pages: each backend's docs.md gives the \
         requests per 10,000 records). Target: at most 3 requests/s at 10,000 shards with TTL 10 s, independent of \
         the shard count.\n",
        if smoke { "16" } else { "100, 1,000 and 10,000" }
    );
    let _ = writeln!(
        w,
        "| backend | TTL | shards | all owned after | renew /s | list /s | shard_records /s | write_shard /s | other /s | requests /s |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.unavailable {
            let _ = writeln!(w, "| {} | | | {} | | | | | | |", r.name, short(why));
            continue;
        }
        for c in &r.group_cost {
            let c: &Cost = match c {
                Ok(c) => c,
                Err(e) => {
                    let _ = writeln!(w, "| {} | {} | | {} | | | | | | |", r.name, secs(r.scale_ttl), short(e));
                    continue;
                }
            };
            let get = |op| c.calls.get(op);
            let named = get(Operation::Renew)
                + get(Operation::List)
                + get(Operation::ShardRecords)
                + get(Operation::WriteShard);
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.1} s | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.name,
                secs(c.ttl),
                c.shards,
                c.all_owned_after.as_secs_f64(),
                c.per_second(get(Operation::Renew)),
                c.per_second(get(Operation::List)),
                c.per_second(get(Operation::ShardRecords)),
                c.per_second(get(Operation::WriteShard)),
                c.per_second(c.calls.total() - named),
                c.calls_per_second(),
            );
        }
    }
}

pub(super) fn group_scale(w: &mut String, reports: &[BackendReport]) {
    let Some((members, shards)) = reports
        .iter()
        .find_map(|r| r.group_scale.as_ref().ok().map(|g| (g.members, g.shards)))
    else {
        return;
    };
    let _ = writeln!(w, "\n### Lease groups at scale: {members} members, {shards} shards\n");
    let _ = writeln!(
        w,
        "{members} members, each a process of its own (`--child-member`), start together (TTL of the first \
         table, `rebalance_every` = TTL/4); \"balanced\" is every shard owned by exactly one member with counts \
         floor/ceil of {shards}/members. Resident memory: `VmRSS` of each member's process once balanced. Then the \
         last member is killed with SIGKILL: time until every shard is owned by the others, their counts. Then a \
         member joins: time to balanced, and the shards that changed owner (target at most ceil({shards}/{members})). \
         Then 10 TTLs of stable membership: shards that changed owner (target 0).\n"
    );
    let _ = writeln!(
        w,
        "| backend | TTL | balanced from cold | resident memory per member | killed: its shards | owned again after | counts | joined: balanced after | moves | counts | stable: moves |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.unavailable {
            let _ = writeln!(w, "| {} | | {} | | | | | | | | |", r.name, short(why));
            continue;
        }
        let g = match &r.group_scale {
            Ok(g) => g,
            Err(e) => {
                let _ = writeln!(w, "| {} | | {} | | | | | | | | |", r.name, short(e));
                continue;
            }
        };
        let rss: Vec<String> = g
            .rss_kb
            .iter()
            .map(|kb| format!("{:.1} MB", *kb as f64 / 1024.0))
            .collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            secs(g.ttl),
            ms(g.cold),
            rss.join(", "),
            cell(&g.crash, |c| c.0.to_string()),
            once(&g.crash, |c| ms(c.1)),
            once(&g.crash, |c| counts(&c.2)),
            cell(&g.join, |j| ms(j.0)),
            once(&g.join, |j| j.1.to_string()),
            once(&g.join, |j| counts(&j.2)),
            cell(&g.stable, |s| format!("{} in {:.0} s", s.1, s.0.as_secs_f64())),
        );
    }
}
