//! What people log and serve about an election: serde forms of the observation types,
//! `Elector::is_leader`, the leader task's tracing span, and `RunError`'s source chain.

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use leasehold_core::{
    CandidateId, DeposedReason, Elector, Error, Event, LeaseName, LeaseStore, MemoryStore, Observation, RunError, Term,
    Transition,
};
use tokio::sync::broadcast;

const TTL: Duration = Duration::from_secs(1);

fn elector(store: &Arc<MemoryStore>, lease: &str, id: &str) -> Elector {
    Elector::builder(store.clone(), lease)
        .ttl(TTL)
        .candidate_id(id)
        .build()
        .unwrap()
}

async fn next_event(events: &mut broadcast::Receiver<Event>, pick: impl Fn(&Event) -> bool) -> Event {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let event = events.recv().await.expect("events");
            if pick(&event) {
                return event;
            }
        }
    })
    .await
    .expect("the event in time")
}

/// Within `slack` of each other.
fn close(a: Instant, b: Instant, slack: Duration) -> bool {
    a.max(b) - a.min(b) <= slack
}

/// Each Instant is written as the RFC 3339 wall-clock time it stands for and read back onto
/// the monotonic clock; everything else comes back equal.
fn assert_round_trip(event: &Event) -> serde_json::Value {
    let json = serde_json::to_value(event).unwrap();
    let back: Event = serde_json::from_value(json.clone()).unwrap();
    let slack = Duration::from_millis(50);
    match (event, &back) {
        (
            Event::Elected { term, at, valid_until },
            Event::Elected {
                term: t2,
                at: a2,
                valid_until: v2,
            },
        ) => {
            assert_eq!(term, t2);
            assert!(
                close(*at, *a2, slack) && close(*valid_until, *v2, slack),
                "{event:?} -> {back:?}"
            );
        }
        (
            Event::Deposed {
                term,
                reason,
                believed_until,
                work_stopped_after,
                aborted,
            },
            Event::Deposed {
                term: t2,
                reason: r2,
                believed_until: b2,
                work_stopped_after: w2,
                aborted: a2,
            },
        ) => {
            assert_eq!((term, reason, work_stopped_after, aborted), (t2, r2, w2, a2));
            assert!(close(*believed_until, *b2, slack), "{event:?} -> {back:?}");
        }
        (Event::LeaderChanged(Some(a)), Event::LeaderChanged(Some(b))) => {
            assert_eq!((&a.holder, a.term, a.since_wall), (&b.holder, b.term, b.since_wall));
            assert!(close(a.since, b.since, slack));
        }
        (Event::StoreTrouble { error }, Event::StoreTrouble { error: e2 }) => {
            // Read back as a store error that carries the text.
            assert!(e2.to_string().ends_with(&error.to_string()), "{json} -> {e2}");
        }
        (Event::LeaderChanged(None), Event::LeaderChanged(None)) => {}
        _ => panic!("{event:?} came back as {back:?} ({json})"),
    }
    json
}

/// A wall-clock time written as RFC 3339, near now.
fn assert_recent_rfc3339(value: &serde_json::Value) {
    let text = value.as_str().unwrap_or_else(|| panic!("a string: {value}"));
    assert!(text.ends_with('Z') && text.contains('T'), "{text}");
    let time = humantime_parse(text);
    let now = SystemTime::now();
    let gap = now.duration_since(time).unwrap_or_else(|e| e.duration());
    assert!(gap < Duration::from_secs(60), "{text} is {gap:?} from now");
}

fn humantime_parse(text: &str) -> SystemTime {
    // Through the types themselves: a Transition's acquired_at is an RFC 3339 string.
    let json = serde_json::json!({"term": 1, "holder": "x", "acquired_at": text, "ended": null});
    serde_json::from_value::<Transition>(json).unwrap().acquired_at
}

