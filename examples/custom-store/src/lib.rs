//! A lease store written outside leasehold, the way a user writes one for a store leasehold does
//! not ship: [`DirStore`] keeps each lease as one JSON file in a directory that every process of
//! one machine opens, and takes an exclusive `flock` on the directory's `.lock` file around every
//! write. Its `tests/conformance.rs` runs leasehold's whole conformance suite against it with one
//! `suite!` line. The guide is `docs/custom-backend.md` at the root of the repository.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::Elector;
//! use leasehold_example_custom_store::DirStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let store = Arc::new(DirStore::open(dir.path())?);
//! let elector = Elector::builder(store, "nightly-report").ttl(Duration::from_secs(2)).build()?;
//! let leader = elector.campaign().await?;
//! assert_eq!(leader.term().0, 1);
//! leader.resign().await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use leasehold_core::{
    AcquireRequest, Acquired, Capabilities, EndReason, Error, Expiry, Grant, HolderInfo, LeaseName, LeaseStore,
    Notifications, Observation, RecordVersion, Renewed, Result, ShardRecord, ShardWrite, Term, Transition, async_trait,
};
use serde::{Deserialize, Serialize};

const STORE: &str = "dir";

/// Terms kept in a lease's history; older ones are dropped.
pub const HISTORY_LIMIT: usize = 1000;

/// A [`LeaseStore`] over a directory: `<lease>.json` per lease, written whole (a temporary file
/// renamed over it) while holding an exclusive `flock` on `<dir>/.lock`, so that writers of every
/// process take turns and each compare-and-set sees the latest record. Reads take no lock: a
/// rename replaces a file at once, so a reader sees the old record or the new one.
///
/// The directory has no clock: a contender takes over a silent holder only after it has seen
/// the same record version unchanged for the holder's TTL on its own monotonic clock
/// ([`Expiry::ObservedByContenders`]); the engine does that watching and passes
/// [`AcquireRequest::takeover`]. Nothing notifies followers: they poll.
///
/// Limits of an example: writes are not `fsync`ed (after a machine crash a term could be granted
/// twice; a production store syncs the file and the directory), and `flock` needs a local file
/// system (not NFS). Lease names are file names as they are (leasehold's names are `[A-Za-z0-9._-]`,
/// never starting with `.` or `-`), so the directory must be on a case-sensitive file system.
///
/// # Cancel safety
///
/// Each operation runs to its end on a blocking thread even when its future is dropped: a dropped
/// write may or may not have been made, as after a timeout.
#[derive(Clone, Debug)]
pub struct DirStore {
    dir: Arc<PathBuf>,
    /// Writes waiting for the next turn of the writer (see [`DirStore::write`]).
    queue: Arc<Mutex<Queue>>,
}

/// A write: given the store under its `flock` (or why the lock could not be taken), it reads,
/// changes and writes one record, and sends its answer to its caller.
type Job = Box<dyn FnOnce(std::result::Result<&DirStore, &str>) + Send>;

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// A writer thread is running and will take the queued jobs.
    writing: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("jobs", &self.jobs.len())
            .field("writing", &self.writing)
            .finish()
    }
}

/// One lease's file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    holder: Option<HolderInfo>,
    last_term: Term,
    previous_end: Option<EndReason>,
    history: Vec<Transition>,
}

/// A shard record's file.
#[derive(Serialize, Deserialize)]
struct ShardFile {
    version: String,
    value: String,
}

