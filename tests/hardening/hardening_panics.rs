//! Reliability sweep (issue 7), panics in user values: a panic payload, a future or a result
//! whose `Drop` panics must cost one task at most. The worker is replaced, capacity is
//! released, and the pool keeps serving.
//!
//! Every case is bounded in time: a regression fails instead of hanging.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::SubmitOptions;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::{Priority, TaskId};
use support::{eventually, gpu, settings};

const WAIT: Duration = Duration::from_secs(10);

/// Panics when dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("bomb");
    }
}

/// A result that may carry a [`Bomb`]. A test that takes one forgets it.
struct Answer {
    id: TaskId,
    bomb: Option<Bomb>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Answer({}, bomb: {})", self.id, self.bomb.is_some())
    }
}

/// What a task does.
enum Act {
    /// Returns its id.
    Quick,
    /// Panics with a payload whose `Drop` panics.
    PanicWithBomb,
    /// Holds a bomb across a long await (raising its flag once it holds it): the timeout or a
    /// cancel drops it.
    HoldBombAndSleep(Duration, Arc<AtomicBool>),
    /// Blocks its thread, then returns a result carrying a bomb.
    BlockThenBombResult(Duration),
    /// Returns a result carrying a bomb.
    BombResult,
}

#[derive(Clone)]
struct Hazards;

#[async_trait::async_trait]
impl WorkerExecutor<Act, Answer> for Hazards {
    async fn execute(&self, act: Act, meta: TaskMetadata) -> Answer {
        let bomb = match act {
            Act::Quick => None,
            Act::PanicWithBomb => std::panic::panic_any(Bomb),
            Act::HoldBombAndSleep(duration, armed) => {
                let held = Bomb;
                armed.store(true, Ordering::SeqCst);
                tokio::time::sleep(duration).await;
                Some(held)
            }
            Act::BlockThenBombResult(duration) => {
                std::thread::sleep(duration);
                Some(Bomb)
            }
            Act::BombResult => Some(Bomb),
        };
        Answer { id: meta.id, bomb }
    }
}

/// The id of a successful answer; a bomb it carries is forgotten, not dropped.
fn answered(outcome: Result<Answer, PoolError>) -> Result<TaskId, PoolError> {
    outcome.map(|mut answer| {
        std::mem::forget(answer.bomb.take());
        answer.id
    })
}

type Pool = WorkerPool<Act, Answer, Hazards>;

async fn submit(pool: &Pool, act: Act, id: TaskId) -> prometheus_parking_lot::MailboxKey {
    pool.submit_async(act, gpu(id, Priority::Normal, 2))
        .await
        .unwrap()
}

