//! Failed runs tried again (`retry`): in memory (the pool keeps a copy of each payload) and
//! on a yaque queue (the queue keeps it), through the config path; the backoff, the final
//! failure with every run's reason, cancelling a task that waits out its backoff, and what
//! happens without the copy or without retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::WorkerExecutor;
use prometheus_parking_lot::core::{PoolError, Retries};
#[cfg(any(feature = "yaque", feature = "postgres"))]
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
};
use prometheus_parking_lot::{
    running, MailboxKey, ResourceCost, ScheduledTask, TaskExecutor, TaskMetadata, WorkerPool,
    WorkerPoolConfig,
};

/// How a task's runs go: the first `fail` runs fail (by `retry_later`, or by a panic with
/// `panics`), the next returns the task's id times 10.
#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Flaky {
    fail: u32,
    panics: bool,
    /// Asks for a retry, then runs until it is cancelled.
    #[serde(default)]
    until_cancelled: bool,
}

/// Counts each task's runs and when they started.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<u64, Vec<Instant>>>>);

impl Runs {
    fn of(&self, id: u64) -> Vec<Instant> {
        self.0.lock().unwrap().get(&id).cloned().unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl TaskExecutor<Flaky, u64> for Runs {
    async fn execute(&self, flaky: Flaky, meta: TaskMetadata) -> u64 {
        let run = {
            let mut runs = self.0.lock().unwrap();
            let starts = runs.entry(meta.id).or_default();
            starts.push(Instant::now());
            starts.len() as u32
        };
        if flaky.until_cancelled {
            running::retry_later("asked, then cancelled");
            while !running::is_cancelled() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            return 0;
        }
        if run <= flaky.fail {
            if flaky.panics {
                panic!("run {run} broke");
            }
            running::retry_later(format!("run {run}: 503 Service Unavailable"));
            return 0;
        }
        meta.id * 10
    }
}

#[async_trait::async_trait]
impl WorkerExecutor<Flaky, u64> for Runs {
    async fn execute(&self, flaky: Flaky, meta: TaskMetadata) -> u64 {
        TaskExecutor::execute(self, flaky, meta).await
    }
}

fn task(id: u64, fail: u32, panics: bool) -> ScheduledTask<Flaky> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(MailboxKey::new("t")),
        Flaky {
            fail,
            panics,
            until_cancelled: false,
        },
    )
}

const WAIT: Duration = Duration::from_secs(20);

