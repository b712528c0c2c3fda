//! [`DynamoDbStore`]: the [`LeaseStore`] on one DynamoDB table.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_core::time::unix_millis;
use leasehold_core::{
    AcquireRequest, Acquired, CandidateId, Capabilities, EndReason, Error, Expiry, Grant, LeaseName, LeaseStore,
    LimitStore, Notifications, Observation, RecordVersion, Renewed, Result, ShardRecord, ShardWrite, Term, Transition,
};

use crate::acquire::Taken;
use crate::config::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, DynamoDbConfig};
use crate::error::{self, STORE};
use crate::record::{
    self, HANDED_OVER_AT, HISTORY_PREFIX, Item, KEY, LEASE_SK, RESERVED_TERM, Record, SORT, TTL_RANGE, key, n, s,
};
use crate::table::{self, Table};

/// A [`LeaseStore`] on one DynamoDB table, shared by every process that names it.
///
/// Each lease is an item holding its holder, term, TTL and a random record version that changes
/// with every acquire and renew; finished terms are kept as history items next to it (see
/// [`docs`](crate::docs) for the layout). Every write is a conditional `PutItem` or
/// `UpdateItem` on the version or on (holder, term), and every read is strongly consistent.
///
/// DynamoDB has no clock a lease could use: a contender takes over a silent holder only after it
/// has seen the same record version unchanged for the holder's full TTL on its own monotonic
/// clock ([`Expiry::ObservedByContenders`]; the engine does the watching and passes
/// [`AcquireRequest::takeover`]). Wall-clock time is written for the audit trail only and never
/// compared.
///
/// The client does not retry on its own (the engine does) and gives every request the
/// configured timeout. At most [`max_in_flight`](DynamoDbConfig::max_in_flight) operations of a
/// store (and its clones) talk to DynamoDB at once, renewals and releases first
/// ([`LimitStore`]): every operation in flight holds a connection, and past the server's own
/// parallelism more of them only make each one slower.
///
/// # Cancel safety
///
/// Every write is one conditional request, applied or not as a whole, and the engine settles an
/// unknown outcome by reading back. An acquire dropped after its grant leaves the term it ended
/// in the lease item's `prev_*` slot: `history` reads it from there, and the next grant writes
/// its history item first. A dropped renewal changes nothing or moves the version on (the grant
/// stays valid until its deadline either way); a dropped release leaves the lease to be taken
/// over once its version has been seen unchanged for a TTL. An operation dropped while it waits
/// for its turn is never sent.
///
/// # Examples
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::Elector;
/// use leasehold_dynamodb::DynamoDbStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = DynamoDbStore::connect(
///     "dynamodb://leases?endpoint=http://127.0.0.1:28000&access_key_id=local&secret_access_key=local&create_table=true",
/// )
/// .await?;
/// let elector = Elector::builder(Arc::new(store), "nightly-report").ttl(Duration::from_secs(10)).build()?;
/// let leader = elector.campaign().await?;
/// println!("leading at term {}", leader.term());
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoDbStore {
    requests: Arc<LimitStore<Table>>,
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client holds the credentials: leave it out.
        let table = self.requests.inner();
        f.debug_struct("DynamoDbStore")
            .field("table", &table.table)
            .field("timeout", &table.timeout)
            .field("max_in_flight", &self.requests.max_in_flight())
            .finish_non_exhaustive()
    }
}

impl DynamoDbStore {
    /// Connects to the table named by a `dynamodb://` URL (see [`DynamoDbConfig`] for the forms
    /// and options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed URL; otherwise as [`DynamoDbStore::from_config`].
    pub async fn connect(url: &str) -> Result<Self> {
        DynamoDbStore::from_config(DynamoDbConfig::from_str(url)?).await
    }

    /// Builds a client for `config`, creates the table when it is missing and
    /// [`DynamoDbConfig::create_table`] is set, and checks that it is active and has leasehold's
    /// key schema.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Refused`] with a [`TableError`](crate::TableError) source: the table is missing
    ///   (and `create_table` is off), not active in time, or no credentials or region are
    ///   configured; also when the service refuses the credentials, or something else than
    ///   DynamoDB answers at the endpoint;
    /// - [`Error::CorruptRecord`] naming the table when it has another key schema (it is left
    ///   unchanged);
    /// - a transient error when DynamoDB cannot be reached.
    pub async fn from_config(config: DynamoDbConfig) -> Result<Self> {
        config.validate()?;
        let client = table::build_client(&config).await?;
        let store = DynamoDbStore::from_client(client, config.table.clone())
            .with_timeout(config.timeout)
            .with_max_in_flight(config.max_in_flight);
        if config.create_table {
            store.create_table_if_missing().await?;
        } else {
            store.verify_table().await?;
        }
        Ok(store)
    }

