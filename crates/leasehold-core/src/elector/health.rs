//! [`Health`]: a service's health check from its elector's events, as `leasehold run --http`
//! serves `/healthz` and `/readyz`.

use super::*;

/// The health of one candidate's election, for a service's `/healthz` and `/readyz`: unhealthy
/// while the store has been in trouble ([`Event::StoreTrouble`]) within the last TTL, with
/// nothing since that shows it answering (an election, a step-down, a new leader seen);
/// ready while this candidate leads.
///
/// It follows the elector's events from the moment it is made, in a task of its own that ends
/// once the elector and this `Health` (and their clones) are gone. Cheap to clone.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{Elector, Health, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let elector = Elector::builder(Arc::new(MemoryStore::new()), "jobs")
///     .ttl(Duration::from_secs(2))
///     .build()?;
/// let health = Health::new(&elector);
/// let leader = elector.campaign().await?;
/// assert!(health.healthy().is_ok()); // GET /healthz: 200
/// assert!(health.ready());           // GET /readyz: 200 while leading
/// leader.resign().await;
/// assert!(!health.ready());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Health {
    elector: Elector,
    trouble: Arc<Mutex<Trouble>>,
}

/// The last trouble since the store last answered: when, and what.
type Trouble = Option<(Instant, Arc<Error>)>;

impl Health {
    /// Follows `elector`'s events from now on.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn new(elector: &Elector) -> Health {
        let health = Health {
            elector: elector.clone(),
            trouble: Arc::default(),
        };
        let (trouble, mut events) = (Arc::downgrade(&health.trouble), elector.events());
        tokio::spawn(async move {
            loop {
                let event = match events.recv().await {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let Some(trouble) = trouble.upgrade() else { return };
                let mut trouble = trouble.lock().expect("trouble lock");
                match event {
                    Event::StoreTrouble { error } => *trouble = Some((now(), error)),
                    Event::Elected { .. } | Event::LeaderChanged(Some(_)) => *trouble = None,
                    Event::Deposed { .. } | Event::LeaderChanged(None) => {}
                }
            }
        });
        health
    }

    /// `Ok` unless the store has been in trouble within the last TTL and has not answered a
    /// request since; the error is that trouble.
    ///
    /// # Errors
    ///
    /// The store's last error, while it is recent.
    pub fn healthy(&self) -> std::result::Result<(), Arc<Error>> {
        let answered = self.elector.inner.answered_at();
        match &*self.trouble.lock().expect("trouble lock") {
            Some((at, error))
                if now().saturating_duration_since(*at) < self.elector.timing().ttl
                    && answered.is_none_or(|answered| answered < *at) =>
            {
                Err(error.clone())
            }
            _ => Ok(()),
        }
    }

    /// Whether this candidate leads now (its leadership not yet ending).
    pub fn ready(&self) -> bool {
        self.elector.is_leader()
    }
}
