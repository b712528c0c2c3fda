//! `leasehold shards run` and `leasehold shards status`: a lease group from the shell.
//!
//! `shards run` is one member of a [`LeaseGroup`]: it runs the command once per shard it owns,
//! each run contained exactly as `run` contains its command (`contain.rs`: a child guard heading
//! its own process group, a cgroup v2 leaf where one can be made, stopped before the shard's
//! lease can pass on). Each command's tree is its own guard's subtree, so stopping one shard's
//! command never touches another's (`tree.rs`).

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use leasehold::{CandidateId, Elector, GroupStatus, Leader, LeaseGroup, LeaseName, ShardLeader, ShardStatus};
use nix::sys::prctl::set_child_subreaper;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::ShardsRunArgs;
use crate::child::{CommandGroup, STUCK_AFTER, check_program, describe};
use crate::contain::{Containment, KillTiming};
use crate::exit::Failure;
use crate::inspect::{connect, lease_name};
use crate::output::{line, millis, short, table};
use crate::run::Shutdown;
use crate::tree::list;

/// `leasehold shards status GROUP`.
pub(crate) async fn status(url: &str, group: &str, json: bool) -> Result<i32, Failure> {
    let group = lease_name(group)?;
    let store = connect(url).await?;
    let status = LeaseGroup::status(store.as_ref(), group.as_str())
        .await
        .map_err(|e| Failure::store(format!("cannot list group {group}"), &e))?;
    if json {
        line(&status_json_of(&status).to_string());
        return Ok(0);
    }
    if status.members.is_empty() && status.shards.is_empty() {
        line(&format!("group {group}: no members and no shards in the store"));
        return Ok(0);
    }
    let members: Vec<Vec<String>> = status
        .members
        .iter()
        .map(|m| {
            let owned = owned_by(&status, &m.id);
            vec![
                m.id.to_string(),
                m.weight.to_string(),
                owned.len().to_string(),
                if owned.is_empty() { "-".into() } else { ranges(&owned) },
            ]
        })
        .collect();
    line(&table(&["MEMBER", "WEIGHT", "SHARDS", "OWNS"], &members));
    line("");
    let shards: Vec<Vec<String>> = status
        .shards
        .iter()
        .map(|s| {
            let (state, owner, member_term) = shard_state(s);
            vec![
                s.shard.to_string(),
                state.into(),
                owner,
                s.term.to_string(),
                member_term,
            ]
        })
        .collect();
    line(&table(&["SHARD", "STATE", "OWNER", "TERM", "MEMBER TERM"], &shards));
    Ok(0)
}

/// A shard's state (`owned`: its owner leads the member lease its record names; `claimable`:
/// it does not; `free`), its owner and the owner's member term as the record names them.
fn shard_state(shard: &ShardStatus) -> (&'static str, String, String) {
    match &shard.owner {
        Some((owner, member_term)) => (
            if shard.live { "owned" } else { "claimable" },
            owner.to_string(),
            member_term.to_string(),
        ),
        None => ("free", "-".into(), "-".into()),
    }
}

/// The shards that `member` owns, in order (not those whose record names it under an earlier
/// member term, see `ShardStatus::owner`).
fn owned_by(status: &GroupStatus, member: &CandidateId) -> Vec<u32> {
    status
        .shards
        .iter()
        .filter(|s| s.owner().is_some_and(|(owner, _)| owner == member))
        .map(|s| s.shard)
        .collect()
}

