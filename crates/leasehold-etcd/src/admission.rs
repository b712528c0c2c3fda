//! Admission control: at most a few requests of one store in flight, the newest served first.
//!
//! A process with many elections can ask etcd for more than it answers within the engine's
//! request timeout. First-come-first-served then makes *every* request late: each is abandoned
//! by the engine just before its answer, and the store collapses into timeouts. Serving the
//! newest waiter first (adaptive LIFO) keeps the requests that are sent fast; the oldest waiters
//! are the ones the engine abandons, and an abandoned waiter never reaches etcd at all.
//! Requests that finish work already under way (a grant after its queue read, a renewal's
//! check, a release) go before those that start new work.

use std::sync::Mutex;

use tokio::sync::oneshot;

#[derive(Debug)]
pub(crate) struct Admission {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    available: usize,
    urgent: Vec<oneshot::Sender<()>>,
    waiters: Vec<oneshot::Sender<()>>,
}

/// A slot in flight; dropping it admits the newest waiter.
#[derive(Debug)]
pub(crate) struct Admitted<'a> {
    admission: &'a Admission,
}

impl Admission {
    pub(crate) fn new(limit: usize) -> Self {
        Admission {
            state: Mutex::new(State {
                available: limit.max(1),
                urgent: Vec::new(),
                waiters: Vec::new(),
            }),
        }
    }

    pub(crate) async fn admit(&self, urgent: bool) -> Admitted<'_> {
        let waiting = {
            let mut state = self.state.lock().expect("admission lock");
            if state.available > 0 {
                state.available -= 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                if urgent {
                    state.urgent.push(tx);
                } else {
                    state.waiters.push(tx);
                }
                Some(rx)
            }
        };
        if let Some(rx) = waiting {
            // The sender is only dropped after sending, so this cannot fail while we wait.
            let _ = rx.await;
        }
        Admitted { admission: self }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut state = self.admission.state.lock().expect("admission lock");
        while let Some(waiter) = state.urgent.pop().or_else(|| state.waiters.pop()) {
            if waiter.send(()).is_ok() {
                return; // the slot passes to the newest live waiter
            }
        }
        state.available += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn newest_waiter_first_and_abandoned_waiters_skipped() {
        let admission = std::sync::Arc::new(Admission::new(1));
        let first = admission.admit(false).await;
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (admission, order) = (admission.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = admission.admit(i == 0).await;
                order.lock().unwrap().push(i);
            }));
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tasks.remove(1).abort();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 2], "urgent first, then the newest");
    }
}
