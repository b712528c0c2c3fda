//! Change notifications through the file system: a follower in any process wakes when a lease it
//! waits for changes hands, instead of at its next poll.
//!
//! After every transaction that granted, renewed, released, handed over or broke a lease (never
//! after one of refused acquires only), the writer rewrites one byte of a small file next to the
//! database, `<file>-changes` (the [`Signal`]), once per transaction. It does so after the commit
//! returned, so whoever looks next sees the change. The file's directory is watched (inotify on
//! Linux, through `notify`) by one [`FileWatch`] per file and process, shared by every store on
//! it. A store's [`Notifier`], while somebody waits or follows, has a connection and a task of
//! its own: on an event it reads, in one statement, the rows of the leases its candidates wait
//! for or follow, and wakes whom a change of hands concerns: for a lease that became free, the
//! first live follower in its queue (`leasehold_waiters`, shared by every process, so every
//! store agrees on the one to wake); for a reservation, the successor it names. A grant or a
//! renewal wakes nobody: each new record version is announced to the lease's announcement
//! streams instead (the row as read after the commit).
//!
//! Why a file of our own rather than the database's `-wal`: a commit appends to the log and
//! *then* (after its sync) publishes itself in the shared-memory index, which produces no file
//! event. A reader woken by the log's last write can run before that and see nothing new, and
//! no further event would come. The signal is written after the commit is visible.
//!
//! A candidate is not woken by its own change (a leader that released learns nothing from it),
//! as on Postgres. Writes by anything other than leasehold-sqlite (the `sqlite3` shell, an older
//! release) send no signal: followers see them at their next poll; while the announcements run,
//! an idle follower's next request is its takeover attempt a TTL after the last version it saw
//! ([`Notifications::Release`]).
//!
//! The notifier never retries on its own: when the watcher cannot be created, subscribing answers
//! `None` (the engine polls); when a read fails, every stream ends (the engine polls) and the
//! next subscription starts a new watcher.
//!
//! [`Notifications::Release`]: leasehold_core::Notifications::Release

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};

use leasehold_core::{Announcements, CandidateId, Changes, LeaseName, Observation};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row, SqliteConnection};
use tokio::sync::{Mutex, oneshot, watch};
use tracing::debug;

use crate::record::Record;

/// The file whose writes say "a lease changed hands": `<database>-changes`, next to the
/// database (its path made canonical, so that every process names the same file).
#[derive(Clone, Debug)]
pub(crate) struct Signal {
    path: PathBuf,
}

impl Signal {
    /// The signal file of the database at `db` (which exists: the store has opened it).
    pub(crate) fn of(db: &Path) -> Signal {
        let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
        let mut path = db.into_os_string();
        path.push("-changes");
        Signal { path: path.into() }
    }