fn memory_pool(retry: Option<Retries>, copies: bool) -> (WorkerPool<Flaky, u64, Runs>, Runs) {
    let runs = Runs::default();
    let mut config = WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(4);
    if let Some(retry) = retry {
        config = config.with_retry(retry);
    }
    let pool = WorkerPool::new(config, runs.clone()).expect("the pool starts");
    if copies {
        pool.retry_tasks();
    }
    (pool, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_run_is_tried_again_after_a_growing_backoff_until_it_succeeds() {
    let retry = Retries::new(4, Duration::from_millis(100));
    let (pool, runs) = memory_pool(Some(retry), true);
    let key = pool
        .submit_async(task(7, 2, false).payload, task(7, 2, false).meta)
        .await
        .expect("admitted");
    assert_eq!(pool.retrieve_async(&key, WAIT).await, Ok(70));
    let starts = runs.of(7);
    assert_eq!(starts.len(), 3, "two failed runs and the one that worked");
    // Each wait is at least half the doubled backoff: 50 ms, then 100 ms.
    let gaps: Vec<u128> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert!(gaps[0] >= 49 && gaps[1] >= 99, "backoffs {gaps:?}");
    let stats = pool.stats();
    assert_eq!(stats.retried_runs, 2);
    assert_eq!((stats.completed_tasks, stats.failed_tasks), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_failure_carries_every_runs_reason() {
    let retry = Retries::new(3, Duration::from_millis(10));
    let (pool, runs) = memory_pool(Some(retry), true);
    let flaky = task(8, 99, true);
    let key = pool
        .submit_async(flaky.payload, flaky.meta)
        .await
        .expect("admitted");
    let outcome = pool.retrieve_async(&key, WAIT).await;
    let Err(PoolError::Failed(reason)) = outcome else {
        panic!("a final failure, not {outcome:?}");
    };
    assert!(
        reason.starts_with("3 runs failed; run 1: executor panicked: run 1 broke"),
        "{reason}"
    );
    assert!(
        reason.contains("run 3: executor panicked: run 3 broke"),
        "{reason}"
    );
    assert_eq!(runs.of(8).len(), 3, "max_attempts runs in all");
    let stats = pool.stats();
    assert_eq!((stats.retried_runs, stats.failed_tasks), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_copy_of_the_payload_a_memory_pool_says_why_it_did_not_retry() {
    let retry = Retries::new(3, Duration::from_millis(10));
    let (pool, runs) = memory_pool(Some(retry), false);
    let flaky = task(9, 1, false);
    let key = pool
        .submit_async(flaky.payload, flaky.meta)
        .await
        .expect("admitted");
    let outcome = pool.retrieve_async(&key, WAIT).await;
    let Err(PoolError::Failed(reason)) = outcome else {
        panic!("a failure, not {outcome:?}");
    };
    assert!(
        reason.starts_with("run 1: 503 Service Unavailable"),
        "{reason}"
    );
    assert!(reason.contains("call retry_tasks()"), "{reason}");
    assert_eq!(runs.of(9).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retries_a_run_that_asks_for_one_fails_with_its_reason() {
    let (pool, runs) = memory_pool(None, true);
    let flaky = task(10, 1, false);
    let key = pool
        .submit_async(flaky.payload, flaky.meta)
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::Failed("run 1: 503 Service Unavailable".into()))
    );
    assert_eq!(runs.of(10).len(), 1);
    assert_eq!(pool.stats().retried_runs, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_out_its_backoff_can_be_cancelled() {
    let retry = Retries::new(5, Duration::from_secs(30));
    let (pool, runs) = memory_pool(Some(retry), true);
    let flaky = task(11, 9, false);
    let key = pool
        .submit_async(flaky.payload, flaky.meta)
        .await
        .expect("admitted");
    let deadline = Instant::now() + WAIT;
    while pool.stats().retried_runs < 1 {
        assert!(Instant::now() < deadline, "the first run failed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        pool.stats().queued_tasks,
        1,
        "it waits out its backoff, parked"
    );
    pool.cancel(&key, 11).await.expect("cancelled");
    assert_eq!(
        pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(runs.of(11).len(), 1);
    // The gauges follow the scheduler's batch, just after the outcome went out.
    while pool.stats().queued_tasks != 0 {
        assert!(Instant::now() < deadline, "nothing left parked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_is_not_tried_again_whatever_it_asked() {
    let retry = Retries::new(5, Duration::from_millis(10));
    let (pool, runs) = memory_pool(Some(retry), true);
    let mut stuck = task(12, 0, false);
    stuck.payload.until_cancelled = true;
    let key = pool
        .submit_async(stuck.payload, stuck.meta)
        .await
        .expect("admitted");
    let deadline = Instant::now() + WAIT;
    while runs.of(12).is_empty() {
        assert!(Instant::now() < deadline, "it started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    pool.cancel(&key, 12).await.expect("cancelled");
    assert_eq!(
        pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(runs.of(12).len(), 1);
    assert_eq!(pool.stats().retried_runs, 0);
}

#[cfg(feature = "yaque")]
fn yaque_pool(
    dir: &std::path::Path,
) -> (prometheus_parking_lot::ResourcePool<Flaky, u64, Runs>, Runs) {
    let config = serde_json::json!({ "pools": { "q": {
        "worker_threads": 2,
        "max_units": 4,
        "retry": { "max_attempts": 3, "backoff_ms": 40 },
        "queue": { "type": "yaque", "path": dir, "stream": "retries" }
    } } });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    let runs = Runs::default();
    let executor = runs.clone();
    let mut built = build_pools_from_scheduler_config::<Flaky, u64, Runs, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        move |_| executor.clone(),
        TokioSpawner,
    )
    .expect("the pool builds");
    (built.pools.remove("q").expect("the pool"), runs)
}

#[cfg(feature = "yaque")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yaque_queue_hands_the_claim_back_and_the_task_runs_again() {
    let dir = std::env::temp_dir().join(format!("pl-retries-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (pool, runs) = yaque_pool(&dir);
    let key = MailboxKey::new("t");
    // Parked first (both workers busy), so the runs come from the queue.
    for (id, fail) in [(1, 0), (2, 0), (3, 2), (4, 5)] {
        pool.submit(task(id, fail, false)).await.expect("admitted");
    }
    let client = pool.client();
    for id in 1..=3 {
        assert_eq!(
            client.retrieve_task(&key, id, WAIT).await,
            Ok(id * 10),
            "task {id}"
        );
    }
    assert_eq!(runs.of(3).len(), 3, "task 3 ran a third time and worked");
    let outcome = client.retrieve_task(&key, 4, WAIT).await;
    assert!(
        matches!(&outcome, Err(PoolError::Failed(reason)) if reason.starts_with("3 runs failed")),
        "{outcome:?}"
    );
    let stats = pool.stats();
    assert_eq!(stats.retried_runs, 4);
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a shared queue (table and pgmq) the queue keeps the task and counts its claims: a
/// failed run's claim is parked again there, from the end of its backoff, for any node, and
/// the task's last run ends it `Failed`, dead-lettered in the queue.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_queue_parks_a_failed_claim_again_and_ends_it_after_its_last_attempt() {
    let mut layouts = vec!["postgres"];
    if cfg!(feature = "pgmq") {
        layouts.push("postgres_pgmq");
    }
    for layout in layouts {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let name = format!("retries_{}_{}", std::process::id(), nanos % 1_000_000_000);
        let config = serde_json::json!({
            "database_url": std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            "pools": { "shared": {
                "worker_threads": 2,
                "max_units": 4,
                "retry": { "max_attempts": 3, "backoff_ms": 50 },
                "queue": { "type": layout, "queue_name": name, "lease_ms": 3_000 },
                "mailbox": { "storage": { "type": "in_memory" } }
            } }
        });
        let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
        let runs = Runs::default();
        let executor = runs.clone();
        let mut built = tokio::task::spawn_blocking(move || {
            build_pools_from_scheduler_config::<Flaky, u64, Runs, TokioSpawner>(
                &config,
                &QueueBuilderContext::Embedded,
                None,
                move |_| executor.clone(),
                TokioSpawner,
            )
        })
        .await
        .expect("built off the runtime")
        .expect("the pool builds");
        let pool = built.pools.remove("shared").expect("the pool");
        let key = MailboxKey::new("t");
        pool.submit(task(1, 1, false)).await.expect("admitted");
        pool.submit(task(2, 9, false)).await.expect("admitted");
        let client = pool.client();
        assert_eq!(
            client.retrieve_task(&key, 1, WAIT).await,
            Ok(10),
            "{layout}"
        );
        assert_eq!(runs.of(1).len(), 2, "{layout}: the second run worked");
        let outcome = client.retrieve_task(&key, 2, WAIT).await;
        assert_eq!(
            outcome,
            Err(PoolError::Failed(
                "3 runs failed; the last: run 3: 503 Service Unavailable".into()
            )),
            "{layout}"
        );
        assert_eq!(runs.of(2).len(), 3, "{layout}: max_attempts runs in all");
        assert_eq!(
            pool.stats().retried_runs,
            3,
            "{layout}: one for task 1, two for task 2"
        );
        drop(pool);
        drop(built);
    }
}
