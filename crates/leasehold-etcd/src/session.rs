//! The connection and the sessions: how one request is sent (and its failure mapped), how
//! `connect` checks the endpoints, and one etcd lease per TTL (whole seconds), shared by every
//! election of the store, with the keepalives that keep it. Keepalives coalesce: one sent after
//! a caller began serves that caller and every other that began before it was sent.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, KvClient, Txn, TxnResponse};
use leasehold_core::{Error, Result};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::error::{CONNECT, RequestError, STORE, lease_gone, map, map_connect};
use crate::state::{Inner, Session};

/// The keys bound to a live session, and its id.
pub(crate) type SessionKeys = (i64, Arc<HashSet<Vec<u8>>>);

impl Inner {
    /// Runs one etcd request of the engine's (the engine bounds it).
    ///
    /// Every etcd request goes through here (or [`Inner::call_unless_lease_gone`]), which puts
    /// the request's future on the heap when it is made: etcd-client's futures are large (a
    /// keepalive's is several KB), and a caller that holds one inline carries that size for as
    /// long as it lives, even while it only waits for a lock (10,000 renewals waiting for the
    /// shared keepalive round took about 14 KB each).
    pub(crate) fn call<'a, T: 'a>(
        &'a self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>> + 'a,
    ) -> impl Future<Output = Result<T>> + 'a {
        let fut = Box::pin(fut);
        async move { fut.await.map_err(|e| map(&e, operation, &self.endpoints)) }
    }

    /// Runs one etcd request that names an etcd lease; `None` when etcd says that lease is gone.
    pub(crate) fn call_unless_lease_gone<'a, T: 'a>(
        &'a self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>> + 'a,
    ) -> impl Future<Output = Result<Option<T>>> + 'a {
        let fut = Box::pin(fut);
        async move {
            match fut.await {
                Ok(answer) => Ok(Some(answer)),
                Err(e) if lease_gone(&e) => Ok(None),
                Err(e) => Err(map(&e, operation, &self.endpoints)),
            }
        }
    }

    /// Runs one request the store makes on its own, which many callers may wait for (a
    /// session's keepalive round): at once, bypassing admission, and bounded by `limit`.
    /// `None` when etcd says the lease it names is gone.
    pub(crate) fn call_shared<'a, T: 'a>(
        &'a self,
        operation: &'static str,
        limit: Duration,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>> + 'a,
    ) -> impl Future<Output = Result<Option<T>>> + 'a {
        let call = self.call_unless_lease_gone(operation, fut);
        async move {
            tokio::time::timeout(limit, call).await.unwrap_or(Err(Error::Timeout {
                store: STORE,
                operation,
                after: limit,
            }))
        }
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The key-value part of the client, for transactions and reads: a clone of the whole
    /// client copies eight service clients and the options, a cost on the way of every request
    /// (a release's, before the successor's grant).
    pub(crate) fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    pub(crate) async fn txn(&self, operation: &'static str, txn: Txn) -> Result<TxnResponse> {
        let mut client = self.kv();
        self.call(operation, async move { client.txn(txn).await }).await
    }

    /// A transaction that only reads, sent once more at once when it failed for a reason that
    /// may pass (its connection broke, etcd had no leader): bytes lost in between (replies
    /// dropped by a network fault) leave an HTTP/2 connection undecodable, and the requests
    /// under way when the client hears of it fail although the network works again; the client
    /// connects afresh for the second copy. Reading twice is harmless, and a read-back that
    /// fails for this reason would leave a grant whose reply was lost unrecognised.
    pub(crate) async fn read_txn(&self, operation: &'static str, txn: Txn) -> Result<TxnResponse> {
        let mut client = self.kv();
        let again = txn.clone();
        match self.call(operation, async move { client.txn(txn).await }).await {
            Ok(answer) => return Ok(answer),
            Err(error) => {
                if !error.is_transient() {
                    return Err(error);
                }
                tracing::debug!(operation, %error, "etcd read failed; reading again");
            }
        }
        let mut client = self.kv();
        self.call(operation, async move { client.txn(again).await }).await
    }

    /// A transaction that binds a key to an etcd lease; `None` when that lease is gone.
    pub(crate) async fn txn_unless_lease_gone(&self, operation: &'static str, txn: Txn) -> Result<Option<TxnResponse>> {
        let mut client = self.kv();
        self.call_unless_lease_gone(operation, async move { client.txn(txn).await })
            .await
    }

    pub(crate) async fn get(
        &self,
        operation: &'static str,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse> {
        let mut client = self.kv();
        self.call(operation, async move { client.get(key, options).await })
            .await
    }

    fn slot(&self, ttl_secs: i64) -> Arc<AsyncMutex<Option<Session>>> {
        let mut sessions = self.sessions.lock().expect("sessions lock");
        sessions.entry(ttl_secs).or_default().clone()
    }

    /// The session for this TTL, granted if there is none.
    pub(crate) async fn session(&self, ttl_secs: i64) -> Result<i64> {
        if let Some(id) = self.current.lock().expect("current lock").get(&ttl_secs) {
            return Ok(*id);
        }
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if let Some(s) = &*session {
            return Ok(s.id);
        }
        let sent = Instant::now();
        let mut client = self.client();
        let granted = self
            .call("lease grant", async move { client.lease_grant(ttl_secs, None).await })
            .await?;
        *session = Some(Session {
            id: granted.id(),
            confirmed: sent,
            keys: None,
        });
        self.current
            .lock()
            .expect("current lock")
            .insert(ttl_secs, granted.id());
        Ok(granted.id())
    }

    /// The session of this TTL, made sure to have been refreshed by a keepalive *sent* at or
    /// after `since`. `None` when the session has expired (its keys are gone); the next
    /// [`Inner::session`] grants a new one.
    pub(crate) async fn refreshed_since(self: &Arc<Self>, ttl_secs: i64, since: Instant) -> Result<Option<i64>> {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        self.refresh_locked(&mut session, ttl_secs, since).await
    }

    async fn refresh_locked(
        self: &Arc<Self>,
        session: &mut Option<Session>,
        ttl_secs: i64,
        since: Instant,
    ) -> Result<Option<i64>> {
        let Some(current) = session.clone() else {
            return Ok(None);
        };
        if current.confirmed >= since {
            return Ok(Some(current.id));
        }
        let mut client = self.client();
        // A round many callers wait for must end; one later than a third of the TTL is of no
        // use to any of them.
        let limit = self.config.timeout.min(third_of(ttl_secs));
        let sent = Instant::now();
        let kept = self
            .call_shared("lease keepalive", limit, async move {
                client.lease_keep_alive(current.id).await
            })
            .await?;
        if kept.is_none() {
            self.expired(session, ttl_secs);
            return Ok(None);
        }
        *session = Some(Session {
            id: current.id,
            confirmed: sent,
            keys: current.keys,
        });
        Ok(Some(current.id))
    }

    /// When the last keepalive (or the grant) of the session `id` of this TTL that etcd confirmed
    /// was *sent*: etcd keeps the session, and every key bound to it, at least its TTL from a
    /// moment after that. `None` when the session of this TTL is another one, or none. Waits for
    /// a keepalive round under way (its answer may move the instant on).
    pub(crate) async fn confirmed_since(&self, ttl_secs: i64, id: i64) -> Option<Instant> {
        let slot = self.slot(ttl_secs);
        let session = slot.lock().await;
        session.as_ref().filter(|s| s.id == id).map(|s| s.confirmed)
    }

    /// The keys bound to the session of this TTL, read after a keepalive sent at or after
    /// `since` was confirmed: one round (a keepalive and a key listing) serves every renewal
    /// that began before it. `None` when the session has expired.
    pub(crate) async fn session_keys(self: &Arc<Self>, ttl_secs: i64, since: Instant) -> Result<Option<SessionKeys>> {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if let Some(Session {
            id,
            keys: Some((read_after, keys)),
            ..
        }) = &*session
            && *read_after >= since
        {
            return Ok(Some((*id, keys.clone())));
        }
        let round = Instant::now();
        let Some(id) = self.refresh_locked(&mut session, ttl_secs, round).await? else {
            return Ok(None);
        };
        let mut client = self.client();
        let options = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
        let listed = self
            .call_shared("lease keys", self.config.timeout, async move {
                client.lease_time_to_live(id, Some(options)).await
            })
            .await?;
        let Some(listed) = listed.filter(|listed| listed.ttl() > 0) else {
            self.expired(&mut session, ttl_secs);
            return Ok(None);
        };
        let keys: Arc<HashSet<Vec<u8>>> = Arc::new(listed.keys().iter().cloned().collect());
        if let Some(s) = session.as_mut() {
            s.keys = Some((round, keys.clone()));
        }
        Ok(Some((id, keys)))
    }

    fn expired(&self, session: &mut Option<Session>, ttl_secs: i64) {
        *session = None;
        self.current.lock().expect("current lock").remove(&ttl_secs);
    }

    /// Refreshes a lease of one grant (see `Inner::grant_in_one_shot`); `false` when it is
    /// gone. Its keepalive is sent after the caller began.
    pub(crate) async fn keep_private_alive(&self, id: i64) -> Result<bool> {
        let mut client = self.client();
        let kept = self
            .call_unless_lease_gone("lease keepalive", async move { client.lease_keep_alive(id).await })
            .await?;
        if kept.is_none() {
            self.private.lock().expect("private lock").remove(&id);
        }
        Ok(kept.is_some())
    }

    /// Forgets a session that etcd no longer knows.
    pub(crate) async fn forget_session(&self, ttl_secs: i64, id: i64) {
        let slot = self.slot(ttl_secs);
        let mut session = slot.lock().await;
        if session.as_ref().is_some_and(|s| s.id == id) {
            self.expired(&mut session, ttl_secs);
        }
    }
}

