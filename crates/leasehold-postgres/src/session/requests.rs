//! How the lock session serves each kind of request: acquires (many leases in one statement),
//! renewals (every held lease in one statement), relocks after a lost session, releases, and
//! the give-back of grants nobody renews.

use std::collections::{HashSet, VecDeque};

use leasehold_core::{AcquireRequest, Acquired, CandidateId, Error, Grant, LeaseName, RecordVersion, Result, Term};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use super::{Actor, Context, Failure, Held, MAX_ACQUIRES, Renewal, idle_timeout, setting};
use crate::error::{self, STORE};
use crate::record::{Record, millis, term_value};
use crate::sql;

/// A renewal waiting for its answer: the grant, when it was asked for, where the answer goes.
pub(super) type Renewing = (Grant, Instant, oneshot::Sender<Result<Renewal>>);

impl Actor {
    /// Gives back the locks of grants that nobody renewed for a full TTL (their elector stepped
    /// down without releasing, or stopped): the session stays alive for its other leases, so
    /// without this such a lock would outlive its grant. The holder stopped believing in it before
    /// its TTL ran out, counted from when it asked for its last renewal.
    pub(super) async fn expire_abandoned(&mut self) {
        let Some(session) = &self.session else { return };
        let now = Instant::now();
        let abandoned: Vec<(LeaseName, Held)> = session
            .held
            .iter()
            .filter(|(_, h)| now >= h.confirmed + h.ttl)
            .map(|(lease, h)| (lease.clone(), h.clone()))
            .collect();
        for (lease, held) in abandoned {
            debug!(%lease, term = %held.term, "giving back the lock of a grant nobody renewed");
            let grant = Grant {
                lease: lease.clone(),
                holder: held.holder.clone(),
                term: held.term,
                ttl: held.ttl,
                token: String::new(),
            };
            if let Err(e) = self.end_term(&grant, "expired").await {
                debug!(%lease, error = %e, "could not end an abandoned grant");
            }
        }
    }

    /// Serves up to [`MAX_ACQUIRES`] queued acquires, each for another lease, in one statement.
    pub(super) async fn acquire_some(&mut self) {
        let mut batch = Vec::new();
        let mut later = VecDeque::new();
        let mut leases = HashSet::new();
        while batch.len() < MAX_ACQUIRES {
            let Some((request, at, reply)) = self.acquires.pop_front() else {
                break;
            };
            // A caller that gave up already treats the outcome as unknown: skip it.
            if reply.is_closed() {
                continue;
            }
            // Two requests for one lease (two candidates of this store) go in separate
            // statements, so that each sees what the other did.
            if leases.insert(request.lease.clone()) {
                batch.push((request, at, reply));
            } else {
                later.push_back((request, at, reply));
            }
        }
        while let Some(request) = later.pop_back() {
            self.acquires.push_front(request);
        }
        if batch.is_empty() {
            return;
        }
        let shortest = batch.iter().map(|(r, ..)| r.ttl).min();
        let limit = self.statement_limit(shortest);
        if let Err(failure) = self.connect(limit).await {
            for (.., reply) in batch {
                let _ = reply.send(Err(failure.to_error("acquire")));
            }
            return;
        }
        let cx = self.cx.clone();
        let session = self.session.as_ref().expect("connected");
        let base = session
            .held
            .iter()
            .filter(|(lease, _)| !leases.contains(*lease))
            .map(|(_, h)| h.ttl)
            .min()
            .unwrap_or_default();
        let mut names = Vec::new();
        let mut held = Vec::new();
        let mut keys = Vec::new();
        let mut candidates = Vec::new();
        let mut ttls = Vec::new();
        let mut versions = Vec::new();
        let mut takeovers = Vec::new();
        let mut payloads = Vec::new();
        let mut old_ttls = Vec::new();
        for (request, ..) in &batch {
            let lease = &request.lease;
            let holding = session.held.get(lease);
            names.push(lease.as_str().to_string());
            held.push(holding.is_some());
            keys.push(cx.key(lease));
            candidates.push(request.candidate.as_str().to_string());
            ttls.push(millis(request.ttl));
            versions.push(String::from(RecordVersion::random()));
            takeovers.push(request.takeover.clone());
            payloads.push(cx.payload(lease, request.candidate.as_str()));
            old_ttls.push(holding.map(|h| millis(h.ttl)));
        }
        let query = sql::query(&cx.sql.acquire)
            .bind(names)
            .bind(held.clone())
            .bind(keys.clone())
            .bind(candidates)
            .bind(ttls)
            .bind(versions.clone())
            .bind(takeovers)
            .bind(payloads)
            .bind(old_ttls)
            .bind(i64::from(cx.config.history_limit()))
            .bind(millis(base))
            .bind(format!("{}/", cx.config.schema()));
        let rows = match self.fetch_all(query, limit).await {
            Ok(rows) if rows.len() == batch.len() => rows,
            outcome => {
                let failure = match outcome {
                    Err(failure) => failure,
                    Ok(rows) => Failure::Sql(sqlx::Error::Protocol(format!(
                        "{} answers to {} acquires",
                        rows.len(),
                        batch.len()
                    ))),
                };
                // Locks the failed statement took survive its rollback: give them back.
                let taken: Vec<i64> = keys
                    .iter()
                    .zip(&held)
                    .filter(|(_, held)| !**held)
                    .map(|(k, _)| *k)
                    .collect();
                self.give_back(taken, limit).await;
                for (.., reply) in batch {
                    let _ = reply.send(Err(failure.to_error("acquire")));
                }
                return;
            }
        };
        for ((((request, at, reply), row), key), version) in batch.into_iter().zip(&rows).zip(keys).zip(versions) {
            let answer = self.answer_acquire(&request, at, row, key, version);
            let _ = reply.send(answer);
        }
        if let Some(session) = self.session.as_mut() {
            session.idle_timeout = idle_timeout(&session.held, None, None);
        }
    }