impl DirStore {
    /// Opens the store in `dir`, creating the directory if needed.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the directory cannot be created or is not writable.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        File::options()
            .create(true)
            .append(true)
            .open(dir.join(".lock"))
            .map_err(|e| io(&dir, e))?;
        Ok(DirStore {
            dir: Arc::new(dir),
            queue: Arc::default(),
        })
    }

    /// The file of `lease`.
    pub fn path_of(&self, lease: &LeaseName) -> PathBuf {
        self.dir.join(format!("{lease}.json"))
    }

    /// Runs `op` on a blocking thread (file I/O and `flock` block).
    async fn blocking<T: Send + 'static>(&self, op: impl FnOnce(&DirStore) -> Result<T> + Send + 'static) -> Result<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || op(&store))
            .await
            .map_err(|e| Error::store(STORE, format!("blocking task failed: {e}")))?
    }

    /// Queues a write of `lease`'s record and waits for its answer.
    ///
    /// Group commit: one blocking thread per store takes every write queued meanwhile and makes
    /// them all under one `flock`, so that 1,000 leases renewing cost one thread wake-up and one
    /// lock per round rather than one each (one lock each did not keep up on a loaded machine).
    async fn write<T: Send + 'static>(
        &self,
        lease: &LeaseName,
        change: impl FnOnce(&mut Record) -> (T, bool) + Send + 'static,
    ) -> Result<T> {
        let lease = lease.clone();
        self.locked(move |store| store.update(&lease, change)).await
    }

    /// Runs `op` on the writer thread, under the directory's `flock` (see [`DirStore::write`]).
    async fn locked<T: Send + 'static>(&self, op: impl FnOnce(&DirStore) -> Result<T> + Send + 'static) -> Result<T> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |locked| {
            let _ = answer.send(match locked {
                Ok(store) => op(store),
                Err(why) => Err(Error::store(STORE, why.to_string())),
            });
        });
        let start = {
            let mut queue = self.queue.lock().expect("queue lock poisoned");
            queue.jobs.push(job);
            !std::mem::replace(&mut queue.writing, true)
        };
        if start {
            let store = self.clone();
            tokio::task::spawn_blocking(move || store.write_queued());
        }
        answered
            .await
            .map_err(|_| Error::store(STORE, "the writer thread ended without an answer"))?
    }

    /// The file of shard record `name`: in `.shards/`, apart from the leases' files.
    fn shard_path(&self, name: &LeaseName) -> PathBuf {
        self.dir.join(".shards").join(format!("{name}.json"))
    }

    /// Reads shard record `name` (`None`: there is none).
    fn read_shard(&self, name: &LeaseName) -> Result<Option<ShardRecord>> {
        let path = self.shard_path(name);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path, e)),
        };
        let file: ShardFile = serde_json::from_slice(&text)
            .map_err(|e| Error::corrupt(STORE, name, format!("not a leasehold shard record: {e}")))?;
        Ok(Some(ShardRecord {
            name: name.clone(),
            version: file.version,
            value: file.value,
        }))
    }

    /// The writer thread: takes the queued jobs and runs them under one `flock`, until none are
    /// left. The lock is released when its file is closed.
    fn write_queued(&self) {
        let lock_path = self.dir.join(".lock");
        loop {
            let jobs = {
                let mut queue = self.queue.lock().expect("queue lock poisoned");
                if queue.jobs.is_empty() {
                    queue.writing = false;
                    return;
                }
                std::mem::take(&mut queue.jobs)
            };
            let locked = File::options()
                .create(true)
                .append(true)
                .open(&lock_path)
                .and_then(|lock| lock.lock().map(|()| lock));
            match &locked {
                Ok(_lock) => jobs.into_iter().for_each(|job| job(Ok(self))),
                Err(e) => {
                    let why = format!("{}: {e}", lock_path.display());
                    jobs.into_iter().for_each(|job| job(Err(&why)));
                }
            }
            // `locked` is dropped here: closing the lock file releases the `flock`.
        }
    }

    /// Reads `lease`'s record; a missing file is a lease never granted.
    fn read(&self, lease: &LeaseName) -> Result<Record> {
        let path = self.path_of(lease);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Record::default()),
            Err(e) => return Err(io(&path, e)),
        };
        let record: Record = serde_json::from_slice(&text)
            .map_err(|e| Error::corrupt(STORE, lease, format!("not a leasehold record: {e}")))?;
        match &record.holder {
            Some(h) if h.term > record.last_term => Err(Error::corrupt(STORE, lease, "holder's term above last_term")),
            Some(h) if RecordVersion::parse(&h.version).is_none() => {
                Err(Error::corrupt(STORE, lease, "version is not 16 hex digits"))
            }
            _ => Ok(record),
        }
    }

    /// Reads `lease`, lets `change` decide, writes the record back if `change` says so. Only
    /// the writer thread calls it, holding the directory's `flock`.
    fn update<T>(&self, lease: &LeaseName, change: impl FnOnce(&mut Record) -> (T, bool)) -> Result<T> {
        let mut record = self.read(lease)?;
        let (answer, write) = change(&mut record);
        if write {
            let path = self.path_of(lease);
            let temporary = self.dir.join(format!(".tmp-{lease}"));
            let text = serde_json::to_vec(&record).map_err(|e| Error::store(STORE, e))?;
            fs::write(&temporary, text).map_err(|e| io(&temporary, e))?;
            fs::rename(&temporary, &path).map_err(|e| io(&path, e))?;
        }
        Ok(answer)
    }
}

