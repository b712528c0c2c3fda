//! Shard records ([`LeaseStore::write_shard`](leasehold_core::LeaseStore::write_shard),
//! [`LeaseStore::shard_records`](leasehold_core::LeaseStore::shard_records)), apart from the
//! leases: one hash per store prefix, `{prefix}shards` (field: the record's name, value:
//! `{version} {value}`), and a sorted set `{prefix}shard-names` of the names (score 0, so in
//! name order), through which a listing by prefix is a range (`ZRANGE ... BYLEX`) and not a scan
//! of every record. The version is random ([`RecordVersion::random`]: 64 bits, new on every
//! write), so it never comes back for a name, also after an operator deleted the record.
//!
//! - A write is one script: the version compared, then the value and the name written.
//! - A listing is one script per [`PAGE`] records, each resuming after the last name of the one
//!   before: 10,000 records take 4 requests.

use std::sync::LazyLock;

use leasehold_core::{Error, LeaseName, RecordVersion, Result, ShardRecord, ShardWrite, check_shard_value};
use redis::{Script, Value};

use crate::config::RedisConfig;
use crate::conn::{Commands, Reply};
use crate::error::{STORE, unexpected};

/// Records read per listing script: a script blocks the server while it runs, and 2,500 records
/// (at most some 1.7 MB of reply) keep that to a few milliseconds.
pub(crate) const PAGE: usize = 2500;

/// The type check of both keys, shared by the two scripts: a key of another type is named, and
/// nothing is written.
const CHECK: &str = r#"
local nonce = ARGV[1]
local records_key, names_key = KEYS[1], KEYS[2]
local function check()
  for _, kw in ipairs({{records_key, 'hash'}, {names_key, 'zset'}}) do
    local t = redis.call('TYPE', kw[1])['ok']
    if t ~= 'none' and t ~= kw[2] then
      return 'key ' .. kw[1] .. ' holds a ' .. t .. ' where leasehold keeps a ' .. kw[2]
    end
  end
  return false
end
"#;

/// `KEYS = [records, names]`, `ARGV = [nonce, name, expects, expected, version, value]`
/// (`expects`: `1` when a version is expected, `0` when no record is). Answers `written`,
/// `conflict` with the record held (nothing when there is none), or `corrupt detail`.
const WRITE: &str = r#"
local name, version, value = ARGV[2], ARGV[5], ARGV[6]
local expected = false
if ARGV[3] == '1' then expected = ARGV[4] end
local bad = check()
if bad then return {nonce, 'corrupt', bad} end
local held = redis.call('HGET', records_key, name)
local current = false
if held then
  current = string.match(held, '^(%x+) ')
  if not current then
    return {nonce, 'corrupt', 'field ' .. name .. ' of key ' .. records_key .. ' is not a leasehold shard record'}
  end
end
if current ~= expected then
  if held then return {nonce, 'conflict', held} end
  return {nonce, 'conflict'}
end
redis.call('HSET', records_key, name, version .. ' ' .. value)
redis.call('ZADD', names_key, 0, name)
return {nonce, 'written'}
"#;

/// `KEYS = [records, names]`, `ARGV = [nonce, min, max, count]` (a lexicographic range of the
/// names). Read-only. Answers `records more names values` (`more`: `1` when names beyond these
/// are in the range; a value is nil for a name whose record is gone) or `corrupt detail`.
const LIST: &str = r#"
local bad = check()
if bad then return {nonce, 'corrupt', bad} end
local count = tonumber(ARGV[4])
local names = redis.pcall('ZRANGE', names_key, ARGV[2], ARGV[3], 'BYLEX', 'LIMIT', '0', count + 1)
if names.err then
  -- Before Redis 6.2, ZRANGE has no BYLEX.
  names = redis.call('ZRANGEBYLEX', names_key, ARGV[2], ARGV[3], 'LIMIT', '0', count + 1)
end
local more = '0'
if #names > count then
  names[#names] = nil
  more = '1'
end
local values = {}
for i = 1, #names, 1000 do
  local got = redis.call('HMGET', records_key, unpack(names, i, math.min(i + 999, #names)))
  for j = 1, #got do values[#values + 1] = got[j] end
end
return {nonce, 'records', more, names, values}
"#;

static WRITE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("-- leasehold\n{CHECK}\n{WRITE}")));
static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("-- leasehold\n{CHECK}\n{LIST}")));

/// The two keys: the records (a hash) and their names (a sorted set).
pub(crate) fn keys(config: &RedisConfig) -> [String; 2] {
    [
        format!("{}shards", config.prefix),
        format!("{}shard-names", config.prefix),
    ]
}