/// The pool is whole again: every worker thread alive, no capacity held, and tasks run.
async fn assert_serving(pool: &Pool, workers: usize, first_id: TaskId) {
    eventually("all worker threads alive", || {
        pool.stats().live_worker_threads == workers
    })
    .await;
    eventually("no capacity held", || pool.stats().used_units == 0).await;
    for id in first_id..first_id + 2 * workers as TaskId {
        let key = submit(pool, Act::Quick, id).await;
        assert_eq!(
            answered(pool.retrieve_async(&key, WAIT).await),
            Ok(id),
            "the pool serves on"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_payload_that_panics_when_dropped_fails_only_its_task() {
    let pool = WorkerPool::new(settings("bomb-payload", 2, 8), Hazards).unwrap();
    let key = submit(&pool, Act::PanicWithBomb, 1).await;
    let outcome = answered(pool.retrieve_async(&key, WAIT).await);
    assert!(matches!(outcome, Err(PoolError::Failed(_))), "{outcome:?}");
    eventually("the worker was replaced", || {
        pool.stats().worker_restarts == 1
    })
    .await;
    assert_serving(&pool, 2, 10).await;
    let stats = pool.stats();
    assert_eq!((stats.failed_tasks, stats.completed_tasks), (1, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_that_panics_when_the_timeout_drops_it_ends_timed_out() {
    let pool =
        WorkerPool::new(settings("bomb-timeout", 2, 8).with_timeout_ms(100), Hazards).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let key = submit(
        &pool,
        Act::HoldBombAndSleep(Duration::from_secs(30), armed),
        1,
    )
    .await;
    let outcome = answered(pool.retrieve_async(&key, WAIT).await);
    eventually("the worker was replaced", || {
        pool.stats().worker_restarts == 1
    })
    .await;
    assert_serving(&pool, 2, 10).await;
    assert_eq!(
        outcome,
        Err(PoolError::TimedOut),
        "the task ran past its timeout; its dropped future's panic comes after"
    );
    assert_eq!(pool.stats().timed_out_tasks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_that_panics_when_cancel_drops_it_ends_cancelled() {
    let pool = WorkerPool::new(settings("bomb-cancel", 2, 8), Hazards).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let key = submit(
        &pool,
        Act::HoldBombAndSleep(Duration::from_secs(30), armed.clone()),
        1,
    )
    .await;
    // Cancel once the future holds its bomb: a cancel that reaches the worker before it first
    // polls the future drops it unpolled, with no bomb in it and nothing to replace.
    eventually("the task holds its bomb", || armed.load(Ordering::SeqCst)).await;
    assert_eq!(pool.cancel(&key, 1).await, Ok(()));
    let outcome = answered(pool.retrieve_async(&key, WAIT).await);
    eventually("the worker was replaced", || {
        pool.stats().worker_restarts == 1
    })
    .await;
    assert_serving(&pool, 2, 10).await;
    assert_eq!(
        outcome,
        Err(PoolError::Cancelled),
        "the cancel succeeded; its dropped future's panic comes after"
    );
    assert_eq!(pool.stats().cancelled_tasks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_that_panics_when_dropped_after_the_watchdog_fired_is_contained() {
    let pool = WorkerPool::new(settings("bomb-late", 1, 8), Hazards).unwrap();
    let options = SubmitOptions {
        timeout: Some(Duration::from_millis(50)),
        ..SubmitOptions::default()
    };
    let key = pool
        .submit_with(
            Act::BlockThenBombResult(Duration::from_millis(400)),
            gpu(1, Priority::Normal, 2),
            options,
        )
        .await
        .unwrap();
    assert_eq!(
        answered(pool.retrieve_async(&key, WAIT).await),
        Err(PoolError::TimedOut),
        "the watchdog answered"
    );
    // The thread returns its bomb-carrying result after the watchdog: it is discarded.
    eventually("the blocked thread returned", || {
        pool.stats().used_units == 0
    })
    .await;
    assert_serving(&pool, 1, 10).await;
    assert_eq!(
        pool.client()
            .try_retrieve(&key)
            .await
            .map(|answer| answer.id),
        Err(PoolError::ResultNotFound),
        "one outcome: the late result was not stored"
    );
    let stats = pool.stats();
    assert_eq!((stats.timed_out_tasks, stats.completed_tasks), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_result_that_panics_when_purged_by_retention_breaks_nothing() {
    let config = settings("bomb-purge", 2, 8).with_retention(Some(Duration::from_secs(1)));
    let pool = WorkerPool::new(config, Hazards).unwrap();
    let forgotten = submit(&pool, Act::BombResult, 1).await;
    eventually("the bomb is stored", || pool.stats().completed_tasks == 1).await;
    // A retrieve waiting on another key across the purge.
    let waiting_key = prometheus_parking_lot::MailboxKey::new("patient");
    let waiting = {
        let client = pool.client().clone();
        let key = waiting_key.clone();
        tokio::spawn(async move { client.retrieve(&key, WAIT).await.map(|answer| answer.id) })
    };
    eventually("the result was purged", || {
        pool.stats().expired_results == 1
    })
    .await;
    assert_eq!(
        pool.client()
            .try_retrieve(&forgotten)
            .await
            .map(|answer| answer.id),
        Err(PoolError::ResultNotFound)
    );
    let meta = TaskMetadata {
        mailbox: Some(waiting_key),
        ..gpu(2, Priority::Normal, 2)
    };
    pool.submit_async(Act::Quick, meta).await.unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap(),
        Ok(2)
    );
    assert_serving(&pool, 2, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncollected_result_that_panics_when_dropped_does_not_escape_the_pool_drop() {
    let pool = WorkerPool::new(settings("bomb-left", 1, 8), Hazards).unwrap();
    submit(&pool, Act::BombResult, 1).await;
    eventually("the bomb is stored", || pool.stats().completed_tasks == 1).await;
    let report = tokio::time::timeout(WAIT, pool.shutdown_with_drain(Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(report.is_ok(), "{report:?}");
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(pool)));
    assert!(
        dropped.is_ok(),
        "dropping a pool panicked because a result it still held panicked in Drop"
    );
}