#[tokio::test]
async fn events_round_trip_through_json_with_wall_clock_times() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(&store, "serde", "a");
    let b = elector(&store, "serde", "b");
    let mut a_events = a.events();
    let mut b_events = b.events();
    let leader = a.campaign().await.unwrap();
    let elected = next_event(&mut a_events, |e| matches!(e, Event::Elected { .. })).await;
    let json = assert_round_trip(&elected);
    assert_eq!(json["elected"]["term"], serde_json::json!(leader.term().0));
    assert_recent_rfc3339(&json["elected"]["at"]);
    assert_recent_rfc3339(&json["elected"]["valid_until"]);

    let b_campaign = tokio::spawn(async move { b.campaign().await.unwrap() });
    let seen = next_event(&mut b_events, |e| matches!(e, Event::LeaderChanged(Some(_)))).await;
    let json = assert_round_trip(&seen);
    assert_eq!(json["leader_changed"]["holder"], "a");
    assert_recent_rfc3339(&json["leader_changed"]["since"]);
    assert_recent_rfc3339(&json["leader_changed"]["since_wall"]);
    let Event::LeaderChanged(Some(info)) = &seen else {
        unreachable!()
    };
    // The two clocks name the same moment.
    let wall_of_since = Event::wall_clock(info.since);
    let gap = wall_of_since
        .duration_since(info.since_wall)
        .unwrap_or_else(|e| e.duration());
    assert!(gap < Duration::from_millis(50), "{gap:?}");

    leader.resign().await;
    let deposed = next_event(&mut a_events, |e| matches!(e, Event::Deposed { .. })).await;
    let json = assert_round_trip(&deposed);
    assert_eq!(json["deposed"]["reason"], "resigned");
    assert_recent_rfc3339(&json["deposed"]["believed_until"]);
    let b_leader = tokio::time::timeout(Duration::from_secs(5), b_campaign)
        .await
        .unwrap()
        .unwrap();

    // A reason with data, and store trouble.
    let superseded = Event::Deposed {
        term: Term(7),
        reason: DeposedReason::Superseded {
            by: Some(CandidateId::new("c").unwrap()),
            term: Some(Term(8)),
        },
        believed_until: Instant::now(),
        work_stopped_after: Some(Duration::from_millis(12)),
        aborted: false,
    };
    let json = assert_round_trip(&superseded);
    assert_eq!(json["deposed"]["reason"]["superseded"]["by"], "c");
    assert_eq!(json["deposed"]["reason"]["superseded"]["term"], 8);
    // Durations are seconds, as Prometheus counts them (were {"secs":0,"nanos":12000000}).
    assert_eq!(json["deposed"]["work_stopped_after"], 0.012);
    let json = assert_round_trip(&Event::StoreTrouble {
        error: Arc::new(Error::unreachable("etcd", "connection refused")),
    });
    assert_eq!(
        json["store_trouble"]["error"],
        "etcd store unreachable: connection refused"
    );

    // What a store reports: an observation and the history.
    let lease = LeaseName::new("serde").unwrap();
    let observation = store.inspect(&lease).await.unwrap();
    let json = serde_json::to_value(&observation).unwrap();
    assert_eq!(json["holder"]["id"], "b");
    assert_eq!(json["holder"]["ttl"], 1.0);
    assert_eq!(serde_json::from_value::<Observation>(json).unwrap(), observation);
    let history = store.history(&lease, 10).await.unwrap();
    assert!(history.len() >= 2, "{history:?}");
    let json = serde_json::to_value(&history).unwrap();
    let ended = history
        .iter()
        .position(|t| t.ended.is_some())
        .expect("a term that ended");
    assert_eq!(json[ended]["ended"][1], "released");
    assert_recent_rfc3339(&json[ended]["ended"][0]);
    assert_recent_rfc3339(&json[ended]["acquired_at"]);
    assert_eq!(serde_json::from_value::<Vec<Transition>>(json).unwrap(), history);
    b_leader.resign().await;

    // Deserializing validates: names and ids follow the same rules as everywhere else.
    assert!(serde_json::from_str::<LeaseName>("\"a/b\"").is_err());
    assert!(serde_json::from_str::<CandidateId>("\"\"").is_err());
    assert_eq!(
        serde_json::from_str::<LeaseName>("\"ok\"").unwrap(),
        LeaseName::new("ok").unwrap()
    );
}

