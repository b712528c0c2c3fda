//! `leasehold run --http ADDR`: who leads, for the application beside `leasehold` and for
//! Kubernetes probes.
//!
//! - `/healthz`: 200 while the process runs and the store answers (no store request failed
//!   within the last `--ttl`, or a later event of the election shows the store answering again);
//!   503 with the last error otherwise.
//! - `/readyz`: 200 only while this instance leads and its lease is valid, checked when the
//!   request arrives ([`Leader::is_cancelled`] and [`Leader::ensure_valid`] read the clock); 503
//!   otherwise.
//! - `/leader`: JSON, who leads as this instance sees it (`holder`, `term`, `since` in RFC 3339).
//! - `/metrics`: Prometheus text exposition of the engine's `metrics` series.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use leasehold::{Elector, Leader};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::exit::{Failure, LISTEN};

/// How long a client may take to send its request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often histograms are drained into their summaries (the exporter leaves it to the caller).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Binds `addr`, before anything else is done, so that a bad address fails at once.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, Failure> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(LISTEN, format!("cannot listen on --http {addr}: {e}")))
}

/// Installs the Prometheus recorder for this process: every `metrics` series the engine emits
/// from now on is kept for `/metrics`.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, Failure> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Failure::runtime(format!("cannot install the metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// What the endpoints answer from; shared with the election's event loop and the leader's task.
#[derive(Debug)]
pub(crate) struct State {
    /// The current leadership of this instance, while it may be served as ready. Cleared
    /// before the leader's task returns: a [`Leader`] clone kept here would keep the lease.
    leader: Mutex<Option<Leader>>,
    /// The last store failure, and when it happened; cleared by any other election event.
    trouble: Mutex<Option<(Instant, String)>>,
    /// A store failure counts against `/healthz` for this long (`--ttl`).
    trouble_window: Duration,
}

impl State {
    pub(crate) fn new(ttl: Duration) -> Self {
        State {
            leader: Mutex::new(None),
            trouble: Mutex::new(None),
            trouble_window: ttl,
        }
    }

    /// Serves `leader` as ready until the returned guard is dropped.
    pub(crate) fn leading(&self, leader: &Leader) -> Leading<'_> {
        *self.leader.lock().expect("leader lock") = Some(leader.clone());
        Leading { state: self }
    }

    /// A store request failed.
    pub(crate) fn store_failed(&self, error: &str) {
        *self.trouble.lock().expect("trouble lock") = Some((Instant::now(), error.to_string()));
    }

    /// The election moved on (an election, a deposition, a new leader seen): the store answered.
    pub(crate) fn store_answered(&self) {
        *self.trouble.lock().expect("trouble lock") = None;
    }

    /// `Ok` while ready: the term and how long the lease may still be believed.
    fn ready(&self) -> Result<(u64, Duration), String> {
        let slot = self.leader.lock().expect("leader lock");
        let Some(leader) = slot.as_ref() else {
            return Err("not the leader".into());
        };
        // Both read the clock: right even if the election's driver has not run lately.
        if leader.is_cancelled() {
            return Err(format!("leadership of term {} is ending", leader.term()));
        }
        match leader.ensure_valid(Duration::ZERO) {
            Ok(()) => Ok((leader.term().0, leader.remaining())),
            Err(e) => Err(e.to_string()),
        }
    }

    fn health(&self) -> Result<(), String> {
        match &*self.trouble.lock().expect("trouble lock") {
            Some((at, error)) if at.elapsed() < self.trouble_window => Err(error.clone()),
            _ => Ok(()),
        }
    }
}

/// Clears the served leadership when dropped.
#[derive(Debug)]
pub(crate) struct Leading<'a> {
    state: &'a State,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.state.leader.lock().expect("leader lock").take();
    }
}

/// Serves the endpoints on `listener` until the process ends.
pub(crate) fn serve(listener: TcpListener, state: Arc<State>, elector: Elector, metrics: PrometheusHandle) {
    let shared = Arc::new(Shared {
        state,
        elector,
        metrics,
    });
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of file descriptors and the like: try again shortly.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(shared.answer(&request)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

#[derive(Debug)]
struct Shared {
    state: Arc<State>,
    elector: Elector,
    metrics: PrometheusHandle,
}

impl Shared {
    fn answer(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        }
        match request.uri().path() {
            "/healthz" => match self.state.health() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(error) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "store trouble within the last {}: {error}\n",
                        crate::output::short(self.state.trouble_window)
                    ),
                ),
            },
            "/readyz" => match self.state.ready() {
                Ok((term, remaining)) => text(
                    StatusCode::OK,
                    format!(
                        "leader of {} at term {term} (valid for {})\n",
                        self.elector.lease(),
                        crate::output::short(remaining)
                    ),
                ),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            "/leader" => {
                let body = self.leader_json();
                let mut response = text(StatusCode::OK, body);
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
            "/metrics" => {
                let mut response = text(StatusCode::OK, self.metrics.render());
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found (try /healthz, /readyz, /leader, /metrics)\n".into(),
            ),
        }
    }

    /// `{"lease":..,"holder":..,"term":..,"since":..,"this_instance":..}`; `holder`, `term` and
    /// `since` are null while nobody holds the lease.
    fn leader_json(&self) -> String {
        let info = self.elector.observe().borrow().clone();
        let me = self.elector.id();
        let value = match info {
            Some(info) => serde_json::json!({
                "lease": self.elector.lease().as_str(),
                "holder": info.holder.as_str(),
                "term": info.term.0,
                "since": wall_clock(info.since),
                "this_instance": &info.holder == me,
            }),
            None => serde_json::json!({
                "lease": self.elector.lease().as_str(),
                "holder": null,
                "term": null,
                "since": null,
                "this_instance": false,
            }),
        };
        format!("{value}\n")
    }
}

/// An `Instant` of this process as RFC 3339 (UTC, milliseconds).
fn wall_clock(at: Instant) -> String {
    let ago = Instant::now().saturating_duration_since(at);
    let when = SystemTime::now().checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH);
    humantime::format_rfc3339_millis(when).to_string()
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}
