//! An in-memory [`LeaseStore`] with the whole contract, for tests and simulation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::record::RecordVersion;
use crate::shard_record::{ShardRecord, ShardWrite};
use crate::store::{Announcements, Changes, LeaseStore};
use crate::types::{
    AcquireRequest, Acquired, Announces, CandidateId, Capabilities, EndReason, Expiry, Grant, HolderInfo, LeaseName,
    Notifications, Observation, Renewed, Term, Transition,
};

const STORE: &str = "memory";

/// An in-memory lease store shared by clones of it: terms, history, expiry and release
/// notifications, all in one process.
///
/// Followers queue: a release wakes the longest-waiting follower still listening, a takeover,
/// an expiry, a handover or a break wakes them all; every grant and renewal is announced
/// ([`Announces::GrantsAndRenewals`]), so idle followers make no requests, and so is every end
/// of a term (the lease free, or reserved for a hand-over's successor).
///
/// Time is tokio's, so tests can run it under `tokio::time::pause`. By default the store
/// expires leases by its own clock ([`Expiry::ServerClock`]); [`MemoryStore::observed_expiry`]
/// makes one without a clock, where contenders take over after observing an unchanged record
/// version for a full TTL, as on SQLite and DynamoDB.
///
/// It is for unit tests and simulation, never a stand-in for a real backend's own tests.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{Elector, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = Arc::new(MemoryStore::new());
/// let elector = Elector::builder(store, "demo").ttl(Duration::from_secs(1)).build()?;
/// let leader = elector.campaign().await?;
/// assert_eq!(leader.term().0, 1);
/// leader.resign().await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    expiry: Expiry,
    leases: Arc<Mutex<HashMap<LeaseName, Entry>>>,
    /// Shard records by name: (version number, value).
    shards: Arc<Mutex<BTreeMap<LeaseName, (u64, String)>>>,
}

#[derive(Debug)]
struct Entry {
    holder: Option<Holding>,
    last_term: Term,
    previous_end: Option<EndReason>,
    history: Vec<Transition>,
    /// Change streams, oldest first; one whose stream was dropped is skipped.
    waiters: VecDeque<(CandidateId, Arc<Notify>)>,
    /// Grants, renewals and ends of terms, as [`LeaseStore::announcements`] announces them (a
    /// queue, not the latest alone: an end and the grant that follows it at once both arrive).
    announced: broadcast::Sender<Observation>,
    corrupt: bool,
}

#[derive(Clone, Debug)]
struct Holding {
    id: CandidateId,
    term: Term,
    ttl: Duration,
    version: String,
    expires_at: Instant,
    /// Handed over to `id`, not taken yet.
    reserved: bool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store whose own clock expires leases.
    pub fn new() -> Self {
        MemoryStore {
            expiry: Expiry::ServerClock,
            leases: Arc::default(),
            shards: Arc::default(),
        }
    }

    /// A store without a clock: contenders take over after observing an unchanged record version
    /// for a full TTL (the record-version-number method).
    pub fn observed_expiry() -> Self {
        MemoryStore {
            expiry: Expiry::ObservedByContenders,
            ..MemoryStore::new()
        }
    }

    /// Simulates someone overwriting the lease's record with garbage: every later operation on it
    /// answers [`Error::CorruptRecord`] until [`MemoryStore::repair`].
    pub fn corrupt(&self, lease: &LeaseName) {
        self.with_entry(lease, |entry| entry.corrupt = true);
    }

    /// Undoes [`MemoryStore::corrupt`] by deleting the record (the term counter is kept).
    pub fn repair(&self, lease: &LeaseName) {
        self.with_entry(lease, |entry| {
            entry.corrupt = false;
            entry.holder = None;
        });
    }

    fn with_entry<T>(&self, lease: &LeaseName, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut leases = self.leases.lock().expect("memory store lock poisoned");
        let entry = leases.entry(lease.clone()).or_insert_with(|| Entry {
            holder: None,
            last_term: Term(0),
            previous_end: None,
            history: Vec::new(),
            waiters: VecDeque::new(),
            announced: broadcast::channel(16).0,
            corrupt: false,
        });
        f(entry)
    }

    /// Runs `f` on a readable, up-to-date entry.
    fn with_live_entry<T>(&self, lease: &LeaseName, f: impl FnOnce(&mut Entry, Instant) -> T) -> Result<T> {
        let expiry = self.expiry;
        self.with_entry(lease, |entry| {
            if entry.corrupt {
                return Err(Error::corrupt(STORE, lease, "record is not a leasehold record"));
            }
            let now = Instant::now();
            if expiry == Expiry::ServerClock && entry.holder.as_ref().is_some_and(|h| now >= h.expires_at) {
                entry.end(EndReason::Expired);
                entry.announce(lease, now, expiry);
                entry.wake_all();
            }
            Ok(f(entry, now))
        })
    }
}

