//! Granting a lease: one conditional `UpdateItem` when the item allows it, else a read and a
//! write conditional on exactly what was read; then the history item of the term it ended.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use leasehold_core::time::unix_millis;
use leasehold_core::{
    AcquireRequest, Acquired, EndReason, Error, Grant, LeaseName, RecordVersion, Result, Term, Transition,
};

use crate::error::{self, STORE};
use crate::record::{self, HANDED_OVER_AT, Item, KEY, LEASE_SK, RESERVED_TERM, Record, key, n, s};
use crate::table::Table;

/// The answer to the one-request grant of an acquire.
pub(crate) enum Taken {
    /// The update was applied (or, after a foreign write, what the item says now).
    Acquired(Acquired),
    /// The condition failed; the item that failed it, where the server returns it.
    Refused(Option<Item>),
}

pub(crate) fn grant(request: &AcquireRequest, term: Term, version: String) -> Grant {
    Grant {
        lease: request.lease.clone(),
        holder: request.candidate.clone(),
        term,
        ttl: request.ttl,
        token: version,
    }
}

impl Table {
    /// The common grant, sent without reading first: one `UpdateItem` on the condition that the
    /// item exists, is free, held by the candidate itself or held at exactly the `takeover`
    /// version, is not reserved (a reserved term ended handed over, which one expression cannot
    /// copy into the slot beside the other ends: [`Table::take_read`] grants over it), and that
    /// its `prev_*` slot is empty (the term before has its history item). It
    /// raises the term by one and moves the term it ends into the slot, all from the item's own
    /// attributes. [`Taken::Refused`] when the condition failed, with the item that failed it
    /// where the server returns it (DynamoDB does; emulators may not).
    pub(crate) async fn take_unread(&self, request: &AcquireRequest) -> Result<Taken> {
        let lease = &request.lease;
        let now = (self.audit_clock)();
        let version = RecordVersion::random().to_string();
        let mut condition = String::from(
            "attribute_type(#t, :number) AND attribute_exists(#lh) AND attribute_not_exists(#pt) \
             AND (attribute_not_exists(#rt) OR #rt <> #t) AND (attribute_not_exists(#h) OR #h = :me",
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
                 REMOVE #pe, #ea, #rt, #hoa",
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
            .expression_attribute_names("#rt", RESERVED_TERM)
            .expression_attribute_names("#hoa", HANDED_OVER_AT)
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
    /// or held at the `takeover` version), when [`Table::take_unread`] was refused: because the
    /// item is reserved (its term ended handed over), or the `prev_*` slot still holds a term
    /// whose history item a previous grant did not get to write (its caller gave up on it).
    /// That history item is written first,
    /// then one `UpdateItem` on the condition that the item is still exactly as read replaces
    /// the slot with the term this grant ends.
    pub(crate) async fn take_read(&self, request: &AcquireRequest, record: &Record) -> Result<Acquired> {
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
        let version = RecordVersion::random().to_string();
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
            .expression_attribute_names("#rt", RESERVED_TERM)
            .expression_attribute_names("#hoa", HANDED_OVER_AT)
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
        let mut remove = String::from(" REMOVE #pe, #ea, #rt, #hoa");
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
    pub(crate) async fn log_previous(&self, lease: &LeaseName, finished: &Transition) {
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
    pub(crate) async fn clear_previous(&self, lease: &LeaseName, term: Term) -> Result<()> {
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
    pub(crate) async fn create(&self, request: &AcquireRequest, record: &Record) -> Result<Acquired> {
        let lease = &request.lease;
        let term = record.last_term.0.checked_add(1).map(Term).ok_or_else(|| {
            Error::corrupt(
                STORE,
                lease,
                format!("term {} cannot grow any further", record.last_term),
            )
        })?;
        let version = RecordVersion::random().to_string();
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

    /// Writes the history item of a finished term: unconditional and idempotent, since a finished
    /// term never changes.
    pub(crate) async fn put_history(
        &self,
        lease: &LeaseName,
        finished: &Transition,
        operation: &'static str,
    ) -> Result<()> {
        self.client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(record::transition_item(lease, finished)))
            .send()
            .await
            .map(drop)
            .map_err(|e| error::map(e, operation, self.timeout))
    }
}