    /// Reads one request's row of the acquire statement and keeps the bookkeeping.
    fn answer_acquire(
        &mut self,
        request: &AcquireRequest,
        at: Instant,
        row: &PgRow,
        key: i64,
        version: String,
    ) -> Result<Acquired> {
        let lease = &request.lease;
        let internal = |e: sqlx::Error| Error::store(STORE, format!("unexpected answer to acquire: {e}"));
        let got: bool = row.try_get(1).map_err(internal)?;
        let granted: bool = row.try_get(2).map_err(internal)?;
        let new_term: Option<i64> = row.try_get(3).map_err(internal)?;
        let valid: bool = row.try_get(11).map_err(internal)?;
        let session = self.session.as_mut().expect("the statement succeeded");
        let held = session.held.contains_key(lease);
        if granted {
            let term = new_term
                .and_then(|t| u64::try_from(t).ok())
                .map(Term)
                .ok_or_else(|| Error::store(STORE, "acquire granted without a term"))?;
            session.held.insert(
                lease.clone(),
                Held {
                    key,
                    holder: request.candidate.clone(),
                    term,
                    ttl: request.ttl,
                    confirmed: at,
                },
            );
            return Ok(Acquired::Granted(Grant {
                lease: lease.clone(),
                holder: request.candidate.clone(),
                term,
                ttl: request.ttl,
                token: version,
            }));
        }
        let record = Record::decode(lease, row, 4)?;
        if !valid && row.try_get::<bool, _>(4).unwrap_or(false) {
            return Err(Error::corrupt(
                STORE,
                lease,
                "the row fails leasehold's checks (see docs: schema)",
            ));
        }
        // The lock was free (this session took it for the statement) but the row names a holder:
        // its session ended (crash, reset, restart) while it may still believe its grant. The
        // row is orphaned: the engine takes it over by its version once it has seen that
        // version unchanged for the holder's TTL.
        let observation = record.observation(lease, got && !held);
        Ok(Acquired::Held(observation))
    }