/// A third of a session's TTL: how often etcd's own clients keep a lease alive.
pub(crate) fn third_of(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1)) / 3
}

/// Asks one endpoint, over a connection of its own, something cheap: so that a wrong address,
/// a port serving another protocol or refused credentials fail `connect`.
pub(crate) async fn probe(config: &EtcdConfig, endpoint: &str, options: etcd_client::ConnectOptions) -> Result<()> {
    let unresolved = || {
        let text = format!("cannot resolve the host of {endpoint}; check the host names in the URL");
        Error::unreachable(STORE, RequestError::new(CONNECT, text))
    };
    let host = endpoint.trim_start_matches("http://").trim_start_matches("https://");
    if !tokio::net::lookup_host(host)
        .await
        .is_ok_and(|mut addresses| addresses.next().is_some())
    {
        return Err(unresolved());
    }
    let asked = async {
        let mut client = Client::connect([endpoint], Some(options)).await?;
        let probe = GetOptions::new().with_count_only();
        // A key under the prefix: a role limited to `{prefix}/` may read it.
        client.get(format!("{}/", config.prefix), Some(probe)).await.map(drop)
    };
    match tokio::time::timeout(config.timeout, asked).await {
        Ok(answer) => answer.map_err(|e| map_connect(&e, endpoint, config.cert.is_some())),
        Err(_) => Err(Error::Timeout {
            store: STORE,
            operation: CONNECT,
            after: config.timeout,
        }),
    }
}

/// The failure to report when no endpoint answered: a permanent one first (it will not mend).
pub(crate) fn pick(failures: Vec<Error>) -> Option<Error> {
    let mut failures = failures.into_iter();
    let first = failures.next()?;
    if first.is_transient() {
        failures.find(|e| !e.is_transient()).or(Some(first))
    } else {
        Some(first)
    }
}
