//! 100,000 tasks, 5% of whose executors panic: afterwards every task ended exactly once with
//! the right outcome, the panicked workers were restarted, no capacity is leaked and the
//! process has exactly the configured number of worker threads again.
//!
//! Its own test binary, so the thread count read from /proc belongs to this pool alone.

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::core::{RestartPolicy, StarvationGuard};
use prometheus_parking_lot::util::serde::ResourceCost;

const TASKS: u64 = 100_000;
const PANIC_EVERY: u64 = 20;
const WORKERS: usize = 2;
const IN_FLIGHT: u64 = 2_000;

/// Panics on every 20th task, returns the task id otherwise.
#[derive(Clone)]
struct Flaky;

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Flaky {
    async fn execute(&self, id: u64, _meta: TaskMetadata) -> u64 {
        if id.is_multiple_of(PANIC_EVERY) {
            panic!("flaky task {id}");
        }
        id
    }
}

/// Worker threads of this process, by the (15-character) name the kernel keeps.
fn worker_threads_in_proc() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return WORKERS;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("parking-lot-wor"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_once_and_no_capacity_or_thread_is_leaked() {
    std::panic::set_hook(Box::new(|_| {}));
    let config = WorkerPoolConfig::new()
        .with_name("storm")
        .with_worker_count(WORKERS)
        .with_max_units(64)
        .with_max_queue_depth(TASKS as usize)
        .with_starvation(StarvationGuard::default())
        .with_restart_policy(RestartPolicy {
            max_restarts: 1_000_000,
            within: Duration::from_secs(60),
        });
    let pool = Arc::new(WorkerPool::new(config, Flaky).unwrap());

    let (mut completed, mut failed) = (0u64, 0u64);
    let mut next = 0u64;
    while next < TASKS {
        let window = next..(next + IN_FLIGHT).min(TASKS);
        next = window.end;
        let mut keys = Vec::with_capacity(IN_FLIGHT as usize);
        for id in window {
            let meta = TaskMetadata::new(id, ResourceCost::cpu(1 + (id % 8) as u32));
            keys.push((id, pool.submit_async(id, meta).await.expect("admitted")));
        }
        for (id, key) in keys {
            match pool.retrieve_async(&key, Duration::from_secs(30)).await {
                Ok(value) => {
                    assert_eq!(value, id);
                    assert_ne!(id % PANIC_EVERY, 0, "task {id} should have panicked");
                    completed += 1;
                }
                Err(PoolError::Failed(message)) => {
                    assert_eq!(id % PANIC_EVERY, 0, "task {id} failed: {message}");
                    assert!(message.contains(&format!("flaky task {id}")), "{message}");
                    failed += 1;
                }
                Err(other) => panic!("task {id} ended {other:?}"),
            }
            assert_eq!(
                pool.client().try_retrieve(&key).await,
                Err(PoolError::ResultNotFound),
                "task {id} ended twice"
            );
        }
    }
    assert_eq!(
        (completed, failed),
        (TASKS - TASKS / PANIC_EVERY, TASKS / PANIC_EVERY)
    );

    let panics = TASKS / PANIC_EVERY;
    for _ in 0..1_000 {
        let stats = pool.stats();
        if stats.worker_restarts == panics && stats.live_worker_threads == WORKERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = pool.stats();
    assert_eq!(stats.worker_restarts, panics, "one restart per panic");
    assert_eq!(stats.live_worker_threads, WORKERS);
    assert_eq!(worker_threads_in_proc(), WORKERS);
    assert_eq!(
        (stats.used_units, stats.active_tasks, stats.queued_tasks),
        (0, 0, 0)
    );
    assert_eq!(
        (
            stats.submitted_tasks,
            stats.completed_tasks,
            stats.failed_tasks
        ),
        (TASKS, completed, failed)
    );
}
