//! [`DynamoDbStore`]: the [`LeaseStore`] on one DynamoDB table.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, StalledStreamProtectionConfig};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus,
};
use leasehold_core::{
    AcquireRequest, Acquired, Capabilities, EndReason, Error, Expiry, Grant, LeaseName, LeaseStore, Notifications,
    Observation, Renewed, Result, Term, Transition,
};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::config::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, DynamoDbConfig};
use crate::error::{self, STORE, TableError};
use crate::record::{
    self, HISTORY_PREFIX, Item, KEY, LEASE_SK, Record, SORT, TTL_RANGE, key, n, new_version, s, unix_millis,
};

/// How long [`DynamoDbStore::create_table_if_missing`] waits for a new table to become active.
const TABLE_WAIT: Duration = Duration::from_secs(120);

/// Where the wall-clock times of the audit trail come from.
type AuditClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

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
/// configured timeout.
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
    client: Client,
    table: Arc<str>,
    timeout: Duration,
    audit_clock: AuditClock,
    /// Bounds the operations in flight (and so the connections in the pool).
    in_flight: Arc<Semaphore>,
    /// Bounds the operations other than renew and release to half of `in_flight`, so that
    /// renewals never queue behind a backlog of campaigns.
    others: Arc<Semaphore>,
    max_in_flight: usize,
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client holds the credentials: leave it out.
        f.debug_struct("DynamoDbStore")
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStore {
    /// Connects to the table named by a `dynamodb://` URL (see [`DynamoDbConfig`] for the forms
    /// and options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a malformed URL; otherwise as [`DynamoDbStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self> {
        DynamoDbStore::connect_with(DynamoDbConfig::from_str(url)?).await
    }

    /// Builds a client for `config`, creates the table when it is missing and
    /// [`DynamoDbConfig::create_table`] is set, and checks that it is active and has leasehold's
    /// key schema.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a field out of range;
    /// - [`Error::Store`] with a [`TableError`] source: the table is missing (and `create_table`
    ///   is off), not active in time, or no credentials or region are configured;
    /// - [`Error::CorruptRecord`] naming the table when it has another key schema (it is left
    ///   unchanged);
    /// - a transient error when DynamoDB cannot be reached.
    pub async fn connect_with(config: DynamoDbConfig) -> Result<Self> {
        config.validate()?;
        let client = build_client(&config).await?;
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
        DynamoDbStore {
            client,
            table: table.into().into(),
            timeout: DEFAULT_TIMEOUT,
            audit_clock: Arc::new(SystemTime::now),
            in_flight: Arc::new(Semaphore::new(DEFAULT_MAX_IN_FLIGHT)),
            others: Arc::new(Semaphore::new(DEFAULT_MAX_IN_FLIGHT.div_ceil(2))),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// The timeout reported in [`Error::Timeout`] (the client's own timeouts cut requests).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Lets at most `max` operations of this store (and its clones) talk to DynamoDB at once;
    /// the others wait their turn in order (default [`DEFAULT_MAX_IN_FLIGHT`]). Acquires,
    /// inspections, history reads and breaks together get at most half of the turns, so that a
    /// renewal or release never waits behind a backlog of campaigns (1,000 electors starting at
    /// once, say): keeping a lease matters more than winning one.
    ///
    /// Every operation in flight holds a connection, so this also bounds the connection pool.
    /// Past the server's own parallelism, more requests in flight only make each one slower
    /// (and a server that is behind then serves requests whose callers have given up); an
    /// operation whose caller gives up while it waits here is never sent.
    #[must_use]
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        let max = max.max(1);
        self.in_flight = Arc::new(Semaphore::new(max));
        self.others = Arc::new(Semaphore::new(max.div_ceil(2)));
        self.max_in_flight = max;
        self
    }

    /// Waits for a turn to talk to DynamoDB (see [`DynamoDbStore::with_max_in_flight`]); a
    /// renewal or release (`keeping`) skips the queue of the other operations.
    async fn turn(&self, keeping: bool) -> (Option<SemaphorePermit<'_>>, Option<SemaphorePermit<'_>>) {
        // The semaphores are never closed; if they were, going ahead unlimited is the safe choice.
        let other = if keeping {
            None
        } else {
            self.others.acquire().await.ok()
        };
        (other, self.in_flight.acquire().await.ok())
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
    pub fn with_audit_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.audit_clock = Arc::new(clock);
        self
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Checks that the table exists, is active and has leasehold's key schema
    /// (`lease` (S) partition key, `sk` (S) sort key).
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::connect_with`].
    pub async fn verify_table(&self) -> Result<()> {
        match self.describe_table().await? {
            Some(status) => self.await_active(status).await,
            None => Err(Error::store(
                STORE,
                TableError::Missing {
                    table: self.table.to_string(),
                },
            )),
        }
    }

    /// Creates the table with on-demand capacity (`PAY_PER_REQUEST`) if it does not exist, waits
    /// until it is active, and checks its key schema. An existing table is never changed.
    ///
    /// # Errors
    ///
    /// As [`DynamoDbStore::connect_with`]; [`Error::Store`] when the table cannot be created
    /// (for instance without `dynamodb:CreateTable` permission).
    pub async fn create_table_if_missing(&self) -> Result<()> {
        if let Some(status) = self.describe_table().await? {
            return self.await_active(status).await;
        }
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| Error::store(STORE, e))
        };
        let key_element = |name: &str, key_type| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(key_type)
                .build()
                .map_err(|e| Error::store(STORE, e))
        };
        let created = self
            .client
            .create_table()
            .table_name(self.table.as_ref())
            .attribute_definitions(attribute(KEY)?)
            .attribute_definitions(attribute(SORT)?)
            .key_schema(key_element(KEY, KeyType::Hash)?)
            .key_schema(key_element(SORT, KeyType::Range)?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // Someone else is creating it at the same moment.
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
            Err(e) => return Err(error::map(e, "create_table", self.timeout)),
        }
        let status = self.describe_table().await?.unwrap_or(TableStatus::Creating);
        self.await_active(status).await
    }

    /// The table's status after checking its key schema, or `None` when it does not exist.
    async fn describe_table(&self) -> Result<Option<TableStatus>> {
        let described = self
            .client
            .describe_table()
            .table_name(self.table.as_ref())
            .send()
            .await;
        let out = match described {
            Ok(out) => out,
            Err(e) if error::is_missing_table(&e) => return Ok(None),
            Err(e) => return Err(error::map(e, "describe_table", self.timeout)),
        };
        let Some(table) = out.table() else { return Ok(None) };
        let keys: Vec<(String, String)> = table
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name().to_string(), k.key_type().as_str().to_string()))
            .collect();
        let types: HashMap<&str, &str> = table
            .attribute_definitions()
            .iter()
            .map(|a| (a.attribute_name(), a.attribute_type().as_str()))
            .collect();
        let expected = [
            (KEY.to_string(), "HASH".to_string()),
            (SORT.to_string(), "RANGE".to_string()),
        ];
        if keys != expected || types.get(KEY) != Some(&"S") || types.get(SORT) != Some(&"S") {
            let found: Vec<String> = keys
                .iter()
                .map(|(name, kind)| format!("{name} ({}) {kind}", types.get(name.as_str()).unwrap_or(&"?")))
                .collect();
            return Err(Error::corrupt(
                STORE,
                format!("table {}", self.table),
                format!(
                    "the table has key schema [{}], leasehold needs [lease (S) HASH, sk (S) RANGE]; \
                     it was left unchanged: use another table name",
                    found.join(", ")
                ),
            ));
        }
        Ok(Some(table.table_status().cloned().unwrap_or(TableStatus::Active)))
    }

    /// Waits (polling, at setup only) until the table is active.
    async fn await_active(&self, mut status: TableStatus) -> Result<()> {
        let started = tokio::time::Instant::now();
        loop {
            match status {
                TableStatus::Active => return Ok(()),
                TableStatus::Creating | TableStatus::Updating if started.elapsed() < TABLE_WAIT => {}
                other => {
                    return Err(Error::store(
                        STORE,
                        TableError::NotActive {
                            table: self.table.to_string(),
                            status: other.as_str().to_string(),
                            waited: started.elapsed(),
                        },
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            status = self.describe_table().await?.unwrap_or(TableStatus::Deleting);
        }
    }

    /// Reads the lease item and the newest history item in one strongly consistent query (the
    /// lease item's sort key `lease` sorts after every `history#...` key). A missing lease item
    /// is a free lease at the highest term its history records, so that a deleted item does not
    /// send the term back.
    async fn read(&self, lease: &LeaseName, operation: &'static str) -> Result<Record> {
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

    /// The common grant, sent without reading first: one `UpdateItem` on the condition that the
    /// item exists, is free, held by the candidate itself or held at exactly the `takeover`
    /// version, and that its `prev_*` slot is empty (the term before has its history item). It
    /// raises the term by one and moves the term it ends into the slot, all from the item's own
    /// attributes. [`Taken::Refused`] when the condition failed, with the item that failed it
    /// where the server returns it (DynamoDB does; emulators may not).
    async fn take_unread(&self, request: &AcquireRequest) -> Result<Taken> {
        let lease = &request.lease;
        let now = (self.audit_clock)();
        let version = new_version();
        let mut condition = String::from(
            "attribute_type(#t, :number) AND attribute_exists(#lh) AND attribute_not_exists(#pt) \
             AND (attribute_not_exists(#h) OR #h = :me",
        );
        if request.takeover.is_some() {
            condition.push_str(" OR #v = :takeover");
        }
        condition.push(')');
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression(
                "SET #h = :me, #lh = :me, #ttl = :ttl, #v = :version, #at = :now, \
                 #pt = #t, #ph = #lh, #pa = if_not_exists(#at, :zero), \
                 #pea = if_not_exists(#ea, :now), #pr = if_not_exists(#pe, :expired), #t = #t + :one \
                 REMOVE #pe, #ea",
            )
            .condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_names("#t", "term")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#lh", "last_holder")
            .expression_attribute_names("#ttl", "ttl_ms")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#at", "acquired_at")
            .expression_attribute_names("#pe", "previous_end")
            .expression_attribute_names("#ea", "ended_at")
            .expression_attribute_names("#pt", "prev_term")
            .expression_attribute_names("#ph", "prev_holder")
            .expression_attribute_names("#pa", "prev_acquired_at")
            .expression_attribute_names("#pea", "prev_ended_at")
            .expression_attribute_names("#pr", "prev_end")
            .expression_attribute_values(":number", s("N"))
            .expression_attribute_values(":me", s(request.candidate.as_str()))
            .expression_attribute_values(":ttl", n(request.ttl.as_millis()))
            .expression_attribute_values(":version", s(version.clone()))
            .expression_attribute_values(":now", n(unix_millis(now)))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":expired", s(EndReason::Expired.to_string()))
            .expression_attribute_values(":one", n(1));
        if let Some(takeover) = &request.takeover {
            update = update.expression_attribute_values(":takeover", s(takeover.clone()));
        }
        // `SET #t = #t + :one` rather than `ADD`: dynalite applies an `ADD` to the very value
        // that `#pt = #t` copied, so the slot would get the new term.
        let out = match update.send().await {
            Ok(out) => out,
            Err(e) => {
                return match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(refused)) => {
                        Ok(Taken::Refused(refused.item().cloned()))
                    }
                    _ => Err(error::map(e, "acquire", self.timeout)),
                };
            }
        };
        // The grant is done; what it wrote says which term it is, and which term it ended.
        let record = match out.attributes() {
            Some(item) => Record::decode(lease, item)?,
            None => self.read(lease, "acquire").await?,
        };
        match &record.holder {
            Some(h) if h.id == request.candidate && h.version == version => {}
            // Only a foreign write right after ours could get here.
            _ => return Ok(Taken::Acquired(Acquired::Held(record.observation(lease)))),
        }
        if let Some(finished) = &record.previous {
            self.log_previous(lease, finished).await;
        }
        Ok(Taken::Acquired(Acquired::Granted(grant(request, record.term, version))))
    }

    /// Grants the lease over the item just read (`record`: present, and free, the candidate's,
    /// or held at the `takeover` version), when [`DynamoDbStore::take_unread`] was refused: most
    /// often because the `prev_*` slot still holds a term whose history item a previous grant
    /// did not get to write (its caller gave up on it). That history item is written first,
    /// then one `UpdateItem` on the condition that the item is still exactly as read replaces
    /// the slot with the term this grant ends.
    async fn take_read(&self, request: &AcquireRequest, record: &Record) -> Result<Acquired> {
        let lease = &request.lease;
        let now = (self.audit_clock)();
        let term = record
            .term
            .0
            .checked_add(1)
            .map(Term)
            .ok_or_else(|| Error::corrupt(STORE, lease, format!("term {} cannot grow any further", record.term)))?;
        if let Some(previous) = record.previous.as_ref().filter(|p| p.term > record.history_term) {
            self.put_history(lease, previous, "acquire").await?;
        }
        let finished = record.transition().map(|t| Transition {
            ended: record.ended.or(Some((now, EndReason::Expired))),
            ..t
        });
        let version = new_version();
        let mut condition = String::from("#t = :t");
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .expression_attribute_names("#t", "term")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#lh", "last_holder")
            .expression_attribute_names("#ttl", "ttl_ms")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#at", "acquired_at")
            .expression_attribute_names("#pe", "previous_end")
            .expression_attribute_names("#ea", "ended_at")
            .expression_attribute_names("#pt", "prev_term")
            .expression_attribute_values(":t", n(record.term.0))
            .expression_attribute_values(":term", n(term.0))
            .expression_attribute_values(":me", s(request.candidate.as_str()))
            .expression_attribute_values(":ttl", n(request.ttl.as_millis()))
            .expression_attribute_values(":version", s(version.clone()))
            .expression_attribute_values(":now", n(unix_millis(now)));
        match &record.holder {
            None => condition.push_str(" AND attribute_not_exists(#h)"),
            Some(holder) => {
                condition.push_str(" AND #v = :seen");
                update = update.expression_attribute_values(":seen", s(holder.version.clone()));
            }
        }
        match &record.previous {
            None => condition.push_str(" AND attribute_not_exists(#pt)"),
            Some(previous) => {
                condition.push_str(" AND #pt = :pt");
                update = update.expression_attribute_values(":pt", n(previous.term.0));
            }
        }
        let mut set = String::from("SET #t = :term, #h = :me, #lh = :me, #ttl = :ttl, #v = :version, #at = :now");
        let mut remove = String::from(" REMOVE #pe, #ea");
        match &finished {
            Some(finished) => {
                for (i, (name, value)) in record::previous_attributes(finished).into_iter().enumerate() {
                    let (name_ref, value_ref) = (format!("#p{i}"), format!(":p{i}"));
                    set.push_str(&format!(", {name_ref} = {value_ref}"));
                    update = update
                        .expression_attribute_names(name_ref, name)
                        .expression_attribute_values(value_ref, value);
                }
            }
            None => {
                for (i, name) in record::PREVIOUS_ATTRIBUTES.iter().enumerate() {
                    remove.push_str(&format!(", #p{i}"));
                    update = update.expression_attribute_names(format!("#p{i}"), *name);
                }
            }
        }
        set.push_str(&remove);
        let sent = update
            .update_expression(set)
            .condition_expression(condition)
            .send()
            .await;
        match sent {
            Ok(_) => {}
            Err(e) if error::is_condition_failed(&e) => {
                // Changed since we read it: tell the engine what it is now.
                return Ok(Acquired::Held(self.read(lease, "acquire").await?.observation(lease)));
            }
            Err(e) => return Err(error::map(e, "acquire", self.timeout)),
        }
        if let Some(finished) = &finished {
            self.log_previous(lease, finished).await;
        }
        Ok(Acquired::Granted(grant(request, term, version)))
    }

    /// After a grant: writes the history item of the term it ended (kept in the `prev_*` slot of
    /// the lease item), then empties the slot, so that the next grant can go without reading.
    /// Both are best effort: whatever is not done here is done by the next grant, which reads
    /// the slot when its own conditional write is refused for it.
    async fn log_previous(&self, lease: &LeaseName, finished: &Transition) {
        let logged = match self.put_history(lease, finished, "acquire").await {
            Ok(()) => self.clear_previous(lease, finished.term).await,
            Err(e) => Err(e),
        };
        if let Err(e) = logged {
            tracing::debug!(lease = %lease, term = %finished.term, error = %e, "history item left to the next grant");
        }
    }

    /// Empties the `prev_*` slot of the lease item if it still holds `term` (whose history item
    /// has been written).
    async fn clear_previous(&self, lease: &LeaseName, term: Term) -> Result<()> {
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .condition_expression("#p0 = :pt")
            .expression_attribute_values(":pt", n(term.0));
        let mut remove = String::from("REMOVE ");
        for (i, name) in record::PREVIOUS_ATTRIBUTES.iter().enumerate() {
            if i > 0 {
                remove.push_str(", ");
            }
            remove.push_str(&format!("#p{i}"));
            update = update.expression_attribute_names(format!("#p{i}"), *name);
        }
        match update.update_expression(remove).send().await {
            Ok(_) => Ok(()),
            Err(e) if error::is_condition_failed(&e) => Ok(()),
            Err(e) => Err(error::map(e, "acquire", self.timeout)),
        }
    }

    /// Takes a lease that has no item (never used, or its item was deleted): a `PutItem` on the
    /// condition that there is still no item, at a term above every term in the history.
    async fn create(&self, request: &AcquireRequest, record: &Record) -> Result<Acquired> {
        let lease = &request.lease;
        let term = record.last_term.0.checked_add(1).map(Term).ok_or_else(|| {
            Error::corrupt(
                STORE,
                lease,
                format!("term {} cannot grow any further", record.last_term),
            )
        })?;
        let version = new_version();
        let mut item = key(lease, LEASE_SK);
        item.extend([
            ("term".to_string(), n(term.0)),
            ("last_holder".to_string(), s(request.candidate.as_str())),
            ("holder".to_string(), s(request.candidate.as_str())),
            ("acquired_at".to_string(), n(unix_millis((self.audit_clock)()))),
            ("ttl_ms".to_string(), n(request.ttl.as_millis())),
            ("version".to_string(), s(version.clone())),
        ]);
        let put = self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Acquired::Granted(grant(request, term, version))),
            Err(e) if error::is_condition_failed(&e) => {
                // Someone else created it first.
                Ok(Acquired::Held(self.read(lease, "acquire").await?.observation(lease)))
            }
            Err(e) => Err(error::map(e, "acquire", self.timeout)),
        }
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

    /// Writes the history item of a finished term: unconditional and idempotent, since a finished
    /// term never changes.
    async fn put_history(&self, lease: &LeaseName, finished: &Transition, operation: &'static str) -> Result<()> {
        self.client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(record::transition_item(lease, finished)))
            .send()
            .await
            .map(drop)
            .map_err(|e| error::map(e, operation, self.timeout))
    }

    /// Ends the current term of `lease` if the item still has term `term` and a holder (and,
    /// for a release, that holder). `false` when the condition failed.
    async fn end(
        &self,
        lease: &LeaseName,
        term: Term,
        holder: Option<&str>,
        reason: EndReason,
        operation: &'static str,
    ) -> Result<bool> {
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression("REMOVE #h, #ttl, #v SET #pe = :reason, #ea = :now")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#ttl", "ttl_ms")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#pe", "previous_end")
            .expression_attribute_names("#ea", "ended_at")
            .expression_attribute_names("#t", "term")
            .expression_attribute_values(":reason", s(reason.to_string()))
            .expression_attribute_values(":now", n(unix_millis((self.audit_clock)())))
            .expression_attribute_values(":t", n(term.0));
        update = match holder {
            Some(me) => update
                .condition_expression("#h = :me AND #t = :t")
                .expression_attribute_values(":me", s(me)),
            None => update.condition_expression("attribute_exists(#h) AND #t = :t"),
        };
        match update.send().await {
            Ok(_) => Ok(true),
            Err(e) if error::is_condition_failed(&e) => Ok(false),
            Err(e) => Err(error::map(e, operation, self.timeout)),
        }
    }
}

