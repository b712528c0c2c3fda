//! The Lua scripts: every operation is one script, so every compare-and-set is atomic on the
//! server.
//!
//! Every script takes `KEYS = [lease, state, history]` (the renewal: once per grant; acquire,
//! release, hand_over, break and withdraw also `queue, woken`) and `ARGV[1]` = a nonce, and answers an array whose first element is that nonce (so that a reply
//! is never taken for the answer to another request) and whose second is a status word:
//!
//! - `held holder term ttl_ms version pttl_ms last_term reserved` (`reserved`: `1` for a lease
//!   handed over to `holder` and not taken yet, else empty)
//! - `free last_term previous_end` (`previous_end`: `released`, `expired`, `broken`,
//!   `handed_over` or empty)
//! - `granted term`, `ok`, `broken term`, `none` (nothing to break)
//! - `renewed_each` and per grant `renewed`, an observation or `corrupt detail`
//! - `seen_each` and per lease an observation or `corrupt detail` (the inspection of many)
//! - `corrupt detail`: a key of another type or shape; nothing was written
//! - `starting uptime_s needed_s`: the restart guard refused a grant
//! - `scan next_cursor keys`: one step of the key scan of `list` (takes no keys)
//!
//! Types and shapes are checked before the first write (of each grant, for the renewal), so a
//! script that refuses has changed nothing (Redis does not roll back a script that fails
//! half-way).

use std::sync::LazyLock;

use redis::Script;

/// Reading and checking the three keys, shared by every script.
const PRELUDE: &str = r#"
local nonce = ARGV[1]
local lease_key, state_key, history_key = KEYS[1], KEYS[2], KEYS[3]
-- Set by the scripts that queue and wake waiters (KEYS[4] and KEYS[5]).
local queue_key, woken_key
-- Waiters kept at most: a candidate that finds the queue full of live waiters is not queued (it
-- is woken only when nobody queued is listening, or by its safety poll).
local QUEUE_LIMIT = 1000

local function uint(s)
  return type(s) == 'string' and #s > 0 and #s <= 19 and not string.find(s, '%D')
end

local function fmt(n)
  return string.format('%d', n)
end

-- A string of digits without its leading zeros ('0' for zero): what HINCRBY accepts.
local function norm(s)
  local n = string.match(s, '^0*(%d*)$')
  if n == '' then return '0' end
  return n
end

-- Whether the digit string a is at least b, exactly (Lua numbers are doubles: 19 digits are not).
local function ge(a, b)
  a, b = norm(a), norm(b)
  if #a ~= #b then return #a > #b end
  return a >= b
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fields(key)
  return table.concat(redis.call('HKEYS', key), ', ')
end

-- The lease record (false when free) and the state, or nil, nil and what is wrong.
local function load()
  local wanted = {{lease_key, 'hash'}, {state_key, 'hash'}, {history_key, 'stream'}}
  if queue_key then
    wanted[4] = {queue_key, 'zset'}
    wanted[5] = {woken_key, 'string'}
  end
  for _, kw in ipairs(wanted) do
    local t = redis.call('TYPE', kw[1])['ok']
    if t ~= 'none' and t ~= kw[2] then
      return nil, nil, 'key ' .. kw[1] .. ' holds a ' .. t .. ' where leasehold keeps a ' .. kw[2]
    end
  end
  local lease = false
  local n = redis.call('HLEN', lease_key)
  if n > 0 then
    -- `reserved` (optional, '1'): handed over to `holder`, who has not taken it yet.
    local f = redis.call('HMGET', lease_key, 'holder', 'term', 'ttl', 'version', 'reserved')
    local count = 4
    if f[5] then count = 5 end
    if n ~= count or not f[1] or not uint(f[2]) or not uint(f[3]) or not f[4] then
      return nil, nil, 'key ' .. lease_key .. ' is not a leasehold lease record (fields: ' .. fields(lease_key) .. ')'
    end
    if f[5] and f[5] ~= '1' then
      return nil, nil, 'key ' .. lease_key .. ' field reserved is "' .. string.sub(f[5], 1, 40) .. '", expected 1'
    end
    local pttl = redis.call('PTTL', lease_key)
    if pttl < 0 then
      return nil, nil, 'key ' .. lease_key .. ' has no expiry'
    end
    lease = {holder = f[1], term = f[2], ttl = f[3], version = f[4], pttl = pttl, reserved = f[5] == '1'}
  end
  local state = {}
  n = redis.call('HLEN', state_key)
  if n > 0 then
    local f = redis.call('HMGET', state_key, 'term', 'holder', 'deadline', 'ended', 'ended_at')
    local ended = f[4]
    if n ~= 5 or not uint(f[1]) or not f[2] or not uint(f[3])
        or not (ended == '' or ended == 'released' or ended == 'expired' or ended == 'broken'
                or ended == 'handed_over')
        or not (f[5] == '' or uint(f[5])) then
      return nil, nil, 'key ' .. state_key .. ' is not a leasehold lease state (fields: ' .. fields(state_key) .. ')'
    end
    state = {term = f[1], holder = f[2], deadline = f[3], ended = ended, ended_at = f[5]}
  end
  return lease, state
