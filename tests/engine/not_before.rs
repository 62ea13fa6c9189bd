//! Scheduled starts through the public faces, in memory: a task submitted with
//! `SubmitOptions::with_not_before` or `with_delay` is admitted at once, says it sleeps
//! (`WaitReason::Sleeping`), starts no earlier than its instant, can be cancelled while it
//! sleeps, and ranks among the parked tasks as usual once awake; the batch path takes the
//! option for every task of the batch, and a streamed task may be scheduled too; absurd
//! values are refused naming the field.

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::{
    PoolError, ScheduledTask, SubmitOptions, TaskMetadata, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::{MailboxKey, Priority, ResourceCost, WorkerPoolConfig};

use crate::support::eventually;

/// Each run's task id and the time it started (ms since the epoch); a payload of `true`
/// holds its worker until the test lets it go.
#[derive(Clone, Default)]
struct Clocked {
    starts: Arc<Mutex<Vec<(u64, u128)>>>,
    hold: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl WorkerExecutor<bool, u64> for Clocked {
    async fn execute(&self, holds: bool, meta: TaskMetadata) -> u64 {
        self.starts
            .lock()
            .expect("starts")
            .push((meta.id, now_ms()));
        if holds {
            self.hold.notified().await;
        }
        meta.id
    }
}

impl Clocked {
    fn started(&self) -> Vec<u64> {
        let starts = self.starts.lock().expect("starts");
        starts.iter().map(|&(id, _)| id).collect()
    }

    fn started_at(&self, id: u64) -> Option<u128> {
        let starts = self.starts.lock().expect("starts");
        starts
            .iter()
            .find(|&&(run, _)| run == id)
            .map(|&(_, at)| at)
    }
}

fn pool(workers: usize, units: u32) -> (WorkerPool<bool, u64, Clocked>, Clocked) {
    let executor = Clocked::default();
    let config = WorkerPoolConfig::new()
        .with_worker_count(workers)
        .with_max_units(units)
        .with_max_queue_depth(100);
    let pool = WorkerPool::new(config, executor.clone()).expect("the pool starts");
    (pool, executor)
}

/// Task `id`, under a key of its own (so each retrieve takes its own result).
fn meta(id: u64) -> TaskMetadata {
    let key = MailboxKey::new("acme").with_session(format!("task-{id}"));
    TaskMetadata::new(id, ResourceCost::gpu_vram(1)).with_mailbox(key)
}

fn not_before(at_ms: u128) -> SubmitOptions {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(at_ms).expect("fits"));
    SubmitOptions::default().with_not_before(at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_task_sleeps_and_starts_no_earlier_than_its_instant() {
    let (pool, clocked) = pool(2, 4);
    let at_ms = now_ms() + 400;
    let key = pool
        .submit_with(false, meta(1), not_before(at_ms))
        .await
        .expect("admitted at once");
    assert_eq!(
        pool.why_waiting(&key, 1).await,
        Ok(Some(WaitReason::Sleeping { until_ms: at_ms })),
        "it sleeps with every unit free"
    );
    assert_eq!(pool.stats().queued_tasks, 1, "counted as parked");
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(1)
    );
    let started = clocked.started_at(1).expect("it ran");
    assert!(started >= at_ms, "started at {started}, before {at_ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_is_counted_from_the_submission() {
    let (pool, clocked) = pool(1, 4);
    let before = now_ms();
    let options = SubmitOptions::default().with_delay(Duration::from_millis(300));
    let key = pool
        .submit_with(false, meta(1), options)
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(1)
    );
    let started = clocked.started_at(1).expect("it ran");
    assert!(
        started >= before + 300,
        "started {} ms after",
        started - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_task_can_be_cancelled_and_never_runs() {
    let (pool, clocked) = pool(2, 4);
    let at_ms = now_ms() + 300;
    let key = pool
        .submit_with(false, meta(1), not_before(at_ms))
        .await
        .expect("admitted");
    // A later sleeper: once it has run, the cancelled one's instant is long past.
    let witness = pool
        .submit_with(false, meta(2), not_before(at_ms + 200))
        .await
        .expect("admitted");
    assert_eq!(pool.cancel(&key, 1).await, Ok(()));
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(
        pool.retrieve_async(&witness, Duration::from_secs(10)).await,
        Ok(2)
    );
    assert_eq!(
        clocked.started(),
        vec![2],
        "the cancelled sleeper never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awake_task_ranks_among_the_parked_as_usual() {
    // One worker, held: a Low task parks; a High task scheduled a moment later wakes behind
    // it in time, ahead of it in rank, and runs first once the worker is free.
    let (pool, clocked) = pool(1, 4);
    pool.submit_async(true, meta(1)).await.expect("runs");
    eventually("task 1 runs", || clocked.started() == vec![1]).await;
    pool.submit_async(false, meta(2).with_priority(Priority::Low))
        .await
        .expect("parks");
    let at_ms = now_ms() + 200;
    let high = meta(3).with_priority(Priority::High);
    let key = pool
        .submit_with(false, high, not_before(at_ms))
        .await
        .expect("sleeps");
    let mut woke = false;
    for _ in 0..1_000 {
        let reason = pool.why_waiting(&key, 3).await;
        if !matches!(reason, Ok(Some(WaitReason::Sleeping { .. }))) {
            woke = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(woke, "task 3 wakes within 10 s");
    assert_eq!(clocked.started(), vec![1], "the worker is still held");
    clocked.hold.notify_one();
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(10)).await,
        Ok(3)
    );
    eventually("all three ran", || clocked.started().len() == 3).await;
    assert_eq!(clocked.started(), vec![1, 3, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_takes_the_instant_for_every_task() {
    let (pool, clocked) = pool(2, 4);
    let at_ms = now_ms() + 300;
    let tasks = (1..=3)
        .map(|id| ScheduledTask::new(meta(id), false))
        .collect();
    let keys = pool.client().submit_batch(tasks, not_before(at_ms)).await;
    for (id, key) in (1..=3).zip(&keys) {
        let key = key.as_ref().expect("admitted");
        assert!(
            matches!(
                pool.why_waiting(key, id).await,
                Ok(Some(WaitReason::Sleeping { .. }))
            ),
            "task {id} sleeps"
        );
    }
    eventually("all three ran", || clocked.started().len() == 3).await;
    for id in 1..=3 {
        let started = clocked.started_at(id).expect("ran");
        assert!(started >= at_ms, "task {id} started before its instant");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_instants_are_refused_naming_the_field() {
    let (pool, clocked) = pool(1, 4);
    let year_and_a_half = now_ms() + 548 * 24 * 3_600 * 1_000;
    let refused = pool
        .submit_with(false, meta(1), not_before(year_and_a_half))
        .await;
    assert!(
        matches!(&refused, Err(PoolError::InvalidConfig(text)) if text.contains("not_before_ms")),
        "{refused:?}"
    );
    let soon = now_ms() + 60_000;
    let mut late = meta(2);
    late.deadline_ms = Some(soon - 1_000);
    let refused = pool.submit_with(false, late, not_before(soon)).await;
    assert!(
        matches!(&refused, Err(PoolError::InvalidConfig(text)) if text.contains("deadline_ms")),
        "{refused:?}"
    );
    assert_eq!(pool.stats().queued_tasks, 0);
    assert!(clocked.started().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_task_may_be_scheduled() {
    use futures_util::StreamExt;
    let (pool, clocked) = pool(1, 4);
    let at_ms = now_ms() + 300;
    let task = ScheduledTask::new(meta(1), false);
    let stream = pool
        .client()
        .submit_streaming(task, not_before(at_ms), 4)
        .await
        .expect("admitted");
    let items: Vec<_> = stream.collect().await;
    assert_eq!(items, vec![Ok(1)], "its outcome ends the stream");
    let started = clocked.started_at(1).expect("it ran");
    assert!(started >= at_ms, "started at {started}, before {at_ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_view_lists_a_sleeper_after_the_parked_with_its_time() {
    // One worker, held: task 2 parks; task 3 sleeps.
    let (pool, clocked) = pool(1, 4);
    pool.submit_async(true, meta(1)).await.expect("runs");
    eventually("task 1 runs", || clocked.started() == vec![1]).await;
    pool.submit_async(false, meta(2)).await.expect("parks");
    let until_ms = now_ms() + 60_000;
    pool.submit_with(
        false,
        meta(3).with_priority(Priority::High),
        not_before(until_ms),
    )
    .await
    .expect("sleeps");
    let view = pool.inspect(0, 10).await.expect("a view");
    assert_eq!(view.parked_total, 2);
    let parked: Vec<_> = view
        .parked
        .iter()
        .map(|task| (task.id, task.reason.clone()))
        .collect();
    assert_eq!(parked[0].0, 2, "the parked task first: {parked:?}");
    assert_eq!(
        parked[1],
        (3, Some(WaitReason::Sleeping { until_ms })),
        "then the sleeper, with its time"
    );
    clocked.hold.notify_one();
}