    pub(super) async fn renew_all(&mut self, batch: Vec<Renewing>) {
        let mut mine = Vec::new();
        let mut relocks = Vec::new();
        let mut relocking = HashSet::new();
        for (grant, at, reply) in batch {
            if reply.is_closed() {
                continue;
            }
            let held = self.session.as_ref().and_then(|s| s.held.get(&grant.lease));
            match held {
                Some(h) if h.holder == grant.holder && h.term == grant.term => mine.push((grant, at, reply)),
                // The session holds this lease for another grant: not this one's any more.
                Some(_) => {
                    let _ = reply.send(Ok(Renewal::NotHeld));
                }
                // A second grant of a lease being relocked: after that relock, when what the
                // session holds is known again.
                None if relocking.contains(&grant.lease) => self.renewals.push((grant, at, reply)),
                None => {
                    relocking.insert(grant.lease.clone());
                    relocks.push((grant, at, reply));
                }
            }
        }
        self.relock_all(relocks).await;
        if mine.is_empty() {
            return;
        }
        let versions: Vec<String> = mine.iter().map(|_| String::from(RecordVersion::random())).collect();
        let limit = self.statement_limit(None);
        let cx = self.cx.clone();
        let query = sql::query(&cx.sql.renew)
            .bind(
                mine.iter()
                    .map(|(g, ..)| g.lease.as_str().to_string())
                    .collect::<Vec<_>>(),
            )
            .bind(
                mine.iter()
                    .map(|(g, ..)| g.holder.as_str().to_string())
                    .collect::<Vec<_>>(),
            )
            .bind(mine.iter().map(|(g, ..)| term_value(g.term)).collect::<Vec<_>>())
            .bind(versions.clone())
            .bind(mine.iter().map(|(g, ..)| cx.key(&g.lease)).collect::<Vec<_>>())
            .bind(format!("{}/", cx.config.schema()));
        let rows = match self.fetch_all(query, limit).await {
            Ok(rows) => rows,
            Err(failure) => {
                for (.., reply) in mine {
                    let _ = reply.send(Err(failure.to_error("renew")));
                }
                return;
            }
        };
        let renewed: HashSet<String> = rows.iter().filter_map(|row| row.try_get(0).ok()).collect();
        let mut lost = Vec::new();
        for ((grant, at, reply), version) in mine.into_iter().zip(versions) {
            if renewed.contains(grant.lease.as_str()) {
                if let Some(h) = self.session.as_mut().and_then(|s| s.held.get_mut(&grant.lease)) {
                    h.confirmed = h.confirmed.max(at);
                }
                let grant = Grant {
                    token: version,
                    ..grant
                };
                let _ = reply.send(Ok(Renewal::Renewed(grant)));
            } else {
                lost.push((grant, reply));
            }
        }
        if lost.is_empty() {
            return;
        }
        // The row no longer names the grant (broken by an operator, overwritten): this session
        // must not keep the lock.
        let mut keys = Vec::new();
        if let Some(session) = self.session.as_mut() {
            for (grant, _) in &lost {
                if let Some(h) = session.held.remove(&grant.lease) {
                    keys.push(h.key);
                }
            }
        }
        if !keys.is_empty() {
            self.give_back(keys, limit).await;
        }
        for (_, reply) in lost {
            let _ = reply.send(Ok(Renewal::NotHeld));
        }
    }

    /// Renews grants (each of another lease) whose locks this session does not hold, by taking
    /// the locks again where the rows still name the grants: all in one statement that does not
    /// wait for a lock (`relock_many`), then each grant whose lock someone held with `relock`,
    /// which waits a little.
    async fn relock_all(&mut self, batch: Vec<Renewing>) {
        let mut batch: Vec<Renewing> = batch.into_iter().filter(|(.., reply)| !reply.is_closed()).collect();
        if batch.len() > 1 {
            batch = self.relock_many(batch).await;
        }
        for (grant, at, reply) in batch {
            let result = self.relock(&grant, at).await;
            let _ = reply.send(result);
        }
    }