end

local function observation(lease, state)
  if lease then
    local reserved = ''
    if lease.reserved then reserved = '1' end
    return {nonce, 'held', lease.holder, lease.term, lease.ttl, lease.version, fmt(lease.pttl), state.term or lease.term,
            reserved}
  end
  local ended = ''
  if state.term then
    ended = state.ended
    -- The record is gone but its term never ended: it expired.
    if ended == '' then ended = 'expired' end
  end
  return {nonce, 'free', state.term or '0', ended}
end

local function append(maxlen, ...)
  if maxlen == '0' then
    redis.call('XADD', history_key, '*', ...)
  else
    redis.call('XADD', history_key, 'MAXLEN', '~', maxlen, '*', ...)
  end
end

-- Sends `message` on `who`'s own channel: whether anybody listens there (the waiter's store
-- subscribes while it campaigns, and its connection closes when its process dies).
local function tell(waiters, who, message)
  return redis.call('PUBLISH', waiters .. who, message) > 0
end

-- Queues `candidate` behind the holder, keeping the place it has. A full queue is first swept of
-- waiters nobody listens for (`probe` wakes nobody).
local function join(candidate, waiters)
  if redis.call('ZSCORE', queue_key, candidate) then return end
  if redis.call('ZCARD', queue_key) >= QUEUE_LIMIT then
    for _, who in ipairs(redis.call('ZRANGE', queue_key, 0, -1)) do
      if not tell(waiters, who, 'probe') then redis.call('ZREM', queue_key, who) end
    end
    if redis.call('ZCARD', queue_key) >= QUEUE_LIMIT then return end
  end
  local t = redis.call('TIME')
  redis.call('ZADD', queue_key, t[1] .. string.format('%06d', tonumber(t[2])), candidate)
end

-- The lease is free: wakes the longest waiter still listening on its own channel (dropping those
-- that are not), remembers it for `ttl_ms` (if it does not take the lease by then, the expiry of
-- that key wakes every follower) and names it on the lease's channel (which wakes nobody). With
-- no waiter listening, the lease's channel wakes every follower.
local function wake_next(event, term, ttl_ms, channel, waiters)
  local message = event .. ' ' .. term
  while true do
    local first = redis.call('ZRANGE', queue_key, 0, 0)[1]
    if not first then break end
    if tell(waiters, first, message) then
      redis.call('SET', woken_key, first, 'PX', ttl_ms)
      redis.call('PUBLISH', channel, message .. ' ' .. first)
      return
    end
    redis.call('ZREM', queue_key, first)
  end
  redis.call('DEL', woken_key)
  redis.call('PUBLISH', channel, message)
end

-- Records the end of the state's open term.
local function finish(state, reason, at, maxlen)
  append(maxlen, 'end', state.term, 'reason', reason, 'at', at)
  redis.call('HSET', state_key, 'ended', reason, 'ended_at', at)
  state.ended = reason
end
"#;

/// `KEYS = [lease, state, history, queue, woken]`, `ARGV = [nonce, candidate, ttl_ms, version,
/// maxlen, guard, channel, waiters]`. A candidate answered `held` is queued (if not already).
const ACQUIRE: &str = r#"
local candidate, ttl, version, maxlen, guard, channel = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
queue_key, woken_key = KEYS[4], KEYS[5]
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
-- The highest term this server remembers granting.
local stored = state.term
if lease and (not stored or ge(lease.term, stored)) then stored = lease.term end
if stored and ge(stored, '9223372036854775807') then
  return {nonce, 'corrupt', 'key ' .. state_key .. ' holds term ' .. stored .. ', which no term can follow'}
end
local now = now_ms()
if lease then
  if lease.holder ~= candidate then
    join(candidate, ARGV[8])
    return observation(lease, state)
  end
  -- The candidate's own earlier term: that leadership has ended, this grant is a new term. (A
  -- reservation for the candidate: its term already ended, handed over.)
  if state.term == lease.term and state.ended == '' then finish(state, 'expired', fmt(now), maxlen) end