/// One script: `value` written under `name` if the record's version is `expected` (no record
/// if `None`), else the record held.
pub(crate) async fn write(
    commands: &Commands,
    config: &RedisConfig,
    name: &LeaseName,
    expected: Option<&str>,
    value: &str,
) -> Result<ShardWrite> {
    check_shard_value(value)?;
    let [records, names] = keys(config);
    let version = String::from(RecordVersion::random());
    let args = vec![
        name.as_str().to_string(),
        if expected.is_some() { "1" } else { "0" }.to_string(),
        expected.unwrap_or_default().to_string(),
        version.clone(),
        value.to_string(),
    ];
    let reply = commands
        .eval("write_shard", &WRITE_SCRIPT, &[&records, &names], args)
        .await?;
    match (reply.status()?, reply.values.len()) {
        ("written", 1) => Ok(ShardWrite::Written(ShardRecord {
            name: name.clone(),
            version,
            value: value.to_string(),
        })),
        ("conflict", 1) => Ok(ShardWrite::Conflict(None)),
        ("conflict", 2) => Ok(ShardWrite::Conflict(Some(record(name, &reply.values[1])?))),
        ("corrupt", 2) => Err(Error::corrupt(STORE, name, reply.text(1)?)),
        _ => Err(unexpected("write_shard", format!("{:?}", reply.values))),
    }
}

/// The records whose name starts with `prefix`, in name order: one script per [`PAGE`].
pub(crate) async fn records(commands: &Commands, config: &RedisConfig, prefix: &str) -> Result<Vec<ShardRecord>> {
    let [records_key, names_key] = keys(config);
    // Names are ASCII letters, digits, `-`, `_` and `.`: every name that starts with `prefix`
    // sorts before `prefix` followed by DEL (0x7f).
    let (mut min, max) = if prefix.is_empty() {
        ("-".to_string(), "+".to_string())
    } else {
        (format!("[{prefix}"), format!("({prefix}\x7f"))
    };
    let mut listed = Vec::new();
    loop {
        let args = vec![min.clone(), max.clone(), PAGE.to_string()];
        let reply = commands
            .eval("shard_records", &LIST_SCRIPT, &[&records_key, &names_key], args)
            .await?;
        let (more, names, values) = page(&reply, &records_key)?;
        let mut last = None;
        for (name, value) in names.iter().zip(values) {
            let text = String::from_utf8_lossy(name_bytes(name)?).into_owned();
            let name = LeaseName::new(text.as_str()).map_err(|e| {
                Error::corrupt(STORE, &names_key, format!("{text:?} is not a shard record's name: {e}"))
            })?;
            // A name whose record is gone (deleted by hand from the hash) is no record.
            if !matches!(value, Value::Nil) && name.as_str().starts_with(prefix) {
                listed.push(record(&name, value)?);
            }
            last = Some(text);
        }
        match last {
            Some(last) if more => min = format!("({last}"),
            _ => return Ok(listed),
        }
    }
}

/// Whether more names follow, and the names and values of a listing script's reply, as many of
/// each.
fn page<'r>(reply: &'r Reply, records_key: &str) -> Result<(bool, &'r [Value], &'r [Value])> {
    match reply.status()? {
        "records" => {
            let (more, names, values) = (reply.text(1)?, reply.array(2)?, reply.array(3)?);
            if names.len() != values.len() || !matches!(more, "0" | "1") {
                return Err(unexpected("shard_records", format!("{:?}", reply.values)));
            }
            Ok((more == "1", names, values))
        }
        "corrupt" => Err(Error::corrupt(STORE, records_key, reply.text(1)?)),
        _ => Err(unexpected("shard_records", format!("{:?}", reply.values))),
    }
}

fn name_bytes(value: &Value) -> Result<&[u8]> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        other => Err(unexpected("shard_records", format!("{other:?}, expected a name"))),
    }
}

/// Reads a record as the hash holds it: `{version} {value}`.
fn record(name: &LeaseName, held: &Value) -> Result<ShardRecord> {
    let corrupt = |detail: &str| Error::corrupt(STORE, name, format!("shard record: {detail}"));
    let Value::BulkString(bytes) = held else {
        return Err(unexpected("shard record", format!("{held:?}, expected text")));
    };
    let text = std::str::from_utf8(bytes).map_err(|_| corrupt("not UTF-8"))?;
    let (version, value) = text.split_once(' ').ok_or_else(|| corrupt("not `{version} {value}`"))?;
    let version = RecordVersion::parse(version).ok_or_else(|| corrupt("the version is not 16 hex digits"))?;
    check_shard_value(value).map_err(|e| corrupt(&format!("not a leasehold value: {e}")))?;
    Ok(ShardRecord {
        name: name.clone(),
        version: String::from(version),
        value: value.to_string(),
    })
}