    /// The `relock_many` statement: answers the grants it renewed or found lost, and returns
    /// those left to `relock` (their lock was held, or the statement failed without ending the
    /// session).
    async fn relock_many(&mut self, batch: Vec<Renewing>) -> Vec<Renewing> {
        let shortest = batch.iter().map(|(g, ..)| g.ttl).min();
        let limit = self.statement_limit(shortest);
        if let Err(failure) = self.connect(limit).await {
            for (.., reply) in batch {
                let _ = reply.send(Err(failure.to_error("renew")));
            }
            return Vec::new();
        }
        let cx = self.cx.clone();
        let session = self.session.as_ref().expect("connected");
        let base = idle_timeout(&session.held, None, None);
        let keys: Vec<i64> = batch.iter().map(|(g, ..)| cx.key(&g.lease)).collect();
        let versions: Vec<String> = batch.iter().map(|_| String::from(RecordVersion::random())).collect();
        let query = sql::query(&cx.sql.relock_many)
            .bind(
                batch
                    .iter()
                    .map(|(g, ..)| g.lease.as_str().to_string())
                    .collect::<Vec<_>>(),
            )
            .bind(
                batch
                    .iter()
                    .map(|(g, ..)| g.holder.as_str().to_string())
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|(g, ..)| term_value(g.term)).collect::<Vec<_>>())
            .bind(keys.clone())
            .bind(versions.clone())
            .bind(batch.iter().map(|(g, ..)| millis(g.ttl)).collect::<Vec<_>>())
            .bind(millis(base))
            .bind(format!("{}/", cx.config.schema()));
        let rows = match self.fetch_all(query, limit).await {
            Ok(rows) if rows.len() == batch.len() => rows,
            Err(failure @ (Failure::NoAnswer(_) | Failure::NotConnected(_))) => {
                for (.., reply) in batch {
                    let _ = reply.send(Err(failure.to_error("renew")));
                }
                return Vec::new();
            }
            Err(Failure::Sql(e)) if error::ends_session(&e) => {
                let failure = Failure::Sql(e);
                for (.., reply) in batch {
                    let _ = reply.send(Err(failure.to_error("renew")));
                }
                return Vec::new();
            }
            // A row lock held past lock_timeout, or a wrong answer: the locks the statement took
            // survive its rollback; give them all back and try each grant alone.
            _ => {
                self.give_back(keys, limit).await;
                return batch;
            }
        };
        let mut again = Vec::new();
        for (((grant, at, reply), row), (key, version)) in
            batch.into_iter().zip(&rows).zip(keys.into_iter().zip(versions))
        {
            let got = row.try_get::<bool, _>(1).unwrap_or(false);
            let renewed = row.try_get::<bool, _>(2).unwrap_or(false);
            if !got {
                again.push((grant, at, reply));
                continue;
            }
            let Some(session) = self.session.as_mut() else {
                let _ = reply.send(Ok(Renewal::NotHeld));
                continue;
            };
            if !renewed {
                let _ = reply.send(Ok(Renewal::NotHeld));
                continue;
            }
            debug!(lease = %grant.lease, term = %grant.term, "took the lock of a recorded grant again");
            session.held.insert(
                grant.lease.clone(),
                Held {
                    key,
                    holder: grant.holder.clone(),
                    term: grant.term,
                    ttl: grant.ttl,
                    confirmed: at,
                },
            );
            let _ = reply.send(Ok(Renewal::Renewed(Grant {
                token: version,
                ..grant
            })));
        }
        if let Some(session) = self.session.as_mut() {
            session.idle_timeout = idle_timeout(&session.held, None, None);
        }
        again
    }

    /// Renews a grant whose lock this session does not hold, by taking the lock again if the row
    /// still names the grant (see the `relock` statement).
    async fn relock(&mut self, grant: &Grant, at: Instant) -> Result<Renewal> {
        let limit = self.statement_limit(Some(grant.ttl));
        if let Err(failure) = self.connect(limit).await {
            return Err(failure.to_error("renew"));
        }
        let session = self.session.as_ref().expect("connected");
        let if_renewed = idle_timeout(&session.held, None, Some(grant.ttl));
        let otherwise = idle_timeout(&session.held, None, None);
        let key = self.cx.key(&grant.lease);
        let version = String::from(RecordVersion::random());
        let query = sql::query(&self.cx.sql.relock)
            .bind(grant.lease.as_str())
            .bind(grant.holder.as_str())
            .bind(term_value(grant.term))
            .bind(key)
            .bind(&version)
            .bind(setting(if_renewed))
            .bind(setting(otherwise))
            .bind(format!("{}/", self.cx.config.schema()));
        let renewed = match self.fetch_one(query, limit).await {
            Ok(row) => row.try_get::<bool, _>(0).unwrap_or(false),
            // Someone else holds the lock (lock_timeout), or the session broke: not renewed.
            Err(Failure::Sql(e)) if !error::ends_session(&e) => false,
            Err(failure) => return Err(failure.to_error("renew")),
        };
        let Some(session) = self.session.as_mut() else {
            return Ok(Renewal::NotHeld);
        };
        if !renewed {
            session.idle_timeout = otherwise;
            return Ok(Renewal::NotHeld);
        }
        debug!(lease = %grant.lease, term = %grant.term, "took the lock of a recorded grant again");
        session.idle_timeout = if_renewed;
        session.held.insert(
            grant.lease.clone(),
            Held {
                key,
                holder: grant.holder.clone(),
                term: grant.term,
                ttl: grant.ttl,
                confirmed: at,
            },
        );
        Ok(Renewal::Renewed(Grant {
            token: version,
            ..grant.clone()
        }))
    }

    pub(super) async fn release(&mut self, grant: &Grant) -> Result<()> {
        let limit = self.statement_limit(None);
        self.connect(limit).await.map_err(|f| f.to_error("release"))?;
        // Also when this session no longer holds the lock (it was lost): the row may still name
        // the grant, and clearing it lets the next candidate in without waiting a TTL.
        self.end_term(grant, "released").await
    }

    /// Hands `grant` over to `to` (see the `hand_over` statement), notifies, and gives back its
    /// lock if this session holds it: the reservation has no lock.
    pub(super) async fn hand_over(&mut self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let limit = self.statement_limit(None);
        self.connect(limit).await.map_err(|f| f.to_error("hand_over"))?;
        self.ending(grant, "hand_over", Some(to), |cx| {
            sql::query(&cx.sql.hand_over)
                .bind(grant.lease.as_str())
                .bind(grant.holder.as_str())
                .bind(term_value(grant.term))
                .bind(to.as_str())
                .bind(String::from(RecordVersion::random()))
                .bind(millis(grant.ttl))
        })
        .await
    }

    /// Ends the term of `grant` in the row and the history as `reason`, notifies, and gives back
    /// its lock if this session holds it.
    async fn end_term(&mut self, grant: &Grant, reason: &str) -> Result<()> {
        self.ending(grant, "release", None, |cx| {
            sql::query(&cx.sql.release)
                .bind(grant.lease.as_str())
                .bind(grant.holder.as_str())
                .bind(term_value(grant.term))
                .bind(reason)
        })
        .await
    }

    /// Runs a statement that ends `grant`'s term (`statement`'s own arguments, then the shared
    /// ones: the notification payload, the lock key this session holds for the grant if any, and
    /// the session's idle timeout without it), and gives the key back if the statement failed.
    ///
    /// `successor`: a handover to it (the notification names it, [`Context::handover_payload`]),
    /// or a release. When a release gives back the lock, the notification says so
    /// ([`Context::queued_payload`]): the candidate
    /// at the head of the store-side queue is woken by the lock itself, and the others need not
    /// wake.
    async fn ending<'q>(
        &mut self,
        grant: &'q Grant,
        operation: &'static str,
        successor: Option<&CandidateId>,
        statement: impl FnOnce(&Context) -> Query<'q, Postgres, PgArguments>,
    ) -> Result<()> {
        let limit = self.statement_limit(None);
        let Some(session) = self.session.as_mut() else {
            return Err(Error::unreachable(STORE, "the lock session is not connected"));
        };
        let key = session
            .held
            .get(&grant.lease)
            .filter(|h| h.holder == grant.holder && h.term == grant.term)
            .map(|h| h.key);
        if key.is_some() {
            session.held.remove(&grant.lease);
        }
        let after = idle_timeout(&session.held, None, None);
        let cx = self.cx.clone();
        let payload = match successor {
            Some(to) => cx.handover_payload(&grant.lease, grant.holder.as_str(), to.as_str()),
            None if key.is_some() => cx.queued_payload(&grant.lease, grant.holder.as_str()),
            None => cx.payload(&grant.lease, grant.holder.as_str()),
        };
        let query = statement(&cx)
            .bind(payload)
            .bind(key.unwrap_or_default())
            .bind(key.is_some())
            .bind(setting(after));
        match self.fetch_one(query, limit).await {
            Ok(_) => {
                if let Some(session) = self.session.as_mut() {
                    session.idle_timeout = after;
                }
                Ok(())
            }
            Err(failure) => {
                if let Some(key) = key {
                    self.give_back(vec![key], limit).await;
                }
                Err(failure.to_error(operation))
            }
        }
    }
}