/// The answer to the one-request grant of an acquire.
enum Taken {
    /// The update was applied (or, after a foreign write, what the item says now).
    Acquired(Acquired),
    /// The condition failed; the item that failed it, where the server returns it.
    Refused(Option<Item>),
}

fn grant(request: &AcquireRequest, term: Term, version: String) -> Grant {
    Grant {
        lease: request.lease.clone(),
        holder: request.candidate.clone(),
        term,
        ttl: request.ttl,
        token: version,
    }
}

/// The SDK client for `config`: static credentials from the URL or the standard AWS chain, no
/// retries (the engine retries), the configured timeout on every request.
async fn build_client(config: &DynamoDbConfig) -> Result<Client> {
    let static_credentials = config.credentials.as_ref().map(|c| {
        Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key.clone(),
            c.session_token.clone(),
            None,
            "leasehold-url",
        )
    });
    #[cfg(feature = "aws-config")]
    let mut builder = {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(credentials) = static_credentials {
            loader = loader.credentials_provider(credentials);
        }
        let shared = loader.load().await;
        if shared.region().is_none() {
            return Err(Error::store(STORE, TableError::NoRegion));
        }
        aws_sdk_dynamodb::config::Builder::from(&shared)
    };
    #[cfg(not(feature = "aws-config"))]
    let mut builder = {
        let credentials = static_credentials.ok_or_else(|| Error::store(STORE, TableError::NoCredentials))?;
        let region = config
            .region
            .clone()
            .ok_or_else(|| Error::store(STORE, TableError::NoRegion))?;
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
    };
    if let Some(endpoint) = &config.endpoint {
        builder = builder.endpoint_url(endpoint);
    }
    let builder = builder
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.timeout)
                .operation_attempt_timeout(config.timeout)
                .operation_timeout(config.timeout)
                .build(),
        )
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
    Ok(Client::from_conf(builder.build()))
}