    /// Creates the file if it is missing, with the database's permissions, so that every process
    /// that may write the database may also signal.
    pub(crate) fn create(&self, db: &Path) {
        let created = OpenOptions::new().write(true).create_new(true).open(&self.path);
        match created {
            Ok(_) => {
                if let Err(e) =
                    std::fs::metadata(db).and_then(|m| std::fs::set_permissions(&self.path, m.permissions()))
                {
                    debug!(path = %self.path.display(), error = %e, "cannot give the change signal the database's permissions");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => debug!(path = %self.path.display(), error = %e, "cannot create the change signal file"),
        }
    }

    /// Tells every watcher that a lease may have changed (hands or version): rewrites the file's first byte.
    /// A failure only costs the watchers their wake-up (they poll), so it is logged, not returned.
    pub(crate) fn send(&self) {
        let sent = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .and_then(|mut file| file.write_all(b"\n"));
        if let Err(e) = sent {
            debug!(path = %self.path.display(), error = %e, "cannot signal a change; watchers will poll");
        }
    }

    fn file_name(&self) -> Option<OsString> {
        self.path.file_name().map(ToOwned::to_owned)
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// What a waiter compares of a lease row: who holds it, at which term, how the last term ended.
/// Not the record version, which every renewal changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hands {
    /// The holder, or for a reservation the successor it names.
    holder: Option<String>,
    reserved: bool,
    /// The holder, term and end as SQLite quotes them: any change of these is a change of hands,
    /// also in a row leasehold cannot read (the waiter then reads the error itself).
    key: String,
}

/// A watched lease's row as one read showed it.
#[derive(Debug)]
struct ReadRow {
    hands: Hands,
    /// The row as [`inspect`](leasehold_core::LeaseStore::inspect) shows it; `None` when it
    /// cannot be decoded (nothing is announced; readers get the error themselves).
    seen: Option<Observation>,
}

/// One lease somebody waits for or follows.
#[derive(Debug)]
struct Watched {
    /// The row as last read (`None`: no row).
    hands: Option<Hands>,
    /// The row as last read, decoded.
    seen: Option<Observation>,
    /// One channel per waiting candidate; the value counts wake-ups.
    waiters: HashMap<String, watch::Sender<u64>>,
    /// Each grant and renewal read since the first subscription: the announcement streams.
    announced: watch::Sender<Option<Observation>>,
}

impl Watched {
    fn new(row: Option<ReadRow>) -> Watched {
        let (hands, seen) = row.map_or((None, None), |row| (Some(row.hands), row.seen));
        Watched {
            hands,
            seen,
            waiters: HashMap::new(),
            announced: watch::channel(None).0,
        }
    }

    /// Whether any stream still listens.
    fn wanted(&self) -> bool {
        !self.waiters.is_empty() || self.announced.receiver_count() > 0
    }

    /// Takes the row as read now: wakes a waiter if it changed hands, announces it if it names
    /// a holder with a record version not announced (or read) before. `queue`: the lease's
    /// waiters in every process, first first, when it was read (the lease became free).
    fn update(&mut self, now: Option<ReadRow>, queue: Option<&[(String, i64)]>) {
        let (hands, seen) = now.map_or((None, None), |row| (Some(row.hands), row.seen));
        if hands != self.hands {
            self.wake(self.hands.as_ref(), hands.as_ref(), queue);
            self.hands = hands;
        }
        if seen != self.seen {
            let version =
                |o: &Option<Observation>| o.as_ref().and_then(|o| o.holder.as_ref()).map(|h| h.version.clone());
            if let Some(new) = seen
                .as_ref()
                .filter(|_| version(&seen).is_some() && version(&seen) != version(&self.seen))
            {
                self.announced.send_replace(Some(new.clone()));
            }
            self.seen = seen;
        }
    }
}

impl Watched {
    /// Wakes whom a change of the row from `before` to `now` concerns, never the candidate that
    /// made it: for a reservation, the successor it names; for a lease that became free
    /// (released, broken, a row leasehold cannot read), the first live waiter of `queue` (every
    /// process's waiters, longest first) other than the holder that let it go, if it waits
    /// here, or every waiter here when the queue could not be read. A grant wakes nobody:
    /// followers learn of it from the announcements.
    fn wake(&self, before: Option<&Hands>, now: Option<&Hands>, queue: Option<&[(String, i64)]>) {
        let ring = |candidate: &str| {
            if let Some(tx) = self.waiters.get(candidate) {
                tx.send_modify(|n| *n += 1);
            }
        };
        match now {
            Some(h) if h.reserved => {
                if let Some(successor) = h.holder.as_deref() {
                    ring(successor);
                }
            }
            Some(h) if h.holder.is_some() => {}
            _ => {
                let let_go = before.filter(|h| !h.reserved).and_then(|h| h.holder.as_deref());
                let others = |candidate: &&str| Some(*candidate) != let_go;
                match queue {
                    Some(queue) => {
                        let first = queue
                            .iter()
                            .find(|(candidate, pid)| others(&candidate.as_str()) && alive(*pid));
                        if let Some((candidate, pid)) = first
                            && *pid == own_pid()
                        {
                            ring(candidate);
                        }
                    }
                    None => self.waiters.keys().map(String::as_str).filter(others).for_each(ring),
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    leases: HashMap<String, Watched>,
    running: Option<Running>,
    /// How many watchers were started.
    started: u64,
    /// The store was closed: no more subscriptions.
    closed: bool,
}

impl Shared {
    /// Forgets the waiters whose streams were dropped, and the leases nobody waits for; answers
    /// the waiters forgotten, `(lease, candidate)`.
    fn prune(&mut self) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        self.leases.retain(|name, watched| {
            watched.waiters.retain(|candidate, tx| {
                let live = tx.receiver_count() > 0;
                if !live {
                    gone.push((name.clone(), candidate.clone()));
                }
                live
            });
            watched.wanted()
        });
        gone
    }
}

/// A store's share of the file watcher, its connection and its task; the task ends when this
/// is dropped.
#[derive(Debug)]
struct Running {
    /// Tells this watcher's task from an earlier one's.
    generation: u64,
    conn: SqliteConnection,
    _watch: Arc<FileWatch>,
    _stop: oneshot::Sender<()>,
}

/// The notification side of a store.
pub(crate) struct Notifier {
    shared: Arc<Mutex<Shared>>,
    signal: Signal,
    options: SqliteConnectOptions,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("signal", &self.signal)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// The notifier of the database that `options` open. Its connection writes only the queue
    /// of waiters (`leasehold_waiters`), which orders wake-ups and nothing else, so its commits
    /// are not synced to disk one by one (`synchronous=NORMAL`, whatever the store's setting):
    /// a follower joining the queue then costs no fsync, and a hundred followers subscribing at
    /// once no longer wait up to 2 s behind each other's syncs (each settles, and makes its
    /// first attempts, before the leader's first resignation).
    pub(crate) fn new(signal: Signal, options: SqliteConnectOptions) -> Notifier {
        Notifier {
            shared: Arc::default(),
            signal,
            options: options.synchronous(SqliteSynchronous::Normal),
        }
    }

    /// A stream that yields when `lease` changes hands by someone other than `candidate`, or
    /// `None` when the file system cannot be watched.
    ///
    /// The row is read before this returns, with the watch already in place: a change made
    /// afterwards wakes the stream, so a caller that looks at the lease after subscribing misses
    /// nothing.
    ///
    /// # Errors
    ///
    /// The SQL error of reading the row; [`sqlx::Error::PoolClosed`] once the store is closed.
    pub(crate) async fn changes(
        &self,
        lease: &LeaseName,
        candidate: &CandidateId,
    ) -> Result<Option<Changes>, sqlx::Error> {
        let rx = self
            .with_watched(lease, Some(candidate), |watched| {
                watched
                    .waiters
                    .entry(candidate.as_str().to_string())
                    .or_insert_with(|| watch::channel(0).0)
                    .subscribe()
            })
            .await?;
        Ok(rx.map(|rx| {
            leasehold_core::notifications(futures::stream::unfold(rx, |mut rx| async move {
                rx.changed().await.ok().map(|()| ((), rx))
            }))
        }))
    }

    /// Every grant and renewal of `lease` that this process's watcher reads from now on (one
    /// read per signal, shared by every follower of the store), or `None` when the file system
    /// cannot be watched. A subscriber that falls behind sees the latest.
    ///
    /// # Errors
    ///
    /// As [`Notifier::changes`].
    pub(crate) async fn announcements(&self, lease: &LeaseName) -> Result<Option<Announcements>, sqlx::Error> {
        let rx = self
            .with_watched(lease, None, |watched| watched.announced.subscribe())
            .await?;
        Ok(rx.map(|mut rx| {
            rx.mark_unchanged();
            leasehold_core::watched_announcements(rx)
        }))
    }

    /// Runs `f` on the watched entry of `lease`, starting the watcher and reading the row first
    /// if needed (the watch is in place before the read: a change made afterwards is seen).
    /// `None` when the file system cannot be watched. A `waiter` not yet waiting here joins the
    /// lease's queue of waiters (`leasehold_waiters`) first.
    async fn with_watched<R>(
        &self,
        lease: &LeaseName,
        waiter: Option<&CandidateId>,
        f: impl FnOnce(&mut Watched) -> R,
    ) -> Result<Option<R>, sqlx::Error> {
        let mut guard = self.shared.lock().await;
        let shared = &mut *guard;
        if shared.closed {
            return Err(sqlx::Error::PoolClosed);
        }
        if shared.running.is_none() {
            shared.started += 1;
            match self.start(shared.started).await {
                Ok(running) => shared.running = Some(running),
                Err(why) => {
                    debug!(signal = %self.signal.path.display(), error = %why, "cannot watch the lease file; followers poll");
                    return Ok(None);
                }
            }
        }
        let gone = shared.prune();
        let conn = &mut shared.running.as_mut().expect("started above").conn;
        forget(conn, &gone).await;
        let watched = match shared.leases.entry(lease.as_str().to_string()) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut rows = read(conn, &[lease.as_str()]).await?;
                entry.insert(Watched::new(rows.remove(lease.as_str())))
            }
        };
        if let Some(waiter) = waiter
            && !watched.waiters.contains_key(waiter.as_str())
        {
            join(conn, lease.as_str(), waiter.as_str()).await?;
        }
        Ok(Some(f(watched)))
    }

    /// Ends every subscription and stops the watcher (the store was closed).
    pub(crate) async fn close(&self) {
        let mut shared = self.shared.lock().await;
        shared.closed = true;
        let gone: Vec<(String, String)> = shared
            .leases
            .iter()
            .flat_map(|(name, watched)| watched.waiters.keys().map(|c| (name.clone(), c.clone())))
            .collect();
        shared.leases.clear();
        if let Some(mut running) = shared.running.take() {
            forget(&mut running.conn, &gone).await;
            let _ = running.conn.close().await;
        }
    }

    /// Joins the process's watcher of the signal file and opens the connection that reads the
    /// rows.
    async fn start(&self, generation: u64) -> Result<Running, Box<dyn std::error::Error + Send + Sync>> {
        let watch = FileWatch::of(&self.signal)?;
        // Subscribed before any row is read: an event from now on is seen.
        let events = watch.events.subscribe();
        let conn = self.options.connect().await?;
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(follow(Arc::downgrade(&self.shared), generation, events, stopped));
        Ok(Running {
            generation,
            conn,
            _watch: watch,
            _stop: stop,
        })
    }
}

/// The file watchers of this process, one per signal file, shared by every store on that file.
static WATCHES: LazyLock<std::sync::Mutex<HashMap<PathBuf, Weak<FileWatch>>>> = LazyLock::new(Default::default);

/// One watcher (one inotify instance and thread on Linux) of a signal file's directory; the
/// watch ends when the last store using it lets go.
struct FileWatch {
    /// Counts the signal file's events; receivers see that it changed.
    events: Arc<watch::Sender<u64>>,
    _watcher: RecommendedWatcher,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch").finish_non_exhaustive()
    }
}

impl FileWatch {
    /// The process's watcher of `signal`, started if there is none.
    fn of(signal: &Signal) -> Result<Arc<FileWatch>, Box<dyn std::error::Error + Send + Sync>> {
        let mut watches = WATCHES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        watches.retain(|_, watch| watch.strong_count() > 0);
        if let Some(watch) = watches.get(&signal.path).and_then(Weak::upgrade) {
            return Ok(watch);
        }
        let name = signal.file_name().ok_or("the signal file has no name")?;
        let events = Arc::new(watch::channel(0_u64).0);
        let tx = Arc::clone(&events);
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                Ok(event) => event.need_rescan() || event.paths.iter().any(|p| p.file_name() == Some(&name)),
                // Events may have been lost: look.
                Err(_) => true,
            };
            if relevant {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        })?;
        watcher.watch(&signal.dir(), RecursiveMode::NonRecursive)?;
        let watch = Arc::new(FileWatch {
            events,
            _watcher: watcher,
        });
        watches.insert(signal.path.clone(), Arc::downgrade(&watch));
        Ok(watch)
    }
}

/// The watcher's task: on each event, reads the rows of the watched leases and wakes the waiters
/// of those that changed hands. Ends when the store is dropped, when nobody waits any more, or
/// when a read fails (every stream then ends).
async fn follow(
    shared: Weak<Mutex<Shared>>,
    generation: u64,
    mut events: watch::Receiver<u64>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        // Events that come while a read is under way collapse into one more read.
        tokio::select! {
            biased;
            // The store stopped this watcher (its `Running` was dropped).
            _ = &mut stopped => return,
            changed = events.changed() => if changed.is_err() {
                return;
            },
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut guard = shared.lock().await;
        let shared = &mut *guard;
        // Replaced meanwhile: not ours to handle.
        if shared.running.as_ref().is_none_or(|r| r.generation != generation) {
            return;
        }
        let gone = shared.prune();
        let running = shared.running.as_mut().expect("checked above");
        forget(&mut running.conn, &gone).await;
        if shared.leases.is_empty() {
            shared.running = None;
            return;
        }
        let names: Vec<&str> = shared.leases.keys().map(String::as_str).collect();
        match read(&mut running.conn, &names).await {
            Ok(mut rows) => {
                // The leases that became free and have waiters here: whom to wake is the first
                // live waiter of every process.
                let freed: Vec<&str> = shared
                    .leases
                    .iter()
                    .filter(|(name, watched)| {
                        let now = rows.get(name.as_str()).map(|row| &row.hands);
                        !watched.waiters.is_empty()
                            && now != watched.hands.as_ref()
                            && now.is_none_or(|h| h.holder.is_none())
                    })
                    .map(|(name, _)| name.as_str())
                    .collect();
                let queues = if freed.is_empty() {
                    Some(HashMap::new())
                } else {
                    match queues(&mut running.conn, &freed).await {
                        Ok(queues) => Some(queues),
                        Err(e) => {
                            debug!(error = %e, "reading the waiters failed; waking every waiter of a freed lease");
                            None
                        }
                    }
                };
                for (name, watched) in &mut shared.leases {
                    let queue = queues
                        .as_ref()
                        .map(|queues| queues.get(name).map_or(&[][..], Vec::as_slice));
                    watched.update(rows.remove(name.as_str()), queue);
                }
            }
            Err(e) => {
                debug!(error = %e, "reading the watched leases failed; followers poll");
                // Ends every stream: the engine polls, and its next campaign subscribes anew.
                shared.leases.clear();
                shared.running = None;
                return;
            }
        }
    }
}

/// This process's id, as `leasehold_waiters.pid` records it.
fn own_pid() -> i64 {
    i64::from(std::process::id())
}

/// Whether process `pid` of this machine runs (where `/proc` tells; elsewhere assumed). A
/// waiter wrongly taken for live costs a TTL (the followers' own timers), never safety.
fn alive(pid: i64) -> bool {
    if pid == own_pid() {
        return true;
    }
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Puts `candidate` in the queue of `lease`'s waiters (keeping its place if it is there).
async fn join(conn: &mut SqliteConnection, lease: &str, candidate: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO leasehold_waiters (name, candidate, pid, since)
         VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(since), 0) + 1 FROM leasehold_waiters))
         ON CONFLICT (name, candidate) DO UPDATE SET pid = excluded.pid",
    )
    .bind(lease)
    .bind(candidate)
    .bind(own_pid())
    .execute(conn)
    .await?;
    Ok(())
}