else
  if guard == '1' then
    local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
    local needed = math.ceil(tonumber(ttl) / 1000) + 1
    if up and up < needed then return {nonce, 'starting', fmt(up), fmt(needed)} end
  end
  if state.term and state.ended == '' then
    -- The previous term expired: record it, at the time the server let it go.
    finish(state, 'expired', state.deadline, maxlen)
  end
end
-- The next term is max(stored + 1, the server's time in microseconds), so that it is above every
-- term granted before also when the counter is missing, or older than the terms granted (a
-- restored snapshot, an AOF that lost its last second, a promoted replica): see docs.md.
local t = redis.call('TIME')
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
if stored and ge(stored, now_us) then
  redis.call('HSET', state_key, 'term', norm(stored))
  redis.call('HINCRBY', state_key, 'term', 1)
else
  redis.call('HSET', state_key, 'term', now_us)
end
local term = redis.call('HGET', state_key, 'term')
redis.call('DEL', lease_key)
redis.call('HSET', lease_key, 'holder', candidate, 'term', term, 'ttl', ttl, 'version', version)
redis.call('PEXPIRE', lease_key, ttl)
redis.call('HSET', state_key, 'holder', candidate, 'deadline', fmt(now + tonumber(ttl)), 'ended', '', 'ended_at', '')
append(maxlen, 'grant', term, 'holder', candidate, 'ttl', ttl)
redis.call('ZREM', queue_key, candidate)
redis.call('DEL', woken_key)
-- Announces the new holder (`announcements`); names it, so it wakes nobody.
redis.call('PUBLISH', channel, 'granted ' .. term .. ' ' .. ttl .. ' ' .. version .. ' ' .. candidate)
return {nonce, 'granted', term}
"#;

/// `KEYS = [lease, state, history]` once per grant, `ARGV = [nonce]` then `holder, term, version`
/// once per grant: renews every grant whose record still names it. Answers `renewed_each` and one
/// array per grant, in order: `renewed`, an observation (without the nonce) when the record names
/// another holder or none, or `corrupt detail` (that grant's keys are left alone, the others are
/// renewed).
const RENEW: &str = r#"
local out = {nonce, 'renewed_each'}
for i = 0, #KEYS / 3 - 1 do
  lease_key, state_key, history_key = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local holder, term, version = ARGV[3 * i + 2], ARGV[3 * i + 3], ARGV[3 * i + 4]
  local lease, state, bad = load()
  if bad then
    out[#out + 1] = {'corrupt', bad}
  elseif lease and not lease.reserved and lease.holder == holder and lease.term == term then
    redis.call('HSET', lease_key, 'version', version)
    redis.call('PEXPIRE', lease_key, lease.ttl)
    if state.term == lease.term then
      redis.call('HSET', state_key, 'deadline', fmt(now_ms() + tonumber(lease.ttl)))
    end
    out[#out + 1] = {'renewed'}
  else
    local seen = observation(lease, state)
    table.remove(seen, 1)
    out[#out + 1] = seen
  end
end
return out
"#;

/// `KEYS = [lease, state, history, queue, woken]`, `ARGV = [nonce, holder, term, maxlen,
/// channel, waiters]`. Wakes the next waiter.
const RELEASE: &str = r#"
queue_key, woken_key = KEYS[4], KEYS[5]
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
if lease and not lease.reserved and lease.holder == ARGV[2] and lease.term == ARGV[3] then
  redis.call('DEL', lease_key)
  if state.term == lease.term then finish(state, 'released', fmt(now_ms()), ARGV[4]) end
  wake_next('released', lease.term, lease.ttl, ARGV[5], ARGV[6])
end
return {nonce, 'ok'}
"#;

/// `KEYS = [lease, state, history, queue, woken]`, `ARGV = [nonce, holder, term, successor,
/// version, maxlen, channel, waiters]`. If the record still names the grant, ends its term
/// `handed_over` and leaves the record naming the successor at the same term, `reserved`, with a
/// new version and a full TTL; the successor alone is woken, on its own channel (nobody else can
/// take the lease before the reservation expires, and its expiry wakes every follower).
const HAND_OVER: &str = r#"
queue_key, woken_key = KEYS[4], KEYS[5]
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
if lease and not lease.reserved and lease.holder == ARGV[2] and lease.term == ARGV[3] then
  local now = now_ms()
  if state.term == lease.term then finish(state, 'handed_over', fmt(now), ARGV[6]) end
  redis.call('DEL', lease_key)
  redis.call('HSET', lease_key, 'holder', ARGV[4], 'term', lease.term, 'ttl', lease.ttl, 'version', ARGV[5],
             'reserved', '1')
  redis.call('PEXPIRE', lease_key, lease.ttl)
  redis.call('HSET', state_key, 'deadline', fmt(now + tonumber(lease.ttl)))
  tell(ARGV[8], ARGV[4], 'handed_over ' .. lease.term)
  redis.call('PUBLISH', ARGV[7], 'handed_over ' .. lease.term .. ' ' .. ARGV[4])
end
return {nonce, 'ok'}
"#;

/// `KEYS = [lease, state, history, queue, woken]`, `ARGV = [nonce, maxlen, channel, waiters]`.
/// Wakes the next waiter, as a release does.
const BREAK: &str = r#"
queue_key, woken_key = KEYS[4], KEYS[5]
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
if not lease then return {nonce, 'none'} end
redis.call('DEL', lease_key)
if lease.reserved then
  -- The term already ended, handed over: the history keeps that.
  redis.call('HSET', state_key, 'ended', 'broken', 'ended_at', fmt(now_ms()))
elseif state.term == lease.term then
  finish(state, 'broken', fmt(now_ms()), ARGV[2])
end
wake_next('broken', lease.term, lease.ttl, ARGV[3], ARGV[4])
return {nonce, 'broken', lease.term}
"#;

/// `KEYS = [lease, state, history, queue, woken]`, `ARGV = [nonce, candidate, channel, waiters]`:
/// takes the candidate out of the queue; if it was woken for a free lease it did not take, wakes
/// the next waiter in its stead.
const WITHDRAW: &str = r#"
queue_key, woken_key = KEYS[4], KEYS[5]
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
redis.call('ZREM', queue_key, ARGV[2])
if not lease and redis.call('GET', woken_key) == ARGV[2] then
  local left = redis.call('PTTL', woken_key)
  if left > 0 then wake_next('withdrawn', state.term or '0', left, ARGV[3], ARGV[4]) end
end
return {nonce, 'ok'}
"#;

/// `ARGV = [nonce]`. Read-only.
const INSPECT: &str = r#"
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
return observation(lease, state)
"#;

/// `KEYS = [lease, state, history]` once per lease, `ARGV = [nonce]`. Read-only. Answers
/// `seen_each` and per lease, in order, its observation (without the nonce) or `corrupt detail`.
const INSPECT_MANY: &str = r#"
local out = {nonce, 'seen_each'}
for i = 0, #KEYS / 3 - 1 do
  lease_key, state_key, history_key = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local lease, state, bad = load()
  if bad then
    out[#out + 1] = {'corrupt', bad}
  else
    local seen = observation(lease, state)
    table.remove(seen, 1)
    out[#out + 1] = seen
  end
end
return out
"#;

/// `ARGV = [nonce, count]`. Read-only. Answers `history open entries`, where `open` is
/// `[term, deadline_ms]` when the last term expired without its end being recorded yet.
const HISTORY: &str = r#"
local lease, state, bad = load()
if bad then return {nonce, 'corrupt', bad} end
local open = {}
if state.term and state.ended == '' and not lease then open = {state.term, state.deadline} end
return {nonce, 'history', open, redis.call('XREVRANGE', history_key, '+', '-', 'COUNT', ARGV[2])}
"#;

/// `ARGV = [nonce, cursor, pattern, count]`, no keys. Read-only. One `SCAN` step: answers
/// `scan next_cursor keys` (`0`: the scan is complete).
const SCAN: &str = r#"
local r = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[3], 'COUNT', ARGV[4])
return {ARGV[1], 'scan', r[1], r[2]}
"#;

/// `ARGV = [nonce]`, no keys: the server's version, and a check that scripts and `INFO` work.
const HELLO: &str = r#"
local version = string.match(redis.call('INFO', 'server'), 'redis_version:([%d%.]+)')
return {ARGV[1], 'hello', version or ''}
"#;

fn with_prelude(body: &str) -> Script {
    Script::new(&format!("-- leasehold\n{PRELUDE}\n{body}"))
}

pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(ACQUIRE));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(RENEW));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(RELEASE));
pub(crate) static HAND_OVER_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(HAND_OVER));
pub(crate) static WITHDRAW_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(WITHDRAW));
pub(crate) static BREAK_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(BREAK));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(INSPECT));
pub(crate) static INSPECT_MANY_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(INSPECT_MANY));
pub(crate) static HISTORY_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_prelude(HISTORY));
pub(crate) static SCAN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SCAN));
pub(crate) static HELLO_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(HELLO));