#[async_trait]
impl LeaseStore for DynamoDbStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: TTL_RANGE,
            expiry: Expiry::ObservedByContenders,
            notifications: Notifications::None,
            fifo: false,
            can_break: true,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        let _turn = self.turn(false).await;
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
        let _turn = self.turn(true).await;
        let lease = &grant.lease;
        let version = new_version();
        let updated = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key(lease, LEASE_SK)))
            .update_expression("SET #v = :new")
            .condition_expression("#h = :me AND #t = :t")
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#t", "term")
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
                    Some(h) if h.id == grant.holder && record.term == grant.term => Ok(Renewed::Renewed(Grant {
                        token: h.version.clone(),
                        ..grant.clone()
                    })),
                    _ => Ok(Renewed::Lost(record.observation(lease))),
                }
            }
            Err(e) => Err(error::map(e, "renew", self.timeout)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let _turn = self.turn(true).await;
        let lease = &grant.lease;
        if !self
            .end(
                lease,
                grant.term,
                Some(grant.holder.as_str()),
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

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let _turn = self.turn(false).await;
        Ok(self.read(lease, "inspect").await?.observation(lease))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let _turn = self.turn(false).await;
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

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let _turn = self.turn(false).await;
        // A holder may renew (same term) between the read and the write; a new grant in between
        // (a new term) is broken on the next attempt.
        for _ in 0..3 {
            let record = self.read(lease, "break_lease").await?;
            if record.holder.is_none() {
                return Ok(None);
            }
            if self
                .end(lease, record.term, None, EndReason::Broken, "break_lease")
                .await?
            {
                return Ok(Some(record.term));
            }
        }
        Err(Error::unreachable(
            STORE,
            format!("break_lease of {lease}: the lease changed hands three times while breaking it"),
        ))
    }
}