impl Record {
    fn observation(&self, lease: &LeaseName) -> Observation {
        Observation {
            lease: lease.clone(),
            holder: self.holder.clone(),
            last_term: self.last_term,
            previous_end: if self.holder.is_none() { self.previous_end } else { None },
        }
    }

    /// Whether `grant` is the current holder's.
    fn holds(&self, grant: &Grant) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.id == grant.holder && h.term == grant.term)
    }

    /// Ends the current term (if any) for `reason`.
    fn end(&mut self, reason: EndReason) {
        if let Some(h) = self.holder.take() {
            if let Some(t) = self.history.iter_mut().rev().find(|t| t.term == h.term) {
                t.ended = Some((SystemTime::now(), reason));
            }
            self.previous_end = Some(reason);
        }
    }

    /// A new term for `request.candidate`.
    fn grant(&mut self, request: &AcquireRequest) -> Grant {
        self.last_term = Term(self.last_term.0 + 1);
        let holder = HolderInfo {
            id: request.candidate.clone(),
            term: self.last_term,
            ttl: request.ttl,
            version: RecordVersion::random().into(),
            store_remaining: None,
            orphaned: false,
            reserved: false,
        };
        self.history.push(Transition {
            term: holder.term,
            holder: holder.id.clone(),
            acquired_at: SystemTime::now(),
            ended: None,
        });
        let excess = self.history.len().saturating_sub(HISTORY_LIMIT);
        self.history.drain(..excess);
        let grant = grant_of(&request.lease, &holder);
        self.holder = Some(holder);
        grant
    }
}

fn grant_of(lease: &LeaseName, holder: &HolderInfo) -> Grant {
    Grant {
        lease: lease.clone(),
        holder: holder.id.clone(),
        term: holder.term,
        ttl: holder.ttl,
        token: holder.version.clone(),
    }
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::store(STORE, format!("{}: {e}", path.display()))
}

