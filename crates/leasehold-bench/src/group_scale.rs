//! Lease groups at scale: `members` members × `shards` shards, each member a process of its own
//! (`--child-member`), so that its resident memory is its own: balanced from cold, a member
//! killed with SIGKILL, a member joining, then 10 TTLs of stable membership.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backends::Available;
use crate::groups::{Member, quotas, until};
use crate::plan::{Outcome, Plan};

/// The measure of one backend.
#[derive(Debug)]
pub(crate) struct ScaleReport {
    pub(crate) members: usize,
    pub(crate) shards: u32,
    pub(crate) ttl: Duration,
    /// From every member starting to balanced (every shard owned once, counts floor/ceil).
    pub(crate) cold: Duration,
    /// Resident memory of each member once balanced, in kB.
    pub(crate) rss_kb: Vec<u64>,
    /// A member killed: its shards, the time until every shard is owned again, the counts then.
    pub(crate) crash: Outcome<(usize, Duration, Vec<usize>)>,
    /// A member joining: the time until balanced, the shards that changed owner, the counts.
    pub(crate) join: Outcome<(Duration, usize, Vec<usize>)>,
    /// Stable membership: the window, and the shards that changed owner in it.
    pub(crate) stable: Outcome<(Duration, usize)>,
}

/// Who owns each shard now, by member index.
fn owners(members: &[Member]) -> HashMap<u32, usize> {
    let mut owners = HashMap::new();
    for (i, m) in members.iter().enumerate() {
        for s in m.owned() {
            owners.insert(s, i);
        }
    }
    owners
}

/// Shards owned in both snapshots, by different members (indices of the same `members`).
fn moved(before: &HashMap<u32, usize>, after: &HashMap<u32, usize>) -> usize {
    after
        .iter()
        .filter(|(s, owner)| before.get(s).is_some_and(|b| b != *owner))
        .count()
}

/// A process's resident memory (`VmRSS` of `/proc/{pid}/status`), in kB.
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the measure on one backend (members in processes: not for the in-memory store).
pub(crate) async fn measure(av: &Available, run: u64, plan: &Plan) -> Outcome<ScaleReport> {
    let (count, shards) = plan.group_scale;
    let Some(url) = av.url() else {
        return Err("members run in processes of their own: not for the in-memory store".into());
    };
    eprintln!("   group at scale: {count} members, {shards} shards, a process each");
    let t = Instant::now();
    let ttl = av.ttl;
    let name = format!("bench-{run}-scale");
    let ids: Vec<String> = (0..=count).map(|i| format!("m{i}")).collect();
    let started = Instant::now();
    let mut members = Vec::new();
    for id in &ids[..count] {
        members.push(Member::spawn(url, &name, shards, id, ttl)?);
    }
    let balanced = quotas(shards, count);
    let limit = Duration::from_secs(600) + ttl * 10;
    let refs: Vec<&Member> = members.iter().collect();
    let cold = until(&refs, shards, limit, "balanced from cold", |counts, all| {
        all && counts == balanced
    })
    .await;
    let mut report = ScaleReport {
        members: count,
        shards,
        ttl,
        cold: Duration::ZERO,
        rss_kb: Vec::new(),
        crash: Err("skipped (an earlier phase failed)".into()),
        join: Err("skipped (an earlier phase failed)".into()),
        stable: Err("skipped (an earlier phase failed)".into()),
    };
    let result = match cold {
        Err(e) => Err(e),
        Ok(_) => {
            report.cold = started.elapsed();
            report.rss_kb = members.iter().filter_map(|m| m.pid().and_then(rss_kb)).collect();
            // The last member is killed.
            let dead = members.pop().expect("members");
            let lost = dead.owned().len();
            let cut = Instant::now();
            dead.kill().await;
            let refs: Vec<&Member> = members.iter().collect();
            report.crash = until(
                &refs,
                shards,
                ttl * 10 + Duration::from_secs(120),
                "the shards owned again",
                |_, all| all,
            )
            .await
            .map(|(_, counts)| (lost, cut.elapsed(), counts));
            if report.crash.is_ok() {
                let before = owners(&members);
                let joined = Instant::now();
                members.push(Member::spawn(url, &name, shards, &ids[count], ttl)?);
                let refs: Vec<&Member> = members.iter().collect();
                report.join = until(
                    &refs,
                    shards,
                    ttl * 20 + Duration::from_secs(300),
                    "balanced after a join",
                    |counts, all| all && counts == balanced,
                )
                .await
                .map(|(_, counts)| (joined.elapsed(), moved(&before, &owners(&members)), counts));
            }
            if report.join.is_ok() {
                let window = ttl * if plan.smoke { 1 } else { 10 };
                let before = owners(&members);
                tokio::time::sleep(window).await;
                report.stable = Ok((window, moved(&before, &owners(&members))));
            }
            Ok(())
        }
    };
    let leaving = members.into_iter().map(|m| m.leave(ttl * 3));
    futures::future::join_all(leaving).await;
    eprintln!("      {:.1} s", t.elapsed().as_secs_f64());
    result.map(|()| report)
}
