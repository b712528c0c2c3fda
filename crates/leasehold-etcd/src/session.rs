//! Sessions: one etcd lease per TTL (whole seconds), shared by every election of the store, and
//! the keepalives that keep it. Keepalives coalesce: one sent after a caller began serves that
//! caller and every other that began before it was sent.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, Result};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::error::STORE;
use crate::store::Inner;

/// An etcd lease held by this store.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) id: i64,
    /// When the last keepalive (or the grant) that etcd confirmed was *sent*: the lease lives at
    /// least its TTL from a moment after this.
    confirmed: Instant,
    /// The keys bound to the lease, read after a keepalive sent at the given instant.
    keys: Option<(Instant, Arc<HashSet<Vec<u8>>>)>,
}

/// The keys bound to a live session, and its id.
pub(crate) type SessionKeys = (i64, Arc<HashSet<Vec<u8>>>);

impl Inner {
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
        // The round runs to its end even if this caller gives up (the engine's request timeout):
        // otherwise under load every round would be cut short by its own caller, and none would
        // serve the callers queued behind it.
        let inner = self.clone();
        detached(async move {
            let slot = inner.slot(ttl_secs);
            let mut session = slot.lock().await;
            inner.refresh_locked(&mut session, ttl_secs, since).await
        })
        .await
    }

    async fn refresh_locked(
        &self,
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

    /// The keys bound to the session of this TTL, read after a keepalive sent at or after
    /// `since` was confirmed: one round (a keepalive and a key listing) serves every renewal
    /// that began before it. `None` when the session has expired.
    pub(crate) async fn session_keys(self: &Arc<Self>, ttl_secs: i64, since: Instant) -> Result<Option<SessionKeys>> {
        let inner = self.clone();
        detached(async move { inner.session_keys_here(ttl_secs, since).await }).await
    }

    async fn session_keys_here(&self, ttl_secs: i64, since: Instant) -> Result<Option<SessionKeys>> {
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

    /// Refreshes a lease of one grant (see `EtcdStore::grant_in_one_shot`); `false` when it is
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

/// Runs `fut` as its own task, so that it completes even when the caller is dropped.
async fn detached<T: Send + 'static>(fut: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    tokio::spawn(fut).await.map_err(|e| Error::store(STORE, e))?
}