/// Takes this process's `gone` waiters out of their queues; a failure leaves a row that the
/// next release may pick (its wake-up then falls to the followers' timers).
async fn forget(conn: &mut SqliteConnection, gone: &[(String, String)]) {
    for (lease, candidate) in gone {
        let deleted = sqlx::query("DELETE FROM leasehold_waiters WHERE name = ?1 AND candidate = ?2 AND pid = ?3")
            .bind(lease)
            .bind(candidate)
            .bind(own_pid())
            .execute(&mut *conn)
            .await;
        if let Err(e) = deleted {
            debug!(error = %e, "cannot leave the queue of waiters");
        }
    }
}

/// The waiters of each of `names`, `(candidate, pid)`, longest waiting first, in one statement.
async fn queues(
    conn: &mut SqliteConnection,
    names: &[&str],
) -> Result<HashMap<String, Vec<(String, i64)>>, sqlx::Error> {
    let list = format!(
        "[{}]",
        names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(",")
    );
    let rows = sqlx::query(
        "SELECT w.name, w.candidate, w.pid
         FROM json_each(?1) AS wanted JOIN leasehold_waiters AS w ON w.name = wanted.value
         ORDER BY w.since",
    )
    .bind(list)
    .fetch_all(conn)
    .await?;
    let mut queues: HashMap<String, Vec<(String, i64)>> = HashMap::new();
    for row in &rows {
        queues
            .entry(row.try_get(0)?)
            .or_default()
            .push((row.try_get(1)?, row.try_get(2)?));
    }
    Ok(queues)
}