    /// A store on `table` using a client you configured yourself (credentials, region, HTTP
    /// client). Nothing is checked or created; call [`DynamoDbStore::verify_table`] or
    /// [`DynamoDbStore::create_table_if_missing`] as you see fit.
    ///
    /// Configure the client without retries (`RetryConfig::disabled()`): the engine retries, and
    /// a client that retries on its own hides how long an attempt really took.
    pub fn from_client(client: Client, table: impl Into<String>) -> Self {
        let table = Table {
            client,
            table: table.into().into(),
            timeout: DEFAULT_TIMEOUT,
            audit_clock: Arc::new(SystemTime::now),
        };
        DynamoDbStore {
            requests: Arc::new(LimitStore::new(table, DEFAULT_MAX_IN_FLIGHT)),
        }
    }

    /// The same store with `change` made to its table client and at most `max_in_flight`
    /// operations at once (for the builder methods, before the store is used).
    fn rebuilt(self, max_in_flight: usize, change: impl FnOnce(&mut Table)) -> Self {
        let mut table = self.requests.inner().clone();
        change(&mut table);
        DynamoDbStore {
            requests: Arc::new(LimitStore::new(table, max_in_flight)),
        }
    }

    /// The timeout reported in [`Error::Timeout`] (the client's own timeouts cut requests).
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        let max = self.requests.max_in_flight();
        self.rebuilt(max, |table| table.timeout = timeout)
    }

    /// Lets at most `max` operations of this store (and its clones) talk to DynamoDB at once
    /// (default [`DEFAULT_MAX_IN_FLIGHT`]); when they queue, renewals and releases go first
    /// ([`LimitStore`]), so that a renewal never waits behind a backlog of campaigns (1,000
    /// electors starting at once, say): keeping a lease matters more than winning one.
    ///
    /// Every operation in flight holds a connection, so this also bounds the connection pool.
    #[must_use]
    pub fn with_max_in_flight(self, max: usize) -> Self {
        self.rebuilt(max.max(1), |_| {})
    }

    /// Takes the wall-clock times written to the audit trail (`acquired_at`, `ended_at`) from
    /// `clock` instead of [`SystemTime::now`].
    ///
    /// No decision of the store depends on it: expiry is observed by contenders on their
    /// monotonic clocks, so a machine whose wall clock is off by hours writes odd timestamps into
    /// the history but takes over, renews and yields exactly as any other. Tests use it to show
    /// just that.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(store: leasehold_dynamodb::DynamoDbStore) {
    /// use std::time::{Duration, SystemTime};
    ///
    /// let six_hours_fast = store.with_audit_clock(|| SystemTime::now() + Duration::from_secs(6 * 3600));
    /// # }
    /// ```
    #[must_use]
    pub fn with_audit_clock(self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        let max = self.requests.max_in_flight();
        self.rebuilt(max, |table| table.audit_clock = Arc::new(clock))
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.requests.inner().client
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.requests.inner().table
    }

    /// Checks that the table exists, is active and has leasehold's key schema
    /// (`lease` (S) partition key, `sk` (S) sort key).
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::from_config`].
    pub async fn verify_table(&self) -> Result<()> {
        self.requests.inner().verify_table().await
    }

    /// Creates the table with on-demand capacity (`PAY_PER_REQUEST`) if it does not exist, waits
    /// until it is active, and checks its key schema. An existing table is never changed.
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::from_config`]; [`Error::Store`] when the table cannot be created
    /// (for instance without `dynamodb:CreateTable` permission).
    pub async fn create_table_if_missing(&self) -> Result<()> {
        self.requests.inner().create_table_if_missing().await
    }
}

