//! End-to-end tests of the actor runtime through the public pools: scheduling decisions,
//! rejections, deadlines, timeouts, panics, cancellation, shutdown and retrieval semantics.

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use prometheus_parking_lot::actors::ractor::rpc::CallResult;
use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, SchedulerRequest};
use prometheus_parking_lot::core::SubmitOptions;
use prometheus_parking_lot::core::{
    EntryId, PoolError, QueueCounts, QueueError, ScheduledTask, Settlement, StoredEntry,
    TaskMetadata, TaskQueue, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::core::{OnGiveUp, PoolLimits, RestartPolicy};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{Priority, ResourceCost, ResourceKind};
use prometheus_parking_lot::ResourcePool;
use prometheus_parking_lot::TaskExecutor;
use support::{eventually, gpu, settings, Job, LabPool};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_order_and_skip_ahead_are_observed() {
    let mut lab = LabPool::new(settings("order", 4, 10));
    let blocker = lab.gated(1);
    lab.pool
        .submit_async(blocker, gpu(1, Priority::Normal, 10))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);

    // Parked behind the blocker: (id, priority, units).
    let parked = [
        (2, Priority::High, 8),
        (3, Priority::Normal, 3),
        (4, Priority::Normal, 2),
        (5, Priority::Low, 1),
        (6, Priority::Critical, 6),
    ];
    let mut keys = Vec::new();
    for (id, priority, units) in parked {
        let job = lab.gated(id);
        keys.push(
            lab.pool
                .submit_async(job, gpu(id, priority, units))
                .await
                .unwrap(),
        );
    }
    eventually("queued_tasks 5", || lab.pool.stats().queued_tasks == 5).await;

    // 10 units free: Critical 6 first; High 8 no longer fits, so 3 and then 1 skip ahead.
    lab.open(1);
    let first: HashSet<_> = [
        lab.next_start().await,
        lab.next_start().await,
        lab.next_start().await,
    ]
    .into();
    assert_eq!(first, HashSet::from([6, 3, 5]));
    lab.assert_no_start().await;
    eventually("used_units 10", || lab.pool.stats().used_units == 10).await;

    // Task 6 frees 6 units: 8 still does not fit, 2 does.
    lab.open(6);
    assert_eq!(lab.next_start().await, 4);
    lab.assert_no_start().await;

    // 3 and 1 free 4 more: now the High task fits.
    lab.open(3);
    lab.assert_no_start().await;
    lab.open(5);
    assert_eq!(lab.next_start().await, 2);
    lab.open(4);
    lab.open(2);
    for (key, (id, ..)) in keys.iter().zip(parked) {
        assert_eq!(lab.pool.retrieve_async(key, WAIT).await, Ok(id));
    }
    eventually("idle pool", || lab.pool.stats().used_units == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_capacity_is_rejected_at_once() {
    let lab = LabPool::new(settings("too-big", 2, 10));
    let refused = lab
        .pool
        .submit_async(Job::Quick, gpu(1, Priority::High, 11))
        .await;
    assert_eq!(
        refused,
        Err(PoolError::InsufficientResources {
            needed: 11,
            available: 10,
            kind: ResourceKind::GpuVram,
        })
    );
    assert_eq!(lab.pool.stats().rejected_tasks, 1);
    eventually("queued_tasks 0", || lab.pool.stats().queued_tasks == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_full_at_max_queue_depth() {
    let mut lab = LabPool::new(settings("full", 1, 4).with_max_queue_depth(2));
    let blocker = lab.gated(1);
    lab.pool
        .submit_async(blocker, gpu(1, Priority::Normal, 4))
        .await
        .unwrap();
    let mut parked = Vec::new();
    for id in [2, 3] {
        let key = lab
            .pool
            .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
            .await
            .unwrap();
        parked.push(key);
    }
    // A newcomer of the same priority finds nothing to shed: refused.
    let refused = lab
        .pool
        .submit_async(Job::Quick, gpu(4, Priority::Normal, 1))
        .await;
    assert_eq!(refused, Err(PoolError::QueueFull));
    eventually("queued_tasks 2", || lab.pool.stats().queued_tasks == 2).await;
    // A Critical one takes the place of the lowest-ranked Normal task, the younger: its
    // caller hears QueueFull (core rule 21), and the older still runs.
    lab.pool
        .submit_async(Job::Quick, gpu(5, Priority::Critical, 1))
        .await
        .unwrap();
    assert_eq!(
        lab.pool.retrieve_async(&parked[1], WAIT).await,
        Err(PoolError::QueueFull)
    );
    eventually("queued_tasks 2", || lab.pool.stats().queued_tasks == 2).await;
    assert_eq!(lab.pool.stats().rejected_tasks, 2);
    lab.open(1);
    assert_eq!(lab.pool.retrieve_async(&parked[0], WAIT).await, Ok(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_tasks_expire_at_their_deadline_while_capacity_stays_busy() {
    let mut lab = LabPool::new(settings("deadline", 1, 4));
    let blocker = lab.gated(1);
    lab.pool
        .submit_async(blocker, gpu(1, Priority::Normal, 4))
        .await
        .unwrap();
    let deadline = now_ms() + 150;
    let key = lab
        .pool
        .submit_async(
            Job::Quick,
            gpu(2, Priority::High, 1).with_deadline_ms(deadline),
        )
        .await
        .unwrap();
    let waited = Instant::now();
    assert_eq!(
        lab.pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::Expired)
    );
    assert!(
        waited.elapsed() < Duration::from_secs(5),
        "expired by a timer, not by a wake-up"
    );
    assert_eq!(lab.pool.stats().expired_tasks, 1);
    eventually("the blocker still runs", || {
        lab.pool.stats().active_tasks == 1
    })
    .await;

    let late = gpu(3, Priority::High, 1).with_deadline_ms(now_ms() - 1);
    assert_eq!(
        lab.pool.submit_async(Job::Quick, late).await,
        Err(PoolError::Expired)
    );
    lab.open(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_executor_past_its_timeout_is_dropped_and_released() {
    let lab = LabPool::new(settings("timeout", 1, 4).with_timeout_ms(100));
    let key = lab
        .pool
        .submit_async(
            Job::Sleep(Duration::from_secs(30)),
            gpu(1, Priority::Normal, 3),
        )
        .await
        .unwrap();
    let waited = Instant::now();
    assert_eq!(
        lab.pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::TimedOut)
    );
    assert!(waited.elapsed() < Duration::from_secs(5));
    eventually("units released", || lab.pool.stats().used_units == 0).await;
    assert_eq!(lab.pool.stats().timed_out_tasks, 1);
    let key = lab
        .pool
        .submit_async(Job::Quick, gpu(2, Priority::Normal, 4))
        .await
        .unwrap();
    assert_eq!(
        lab.pool.retrieve_async(&key, WAIT).await,
        Ok(2),
        "the worker serves on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_thread_times_out_at_once_but_keeps_its_units_until_it_returns() {
    let lab = LabPool::new(settings("blocked", 1, 4));
    let options = SubmitOptions {
        timeout: Some(Duration::from_millis(50)),
        ..SubmitOptions::default()
    };
    let key = lab
        .pool
        .submit_with(
            Job::Block(Duration::from_millis(800)),
            gpu(1, Priority::Normal, 3),
            options,
        )
        .await
        .unwrap();
    let waited = Instant::now();
    assert_eq!(
        lab.pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::TimedOut)
    );
    assert!(
        waited.elapsed() < Duration::from_millis(700),
        "the watchdog answers before the thread returns"
    );
    assert_eq!(
        lab.pool.stats().used_units,
        3,
        "the blocked thread still holds its memory"
    );
    eventually("units released after the thread returns", || {
        lab.pool.stats().used_units == 0
    })
    .await;
    assert_eq!(
        lab.pool.stats().timed_out_tasks,
        1,
        "one terminal state, not two"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_the_task_and_restarts_the_worker() {
    let mut lab = LabPool::new(settings("panic", 2, 8));
    let key = lab
        .pool
        .submit_async(Job::Panic, gpu(1, Priority::Normal, 2))
        .await
        .unwrap();
    match lab.pool.retrieve_async(&key, WAIT).await {
        Err(PoolError::Failed(message)) => {
            assert!(message.contains("task 1 exploded"), "{message}")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    eventually("worker restarted", || lab.pool.stats().worker_restarts == 1).await;
    eventually("two live threads", || {
        lab.pool.stats().live_worker_threads == 2
    })
    .await;
    eventually("used_units 0", || lab.pool.stats().used_units == 0).await;
    for id in 2..6 {
        let key = lab
            .pool
            .submit_async(Job::Quick, gpu(id, Priority::Normal, 2))
            .await
            .unwrap();
        assert_eq!(lab.pool.retrieve_async(&key, WAIT).await, Ok(id));
    }
    let mut names = HashSet::new();
    while let Ok((_, thread)) = lab.started.try_recv() {
        names.insert(thread);
    }
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("parking-lot-worker-panic-")),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_intensity_past_its_bound_escalates_with_a_clear_error() {
    let policy = RestartPolicy {
        max_restarts: 2,
        within: Duration::from_secs(60),
    };
    let lab = LabPool::new(settings("crashloop", 1, 8).with_restart_policy(policy));
    for id in 1..=3 {
        let key = lab
            .pool
            .submit_async(Job::Panic, gpu(id, Priority::Normal, 1))
            .await
            .unwrap();
        assert!(matches!(
            lab.pool.retrieve_async(&key, WAIT).await,
            Err(PoolError::Failed(_))
        ));
    }
    let mut refusal = None;
    for _ in 0..500 {
        match lab
            .pool
            .submit_async(Job::Quick, gpu(100, Priority::Normal, 1))
            .await
        {
            Err(error) => {
                refusal = Some(error);
                break;
            }
            Ok(key) => {
                // It may be sent to a worker that is gone for good: it must end, not hang.
                let outcome = lab.pool.retrieve_async(&key, Duration::from_secs(3)).await;
                assert_ne!(outcome, Err(PoolError::Timeout), "a task was stranded");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    match refusal {
        Some(PoolError::Internal(reason)) => {
            assert!(reason.contains("restart intensity exceeded"), "{reason}")
        }
        other => panic!("expected an escalation, got {other:?}"),
    }
    eventually("no stranded capacity", || lab.pool.stats().used_units == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_parked_and_running_tasks_and_frees_capacity() {
    let mut lab = LabPool::new(settings("cancel", 1, 4));
    let running = lab.gated(1);
    let running_key = lab
        .pool
        .submit_async(running, gpu(1, Priority::Normal, 4))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);
    let parked_key = lab
        .pool
        .submit_async(Job::Quick, gpu(2, Priority::Normal, 4))
        .await
        .unwrap();

    lab.pool.cancel(&parked_key, 2).await.unwrap();
    assert_eq!(
        lab.pool.retrieve_async(&parked_key, WAIT).await,
        Err(PoolError::Cancelled)
    );
    lab.pool.cancel(&running_key, 1).await.unwrap();
    assert_eq!(
        lab.pool.retrieve_async(&running_key, WAIT).await,
        Err(PoolError::Cancelled)
    );
    eventually("units released", || lab.pool.stats().used_units == 0).await;
    assert_eq!(
        lab.pool.cancel(&running_key, 99).await,
        Err(PoolError::TaskNotFound(99))
    );
    assert_eq!(lab.pool.stats().cancelled_tasks, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrieve_timeout_consumes_nothing_and_a_dropped_retrieve_loses_nothing() {
    // A pool that keeps tasks whose waiter gave up (with the in-memory mailbox it would
    // abandon this one, whose key it made: see `compat::inference_server_gives_up`).
    let keep = settings("retrieve", 1, 4).with_on_give_up(Some(OnGiveUp::Keep));
    let mut lab = LabPool::new(keep);
    let job = lab.gated(1);
    let key = lab
        .pool
        .submit_async(job, gpu(1, Priority::Normal, 1))
        .await
        .unwrap();
    assert_eq!(
        lab.pool
            .retrieve_async(&key, Duration::from_millis(20))
            .await,
        Err(PoolError::Timeout)
    );
    // A retrieve dropped mid-wait (a client that went away).
    tokio::select! {
        _ = lab.pool.retrieve_async(&key, WAIT) => panic!("the gate is still closed"),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    lab.open(1);
    assert_eq!(lab.pool.retrieve_async(&key, WAIT).await, Ok(1));
    assert_eq!(
        lab.pool.client().try_retrieve(&key).await,
        Err(PoolError::ResultNotFound),
        "exactly one result"
    );
}

#[test]
fn many_waiting_retrieves_tie_up_no_thread() {
    let pool = std::sync::Arc::new(LabPool::new(settings("waiters", 2, 1_000)).pool);
    // One thread, one runtime: 500 concurrent waits can only all finish if none blocks it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut waits = tokio::task::JoinSet::new();
        for id in 0..500 {
            let key = pool
                .submit_async(
                    Job::Sleep(Duration::from_millis(5)),
                    gpu(id, Priority::Normal, 1),
                )
                .await
                .unwrap();
            let pool = pool.clone();
            waits.spawn(async move { (id, pool.retrieve_async(&key, WAIT).await) });
        }
        let mut finished = 0;
        while let Some(joined) = waits.join_next().await {
            let (id, result) = joined.unwrap();
            assert_eq!(result, Ok(id));
            finished += 1;
        }
        assert_eq!(finished, 500);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_parked_tasks_drains_running_ones_and_refuses_new_work() {
    let mut lab = LabPool::new(settings("drain", 1, 4));
    let running = lab
        .pool
        .submit_async(
            Job::Sleep(Duration::from_millis(100)),
            gpu(1, Priority::Normal, 4),
        )
        .await
        .unwrap();
    let parked = lab
        .pool
        .submit_async(Job::Quick, gpu(2, Priority::Normal, 4))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);
    let report = lab
        .pool
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        (
            report.cancelled_parked,
            report.finished_running,
            report.abandoned_running
        ),
        (1, 1, 0)
    );
    assert_eq!(lab.pool.retrieve_async(&running, WAIT).await, Ok(1));
    assert_eq!(
        lab.pool.retrieve_async(&parked, WAIT).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(
        lab.pool
            .submit_async(Job::Quick, gpu(3, Priority::Normal, 1))
            .await,
        Err(PoolError::Shutdown)
    );
    eventually("worker threads gone", || {
        lab.pool.stats().live_worker_threads == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_never_waits_past_its_deadline_for_a_stuck_task() {
    let mut lab = LabPool::new(settings("stuck", 1, 4));
    let stuck = lab.gated(1);
    let key = lab
        .pool
        .submit_async(stuck, gpu(1, Priority::Normal, 1))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);
    let began = Instant::now();
    let report = lab
        .pool
        .shutdown_with_drain(Duration::from_millis(100))
        .await
        .unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "took {:?}",
        began.elapsed()
    );
    assert_eq!(report.abandoned_running, 1);
    assert_eq!(
        lab.pool.retrieve_async(&key, WAIT).await,
        Err(PoolError::Cancelled)
    );
}

/// An executor whose result is a token stream fed by a task it spawns on its worker runtime.
#[derive(Clone)]
struct Streamer;

#[async_trait::async_trait]
impl WorkerExecutor<u32, tokio::sync::mpsc::Receiver<String>> for Streamer {
    async fn execute(
        &self,
        tokens: u32,
        _meta: TaskMetadata,
    ) -> tokio::sync::mpsc::Receiver<String> {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        tokio::spawn(async move {
            for n in 0..tokens {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if sender.send(format!("{thread}:{n}")).await.is_err() {
                    return;
                }
            }
        });
        receiver
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_producer_keeps_streaming_after_execute_returns() {
    let pool = WorkerPool::new(settings("stream", 1, 4), Streamer).unwrap();
    let key = pool
        .submit_async(8, TaskMetadata::new(1, ResourceCost::cpu(1)))
        .await
        .unwrap();
    let mut tokens = pool.retrieve_async(&key, WAIT).await.unwrap();
    let mut received = Vec::new();
    while let Some(token) = tokio::time::timeout(WAIT, tokens.recv()).await.unwrap() {
        received.push(token);
    }
    assert_eq!(received.len(), 8);
    assert!(
        received
            .iter()
            .all(|token| token.starts_with("parking-lot-worker-stream-0:")),
        "{received:?}"
    );
    assert_eq!(
        received.last().map(String::as_str),
        Some("parking-lot-worker-stream-0:7")
    );
}

#[derive(Clone)]
struct Double;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Double {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        payload * 2
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_api_submits_with_a_reply_port() {
    let supervisor = spawn_supervisor().await.unwrap();
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "actors".into(),
        limits: PoolLimits::new(8, 2),
        workers: prometheus_parking_lot::actors::WorkerSettings {
            count: 2,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Double,
        queue: Box::new(InMemoryQueue::new()),
        mailbox: std::sync::Arc::new(InMemoryMailbox::new()),
        notifiers: Vec::new(),
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: None,
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    let pool = start_pool(&supervisor, spec).await.unwrap();
    let task = ScheduledTask::new(TaskMetadata::new(5, ResourceCost::cpu(1)), 21);
    let admitted = pool
        .scheduler()
        .call(
            |reply| SchedulerRequest::Submit {
                task,
                options: SubmitOptions::default(),
                reply,
            },
            Some(WAIT),
        )
        .await
        .unwrap();
    let key = match admitted {
        CallResult::Success(Ok(key)) => key,
        other => panic!("not admitted: {other:?}"),
    };
    assert_eq!(pool.retrieve(&key, WAIT).await, Ok(42));
    pool.shutdown(Duration::from_secs(1)).await.unwrap();
    supervisor.stop(None);
}

/// An in-memory queue that yields before every operation, as a backend doing I/O would, so
/// the engine drives it through the queue actor. `durable` makes it claim to keep its parked
/// tasks across pools, which is what a durable backend does across processes.
struct SlowQueue {
    inner: std::sync::Arc<InMemoryQueue<u64>>,
    durable: bool,
}

impl SlowQueue {
    fn new() -> Self {
        Self {
            inner: std::sync::Arc::new(InMemoryQueue::new()),
            durable: false,
        }
    }

    /// A durable queue over `inner`, which outlives the pools that use it.
    fn durable(inner: std::sync::Arc<InMemoryQueue<u64>>) -> Self {
        Self {
            inner,
            durable: true,
        }
    }
}

#[async_trait::async_trait]
impl TaskQueue<u64> for SlowQueue {
    fn backend(&self) -> &'static str {
        "slow"
    }
    fn is_durable(&self) -> bool {
        self.durable
    }
    async fn park(&self, entry: EntryId, task: ScheduledTask<u64>) -> Result<(), QueueError> {
        tokio::task::yield_now().await;
        self.inner.park(entry, task).await
    }
    async fn claim(&self, entry: EntryId) -> Result<Option<ScheduledTask<u64>>, QueueError> {
        tokio::task::yield_now().await;
        self.inner.claim(entry).await
    }
    async fn settle(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError> {
        tokio::task::yield_now().await;
        self.inner.settle(entry, settlement).await
    }
    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<u64>>, QueueError> {
        tokio::task::yield_now().await;
        self.inner.remove(entry).await
    }
    async fn load_parked(&self) -> Result<Vec<StoredEntry>, QueueError> {
        tokio::task::yield_now().await;
        self.inner.load_parked().await
    }
    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        self.inner.counts().await
    }
}

/// Sleeps for the payload's milliseconds, returns it.
#[derive(Clone)]
struct Nap;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Nap {
    async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        ms
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_backend_that_awaits_serves_parking_cancel_and_expiry() {
    let settings = settings("slow-queue", 1, 4);
    let queue = Box::new(SlowQueue::new());
    let pool = ResourcePool::with_settings(
        settings,
        Nap,
        queue,
        std::sync::Arc::new(InMemoryMailbox::new()),
        &prometheus_parking_lot::TokioSpawner,
    )
    .unwrap();
    let task = |id: u64, ms: u64, priority| ScheduledTask::new(gpu(id, priority, 4), ms);
    let blocker = pool.submit(task(1, 200, Priority::Normal)).await.unwrap();
    let low = pool.submit(task(2, 1, Priority::Low)).await.unwrap();
    let high = pool.submit(task(3, 1, Priority::High)).await.unwrap();
    let cancelled = pool.submit(task(4, 1, Priority::Normal)).await.unwrap();
    let expiring = pool
        .submit(ScheduledTask::new(
            gpu(5, Priority::Critical, 4).with_deadline_ms(now_ms() + 50),
            1,
        ))
        .await
        .unwrap();
    eventually("four parked", || pool.stats().queued_tasks == 4).await;
    pool.cancel(&cancelled, 4).await.unwrap();
    assert_eq!(
        pool.retrieve(&cancelled, WAIT).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(
        pool.retrieve(&expiring, WAIT).await,
        Err(PoolError::Expired)
    );
    assert_eq!(pool.retrieve(&blocker, WAIT).await, Ok(200));
    assert_eq!(pool.retrieve(&high, WAIT).await, Ok(1));
    assert_eq!(pool.retrieve(&low, WAIT).await, Ok(1));
    eventually("idle", || pool.stats().used_units == 0).await;
    let stats = pool.stats();
    assert_eq!(
        (
            stats.completed_tasks,
            stats.cancelled_tasks,
            stats.expired_tasks
        ),
        (3, 1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncollected_results_are_dropped_after_the_retention_period() {
    let config = settings("retention", 1, 4).with_retention(Some(Duration::from_secs(1)));
    let lab = LabPool::new(config);
    let forgotten = lab
        .pool
        .submit_async(Job::Quick, gpu(1, Priority::Normal, 1))
        .await
        .unwrap();
    eventually("task done", || lab.pool.stats().completed_tasks == 1).await;
    let collected = lab
        .pool
        .submit_async(Job::Quick, gpu(2, Priority::Normal, 1))
        .await
        .unwrap();
    assert_eq!(lab.pool.retrieve_async(&collected, WAIT).await, Ok(2));
    // The cleaner sweeps every second: within three the forgotten result is gone.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert_eq!(
        lab.pool.client().try_retrieve(&forgotten).await,
        Err(PoolError::ResultNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_queue_keeps_parked_tasks_at_shutdown_and_the_next_pool_runs_them() {
    let stored = std::sync::Arc::new(InMemoryQueue::new());
    let start = |name: &str| {
        ResourcePool::with_settings(
            settings(name, 1, 4),
            Nap,
            Box::new(SlowQueue::durable(stored.clone())),
            std::sync::Arc::new(InMemoryMailbox::new()),
            &prometheus_parking_lot::TokioSpawner,
        )
        .unwrap()
    };
    let first = start("durable-a");
    let task = |id: u64, ms: u64, priority| ScheduledTask::new(gpu(id, priority, 4), ms);
    let running = first.submit(task(1, 300, Priority::Normal)).await.unwrap();
    for (id, priority) in [
        (2, Priority::Low),
        (3, Priority::High),
        (4, Priority::Normal),
    ] {
        first.submit(task(id, 1, priority)).await.unwrap();
    }
    assert_eq!(first.stats().queued_tasks, 3);
    let report = first
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((report.kept_parked, report.cancelled_parked), (3, 0));
    assert_eq!(report.finished_running, 1);
    assert_eq!(first.retrieve(&running, WAIT).await, Ok(300));
    assert_eq!(
        stored.counts().await.unwrap(),
        QueueCounts {
            parked: 3,
            claimed: 0
        }
    );

    // A new pool on the same queue indexes the kept tasks and runs them in rank order.
    let second = start("durable-b");
    eventually("kept tasks ran", || second.stats().completed_tasks == 3).await;
    // The queue forgets a task on its own time after the task ends: wait for it, bounded.
    let mut counts = stored.counts().await.unwrap();
    for _ in 0..500 {
        if counts == QueueCounts::default() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        counts = stored.counts().await.unwrap();
    }
    assert_eq!(counts, QueueCounts::default());
    second
        .shutdown_with_drain(Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_tasks_park_in_a_queue_that_awaits_gets_every_key() {
    let pool = ResourcePool::with_settings(
        settings("slow-batch", 1, 4),
        Nap,
        Box::new(SlowQueue::new()),
        std::sync::Arc::new(InMemoryMailbox::new()),
        &prometheus_parking_lot::TokioSpawner,
    )
    .unwrap();
    // One task starts; the other five park through the queue actor, whose answers come after
    // the scheduler has handled the whole batch.
    let tasks = (1..=6)
        .map(|id| ScheduledTask::new(gpu(id, Priority::Normal, 4), 5))
        .collect();
    let answers = pool
        .client()
        .submit_batch(
            tasks,
            prometheus_parking_lot::core::SubmitOptions::default(),
        )
        .await;
    assert_eq!(answers.len(), 6);
    for (id, answer) in (1..=6).zip(answers) {
        let key = answer.unwrap_or_else(|error| panic!("task {id} refused: {error}"));
        assert_eq!(pool.retrieve(&key, WAIT).await, Ok(5), "task {id}");
    }
}