/// `[0, 1, 2, 5, 7, 8]` as `0-2, 5, 7-8`.
fn ranges(shards: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < shards.len() {
        let mut j = i;
        while j + 1 < shards.len() && shards[j + 1] == shards[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            shards[i].to_string()
        } else {
            format!("{}-{}", shards[i], shards[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

fn status_json_of(status: &GroupStatus) -> Value {
    let members: Vec<Value> = status
        .members
        .iter()
        .map(|m| {
            let holder = m.lease.holder.as_ref();
            json!({
                "id": m.id.as_str(),
                "weight": m.weight,
                "shards": owned_by(status, &m.id),
                "ttl_ms": holder.map(|h| millis(h.ttl)),
                "store_remaining_ms": holder.and_then(|h| h.store_remaining).map(millis),
            })
        })
        .collect();
    let shards: Vec<Value> = status
        .shards
        .iter()
        .map(|s| {
            let (state, _, _) = shard_state(s);
            json!({
                "shard": s.shard,
                "record": s.record.name.as_str(),
                "state": state,
                "owner": s.owner.as_ref().map(|(id, _)| id.as_str()),
                "member_term": s.owner.as_ref().map(|(_, t)| t.0),
                "term": s.term.0,
            })
        })
        .collect();
    json!({"group": status.group.as_str(), "members": members, "shards": shards})
}

/// `leasehold shards run --group NAME --shards N -- CMD...`. Returns the exit code.
pub(crate) async fn run(url: &str, args: ShardsRunArgs) -> Result<i32, Failure> {
    let group_name = lease_name(&args.group)?;
    let id = match &args.id {
        Some(id) => CandidateId::new(id.clone()).map_err(Failure::usage)?,
        None => CandidateId::generate(),
    };
    let kill = KillTiming::new(args.ttl, args.kill_grace);
    check_program(&args.command[0])?;
    // Orphans of a command's tree come to this process, not to PID 1, once its guard is gone.
    set_child_subreaper(true).map_err(|e| Failure::runtime(format!("cannot become a child subreaper: {e}")))?;
    let stop = Shutdown::listen()?;
    let store = connect(url).await?;
    let margin = kill.step_down_margin();
    // Every shard's elector has this timing (the member's own lease too).
    let timing = Elector::builder(store.clone(), group_name.as_str())
        .ttl(args.ttl)
        .step_down_margin(margin)
        .timing();
    kill.check(&timing)?;
    let group = LeaseGroup::builder(store.clone(), group_name.as_str(), args.shards)
        .member_id(id.as_str())
        .ttl(args.ttl)
        .weight(args.weight)
        .electors(move |b| b.step_down_margin(margin))
        .build()
        .map_err(|e| Failure::store("invalid group settings", &e))?;
    // Every member lists the group every round: a store that cannot list cannot run one.
    LeaseGroup::status(store.as_ref(), group_name.as_str())
        .await
        .map_err(|e| Failure::store(format!("cannot list group {group_name}"), &e))?;

    let ctx = Arc::new(ShardSupervisor {
        contain: Containment::new(args.command, kill, args.quiet, args.no_cgroup, stop.hurry.clone()),
        group: group_name.clone(),
        shards: args.shards,
        stop_requested: stop.requested.clone(),
        stop_signal: stop.signal.clone(),
    });
    ctx.contain.log(format_args!(
        "{id} joins group {group_name} ({} shards, weight {}, ttl {}): runs {} once per shard it owns",
        args.shards,
        args.weight,
        short(args.ttl),
        ctx.contain.program(),
    ));
    let task = {
        let ctx = ctx.clone();
        move |shard: ShardLeader| {
            let ctx = ctx.clone();
            async move { ctx.supervise(shard).await }
        }
    };
    group
        .run_until(task, stop.requested.clone().cancelled_owned())
        .await
        .map_err(|e| Failure::store(format!("cannot run group {group_name}"), &e))?;
    ctx.contain.log(format_args!(
        "{id} left group {group_name}: every shard it owned is released"
    ));
    Ok(stop.signal().map_or(0, |signal| 128 + signal))
}

/// What each shard's task needs; shared by every shard and term.
#[derive(Debug)]
struct ShardSupervisor {
    contain: Containment,
    group: LeaseName,
    shards: u32,
    /// Cancelled by the first SIGINT, SIGTERM or SIGHUP.
    stop_requested: CancellationToken,
    /// Which signal that was.
    stop_signal: Arc<AtomicI32>,
}

impl ShardSupervisor {
    /// A shard's task: run the command until it exits, or until this member's ownership of the
    /// shard ends. Returning releases the shard (once the command's tree is empty).
    async fn supervise(&self, shard: ShardLeader) -> Result<(), Failure> {
        let leader = shard.leader();
        let number = shard.shard();
        let term = leader.term();
        let name = format!("{} for shard {number}", self.contain.program());
        self.contain.log(format_args!(
            "{} owns shard {number} of {} at term {term} (valid for {})",
            leader.holder(),
            self.group,
            short(leader.remaining()),
        ));
        if !self.contain.lease_fits(leader).await || self.stop_requested.is_cancelled() {
            return Ok(());
        }
        if !self.contain.clear_earlier(leader, &name).await || self.stop_requested.is_cancelled() {
            return Ok(());
        }
        let env = [
            ("LEASEHOLD_GROUP", self.group.to_string()),
            ("LEASEHOLD_SHARD", number.to_string()),
            ("LEASEHOLD_SHARDS", self.shards.to_string()),
            ("LEASEHOLD_LEASE", leader.lease().to_string()),
            ("LEASEHOLD_HOLDER", leader.holder().to_string()),
            ("LEASEHOLD_TERM", term.to_string()),
        ];
        let leaf = format!("leasehold-{}-s{number}-{term}", std::process::id());
        let mut group = self.contain.start(leader, &name, &env, &leaf).inspect_err(|failure| {
            self.contain
                .log(format_args!("{failure}; releasing shard {number} (term {term})"));
        })?;
        tokio::select! {
            status = group.wait() => return self.after_exit(leader, number, &name, group, status).await,
            () = leader.cancelled() => {}
        }
        let why = self.why_ending(leader, number);
        self.contain.stop(leader, &name, &mut group, &why).await;
        Ok(())
    }

    /// The command's guard exited: the command exited (the guard ended what it left behind), or
    /// the guard itself was killed. Empties the tree; the shard is released when this returns,
    /// and campaigned for again at the member's next round if the group still plans it here.
    async fn after_exit(
        &self,
        leader: &Leader,
        number: u32,
        name: &str,
        mut group: CommandGroup,
        status: std::process::ExitStatus,
    ) -> Result<(), Failure> {
        let term = leader.term();
        let left = group.clear(Some(Instant::now() + STUCK_AFTER)).await;
        let what = if status.signal().is_some() {
            let killed = match &left {
                Ok(0) => format!("nothing of {name}'s tree was left"),
                Ok(n) => format!("killed {name}'s tree ({n} process{}) with SIGKILL", plural(*n)),
                Err(_) => format!("killing {name}'s tree with SIGKILL"),
            };
            format!("the child guard (pid {}) {}: {killed}", group.pgid(), describe(status))
        } else {
            let behind = match &left {
                Ok(0) | Err(_) => String::new(),
                Ok(n) => format!("; killed {n} process{} it left behind", plural(*n)),
            };
            format!("{name} {}{behind}", describe(status))
        };
        if let Err(left) = left {
            self.contain.log(format_args!(
                "{what}; {} still alive {} into SIGKILL (a process in uninterruptible sleep dies \
                 only when its system call returns): shard {number} (term {term}) is kept until \
                 they are gone, and leasehold keeps killing",
                list(&left),
                short(STUCK_AFTER),
            ));
            // Until empty (the shard renewed meanwhile), or aborted at `valid_until` should
            // leadership end: then the lease is not released, it runs out.
            let _ = group.clear(None).await;
        }
        self.contain.log(format_args!(
            "{what}; releasing shard {number} (term {term}); it runs again at a higher term when \
             the group next gives it to a member"
        ));
        Ok(())
    }

    /// Why this member's ownership of shard `number` is ending, for the first line about it.
    fn why_ending(&self, leader: &Leader, number: u32) -> String {
        let term = leader.term();
        if self.stop_requested.is_cancelled() {
            let signal = self.stop_signal.load(Ordering::SeqCst);
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| format!("signal {signal}"), |s| s.to_string());
            return format!("received {name}: giving up shard {number} (term {term})");
        }
        let moved = format!(
            "giving up shard {number} (term {term}): the group moves it to another member, or this \
             member's own lease ended"
        );
        match leader.ensure_valid(Duration::ZERO) {
            Err(leasehold::Error::NotLeader { reason, .. }) => {
                let reason = reason.strip_prefix("deposed: ").unwrap_or(&reason);
                if reason == "resigned" {
                    moved
                } else {
                    format!("lost shard {number} (term {term}): {reason}")
                }
            }
            Err(error) => format!("lost shard {number} (term {term}): {error}"),
            Ok(()) => moved,
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "es" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_lists_read_as_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&(0..32).collect::<Vec<_>>()), "0-31");
    }
}