impl Entry {
    fn observation(&self, lease: &LeaseName, now: Instant, expiry: Expiry) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: self.holder.as_ref().map(|h| HolderInfo {
                id: h.id.clone(),
                term: h.term,
                ttl: h.ttl,
                version: h.version.clone(),
                orphaned: false,
                reserved: h.reserved,
                store_remaining: (expiry == Expiry::ServerClock).then(|| h.expires_at.saturating_duration_since(now)),
            }),
            last_term: self.last_term,
            previous_end: if self.holder.is_none() { self.previous_end } else { None },
        }
    }

    fn end(&mut self, reason: EndReason) {
        if let Some(h) = self.holder.take() {
            // A reservation's term already ended, handed over.
            if let Some(t) = self.history.iter_mut().rev().find(|t| t.term == h.term && !h.reserved) {
                t.ended = Some((SystemTime::now(), reason));
            }
            self.previous_end = Some(if h.reserved { EndReason::HandedOver } else { reason });
        }
    }

    /// Wakes every follower still listening.
    fn wake_all(&mut self) {
        self.waiters.retain(|(_, w)| Arc::strong_count(w) > 1);
        for (_, waiter) in &self.waiters {
            waiter.notify_one();
        }
    }

    /// Wakes the longest-waiting follower still listening (it stays first in line until its
    /// stream is dropped, e.g. once it leads).
    fn wake_next(&mut self) {
        while let Some((_, waiter)) = self.waiters.front() {
            if Arc::strong_count(waiter) > 1 {
                waiter.notify_one();
                return;
            }
            self.waiters.pop_front();
        }
    }

    /// Announces the holder as it is now.
    fn announce(&self, lease: &LeaseName, now: Instant, expiry: Expiry) {
        // Nobody listening is fine.
        let _ = self.announced.send(self.observation(lease, now, expiry));
    }

    fn grant(&mut self, lease: &LeaseName, id: &CandidateId, ttl: Duration, now: Instant) -> Grant {
        self.last_term = Term(self.last_term.0 + 1);
        let holding = Holding {
            id: id.clone(),
            term: self.last_term,
            ttl,
            version: RecordVersion::random().into(),
            expires_at: now + ttl,
            reserved: false,
        };
        self.history.push(Transition {
            term: holding.term,
            holder: id.clone(),
            acquired_at: SystemTime::now(),
            ended: None,
        });
        let grant = holding.grant(lease);
        self.holder = Some(holding);
        grant
    }
}

impl Holding {
    fn grant(&self, lease: &LeaseName) -> Grant {
        Grant {
            lease: lease.clone(),
            holder: self.id.clone(),
            term: self.term,
            ttl: self.ttl,
            token: self.version.clone(),
        }
    }

