//! OpenTelemetry traces of tasks, read back from an in-process exporter: the tree of spans
//! (submit under the submitter's span; wait, run, deliver under submit) and their attributes,
//! for a task that waited, a task whose first run failed and was retried, and a task whose
//! submitter gave a W3C `traceparent`. A binary of its own: it installs the process's global
//! tracer provider.
#![cfg(feature = "otel")]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanId, Status, TraceContextExt, Tracer, TracerProvider as _,
};
use opentelemetry::{global, Context, KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use prometheus_parking_lot::core::{Retries, SubmitOptions, TraceParent, WorkerExecutor};
use prometheus_parking_lot::{
    running, MailboxKey, ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig,
};

/// The exporter every test reads (each its own trace's spans); installed once, as the
/// global provider.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider);
        exporter
    })
}

/// What a job does: hold its slot until released, fail its first `fail` runs, or neither.
#[derive(Clone)]
enum Job {
    Hold(Arc<tokio::sync::Semaphore>),
    Fail(u32),
    Quick,
}

#[derive(Clone, Default)]
struct Runner {
    runs: Arc<Mutex<u32>>,
}

#[async_trait::async_trait]
impl WorkerExecutor<Job, u64> for Runner {
    async fn execute(&self, job: Job, meta: TaskMetadata) -> u64 {
        match job {
            Job::Hold(release) => {
                let _ = release.acquire().await;
            }
            Job::Fail(fail) => {
                let run = {
                    let mut runs = self.runs.lock().unwrap();
                    *runs += 1;
                    *runs
                };
                if run <= fail {
                    running::retry_later(format!("run {run}: 503 Service Unavailable"));
                }
            }
            Job::Quick => {}
        }
        meta.id
    }
}

fn pool(name: &str) -> WorkerPool<Job, u64, Runner> {
    let config = WorkerPoolConfig::new()
        .with_name(name)
        .with_worker_count(2)
        .with_max_units(4)
        .with_retry(Retries::new(3, Duration::from_millis(20)));
    let pool = WorkerPool::new(config, Runner::default()).expect("the pool starts");
    pool.retry_tasks();
    pool
}

fn meta(id: u64, units: u32) -> TaskMetadata {
    let key = MailboxKey::new("acme").with_session(format!("task-{id}"));
    TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(key)
}

/// The spans of `trace`, once `count` of them are exported (a delivery's span comes after
/// the result is retrievable), within 5 s.
async fn spans_of(trace: opentelemetry::TraceId, count: usize) -> Vec<SpanData> {
    for _ in 0..500 {
        let spans: Vec<SpanData> = exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|span| span.span_context.trace_id() == trace)
            .collect();
        if spans.len() >= count {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names: Vec<_> = exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.span_context.trace_id() == trace)
        .map(|span| span.name.to_string())
        .collect();
    panic!("{count} spans expected in the trace, found {names:?}");
}

/// The spans named `name`, in start order.
fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    let mut found: Vec<&SpanData> = spans.iter().filter(|span| span.name == name).collect();
    found.sort_by_key(|span| span.start_time);
    found
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|attribute| &attribute.value)
}

fn text(span: &SpanData, key: &str) -> String {
    attribute(span, key).map_or_else(|| "<none>".into(), |value| value.as_str().into_owned())
}

fn number(span: &SpanData, key: &str) -> i64 {
    match attribute(span, key) {
        Some(Value::I64(value)) => *value,
        other => panic!("{key} of {}: {other:?}", span.name),
    }
}