#[async_trait]
impl LeaseStore for DynamoDbStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        self.requests.capabilities()
    }

    fn can_break(&self) -> bool {
        self.requests.can_break()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.requests.acquire(request).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        self.requests.renew(grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        self.requests.release(grant).await
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        self.requests.hand_over(grant, to).await
    }

    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        self.requests.withdraw(lease, candidate).await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        self.requests.inspect(lease).await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.requests.history(lease, limit).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.requests.list(prefix).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.requests.break_lease(lease).await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.requests.shard_records(prefix).await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.requests.write_shard(name, expected, value).await
    }
}

impl Table {
    /// Reads the lease item and the newest history item in one strongly consistent query (the
    /// lease item's sort key `lease` sorts after every `history#...` key). A missing lease item
    /// is a free lease at the highest term its history records, so that a deleted item does not
    /// send the term back.
    pub(crate) async fn read(&self, lease: &LeaseName, operation: &'static str) -> Result<Record> {
        let out = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .key_condition_expression("#k = :k AND #s <= :lease")
            .expression_attribute_names("#k", KEY)
            .expression_attribute_names("#s", SORT)
            .expression_attribute_values(":k", s(lease.as_str()))
            .expression_attribute_values(":lease", s(LEASE_SK))
            .scan_index_forward(false)
            .consistent_read(true)
            .limit(2)
            .send()
            .await
            .map_err(|e| error::map(e, operation, self.timeout))?;
        let mut record = None;
        let mut history_term = Term(0);
        for item in out.items() {
            match item.get(SORT) {
                Some(AttributeValue::S(sk)) if sk == LEASE_SK => record = Some(Record::decode(lease, item)?),
                Some(AttributeValue::S(sk)) if sk.starts_with(HISTORY_PREFIX) => {
                    history_term = record::decode_transition(lease, item)?.term;
                    break;
                }
                other => {
                    return Err(Error::corrupt(
                        STORE,
                        lease,
                        format!("a foreign item with sort key {other:?}"),
                    ));
                }
            }
        }
        Ok(match record {
            Some(record) => Record {
                last_term: record.term.max(history_term),
                history_term,
                ..record
            },
            None => Record::absent(history_term),
        })
    }

    /// The `limit` most recent history items, newest first.
    async fn history_items(&self, lease: &LeaseName, limit: usize, operation: &'static str) -> Result<Vec<Transition>> {
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        while found.len() < limit {
            let page = i32::try_from(limit - found.len()).unwrap_or(i32::MAX).min(1000);
            let out = self
                .client
                .query()
                .table_name(self.table.as_ref())
                .key_condition_expression("#k = :k AND begins_with(#s, :p)")
                .expression_attribute_names("#k", KEY)
                .expression_attribute_names("#s", SORT)
                .expression_attribute_values(":k", s(lease.as_str()))
                .expression_attribute_values(":p", s(HISTORY_PREFIX))
                .scan_index_forward(false)
                .consistent_read(true)
                .limit(page)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| error::map(e, operation, self.timeout))?;
            for item in out.items() {
                found.push(record::decode_transition(lease, item)?);
            }
            match out.last_evaluated_key() {
                Some(next) if !out.items().is_empty() => start = Some(next.clone()),
                _ => break,
            }
        }
        found.truncate(limit);
        Ok(found)
    }

    /// Ends the current term of `lease` if the item still has term `term`, a holder (and, for
    /// a release, that holder) and is reserved or not as `reserved` says. `false` when the
    /// condition failed. A reservation's term already ended (`ended`: when it was handed over,
    /// and [`EndReason::HandedOver`]); any other term ends now, for `reason`.
    async fn end(
        &self,
        lease: &LeaseName,
        term: Term,
        holder: Option<&str>,
        reserved: Option<SystemTime>,
        reason: EndReason,
        operation: &'static str,
    ) -> Result<bool> {
        let (at, reason) = match reserved {
            Some(at) => (at, EndReason::HandedOver),
            None => ((self.audit_clock)(), reason),
        };
        let mut condition = String::from(match holder {
            Some(_) => "#h = :me AND #t = :t",
            None => "attribute_exists(#h) AND #t = :t",
        });
        condition.push_str(if reserved.is_some() {
            " AND #rt = :t"
        } else {
            " AND (attribute_not_exists(#rt) OR #rt <> :t)"
        });
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression("REMOVE #h, #ttl, #v, #rt, #hoa SET #pe = :reason, #ea = :at")
            .condition_expression(condition)
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#ttl", "ttl_ms")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#rt", RESERVED_TERM)
            .expression_attribute_names("#hoa", HANDED_OVER_AT)
            .expression_attribute_names("#pe", "previous_end")
            .expression_attribute_names("#ea", "ended_at")
            .expression_attribute_names("#t", "term")
            .expression_attribute_values(":reason", s(reason.to_string()))
            .expression_attribute_values(":at", n(unix_millis(at)))
            .expression_attribute_values(":t", n(term.0));
        if let Some(me) = holder {
            update = update.expression_attribute_values(":me", s(me));
        }
        match update.send().await {
            Ok(_) => Ok(true),
            Err(e) if error::is_condition_failed(&e) => Ok(false),
            Err(e) => Err(error::map(e, operation, self.timeout)),
        }
    }
}