    fn refresh(&mut self, now: Instant) {
        self.version = RecordVersion::random().into();
        self.expires_at = now + self.ttl;
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: Duration::from_millis(1)..=Duration::from_secs(24 * 3600),
            expiry: self.expiry,
            notifications: Notifications::Release,
            announces: Announces::GrantsAndRenewals,
            fifo: false,
        }
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let expiry = self.expiry;
        let lease = &request.lease;
        self.with_live_entry(lease, |entry, now| {
            match &mut entry.holder {
                None => {}
                // The candidate's own earlier term ended when its leadership did: a new term.
                Some(h) if h.id == request.candidate => entry.end(EndReason::Expired),
                Some(h) if request.takeover.as_ref() == Some(&h.version) && expiry == Expiry::ObservedByContenders => {
                    entry.end(EndReason::Expired);
                    entry.wake_all();
                }
                Some(_) => return Acquired::Held(entry.observation(lease, now, expiry)),
            }
            let grant = entry.grant(lease, &request.candidate, request.ttl, now);
            entry.announce(lease, now, expiry);
            Acquired::Granted(grant)
        })
    }

    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let expiry = self.expiry;
        self.with_live_entry(&grant.lease, |entry, now| match &mut entry.holder {
            Some(h) if h.id == grant.holder && h.term == grant.term && !h.reserved => {
                h.refresh(now);
                let renewed = h.grant(&grant.lease);
                entry.announce(&grant.lease, now, expiry);
                Renewed::Renewed(renewed)
            }
            _ => Renewed::Lost(entry.observation(&grant.lease, now, expiry)),
        })
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let expiry = self.expiry;
        self.with_live_entry(&grant.lease, |entry, now| {
            // Not a reservation (a hand-over's successor has not taken it yet), as on every store.
            if entry
                .holder
                .as_ref()
                .is_some_and(|h| h.id == grant.holder && h.term == grant.term && !h.reserved)
            {
                entry.end(EndReason::Released);
                entry.announce(&grant.lease, now, expiry);
                entry.wake_next();
            }
        })
    }

    async fn hand_over(&self, grant: &Grant, to: &CandidateId) -> Result<()> {
        let expiry = self.expiry;
        self.with_live_entry(&grant.lease, |entry, now| {
            let Some(h) = entry
                .holder
                .as_mut()
                .filter(|h| h.id == grant.holder && h.term == grant.term && !h.reserved)
            else {
                return;
            };
            if let Some(t) = entry.history.iter_mut().rev().find(|t| t.term == grant.term) {
                t.ended = Some((SystemTime::now(), EndReason::HandedOver));
            }
            h.id = to.clone();
            h.reserved = true;
            h.refresh(now);
            entry.announce(&grant.lease, now, expiry);
            entry.wake_all();
        })
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let expiry = self.expiry;
        self.with_live_entry(lease, |entry, now| entry.observation(lease, now, expiry))
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        self.with_live_entry(lease, |entry, _| {
            let skip = entry.history.len().saturating_sub(limit);
            entry.history[skip..].to_vec()
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let mut names: Vec<LeaseName> = {
            let leases = self.leases.lock().expect("memory store lock poisoned");
            leases
                .iter()
                .filter(|(name, entry)| name.as_str().starts_with(prefix) && (entry.last_term.0 > 0 || entry.corrupt))
                .map(|(name, _)| name.clone())
                .collect()
        };
        names.sort();
        names
            .iter()
            .map(|lease| self.with_live_entry(lease, |entry, now| entry.observation(lease, now, self.expiry)))
            .collect()
    }

    /// The holder (while it holds, not reserved), then every follower listening for changes, in
    /// the order they started to.
    async fn candidates(&self, lease: &LeaseName) -> Result<Vec<CandidateId>> {
        let now = Instant::now();
        self.with_entry(lease, |entry| {
            let mut listed: Vec<CandidateId> = Vec::new();
            if let Some(h) = entry.holder.as_ref().filter(|h| !h.reserved && h.expires_at > now) {
                listed.push(h.id.clone());
            }
            for (id, waiter) in &entry.waiters {
                if Arc::strong_count(waiter) > 1 && !listed.contains(id) {
                    listed.push(id.clone());
                }
            }
            Ok(listed)
        })
    }

    async fn changes(&self, lease: &LeaseName, candidate: &CandidateId) -> Result<Option<Changes>> {
        let waiter = Arc::new(Notify::new());
        self.with_entry(lease, |entry| {
            entry.waiters.push_back((candidate.clone(), waiter.clone()))
        });
        let stream = futures::stream::unfold(waiter, |waiter| async move {
            waiter.notified().await;
            Some(((), waiter))
        });
        Ok(Some(crate::store::notifications(stream)))
    }

    /// Every grant, renewal and end of a term, from the moment it is made (a subscriber that
    /// falls more than 16 behind skips the oldest).
    async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>> {
        let rx = self.with_entry(lease, |entry| entry.announced.subscribe());
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(seen) => return Some((seen, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(Some(Box::pin(stream)))
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let shards = self.shards.lock().expect("memory store lock poisoned");
        Ok(shards
            .iter()
            .filter(|(name, _)| name.as_str().starts_with(prefix))
            .map(|(name, (version, value))| shard_record(name, *version, value))
            .collect())
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let mut shards = self.shards.lock().expect("memory store lock poisoned");
        let current = shards
            .get(name)
            .map(|(version, value)| shard_record(name, *version, value));
        if current.as_ref().map(|r| r.version.as_str()) != expected {
            return Ok(ShardWrite::Conflict(current));
        }
        let version = shards.get(name).map_or(1, |(v, _)| v + 1);
        shards.insert(name.clone(), (version, value.to_string()));
        Ok(ShardWrite::Written(shard_record(name, version, value)))
    }

    fn can_break(&self) -> bool {
        true
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        let expiry = self.expiry;
        self.with_live_entry(lease, |entry, now| {
            let term = entry.holder.as_ref().map(|h| h.term);
            entry.end(EndReason::Broken);
            entry.announce(lease, now, expiry);
            entry.wake_all();
            term
        })
    }
}

fn shard_record(name: &LeaseName, version: u64, value: &str) -> ShardRecord {
    ShardRecord {
        name: name.clone(),
        version: version.to_string(),
        value: value.to_string(),
    }
}
