//! `candidates(lease)`: the holder, then the waiters of the lease's queue (the sorted set
//! `queue`, in the order they are woken) that still listen on their own channel. A waiter whose
//! process died stays in the set until a wake-up or a sweep finds nobody listening; the
//! listening check (`PUBSUB NUMSUB`, in the same script) leaves it out at once.

use std::sync::LazyLock;

use leasehold_core::{CandidateId, Error, LeaseName, Observation, Result};
use redis::{Script, Value};

use crate::config::LeaseKeys;
use crate::conn::Commands;
use crate::error::{STORE, unexpected};

/// `KEYS = [queue]`, `ARGV = [nonce, waiters]`: the queued candidates someone listens for.
const LISTENING: &str = r#"
local nonce, waiters = ARGV[1], ARGV[2]
local listening = {}
for _, who in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if tonumber(redis.call('PUBSUB', 'NUMSUB', waiters .. who)[2]) > 0 then
    table.insert(listening, who)
  end
end
return {nonce, 'listening', listening}
"#;

static LISTENING_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LISTENING));

/// The candidates of `lease`: `seen`'s holder (while it holds, not reserved), then the waiters
/// still listening, in queue order. Two requests: `seen` is read first by the caller, so a
/// holder that left in between may still be listed.
pub(crate) async fn queued(
    commands: &Commands,
    keys: &LeaseKeys,
    lease: &LeaseName,
    seen: Observation,
) -> Result<Vec<CandidateId>> {
    let reply = commands
        .eval(
            "candidates",
            &LISTENING_SCRIPT,
            &[&keys.queue],
            vec![keys.waiters.clone()],
        )
        .await?;
    if reply.status()? != "listening" {
        return Err(unexpected("candidates", format!("{:?}", reply.values)));
    }
    let mut listed: Vec<CandidateId> = seen.holder.filter(|h| !h.reserved).map(|h| h.id).into_iter().collect();
    for value in reply.array(1)? {
        let Value::BulkString(bytes) = value else {
            return Err(unexpected("candidates", format!("{value:?}")));
        };
        let text = String::from_utf8_lossy(bytes);
        let id = CandidateId::new(text.as_ref())
            .map_err(|e| Error::corrupt(STORE, lease, format!("queue entry {text:?}: {e}")))?;
        if !listed.contains(&id) {
            listed.push(id);
        }
    }
    Ok(listed)
}
