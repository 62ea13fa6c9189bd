//! What tracing costs a pool (the `otel` feature): tasks through an in-memory pool with no
//! tracer provider installed (tasks carry no trace; a branch per step) beside the same run
//! with an SDK provider that records every span (submit, wait, run, deliver) and hands it to
//! a batch processor, in the same process, rounds alternating.
//!
//! Each round: N no-op tasks of one unit, submitted from 4 submitters (each waits for its
//! admission answer) to a pool of 4 workers and 4 units, every result retrieved. The
//! tasks do nothing, so the ratio is the tracing's cost per task at its most visible: a
//! task that runs for milliseconds hides it.
//! Throughput is tasks per second; the ratio is traced over untraced. `cargo bench -p
//! prometheus_parking_lot_benches --features otel --bench otel_overhead` runs N = 20,000,
//! R = 5 (override with `OTEL_TASKS`, `OTEL_ROUNDS`); under `cargo test` it runs N = 500
//! once as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::global;
use opentelemetry::trace::noop::NoopTracerProvider;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::{MailboxKey, ResourceCost};
use tokio::runtime::Runtime;

const WORKERS: usize = 4;
const SUBMITTERS: u64 = 4;

#[derive(Clone)]
struct Nothing;

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Nothing {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        payload
    }
}

/// One round through a fresh pool: tasks per second.
fn round(runtime: &Runtime, tasks: u64) -> f64 {
    let config = WorkerPoolConfig::new()
        .with_name("traced")
        .with_worker_count(WORKERS)
        .with_max_units(WORKERS as u32)
        .with_max_queue_depth(tasks as usize + 10);
    let pool = Arc::new(WorkerPool::new(config, Nothing).expect("the pool starts"));
    let started = Instant::now();
    runtime.block_on(async {
        let submitters: Vec<_> = (0..SUBMITTERS)
            .map(|submitter| {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move {
                    let ids = (submitter..tasks).step_by(SUBMITTERS as usize);
                    let mut keys = Vec::new();
                    for id in ids {
                        let key = MailboxKey::new("bench").with_session(format!("s{id}"));
                        let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key);
                        keys.push((id, pool.submit_async(id, meta).await.expect("admitted")));
                    }
                    for (id, key) in keys {
                        let result = pool.retrieve_async(&key, Duration::from_secs(60)).await;
                        assert_eq!(result, Ok(id));
                    }
                })
            })
            .collect();
        for submitter in submitters {
            submitter.await.expect("the submitter ends");
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    pool.shutdown();
    tasks as f64 / seconds
}

fn main() {
    let (tasks, rounds) = if support::measured() {
        (
            support::env_u64("OTEL_TASKS", 20_000),
            support::env_u64("OTEL_ROUNDS", 5) as usize,
        )
    } else {
        (500, 1)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let exporter = InMemorySpanExporter::default();
    let (mut untraced, mut traced) = (Vec::new(), Vec::new());
    let mut spans = 0;
    for _ in 0..rounds {
        global::set_tracer_provider(NoopTracerProvider::new());
        untraced.push(round(&runtime, tasks));
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider.clone());
        traced.push(round(&runtime, tasks));
        provider.force_flush().expect("spans flushed");
        spans = exporter.get_finished_spans().expect("spans").len();
        exporter.reset();
    }
    let (untraced, traced) = (support::median(&untraced), support::median(&traced));
    println!("otel_overhead: {tasks} tasks, {rounds} rounds (medians)");
    println!("  no tracer provider:  {untraced:>10.0} tasks/s");
    println!("  every span recorded: {traced:>10.0} tasks/s ({spans} spans in the last round)");
    println!("  traced / untraced:   {:>10.2}", traced / untraced);
    assert!(
        spans as u64 >= tasks * 3,
        "submit, run and deliver for every task: {spans}"
    );
}
