//! The lock session: one connection per store that never returns to a pool, owned by one task
//! that serves the store's acquires, renewals and releases from a queue. It holds the named lock
//! (`GET_LOCK`) of every lease the store holds; the server frees them all when the session ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireRequest, Acquired, Error, Grant, LeaseName, Renewed, Result};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::MysqlConfig;
use crate::error::{self, STORE};
use crate::statements::{
    Failure, Session, acquire_many, clone_error, configure_lock_session, query, release, renew, timed, unlock,
};

/// Renewals per statement.
const MAX_RENEWALS: usize = 200;

/// Acquires sent in one packet (each for another lease) before the queue is looked at again, so
/// that renewals and releases that arrive while many acquires wait are not held up behind all
/// of them.
const ACQUIRES_PER_ROUND: usize = 16;

/// What the store's tasks share: the config and the driver's options.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) config: MysqlConfig,
}

impl Context {
    fn options(&self) -> MySqlConnectOptions {
        self.config.connect_options()
    }
}

type Reply<T> = oneshot::Sender<Result<T>>;

enum Command {
    Acquire(AcquireRequest, Reply<Acquired>),
    /// Renewals queued together, so that they share statements.
    Renew(Vec<(Grant, Reply<Renewed>)>),
    Release(Grant, Reply<()>),
}

/// The handle of the lock session's task; the task ends (and the session with it) when every
/// handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct LockSession {
    commands: mpsc::UnboundedSender<Command>,
}

fn gone() -> Error {
    Error::unreachable(STORE, "the lock session task has stopped (its tokio runtime shut down)")
}

impl LockSession {
    /// Starts the task on the current tokio runtime with `conn` as its first lock connection.
    pub(crate) fn spawn(cx: Arc<Context>, conn: MySqlConnection) -> LockSession {
        let (commands, queue) = mpsc::unbounded_channel();
        let actor = Actor {
            cx,
            session: Some(Session::new(conn)),
            acquires: VecDeque::new(),
            renewals: Vec::new(),
            releases: VecDeque::new(),
        };
        tokio::spawn(actor.run(queue));
        LockSession { commands }
    }