#[async_trait]
impl LeaseStore for Table {
    fn name(&self) -> &'static str {
        STORE
    }

    fn can_break(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ObservedByContenders,
            notifications: Notifications::None,
            announces: leasehold_core::Announces::None,
            fifo: false,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let lease = &request.lease;
        // One conditional request first, so that an acquire whose reply is lost has been applied
        // (or not) as a whole, and a read-back settles it.
        let refused = match self.take_unread(request).await? {
            Taken::Acquired(acquired) => return Ok(acquired),
            Taken::Refused(item) => item,
        };
        // Refused: the lease is held by someone else, its item is missing or unreadable, or the
        // slot of the term before is still full. When DynamoDB returned the item and it names
        // another holder, that is the answer; otherwise read it and act on exactly what it says.
        if let Some(item) = refused {
            let record = Record::decode(lease, &item)?;
            if record
                .holder
                .as_ref()
                .is_some_and(|h| h.id != request.candidate && request.takeover.as_deref() != Some(h.version.as_str()))
            {
                return Ok(Acquired::Held(record.observation(lease)));
            }
        }
        let record = self.read(lease, "acquire").await?;
        if !record.present {
            return self.create(request, &record).await;
        }
        let grantable = match &record.holder {
            None => true,
            // Ours from an earlier campaign that the engine does not believe: a new term.
            Some(holder) if holder.id == request.candidate => true,
            Some(holder) => request.takeover.as_deref() == Some(holder.version.as_str()),
        };
        if !grantable {
            return Ok(Acquired::Held(record.observation(lease)));
        }
        self.take_read(request, &record).await
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let lease = &grant.lease;
        let version = RecordVersion::random().to_string();
        let updated = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression("SET #v = :new")
            // A reservation for the holder at its old term is no grant of it.
            .condition_expression("#h = :me AND #t = :t AND (attribute_not_exists(#rt) OR #rt <> :t)")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#t", "term")
            .expression_attribute_names("#rt", RESERVED_TERM)
            .expression_attribute_values(":new", s(version.clone()))
            .expression_attribute_values(":me", s(grant.holder.as_str()))
            .expression_attribute_values(":t", n(grant.term.0))
            .send()
            .await;
        match updated {
            Ok(_) => Ok(Renewed::Renewed(Grant {
                token: version,
                ..grant.clone()
            })),
            Err(e) if error::is_condition_failed(&e) => {
                let record = self.read(lease, "renew").await?;
                match &record.holder {
                    // Cannot happen (terms only grow), but the store's word is what counts.
                    Some(h) if h.id == grant.holder && record.term == grant.term && !h.reserved => {
                        Ok(Renewed::Renewed(Grant {
                            token: h.version.clone(),
                            ..grant.clone()
                        }))
                    }
                    _ => Ok(Renewed::Lost(record.observation(lease))),
                }
            }
            Err(e) => Err(error::map(e, "renew", self.timeout)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let lease = &grant.lease;
        if !self
            .end(
                lease,
                grant.term,
                Some(grant.holder.as_str()),
                None,
                EndReason::Released,
                "release",
            )
            .await?
        {
            // Not ours any more; still, refuse to pass over a record that cannot be read.
            self.read(lease, "release").await?;
        }
        Ok(())
    }

    /// One `UpdateItem` on the condition that the item still gives the grant's term to its
    /// holder, unreserved: `holder` becomes `to`, `reserved_term` the grant's term (which
    /// stays), with a new version and `handed_over_at`. The item then describes the grant's term
    /// as ended handed over; `to`'s acquire ends the reservation with a new term (and writes that
    /// history item as every grant does), anyone else's is `Held` until it has seen the version
    /// unchanged for the TTL.
    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let lease = &grant.lease;
        let updated = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression("SET #h = :to, #v = :new, #ttl = :ttl, #rt = :t, #hoa = :now")
            .condition_expression("#h = :me AND #t = :t AND (attribute_not_exists(#rt) OR #rt <> :t)")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#ttl", "ttl_ms")
            .expression_attribute_names("#t", "term")
            .expression_attribute_names("#rt", RESERVED_TERM)
            .expression_attribute_names("#hoa", HANDED_OVER_AT)
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":new", s(RecordVersion::random().to_string()))
            .expression_attribute_values(":ttl", n(grant.ttl.as_millis()))
            .expression_attribute_values(":t", n(grant.term.0))
            .expression_attribute_values(":now", n(unix_millis((self.audit_clock)())))
            .expression_attribute_values(":me", s(grant.holder.as_str()))
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(e) if error::is_condition_failed(&e) => {
                // Not ours any more: nothing to hand over, but refuse to pass over a record that
                // cannot be read.
                self.read(lease, "hand_over").await?;
                Ok(())
            }
            Err(e) => Err(error::map(e, "hand_over", self.timeout)),
        }
    }

    /// Ends a term the item gives to `candidate` although its engine holds no grant (an acquire
    /// whose answer never arrived), or a reservation for it: released, so the lease is free at
    /// once rather than after a contender has watched its version for a TTL (a reserved term
    /// stays ended handed over).
    async fn withdraw(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<()> {
        let record = self.read(lease, "withdraw").await?;
        if let Some(holder) = record.holder.as_ref().filter(|h| h.id == *candidate) {
            let reserved = record.ended.filter(|_| holder.reserved).map(|(at, _)| at);
            self.end(
                lease,
                record.term,
                Some(candidate.as_str()),
                reserved,
                EndReason::Released,
                "withdraw",
            )
            .await?;
        }
        Ok(())
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        Ok(self.read(lease, "inspect").await?.observation(lease))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        // Like every operation, refuse to report on a lease whose record cannot be read.
        let record = self.read(lease, "history").await?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut terms: BTreeMap<Term, Transition> = self
            .history_items(lease, limit, "history")
            .await?
            .into_iter()
            .map(|t| (t.term, t))
            .collect();
        // The lease item describes its own term, and the one before it until a later grant has
        // made sure its history item exists.
        if let Some(previous) = record.previous.clone() {
            terms.entry(previous.term).or_insert(previous);
        }
        if let Some(current) = record.transition() {
            terms.insert(current.term, current);
        }
        let skip = terms.len().saturating_sub(limit);
        Ok(terms.into_values().skip(skip).collect())
    }

    /// A strongly consistent Scan of the lease items (sort key `lease`) whose name begins with
    /// `prefix`, every page; history items are never returned.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        self.list_leases(prefix).await
    }

    /// A consistent `Query` of the `#shards` partition, `begins_with(sk, prefix)`, every page:
    /// one request per 1 MB of the records listed.
    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        self.list_shards(prefix).await
    }

    /// One conditional `PutItem` (`attribute_not_exists(lease)` or `version = :expected`),
    /// answering a conflict with the item DynamoDB returns (`ALL_OLD`), or else one consistent
    /// `GetItem`.
    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        self.put_shard(name, expected, value).await
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let record = self.read(lease, "break_lease").await?;
        let Some(holder) = &record.holder else {
            return Ok(None);
        };
        // A reservation is broken like a grant, but its term stays ended handed over.
        let reserved = record.ended.filter(|_| holder.reserved).map(|(at, _)| at);
        // The holder may renew (same term) between the read and the write; a new grant or a
        // handover in between is a lost race the caller can try again.
        if self
            .end(lease, record.term, None, reserved, EndReason::Broken, "break_lease")
            .await?
        {
            return Ok(Some(record.term));
        }
        let now = self.read(lease, "break_lease").await?;
        Err(Error::store(
            STORE,
            format!(
                "break_lease of {lease}: the lease changed (now term {}) while term {} was being broken; break it again",
                now.term, record.term
            ),
        ))
    }
}
