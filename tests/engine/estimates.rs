//! "When will it start?": a parked task's place in line and expected start (core rule 20),
//! through `waiting` and `inspect`; and the opt-in refusal of a submission that would start
//! after its deadline, set in code and in a configuration file.
//!
//! Nothing here depends on how fast the machine is: the running task holds its units until
//! the test opens its gate, and, with no run seen yet, each task is expected to run for its
//! execution timeout (a minute), so the estimates are a minute apart whatever the clock says.
//! The one test of a learnt run holds that run 1.5 s, so that the claim after it is not yet
//! longer than every run seen when the test asks (which would make it late).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::{
    Admission, PoolError, TaskExecutor, TaskMetadata, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, MailboxKey, QueueBuilderContext, ResourceCost,
    ScheduledTask, SchedulerConfig, TokioSpawner, WorkerPoolConfig,
};

const MINUTE_MS: u64 = 60_000;

/// Runs until the gate opens.
#[derive(Clone)]
struct Gated(Arc<AtomicBool>);

impl Gated {
    async fn wait(&self) {
        while !self.0.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        self.wait().await;
        payload
    }
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        self.wait().await;
        payload
    }
}

fn config() -> WorkerPoolConfig {
    WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(10)
        .with_timeout_ms(MINUTE_MS)
}

