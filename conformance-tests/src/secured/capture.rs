//! Everything the process logs (`tracing`, every level, span fields too) and every metric key
//! with its labels, captured in memory for the secret scan.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata as TraceMetadata, Subscriber};

/// What has been captured so far.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    lines: Arc<Mutex<Vec<String>>>,
    metrics: Arc<Mutex<Vec<String>>>,
}

impl Captured {
    /// Every log line so far (an event's fields, or a span's).
    pub fn logs(&self) -> Vec<String> {
        self.lines.lock().expect("not poisoned").clone()
    }

    /// Every metric key registered so far, as `name{label=value,...}`.
    pub fn metrics(&self) -> Vec<String> {
        self.metrics.lock().expect("not poisoned").clone()
    }
}

/// Installs the process-wide log subscriber and metrics recorder (once; later calls share them).
///
/// # Panics
///
/// When another subscriber or recorder was installed first: nothing would be captured.
pub fn install() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            tracing::subscriber::set_global_default(Logs {
                lines: captured.lines.clone(),
                next: AtomicU64::new(1),
            })
            .expect("no other tracing subscriber is installed");
            metrics::set_global_recorder(Metrics {
                keys: captured.metrics.clone(),
            })
            .expect("no other metrics recorder is installed");
            captured
        })
        .clone()
}

struct Logs {
    lines: Arc<Mutex<Vec<String>>>,
    next: AtomicU64,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let _ = write!(self.0, " {}={value} ({value:?})", field.name());
    }
}

impl Logs {
    fn push(&self, line: Line) {
        self.lines.lock().expect("not poisoned").push(line.0);
    }
}

impl Subscriber for Logs {
    fn enabled(&self, _: &TraceMetadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut line = Line(format!("span {}:", span.metadata().name()));
        span.record(&mut line);
        self.push(line);
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut line = Line("span record:".into());
        values.record(&mut line);
        self.push(line);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line(format!("{} {}:", event.metadata().level(), event.metadata().target()));
        event.record(&mut line);
        self.push(line);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

struct Metrics {
    keys: Arc<Mutex<Vec<String>>>,
}

impl Metrics {
    fn note(&self, key: &Key) {
        let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        let text = format!("{}{{{}}}", key.name(), labels.join(","));
        let mut keys = self.keys.lock().expect("not poisoned");
        if !keys.contains(&text) {
            keys.push(text);
        }
    }
}

impl Recorder for Metrics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.note(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.note(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.note(key);
        Histogram::noop()
    }
}