#[async_trait]
impl LeaseStore for DirStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            ttl: Duration::from_millis(100)..=Duration::from_secs(24 * 3600),
            expiry: Expiry::ObservedByContenders,
            notifications: Notifications::None,
            announces: leasehold_core::Announces::None,
            fifo: false,
        }
    }

    /// Takes a free lease; replaces the holder only when it is the candidate itself (a new,
    /// higher term) or `request.takeover` names the record's current version.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquired> {
        self.capabilities().check_ttl(STORE, request.ttl)?;
        let request = request.clone();
        self.write(&request.lease.clone(), move |record| {
            match &record.holder {
                None => {}
                Some(h) if h.id == request.candidate => record.end(EndReason::Expired),
                Some(h) if request.takeover.as_deref() == Some(h.version.as_str()) => record.end(EndReason::Expired),
                Some(_) => return (Acquired::Held(record.observation(&request.lease)), false),
            }
            (Acquired::Granted(record.grant(&request)), true)
        })
        .await
    }

    /// A new record version if the grant still holds the lease.
    async fn renew(&self, grant: &Grant) -> Result<Renewed> {
        let grant = grant.clone();
        self.write(&grant.lease.clone(), move |record| {
            if !record.holds(&grant) {
                return (Renewed::Lost(record.observation(&grant.lease)), false);
            }
            let holder = record.holder.as_mut().expect("holds() saw a holder");
            holder.version = RecordVersion::random().into();
            (Renewed::Renewed(grant_of(&grant.lease, holder)), true)
        })
        .await
    }

    async fn release(&self, grant: &Grant) -> Result<()> {
        let grant = grant.clone();
        self.write(&grant.lease.clone(), move |record| {
            let held = record.holds(&grant);
            if held {
                record.end(EndReason::Released);
            }
            ((), held)
        })
        .await
    }

    async fn inspect(&self, lease: &LeaseName) -> Result<Observation> {
        let lease = lease.clone();
        self.blocking(move |store| Ok(store.read(&lease)?.observation(&lease)))
            .await
    }

    async fn history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let lease = lease.clone();
        self.blocking(move |store| {
            let history = store.read(&lease)?.history;
            Ok(history[history.len().saturating_sub(limit)..].to_vec())
        })
        .await
    }

    /// The directory's `<lease>.json` files whose lease name starts with `prefix`, in name order.
    async fn list(&self, prefix: &str) -> Result<Vec<Observation>> {
        let prefix = prefix.to_string();
        self.blocking(move |store| {
            let entries = fs::read_dir(&*store.dir).map_err(|e| io(&store.dir, e))?;
            let mut leases = Vec::new();
            for entry in entries {
                let name = entry.map_err(|e| io(&store.dir, e))?.file_name();
                let Some(name) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                    continue;
                };
                if name.starts_with(prefix.as_str())
                    && let Ok(lease) = LeaseName::new(name)
                {
                    leases.push(lease);
                }
            }
            leases.sort();
            leases
                .iter()
                .map(|lease| Ok(store.read(lease)?.observation(lease)))
                .collect()
        })
        .await
    }

    async fn shard_records(&self, prefix: &str) -> Result<Vec<ShardRecord>> {
        let prefix = prefix.to_string();
        self.blocking(move |store| {
            let dir = store.dir.join(".shards");
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(io(&dir, e)),
            };
            let mut records = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| io(&dir, e))?;
                let file = entry.file_name();
                let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".json")) else {
                    continue;
                };
                let Ok(name) = LeaseName::new(name) else { continue };
                if name.as_str().starts_with(&prefix)
                    && let Some(record) = store.read_shard(&name)?
                {
                    records.push(record);
                }
            }
            records.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(records)
        })
        .await
    }

    async fn write_shard(&self, name: &LeaseName, expected: Option<&str>, value: &str) -> Result<ShardWrite> {
        let (name, expected, value) = (name.clone(), expected.map(str::to_string), value.to_string());
        self.locked(move |store| {
            let current = store.read_shard(&name)?;
            if current.as_ref().map(|r| r.version.as_str()) != expected.as_deref() {
                return Ok(ShardWrite::Conflict(current));
            }
            let version = format!("{:016x}", leasehold_core::random_u64());
            let file = ShardFile {
                version: version.clone(),
                value: value.clone(),
            };
            let path = store.shard_path(&name);
            let folder = store.dir.join(".shards");
            fs::create_dir_all(&folder).map_err(|e| io(&folder, e))?;
            let temporary = folder.join(format!(".tmp-{name}"));
            let text = serde_json::to_vec(&file).map_err(|e| Error::store(STORE, e))?;
            fs::write(&temporary, text).map_err(|e| io(&temporary, e))?;
            fs::rename(&temporary, &path).map_err(|e| io(&path, e))?;
            Ok(ShardWrite::Written(ShardRecord { name, version, value }))
        })
        .await
    }

    fn can_break(&self) -> bool {
        true
    }

    async fn break_lease(&self, lease: &LeaseName) -> Result<Option<Term>> {
        self.write(lease, |record| {
            let term = record.holder.as_ref().map(|h| h.term);
            record.end(EndReason::Broken);
            (term, term.is_some())
        })
        .await
    }
}
