//! The command connection: a `ConnectionManager` (which reconnects after a broken connection),
//! replaced as a whole when a request times out or its reply does not match.
//!
//! A multiplexed Redis connection pairs replies with requests by their order. When a network
//! drops data without breaking the connection, a reply goes missing and every later reply would
//! be paired with the wrong request. So every script echoes a random nonce; a reply that reaches
//! the wrong request is handed to the request it names; and a request that times out, gets
//! another request's reply or is dropped before its reply came retires the connection it used.
//!
//! Requests run in the caller's task: the engine runs every store call to completion in a task
//! of its own, so nothing here spawns to outlive a caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Result, random_u64};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use tokio::sync::oneshot;

use crate::error::{self, Failure};

/// A reply of one of the scripts, without its nonce: a status word and its fields.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) operation: &'static str,
    pub(crate) values: Vec<Value>,
}

#[derive(Clone)]
pub(crate) struct Commands {
    shared: Arc<Shared>,
}

struct Shared {
    client: redis::Client,
    config: ConnectionManagerConfig,
    timeout: Duration,
    current: Mutex<Current>,
    /// The requests under way, by nonce: where a reply that reached the wrong request goes.
    waiting: Mutex<HashMap<String, oneshot::Sender<Vec<Value>>>>,
}

struct Current {
    generation: u64,
    manager: ConnectionManager,
}

impl std::fmt::Debug for Commands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let generation = self.shared.current.lock().map(|c| c.generation).unwrap_or_default();
        f.debug_struct("Commands")
            .field("timeout", &self.shared.timeout)
            .field("generation", &generation)
            .finish()
    }
}

impl Commands {
    /// A lazy connection: nothing is sent until the first request. Needs a tokio runtime.
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // Our own timeout (below) also retires the connection; the client's would not.
            .set_response_timeout(None)
            // The engine decides when to try again; a store never retries in a loop.
            .set_number_of_retries(0);
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| error::map(e, "connect"))?;
        Ok(Commands {
            shared: Arc::new(Shared {
                client,
                config,
                timeout,
                current: Mutex::new(Current { generation: 0, manager }),
                waiting: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Runs `script` with `keys` and, after the nonce, `args`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] after the configured timeout; [`Error::Unreachable`] for a broken
    /// connection or a reply that answered another request; otherwise as [`error::map`].
    pub(crate) async fn eval(
        &self,
        operation: &'static str,
        script: &'static Script,
        keys: &[&str],
        args: Vec<String>,
    ) -> Result<Reply> {
        let nonce = format!("{:016x}", random_u64());
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        invocation.arg(&nonce);
        for arg in &args {
            invocation.arg(arg);
        }
        let shared = &self.shared;
        let (generation, mut manager) = shared.current();
        let (forwarded_tx, mut forwarded) = oneshot::channel();
        shared
            .waiting
            .lock()
            .expect("waiting lock poisoned")
            .insert(nonce.clone(), forwarded_tx);
        // Dropped before the reply was judged (the caller stopped waiting): the reply may still
        // come and be paired with a later request, so the connection is retired, as after a
        // timeout.
        let mut pending = Pending {
            shared,
            nonce: &nonce,
            generation,
            judged: false,
        };
        let call = async {
            tokio::select! {
                outcome = invocation.invoke_async::<Value>(&mut manager) => match outcome {
                    Err(e) => Err(Failure::Redis(e)),
                    Ok(value) => match split_nonce(value) {
                        Some((of, values)) if of == nonce => Ok(values),
                        Some((of, values)) => {
                            shared.forward(&of, values);
                            Err(Failure::OutOfStep)
                        }
                        None => Err(Failure::OutOfStep),
                    },
                },
                // Our reply reached another request first.
                Ok(values) = &mut forwarded => Ok(values),
            }
        };
        let result = tokio::time::timeout(shared.timeout, call)
            .await
            .unwrap_or(Err(Failure::Timeout(shared.timeout)));
        pending.judged = true;
        match &result {
            Err(Failure::Redis(e)) if !error::is_connection_error(e) => {}
            Err(_) => shared.retire(generation),
            Ok(_) => {}
        }
        drop(pending);
        match result {
            Ok(values) => Ok(Reply { operation, values }),
            Err(failure) => Err(failure.into_error(operation)),
        }
    }
}

/// A request under way: forgets its nonce when it ends, and retires its connection if it ends
/// before its reply was judged.
struct Pending<'a> {
    shared: &'a Shared,
    nonce: &'a str,
    generation: u64,
    judged: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.shared
            .waiting
            .lock()
            .expect("waiting lock poisoned")
            .remove(self.nonce);
        if !self.judged {
            self.shared.retire(self.generation);
        }
    }
}

impl Shared {
    /// Hands a reply to the request it answers, if that one still waits.
    fn forward(&self, nonce: &str, values: Vec<Value>) {
        if let Some(tx) = self.waiting.lock().expect("waiting lock poisoned").remove(nonce) {
            let _ = tx.send(values);
        }
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let current = self.current.lock().expect("connection lock poisoned");
        (current.generation, current.manager.clone())
    }

    /// Replaces the connection of `generation` (unless another request already did) with a new
    /// lazy one; the old one closes when its last request is done.
    fn retire(&self, generation: u64) {
        let mut current = self.current.lock().expect("connection lock poisoned");
        if current.generation != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(manager) => {
                tracing::debug!(generation, "replacing the redis connection");
                *current = Current {
                    generation: generation + 1,
                    manager,
                };
            }
            Err(e) => tracing::warn!(error = %e, "cannot replace the redis connection"),
        }
    }
}

/// The nonce a reply echoes and the values after it, if the reply is an array that starts with
/// a nonce.
fn split_nonce(value: Value) -> Option<(String, Vec<Value>)> {
    let Value::Array(mut values) = value else {
        return None;
    };
    match values.first() {
        Some(Value::BulkString(first)) => {
            let nonce = String::from_utf8(first.clone()).ok()?;
            values.remove(0);
            Some((nonce, values))
        }
        _ => None,
    }
}

impl Reply {
    /// The status word.
    pub(crate) fn status(&self) -> Result<&str> {
        self.text(0)
    }

    /// Field `i` as text.
    pub(crate) fn text(&self, i: usize) -> Result<&str> {
        match self.values.get(i) {
            Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes)
                .map_err(|_| error::unexpected(self.operation, format!("field {i} is not UTF-8"))),
            Some(Value::SimpleString(s)) => Ok(s),
            other => Err(error::unexpected(
                self.operation,
                format!("field {i} is {other:?}, expected text"),
            )),
        }
    }

    /// Field `i`, an array.
    pub(crate) fn array(&self, i: usize) -> Result<&[Value]> {
        match self.values.get(i) {
            Some(Value::Array(values)) => Ok(values),
            other => Err(error::unexpected(
                self.operation,
                format!("field {i} is {other:?}, expected an array"),
            )),
        }
    }
}
