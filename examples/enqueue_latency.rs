//! Enqueue latency through the Postgres queue: a producer-only pool (`worker_threads: 0`)
//! parks a batch of tasks with one `submit_batch` (each task is in the table when it returns),
//! again and again, and prints the median and p90 batch latency and how many batches took
//! 40 ms or more (the delayed-ACK stall a connection without `TCP_NODELAY` pays).
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --features postgres --example enqueue_latency
//! ```
//!
//! `ROUNDS` (default 50), `BATCH` (tasks a batch, 50) and `PAYLOAD` (bytes a task, 100) change
//! the run. `scripts/downstream_latency.sh` builds it as a crate that depends on this one.

use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};

/// Never runs: the producer node has no workers.
#[derive(Clone)]
struct Unused;

#[async_trait::async_trait]
impl TaskExecutor<String, u64> for Unused {
    async fn execute(&self, _text: String, meta: TaskMetadata) -> u64 {
        meta.id
    }
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A producer-only node on a queue of its own.
fn producer_config() -> SchedulerConfig {
    let text = serde_json::json!({
        "database_url": "${DATABASE_URL}",
        "pools": { "producer": {
            "worker_threads": 0,
            "max_units": 1_000_000,
            "max_queue_depth": 10_000_000,
            "queue": { "type": "postgres", "queue_name": format!("enqueue_latency_{}", std::process::id()) },
            "mailbox": { "storage": { "type": "postgres", "table": "pl_mailbox_messages" } }
        } }
    });
    SchedulerConfig::from_json_str(&text.to_string()).expect("the example's config is valid")
}

fn main() {
    let (rounds, batch, payload) = (
        setting("ROUNDS", 50),
        setting("BATCH", 50),
        setting("PAYLOAD", 100),
    );
    if std::env::var("DATABASE_URL").is_err() {
        std::env::set_var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    }
    let built = build_pools_from_scheduler_config::<String, u64, Unused, TokioSpawner>(
        &producer_config(),
        &QueueBuilderContext::Embedded,
        None,
        |_| Unused,
        TokioSpawner,
    )
    .expect("the producer starts");
    let client = built.pools["producer"].client().clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Three batches warm the connection pool and the statement cache first.
    let warm_up = 3;
    let mut latencies = runtime.block_on(async move {
        let key =
            MailboxKey::new("example").with_session(format!("enqueue-{}", std::process::id()));
        let mut latencies = Vec::new();
        for round in 0..rounds + warm_up {
            let tasks = (0..batch)
                .map(|n| {
                    let meta = TaskMetadata::new(round * batch + n, ResourceCost::gpu_vram(1))
                        .with_mailbox(key.clone());
                    ScheduledTask::new(meta, "x".repeat(payload as usize))
                })
                .collect();
            let started = Instant::now();
            for answer in client.submit_batch(tasks, SubmitOptions::default()).await {
                answer.expect("parked");
            }
            if round >= warm_up {
                latencies.push(started.elapsed());
            }
        }
        latencies
    });
    latencies.sort();
    let ms = |latency: Duration| latency.as_secs_f64() * 1e3;
    let stalled = latencies
        .iter()
        .filter(|latency| **latency >= Duration::from_millis(40))
        .count();
    println!(
        "{} batches of {batch} tasks x {payload} B: median {:.1} ms, p90 {:.1} ms, {stalled} of {} took >= 40 ms",
        latencies.len(),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 9 / 10]),
        latencies.len()
    );
}