/// The rows of `names` that exist, in one statement.
async fn read(conn: &mut SqliteConnection, names: &[&str]) -> Result<HashMap<String, ReadRow>, sqlx::Error> {
    // Lease names are ASCII letters, digits, '-', '_' and '.': nothing to escape in JSON.
    let list = format!(
        "[{}]",
        names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(",")
    );
    let rows = sqlx::query(
        "SELECT l.name,
                CASE WHEN typeof(l.holder) = 'text' THEN l.holder END,
                l.holder IS NOT NULL AND l.previous_end IS 'handed_over',
                quote(l.holder) || ' ' || quote(l.term) || ' ' || quote(l.previous_end),
                l.holder, l.term, l.ttl_ms, l.version, l.previous_end,
                (SELECT MAX(t.term) FROM leasehold_terms AS t WHERE t.name = l.name),
                1
         FROM json_each(?1) AS wanted JOIN leasehold_leases AS l ON l.name = wanted.value",
    )
    .bind(list)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let name = row.try_get::<String, _>(0)?;
            let seen = LeaseName::new(name.as_str())
                .ok()
                .and_then(|lease| Some(Record::decode(&lease, row, 4).ok()?.observation(&lease)));
            Ok((
                name,
                ReadRow {
                    hands: Hands {
                        holder: row.try_get(1)?,
                        reserved: row.try_get(2)?,
                        key: row.try_get(3)?,
                    },
                    seen,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue of waiters is written without a sync per commit, even when the store syncs
    /// every commit of its leases (the default, `synchronous=FULL`). Without it, each follower's
    /// subscription waited for a disk sync behind every other's (100 followers: up to 2 s).
    #[tokio::test]
    async fn the_queue_of_waiters_is_written_without_a_sync_per_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        // Creates the tables.
        crate::SqliteStore::open(&path).await.unwrap();
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .synchronous(SqliteSynchronous::Full);
        let notifier = Notifier::new(Signal::of(&path), options);
        let lease: LeaseName = "jobs".parse().unwrap();
        let candidate: CandidateId = "b".parse().unwrap();
        let _changes = notifier.changes(&lease, &candidate).await.unwrap().expect("watched");
        let mut shared = notifier.shared.lock().await;
        let conn = &mut shared.running.as_mut().expect("started").conn;
        let queued: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM leasehold_waiters WHERE candidate = 'b'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(queued, 1, "b joined the queue");
        // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(synchronous, 1, "the notifier's connection runs synchronous=NORMAL");
    }
}