#[tokio::test]
async fn is_leader_follows_election_and_resignation() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(&store, "is-leader", "a");
    let b = elector(&store, "is-leader", "b");
    assert!(!a.is_leader() && !b.is_leader());
    let leader = a.campaign().await.unwrap();
    assert!(a.is_leader());
    assert!(!b.is_leader());
    let mut b_events = b.events();
    let b_campaign = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await.unwrap() }
    });
    // b follows a: still not leader.
    next_event(&mut b_events, |e| matches!(e, Event::LeaderChanged(Some(_)))).await;
    assert!(!b.is_leader());
    leader.resign().await;
    assert!(!a.is_leader());
    let b_leader = tokio::time::timeout(Duration::from_secs(5), b_campaign)
        .await
        .unwrap()
        .unwrap();
    assert!(b.is_leader());
    assert!(!a.is_leader());
    // Deposed (the lease broken and renewals failing): no longer leader.
    let mut b_events = b.events();
    store.break_lease(&LeaseName::new("is-leader").unwrap()).await.unwrap();
    next_event(&mut b_events, |e| matches!(e, Event::Deposed { .. })).await;
    assert!(!b.is_leader());
    drop(b_leader);
}

#[derive(Debug)]
struct Root;

impl fmt::Display for Root {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("disk full")
    }
}

impl StdError for Root {}

#[derive(Debug)]
struct TaskFailed(Root);

impl fmt::Display for TaskFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("writing the batch failed")
    }
}

impl StdError for TaskFailed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test]
async fn run_error_keeps_the_task_errors_source_chain() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(&store, "source-chain", "a");
    let err = a
        .run(|_leader| async { Err::<(), _>(TaskFailed(Root)) })
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Task(TaskFailed(Root))), "{err:?}");
    let chain: Vec<String> = std::iter::successors(Some(&err as &(dyn StdError + 'static)), |e| (*e).source())
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        chain,
        ["the leader's task failed", "writing the batch failed", "disk full"]
    );
    // Also as a boxed error (`?` in a function returning Box<dyn Error>).
    let boxed: Box<dyn StdError + Send + Sync> = Box::new(err);
    assert_eq!(boxed.source().unwrap().to_string(), "writing the batch failed");

    // An election error is transparent: its own text, its own source.
    let election: RunError<TaskFailed> = RunError::Election(leasehold_core::Error::unreachable("memory", Root));
    assert_eq!(election.to_string(), "memory store unreachable: disk full");
    assert_eq!(election.source().unwrap().to_string(), "disk full");
    assert!(RunError::<TaskFailed>::Panicked.source().is_none());
}

/// A span's name and its fields as text.
type SpanRecord = (String, Vec<(String, String)>);

/// Records the spans created and which were entered.
#[derive(Default)]
struct Spans {
    created: Mutex<Vec<SpanRecord>>,
    entered: Mutex<Vec<u64>>,
}

struct Recorder(Arc<Spans>);

struct Fields(Vec<(String, String)>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.push((field.name().to_string(), format!("{value:?}")));
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = Fields(Vec::new());
        span.record(&mut fields);
        let mut created = self.0.created.lock().unwrap();
        created.push((span.metadata().name().to_string(), fields.0));
        tracing::span::Id::from_u64(created.len() as u64)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, span: &tracing::span::Id) {
        self.0.entered.lock().unwrap().push(span.into_u64());
    }
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn the_leaders_task_runs_in_a_span_with_lease_term_and_holder() {
    let spans = Arc::new(Spans::default());
    let _guard = tracing::subscriber::set_default(Recorder(spans.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let term = runtime.block_on(async {
        let store = Arc::new(MemoryStore::new());
        let a = elector(&store, "traced", "a");
        let (term_tx, term_rx) = tokio::sync::oneshot::channel();
        let mut term_tx = Some(term_tx);
        a.run(move |leader| {
            let _ = term_tx.take().map(|tx| tx.send(leader.term()));
            async { Ok::<(), leasehold_core::Error>(()) }
        })
        .await
        .unwrap();
        term_rx.await.unwrap()
    });
    let created = spans.created.lock().unwrap().clone();
    let (index, (_, fields)) = created
        .iter()
        .enumerate()
        .find(|(_, (name, _))| name == "leader")
        .unwrap_or_else(|| panic!("no leader span: {created:?}"));
    let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(field("lease"), Some("traced"));
    assert_eq!(field("term"), Some(term.to_string().as_str()));
    assert_eq!(field("holder"), Some("a"));
    let id = index as u64 + 1;
    assert!(
        spans.entered.lock().unwrap().contains(&id),
        "the task was never polled inside its span"
    );
}