    pub(crate) async fn acquire(&self, request: AcquireRequest) -> Result<Acquired> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Acquire(request, reply))
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The answers in order.
    pub(crate) async fn renew_many(&self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let (requests, answers): (Vec<_>, Vec<_>) = grants
            .iter()
            .map(|grant| {
                let (reply, answer) = oneshot::channel();
                ((grant.clone(), reply), answer)
            })
            .unzip();
        self.commands.send(Command::Renew(requests)).map_err(|_| gone())?;
        let mut renewals = Vec::with_capacity(answers.len());
        for answer in answers {
            renewals.push(answer.await.unwrap_or_else(|_| Err(gone())));
        }
        Ok(renewals)
    }

    pub(crate) async fn release(&self, grant: Grant) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Release(grant, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

struct Actor {
    cx: Arc<Context>,
    session: Option<Session>,
    acquires: VecDeque<(AcquireRequest, Reply<Acquired>)>,
    renewals: Vec<(Grant, Reply<Renewed>)>,
    releases: VecDeque<(Grant, Reply<()>)>,
}

impl Actor {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.acquires.is_empty() && self.renewals.is_empty() && self.releases.is_empty() {
                match commands.recv().await {
                    Some(command) => self.queue(command),
                    None => break,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.queue(command);
            }
            self.forget_silent_session();
            self.expire_abandoned().await;
            while let Some((grant, reply)) = self.releases.pop_front() {
                // Always carried out, even when the caller gave up: it only frees the lease.
                let result = self.release(&grant).await;
                let _ = reply.send(result);
            }
            while !self.renewals.is_empty() {
                let take = self.renewals.len().min(MAX_RENEWALS);
                let batch: Vec<_> = self.renewals.drain(..take).collect();
                let grants: Vec<Grant> = batch.iter().map(|(g, _)| g.clone()).collect();
                match self.renew(&grants).await {
                    Ok(answers) => {
                        for ((_, reply), answer) in batch.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(e) => {
                        for (_, reply) in batch {
                            let _ = reply.send(Err(clone_error(&e)));
                        }
                    }
                }
            }
            let mut batch: Vec<(AcquireRequest, Reply<Acquired>)> = Vec::new();
            let mut later = VecDeque::new();
            while batch.len() < ACQUIRES_PER_ROUND
                && let Some((request, reply)) = self.acquires.pop_front()
            {
                if reply.is_closed() {
                    continue; // nobody waits for it: not sent, nothing applied
                }
                if batch.iter().any(|(r, _)| r.lease == request.lease) {
                    later.push_back((request, reply)); // one acquire per lease and packet
                } else {
                    batch.push((request, reply));
                }
            }
            later.append(&mut self.acquires);
            self.acquires = later;
            if !batch.is_empty() {
                let requests: Vec<AcquireRequest> = batch.iter().map(|(r, _)| r.clone()).collect();
                match self.acquire_many(&requests).await {
                    Ok(answers) => {
                        for ((_, reply), answer) in batch.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(e) => {
                        for (_, reply) in batch {
                            let _ = reply.send(Err(clone_error(&e)));
                        }
                    }
                }
            }
        }
        // Every store handle is gone: closing the connection ends the session and its locks.
        if let Some(session) = self.session.take() {
            let _ = session.conn.close().await;
        }
    }

    fn queue(&mut self, command: Command) {
        match command {
            Command::Acquire(request, reply) => self.acquires.push_back((request, reply)),
            Command::Renew(renewals) => self.renewals.extend(renewals),
            Command::Release(grant, reply) => self.releases.push_back((grant, reply)),
        }
    }

    /// A session that said nothing for its whole `wait_timeout` has been ended by the server (or
    /// will be before the next statement arrives): forget it instead of failing a request on it.
    fn forget_silent_session(&mut self) {
        let Some(session) = &self.session else { return };
        let limit = Duration::from_secs(session.wait_timeout);
        if !limit.is_zero() && session.last_used.elapsed() + limit / 20 >= limit {
            warn!(
                held = session.held.len(),
                idle = ?session.last_used.elapsed(),
                "the lock session was silent for its wait_timeout; its locks are gone"
            );
            self.session = None;
        }
    }

    /// Gives back the lock of every grant nobody renewed for a whole TTL (an elector dropped,
    /// or one whose renewals failed while the session went on serving the store's other
    /// leases): its holder no longer believes in it, and while the session lives nothing else
    /// would free it. The row still names the holder, so contenders see it orphaned and take it
    /// over by its record version.
    async fn expire_abandoned(&mut self) {
        let Some(session) = &self.session else { return };
        let stale: Vec<LeaseName> = session
            .held
            .iter()
            .filter(|(_, h)| h.confirmed.elapsed() >= h.ttl)
            .map(|(lease, _)| lease.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let Ok((mut session, limit)) = self.begin(None).await else {
            return;
        };
        let mut result = Ok(());
        for lease in &stale {
            debug!(%lease, "giving back the lock of a grant nobody renewed for its TTL");
            if let Err(failure) = unlock(&mut session, lease, limit).await {
                result = Err(failure);
                break;
            }
        }
        let _ = self.finish(session, limit, "renew", result).await;
    }

    /// Takes the session (connecting one if needed) and the bound on its statements: half the
    /// shortest TTL the session holds or is asked for (a session that cannot answer within that
    /// cannot keep its shortest lease anyway).
    async fn begin(&mut self, ttl: Option<Duration>) -> Result<(Session, Duration)> {
        let shortest = self
            .session
            .as_ref()
            .and_then(|s| s.held.values().map(|h| h.ttl).min())
            .into_iter()
            .chain(ttl)
            .min();
        let limit = shortest.map_or(self.cx.config.connect_timeout(), |ttl| ttl / 2);
        let session = match self.session.take() {
            Some(session) => session,
            None => self.connect(limit).await?,
        };
        Ok((session, limit))
    }

    /// Puts the session back after `result`, unless it failed in a way that leaves the session
    /// untrustworthy: then it is dropped, and with it every lock it held. Sets `wait_timeout` to
    /// the shortest TTL held (rounded up to whole seconds, as the server counts).
    async fn finish<T>(
        &mut self,
        mut session: Session,
        limit: Duration,
        operation: &'static str,
        result: Result<T, Failure>,
    ) -> Result<T> {
        if let Err(failure) = &result
            && failure.ends_session()
        {
            warn!(error = ?failure, held = session.held.len(), "the lock session failed; its locks are gone");
            return result.map_err(|f| f.into_error(operation));
        }
        session.last_used = Instant::now();
        let wanted = session
            .held
            .values()
            .map(|h| u64::try_from(h.ttl.as_millis().div_ceil(1000)).unwrap_or(u64::MAX))
            .min()
            .unwrap_or(0);
        if wanted != session.wait_timeout {
            // 0: nothing held; the server's default (hours) is then harmless.
            let seconds = if wanted == 0 { 28_800 } else { wanted };
            let set = timed(
                limit,
                query(format!("SET SESSION wait_timeout = {seconds}")).execute(&mut session.conn),
            )
            .await;
            match set {
                Ok(_) => {
                    session.wait_timeout = wanted;
                    session.last_used = Instant::now();
                }
                Err(failure) => {
                    warn!(error = ?failure, "cannot set the lock session's wait_timeout; dropping the session");
                    return Err(failure.into_error(operation));
                }
            }
        }
        self.session = Some(session);
        result.map_err(|f| f.into_error(operation))
    }

    async fn release(&mut self, grant: &Grant) -> Result<()> {
        let (mut session, limit) = self.begin(Some(grant.ttl)).await?;
        let result = release(&mut session, grant, limit).await;
        self.finish(session, limit, "release", result).await
    }

    async fn renew(&mut self, grants: &[Grant]) -> Result<Vec<Result<Renewed>>> {
        let (mut session, limit) = self.begin(grants.iter().map(|g| g.ttl).min()).await?;
        let result = renew(&mut session, grants, limit).await;
        self.finish(session, limit, "renew", result).await
    }

    async fn acquire_many(&mut self, requests: &[AcquireRequest]) -> Result<Vec<Result<Acquired>>> {
        let (mut session, limit) = self.begin(requests.iter().map(|r| r.ttl).min()).await?;
        let history_limit = self.cx.config.history_limit();
        let result = acquire_many(&mut session, history_limit, requests, limit).await;
        self.finish(session, limit, "acquire", result).await
    }

    async fn connect(&mut self, limit: Duration) -> Result<Session> {
        let limit = limit.min(self.cx.config.connect_timeout());
        let endpoint = self.cx.config.endpoint();
        match tokio::time::timeout(limit, MySqlConnection::connect_with(&self.cx.options())).await {
            Ok(Ok(mut conn)) => {
                configure_lock_session(&mut conn, limit)
                    .await
                    .map_err(|f| f.into_error("connect"))?;
                debug!("lock session connected");
                Ok(Session::new(conn))
            }
            Ok(Err(e)) => Err(error::map_connect(&e, &endpoint, limit)),
            Err(_) => Err(error::connect_timeout(&endpoint, limit)),
        }
    }
}