fn meta(id: u64, units: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(MailboxKey::new("acme"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_task_says_its_place_in_line_and_when_it_should_start() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(config(), Gated(gate.clone())).expect("the pool starts");
    let key = MailboxKey::new("acme");
    pool.submit_async(1, meta(1, 10)).await.expect("runs");
    pool.submit_async(2, meta(2, 6)).await.expect("parks");
    pool.submit_async(3, meta(3, 6)).await.expect("parks");
    assert_eq!(pool.waiting(&key, 1).await, Ok(None), "it runs");
    let second = pool.waiting(&key, 2).await.unwrap().expect("parked");
    let third = pool.waiting(&key, 3).await.unwrap().expect("parked");
    assert!(matches!(second.reason, WaitReason::Units { .. }));
    assert_eq!((second.position, third.position), (1, 2));
    let (Some(second_at), Some(third_at)) = (second.expected_start_ms, third.expected_start_ms)
    else {
        panic!("both have an estimate: {second:?} {third:?}");
    };
    // Task 1 runs a minute at most (its timeout), then task 2 does, then task 3 starts.
    assert!(
        second_at > second.at_ms && second_at <= second.at_ms + u128::from(MINUTE_MS),
        "{second:?}"
    );
    assert_eq!(third_at, second_at + u128::from(MINUTE_MS));
    // With no run seen, the minute is a latest start, and the words say so.
    assert!(second.from_timeouts && third.from_timeouts, "{third:?}");
    assert!(
        third.in_words().starts_with("2nd in line, within ~")
            && third.in_words().contains("no run seen yet"),
        "{}",
        third.in_words()
    );
    let view = pool.inspect(0, 10).await.expect("a view");
    let listed: Vec<_> = view
        .parked
        .iter()
        .map(|task| (task.id, task.position, task.expected_start_ms))
        .collect();
    assert_eq!(
        listed,
        vec![(2, Some(1), Some(second_at)), (3, Some(2), Some(third_at))]
    );
    assert_eq!(view.running[0].position, None);
    assert_eq!(
        pool.waiting(&key, 99).await,
        Err(PoolError::TaskNotFound(99))
    );
    gate.store(true, Ordering::Release);
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_run_is_seen_the_estimate_follows_it_not_the_timeout() {
    let gate = Arc::new(AtomicBool::new(true));
    let pool = WorkerPool::new(config(), Gated(gate.clone())).expect("the pool starts");
    let key = MailboxKey::new("acme");
    // One run of the kind, held for 1.5 s: the pool learns runs take about that long. (A
    // run of a millisecond would make task 2 late as soon as it starts, "longer than every
    // run seen", and a late claim is expected to end halfway to its timeout.)
    gate.store(false, Ordering::Release);
    pool.submit_async(1, meta(1, 10)).await.expect("runs");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    gate.store(true, Ordering::Release);
    assert_eq!(
        pool.client()
            .retrieve_task(&key, 1, Duration::from_secs(30))
            .await,
        Ok(1)
    );
    gate.store(false, Ordering::Release);
    pool.submit_async(2, meta(2, 10)).await.expect("runs");
    pool.submit_async(3, meta(3, 6)).await.expect("parks");
    let third = pool.waiting(&key, 3).await.unwrap().expect("parked");
    let at = third.expected_start_ms.expect("an estimate");
    assert!(!third.from_timeouts, "{third:?}");
    assert!(
        at.saturating_sub(third.at_ms) < u128::from(MINUTE_MS / 4),
        "expected after the run seen, not the minute's timeout: {third:?}"
    );
    assert!(
        third.in_words().starts_with("1st in line, expected in ~"),
        "{}",
        third.in_words()
    );
    gate.store(true, Ordering::Release);
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_that_would_start_after_its_deadline_is_refused_at_once() {
    let gate = Arc::new(AtomicBool::new(false));
    let strict = config().with_admission(Admission {
        refuse_if_late: true,
    });
    let pool = WorkerPool::new(strict, Gated(gate.clone())).expect("the pool starts");
    pool.submit_async(1, meta(1, 10)).await.expect("runs");
    let soon = now_ms() + 5_000;
    let refused = pool
        .submit_async(2, meta(2, 6).with_deadline_ms(soon))
        .await
        .expect_err("it would start about a minute from now");
    let PoolError::WouldMissDeadline(miss) = &refused else {
        panic!("refused with {refused:?}");
    };
    // The refusal's instants compare with the caller's own, as they are.
    assert_eq!(miss.deadline_ms, soon);
    assert!(miss.estimated_start_ms > soon + 40_000, "{refused}");
    assert!(miss.late_by_ms() > 40_000, "{refused}");
    assert!(refused.is_retryable());
    assert!(
        refused.to_string().contains("after its deadline"),
        "{refused}"
    );
    // Time enough, or no deadline: it parks. A task that fits starts whatever its deadline.
    let later = now_ms() + 10 * u128::from(MINUTE_MS);
    pool.submit_async(3, meta(3, 6).with_deadline_ms(later))
        .await
        .expect("parks");
    pool.submit_async(4, meta(4, 6)).await.expect("parks");
    crate::support::eventually("two tasks parked", || pool.stats().queued_tasks == 2).await;
    let stats = pool.stats();
    assert_eq!(stats.rejected_tasks, 1, "{stats:?}");
    gate.store(true, Ordering::Release);
    let key = MailboxKey::new("acme");
    for id in [1, 3, 4] {
        assert_eq!(
            pool.retrieve_async(&key, Duration::from_secs(30)).await,
            Ok(id)
        );
    }
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_setting_a_late_submission_parks() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(config(), Gated(gate.clone())).expect("the pool starts");
    pool.submit_async(1, meta(1, 10)).await.expect("runs");
    pool.submit_async(2, meta(2, 6).with_deadline_ms(now_ms() + 5_000))
        .await
        .expect("parks, to expire later");
    // The gauges are published after the admission is answered: wait for them, bounded.
    crate::support::eventually("the late task parked", || pool.stats().queued_tasks == 1).await;
    gate.store(true, Ordering::Release);
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_file_turns_the_refusal_on() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/refuse_if_late.json");
    let config = SchedulerConfig::from_path(&path).expect("valid config");
    assert!(config.pools["llm"]
        .admission
        .is_some_and(|admission| admission.refuse_if_late));
    let gate = Arc::new(AtomicBool::new(false));
    let executor = Gated(gate.clone());
    let mut built = build_pools_from_scheduler_config::<u64, u64, Gated, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        move |_| executor.clone(),
        TokioSpawner,
    )
    .expect("the pool builds");
    let pool = built.pools.remove("llm").expect("the pool");
    pool.submit(ScheduledTask::new(meta(1, 10), 1))
        .await
        .expect("runs");
    let late = meta(2, 6).with_deadline_ms(now_ms() + 5_000);
    let refused = pool.submit(ScheduledTask::new(late, 2)).await;
    assert!(
        matches!(refused, Err(PoolError::WouldMissDeadline { .. })),
        "{refused:?}"
    );
    gate.store(true, Ordering::Release);
}
