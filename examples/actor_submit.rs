//! Speaking to the actor tree directly: spawn a supervisor on your own tokio runtime, start a
//! pool under it, and send the scheduler a typed `Submit` message with a reply port.
//!
//! Its output: the task's answer (the words it counted), then the pool's counters after it,
//! one per line: one task submitted and completed, none running or parked, and the units the
//! task held given back.
//!
//! ```text
//! cargo run --example actor_submit
//! ```

use std::time::Duration;

use prometheus_parking_lot::actors::ractor::rpc::CallResult;
use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, SchedulerRequest};
use prometheus_parking_lot::core::{PoolError, ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::util::serde::ResourceCost;
use prometheus_parking_lot::{TaskExecutor, WorkerPoolConfig};

/// Counts the words of a prompt.
#[derive(Clone)]
struct WordCount;

#[async_trait::async_trait]
impl TaskExecutor<String, usize> for WordCount {
    async fn execute(&self, prompt: String, _meta: TaskMetadata) -> usize {
        prompt.split_whitespace().count()
    }
}

#[tokio::main]
async fn main() -> Result<(), PoolError> {
    let supervisor = spawn_supervisor().await?;
    // The same settings type every pool takes; `pool_spec` turns it into what the actor
    // tree starts, over the queue and mailbox given.
    let settings = WorkerPoolConfig::new()
        .with_name("words")
        .with_worker_count(2)
        .with_max_units(8)
        .with_timeout_ms(5_000);
    let spec = settings.pool_spec(
        WordCount,
        Box::new(InMemoryQueue::new()),
        Box::new(InMemoryMailbox::new()),
    );
    let pool = start_pool(&supervisor, spec).await?;

    // The typed protocol (requests only): Submit carries the task and a reply port for the
    // admission answer.
    let task = ScheduledTask::new(
        TaskMetadata::new(1, ResourceCost::cpu(1)),
        "parking lots for GPUs".to_string(),
    );
    let answer = pool
        .scheduler()
        .call(
            |reply| SchedulerRequest::Submit {
                task,
                options: SubmitOptions::default(),
                reply,
            },
            Some(Duration::from_secs(5)),
        )
        .await
        .map_err(|error| PoolError::Internal(error.to_string()))?;
    let key = match answer {
        CallResult::Success(admitted) => admitted?,
        CallResult::Timeout | CallResult::SenderError => return Err(PoolError::Shutdown),
    };
    let words = pool.retrieve(&key, Duration::from_secs(5)).await?;
    println!("task 1 counted {words} words");
    let stats = pool.stats();
    for (counter, value) in [
        ("worker threads", stats.worker_count as u64),
        ("tasks submitted", stats.submitted_tasks),
        ("tasks completed", stats.completed_tasks),
        ("tasks failed", stats.failed_tasks),
        ("tasks running", stats.active_tasks as u64),
        ("tasks parked", stats.queued_tasks as u64),
        ("units in use", stats.used_units),
        ("units in total", stats.total_units),
    ] {
        println!("  {counter:<16}{value:>4}");
    }

    pool.shutdown(Duration::from_secs(5)).await?;
    supervisor.stop(None);
    Ok(())
}
