//! A pool whose tasks send their traces to an OpenTelemetry collector over OTLP/HTTP.
//!
//! Three requests, each handled under a span of the application's own ("handle request"),
//! go to a pool of 4 GPU units: a long one that takes 3 units, one that needs 2 and so waits
//! for the first, and a flaky one whose first run fails and is retried after a backoff. Each
//! request is one trace: the application's span, the pool's `submit` under it, and under
//! `submit` the task's `wait`, `run` (one per attempt) and `deliver` spans (`src/otel.rs`
//! names them and their attributes). The example prints each trace id and sends the spans to
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (default `http://localhost:4318`), to its `/v1/traces`, as
//! OTLP protobuf.
//!
//! ```text
//! docker run --rm -p 16686:16686 -p 4318:4318 jaegertracing/all-in-one
//! cargo run --features otel --example otel
//! # then open http://localhost:16686, service "parking-lot-otel-example"
//! ```
//!
//! The exporter sends through the reqwest client the crate already uses
//! (`examples/support/otlp_http.rs` says why and how).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::context::FutureExt;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{global, Context, KeyValue};
use prometheus_parking_lot::core::{Retries, WorkerExecutor};
use prometheus_parking_lot::{
    running, MailboxKey, ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig,
};

#[path = "support/otlp_http.rs"]
mod otlp_http;

/// Whatever went wrong, as the example reports it.
type Error = Box<dyn std::error::Error + Send + Sync>;

/// Where spans go when `OTEL_EXPORTER_OTLP_ENDPOINT` is not set: a collector on this machine.
const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// The service name the traces are filed under.
const SERVICE: &str = "parking-lot-otel-example";

/// What a request asks of its worker.
#[derive(Clone, Copy)]
enum Job {
    /// Works for this long.
    Work(Duration),
    /// Fails its first run with a reason the retry span shows, then succeeds.
    Flaky,
}

/// The executor: counts the flaky job's runs, so only the first one fails.
#[derive(Clone, Default)]
struct Model {
    flaky_runs: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl WorkerExecutor<Job, String> for Model {
    async fn execute(&self, job: Job, meta: TaskMetadata) -> String {
        match job {
            Job::Work(duration) => tokio::time::sleep(duration).await,
            Job::Flaky => {
                let run = self.flaky_runs.fetch_add(1, Ordering::SeqCst) + 1;
                if run == 1 {
                    running::retry_later("upstream answered 503 Service Unavailable");
                }
            }
        }
        format!("task {} done", meta.id)
    }
}

fn main() -> Result<(), Error> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .unwrap_or_else(|_| DEFAULT_ENDPOINT.to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let provider = otlp_http::tracer_provider(&endpoint, SERVICE, runtime.handle().clone())?;
    global::set_tracer_provider(provider.clone());
    println!("sending spans to {}", otlp_http::traces_url(&endpoint));

    let outcome = runtime.block_on(serve_three_requests());

    // Outside the runtime's threads, so the last batch's request can still run on them.
    if let Err(error) = provider.force_flush() {
        eprintln!("the spans were not accepted by {endpoint}: {error}");
    }
    provider.shutdown()?;
    for (name, trace, answer) in outcome? {
        println!("{name:<10} trace {trace}  {answer}");
    }
    Ok(())
}

/// Submits the three requests together, each under its own "handle request" span, and
/// returns each one's name, trace id and answer.
async fn serve_three_requests() -> Result<Vec<(&'static str, String, String)>, Error> {
    let config = WorkerPoolConfig::new()
        .with_name("otel-example")
        .with_worker_count(2)
        .with_max_units(4)
        .with_retry(Retries::new(3, Duration::from_millis(100)));
    let pool = WorkerPool::new(config, Model::default())?;
    pool.retry_tasks();

    let requests = [
        ("summarise", 1, 3, Job::Work(Duration::from_millis(300))),
        ("translate", 2, 2, Job::Work(Duration::from_millis(100))),
        ("flaky", 3, 1, Job::Flaky),
    ];
    let handled = requests.map(|(name, id, units, job)| {
        let pool = &pool;
        async move { handle_request(pool, name, id, units, job).await }
    });
    let outcome = futures_util::future::join_all(handled).await;
    pool.shutdown_with_drain(Duration::from_secs(5)).await?;
    outcome.into_iter().collect()
}

/// One request as a web handler would serve it: a span of its own, the task submitted and
/// its answer awaited under it.
async fn handle_request(
    pool: &WorkerPool<Job, String, Model>,
    name: &'static str,
    id: u64,
    units: u32,
    job: Job,
) -> Result<(&'static str, String, String), Error> {
    let tracer = global::tracer_provider().tracer(SERVICE);
    let span = tracer
        .span_builder("handle request")
        .with_attributes([KeyValue::new("request", name)])
        .start(&tracer);
    let trace = span.span_context().trace_id().to_string();
    let context = Context::current_with_span(span);
    let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units))
        .with_mailbox(MailboxKey::new("example").with_session(name));
    let answer = async {
        let key = pool.submit_async(job, meta).await?;
        pool.retrieve_async(&key, Duration::from_secs(10)).await
    }
    .with_context(context.clone())
    .await;
    context.span().end();
    Ok((name, trace, answer?))
}
