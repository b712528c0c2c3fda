//! Fenced writes where the downstream system is not a SQL database: etcd, Redis, DynamoDB.
//!
//! The rule is the same everywhere: keep the highest term accepted under a [`FenceKey`], and
//! in **one atomic operation** with the write, refuse the write if its term is lower, else
//! raise the stored term to it. A check in one request and the write in another is not a
//! fence: the leader can be deposed between them.
//!
//! [`FenceKey`]: crate::FenceKey
//!
//! # etcd: a transaction comparing the fence key's value
//!
//! etcd compares values as bytes, so the term is stored as [`etcd_term`] (20 decimal digits,
//! zero-padded), whose byte order is the numeric order. A value comparison on a key that does
//! not exist is false, so the transaction asks "is the stored term greater?" and writes in the
//! `else` branch:
//!
//! ```no_run
//! use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
//! use leasehold_fence::recipes::etcd_term;
//!
//! # async fn example(client: &mut Client, fence_key: &str, term: u64) -> Result<(), Box<dyn std::error::Error>> {
//! let fence = format!("fence/{fence_key}");
//! let txn = Txn::new()
//!     .when([Compare::value(fence.as_str(), CompareOp::Greater, etcd_term(term))])
//!     .and_then([TxnOp::get(fence.as_str(), None)])
//!     .or_else([
//!         TxnOp::put(fence.as_str(), etcd_term(term), None),
//!         TxnOp::put("orders/42", "shipped", None), // the fenced write
//!     ]);
//! if client.txn(txn).await?.succeeded() {
//!     return Err("stale term: a newer leader has written".into()); // nothing was written
//! }
//! # Ok(()) }
//! ```
//!
//! (etcd-client 0.21; `Compare::value` and `TxnOp` take anything `Into<Vec<u8>>`.)
//!
//! # Redis: a Lua script
//!
//! A script runs atomically: [`REDIS_FENCED_SET`] checks the term under `KEYS[1]` and, if it is
//! not lower, stores it and does the write (`SET KEYS[2] ARGV[2]`; replace that line with your
//! own write). It returns `{1, term}` when it wrote and `{0, highest}` when the term is stale. Terms
//! are compared as decimal strings (by length, then bytes), not as Lua numbers, which are
//! doubles and lose precision above 2⁵³. On Redis Cluster, give both keys one hash tag
//! (`{orders}:fence`, `{orders}:42`) so that they live on one shard.
//!
//! ```no_run
//! use leasehold_fence::recipes::REDIS_FENCED_SET;
//!
//! # async fn example(conn: &mut redis::aio::MultiplexedConnection, term: u64) -> Result<(), Box<dyn std::error::Error>> {
//! let (wrote, highest): (i64, String) = redis::Script::new(REDIS_FENCED_SET)
//!     .key("{orders}:fence")
//!     .key("{orders}:42")
//!     .arg(term.to_string())
//!     .arg("shipped")
//!     .invoke_async(conn)
//!     .await?;
//! if wrote == 0 {
//!     return Err(format!("stale term {term}: {highest} has been accepted").into()); // nothing written
//! }
//! # Ok(()) }
//! ```
//!
//! Redis's own durability applies: with asynchronous replication, a failover can lose the
//! fence's latest term along with the write it guarded.
//!
//! # DynamoDB: a condition expression
//!
//! DynamoDB numbers hold 38 digits, so terms are stored as they are. Where the fenced data is
//! one item, keep the term in it and write with a condition:
//!
//! ```text
//! PutItem / UpdateItem
//!   UpdateExpression:    SET #data = :data, fence_term = :t
//!   ConditionExpression: attribute_not_exists(fence_term) OR fence_term <= :t
//! ```
//!
//! A `ConditionalCheckFailedException` means the term is stale; nothing was written. Where the
//! write spans items, use `TransactWriteItems` with the fence item first:
//!
//! ```text
//! Update { Key: {pk: <fence key>}, UpdateExpression: "SET term = :t",
//!          ConditionExpression: "attribute_not_exists(term) OR term <= :t" }
//! Put    { ...the fenced write... }
//! ```
//!
//! and read a `TransactionCanceledException` whose first cancellation reason is
//! `ConditionalCheckFailed` as a stale term. (The crate's tests run the single-item form against
//! a local dynalite; the transactional form is untested: dynalite answers `TransactWriteItems` with
//! `UnknownOperationException`.)

/// The Redis script of the recipe: `KEYS[1]` the fence key, `KEYS[2]` the data key, `ARGV[1]`
/// the term (decimal, no leading zeros), `ARGV[2]` the value to write. Returns `{1, term}` when
/// it wrote, `{0, highest}` when the term is lower than the stored one (nothing written).
pub const REDIS_FENCED_SET: &str = r#"
local stored = redis.call('GET', KEYS[1])
local term = ARGV[1]
if not string.match(term, '^%d+$') or (#term > 1 and string.sub(term, 1, 1) == '0') then
  return redis.error_reply('fence: the term must be a decimal number without leading zeros')
end
if stored and (#stored > #term or (#stored == #term and stored > term)) then
  return {0, stored}
end
redis.call('SET', KEYS[1], term)
-- The fenced write: replace it with yours.
redis.call('SET', KEYS[2], ARGV[2])
return {1, term}
"#;

/// `term` as the etcd recipe stores it: 20 decimal digits, zero-padded, so that etcd's byte
/// comparison orders terms numerically (`u64::MAX` has 20 digits).
///
/// ```
/// use leasehold_fence::recipes::etcd_term;
///
/// assert_eq!(etcd_term(42), "00000000000000000042");
/// assert!(etcd_term(9) < etcd_term(10));
/// assert!(etcd_term(u64::MAX - 1) < etcd_term(u64::MAX));
/// ```
pub fn etcd_term(term: u64) -> String {
    format!("{term:020}")
}