/// Runs `work` inside a span of the test's own (the submitter's), returning its id too.
async fn as_submitter<T>(
    work: impl std::future::Future<Output = T>,
) -> (T, SpanId, opentelemetry::TraceId) {
    use opentelemetry::context::FutureExt;
    let tracer = global::tracer_provider().tracer("test");
    let parent = tracer.start("handle request");
    let (span_id, trace_id) = (
        parent.span_context().span_id(),
        parent.span_context().trace_id(),
    );
    let context = Context::current_with_span(parent);
    let output = work.with_context(context.clone()).await;
    context.span().end();
    (output, span_id, trace_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_waited_is_one_trace_under_its_submitter() {
    exporter();
    let pool = pool("traced");
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = pool
        .submit_async(Job::Hold(release.clone()), meta(1, 4))
        .await
        .expect("the holder runs");
    let (key, request, trace) = as_submitter(async {
        pool.submit_async(Job::Quick, meta(2, 2))
            .await
            .expect("parks")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    release.add_permits(1);
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(2)
    );
    assert_eq!(
        pool.retrieve_async(&holder, Duration::from_secs(10)).await,
        Ok(1)
    );

    let spans = spans_of(trace, 5).await;
    let submit = named(&spans, "submit");
    assert_eq!(submit.len(), 1, "{spans:#?}");
    let submit = submit[0];
    assert_eq!(
        submit.parent_span_id, request,
        "submit is the submitter's child"
    );
    assert_eq!(number(submit, "task.id"), 2);
    assert_eq!(text(submit, "tenant"), "acme");
    assert_eq!(number(submit, "cost.units"), 2);
    assert_eq!(attribute(submit, "admitted"), Some(&Value::Bool(true)));
    for name in ["wait", "run", "deliver"] {
        let found = named(&spans, name);
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        let span = found[0];
        assert_eq!(
            span.parent_span_id,
            submit.span_context.span_id(),
            "{name} under submit"
        );
        assert_eq!(text(span, "pool"), "traced");
    }
    let wait = named(&spans, "wait")[0];
    assert_eq!(
        text(wait, "wait.reason"),
        "units",
        "it waited for the holder's units"
    );
    assert!(wait.end_time > wait.start_time, "the wait lasted");
    let run = named(&spans, "run")[0];
    assert_eq!(
        (number(run, "attempt"), text(run, "outcome")),
        (1, "completed".into())
    );
    assert!(run.start_time >= wait.end_time, "it ran after it waited");
    assert_eq!(text(named(&spans, "deliver")[0], "outcome"), "completed");
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_task_shows_each_run_and_the_backoff_between() {
    exporter();
    let pool = pool("retried");
    let (key, _, trace) = as_submitter(async {
        pool.submit_async(Job::Fail(1), meta(7, 1))
            .await
            .expect("admitted")
    })
    .await;
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(7)
    );

    let spans = spans_of(trace, 5).await;
    let runs = named(&spans, "run");
    assert_eq!(runs.len(), 2, "{spans:#?}");

    assert_eq!(number(runs[0], "attempt"), 1);
    assert_eq!(text(runs[0], "outcome"), "retried");
    assert_eq!(
        text(runs[0], "retry.reason"),
        "run 1: 503 Service Unavailable"
    );
    assert!(
        matches!(runs[0].status, Status::Error { .. }),
        "the failed run is an error"
    );
    assert_eq!(
        (number(runs[1], "attempt"), text(runs[1], "outcome")),
        (2, "completed".into())
    );
    let waits = named(&spans, "wait");
    assert_eq!(waits.len(), 1, "the backoff: {spans:#?}");
    assert_eq!(text(waits[0], "wait.reason"), "sleeping");
    assert_eq!(number(waits[0], "attempt"), 2);
    assert!(waits[0].start_time >= runs[0].end_time && waits[0].end_time <= runs[1].start_time);
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_the_submitter_gives_is_the_parent() {
    exporter();
    let pool = pool("given");
    let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let parent: TraceParent = header.parse().unwrap();
    let options = SubmitOptions::default().with_traceparent(parent);
    let key = pool
        .submit_with(Job::Quick, meta(9, 1), options)
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(9)
    );

    let trace = opentelemetry::TraceId::from_bytes(parent.trace_id());
    let spans = spans_of(trace, 3).await;
    let submit = named(&spans, "submit")[0];
    assert_eq!(submit.parent_span_id, SpanId::from_bytes(parent.span_id()));
    assert!(submit.parent_span_is_remote);
    let run = named(&spans, "run")[0];
    assert_eq!(run.parent_span_id, submit.span_context.span_id());
    assert!(
        named(&spans, "wait").is_empty(),
        "it started at once: {spans:#?}"
    );
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_submission_is_an_error_span_and_nothing_more() {
    exporter();
    let pool = pool("refused");
    let (refused, _, trace) =
        as_submitter(async { pool.submit_async(Job::Quick, meta(3, 64)).await }).await;
    assert!(refused.is_err(), "64 units of 4");
    let spans = spans_of(trace, 2).await;
    let submit = named(&spans, "submit")[0];
    assert_eq!(attribute(submit, "admitted"), Some(&Value::Bool(false)));
    assert!(matches!(submit.status, Status::Error { .. }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = spans_of(trace, 2).await;
    assert_eq!(
        after.len(),
        2,
        "the submitter's span and submit: {after:#?}"
    );
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
}

/// A task parked in a yaque file goes on in its trace after a restart: submitted in a given
/// trace behind a task that holds the pool, the pool stopped (the task kept parked) and
/// opened again on the same files, its run and delivery in the second pool are children of
/// the first pool's `submit` span.
#[cfg(feature = "yaque")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_resumed_after_a_restart_goes_on_in_its_trace() {
    use prometheus_parking_lot::core::{Durability, StarvationGuard, TaskExecutor};
    use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
    use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
    use prometheus_parking_lot::{ResourcePool, ScheduledTask, TokioSpawner};

    /// Payload 0 holds its slot until the gate opens; any other returns at once.
    #[derive(Clone)]
    struct Gate(Arc<tokio::sync::Semaphore>);

    #[async_trait::async_trait]
    impl TaskExecutor<u64, u64> for Gate {
        async fn execute(&self, payload: u64, meta: TaskMetadata) -> u64 {
            if payload == 0 {
                let _ = self.0.acquire().await;
            }
            meta.id
        }
    }

    let dir = std::env::temp_dir().join(format!("pl-otel-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let open = |gate: Gate| {
        let settings = WorkerPoolConfig::new()
            .with_name("resumed")
            .with_worker_count(1)
            .with_max_units(1)
            .with_starvation(StarvationGuard::disabled())
            .with_durability(Durability::Accepted);
        let queue = YaqueQueue::<u64>::open(&dir, "stream").expect("the queue opens");
        ResourcePool::with_settings(
            settings,
            gate,
            Box::new(queue),
            Arc::new(InMemoryMailbox::new()),
            &TokioSpawner,
        )
        .expect("the pool starts")
    };
    exporter();
    let header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let parent: TraceParent = header.parse().unwrap();
    let trace = opentelemetry::TraceId::from_bytes(parent.trace_id());

    let held = Gate(Arc::new(tokio::sync::Semaphore::new(0)));
    let first = open(held.clone());
    first
        .submit(ScheduledTask::new(meta(20, 1), 0))
        .await
        .expect("admitted");
    let options = SubmitOptions::default().with_traceparent(parent);
    first
        .submit_with(ScheduledTask::new(meta(21, 1), 21), options)
        .await
        .expect("admitted");
    let report = first
        .shutdown_with_drain(Duration::from_millis(20))
        .await
        .expect("stops");
    assert_eq!(report.kept_parked, 1, "the traced task is kept parked");
    held.0.add_permits(1);
    drop(first);
    let submit = named(&spans_of(trace, 1).await, "submit")[0].clone();

    let second = open(Gate(Arc::new(tokio::sync::Semaphore::new(1))));
    let key = meta(21, 1).mailbox.expect("a key");
    assert_eq!(second.retrieve(&key, Duration::from_secs(10)).await, Ok(21));
    let spans = spans_of(trace, 3).await;
    let run = named(&spans, "run");
    assert_eq!(run.len(), 1, "one run, in the second pool: {spans:#?}");
    assert_eq!(run[0].parent_span_id, submit.span_context.span_id());
    let deliver = named(&spans, "deliver");
    assert_eq!(deliver.len(), 1, "{spans:#?}");
    assert_eq!(deliver[0].parent_span_id, submit.span_context.span_id());
    second
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
