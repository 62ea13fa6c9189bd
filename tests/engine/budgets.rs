//! Budgets (core rule 15) through a pool built from a configuration file: units that refill
//! with time, a cap on starts, units given back by a run, and what stats, events and
//! metrics say about a task that waits for a budget.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
use prometheus_parking_lot::core::{Budget, RestartPolicy};
use prometheus_parking_lot::core::{
    EventSubscriber, PoolLimits, SubmitOptions, TaskEvent, TaskStep,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, running, MailboxKey, QueueBuilderContext, ResourceCost,
    ResourceKind, ResourcePool, ScheduledTask, SchedulerConfig, TaskExecutor, TaskMetadata,
    TokioSpawner,
};

/// Records when each task started, and gives back what its payload says it did not use.
#[derive(Clone, Default)]
struct Clocked {
    starts: Arc<Mutex<Vec<(u64, Instant)>>>,
}

#[async_trait::async_trait]
impl TaskExecutor<u32, u64> for Clocked {
    async fn execute(&self, unused: u32, meta: TaskMetadata) -> u64 {
        self.starts.lock().unwrap().push((meta.id, Instant::now()));
        running::return_units(unused);
        meta.id
    }
}

fn pool_of(budget: &str) -> (ResourcePool<u32, u64, Clocked>, Clocked) {
    let config = format!(
        r#"{{ "pools": {{ "api": {{ "worker_threads": 4, "max_units": 64, "budgets": {{ "io": {budget} }} }} }} }}"#
    );
    let config = SchedulerConfig::from_json_str(&config).expect("a valid configuration");
    let clocked = Clocked::default();
    let executor = clocked.clone();
    let mut built = build_pools_from_scheduler_config::<u32, u64, Clocked, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        move |_| executor.clone(),
        TokioSpawner,
    )
    .expect("the pool builds");
    (built.pools.remove("api").expect("the pool"), clocked)
}

fn io_task(id: u64, units: u32, unused: u32) -> ScheduledTask<u32> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::io(units)).with_mailbox(MailboxKey::new("t")),
        unused,
    )
}

/// Starts in order, as milliseconds since the first.
fn offsets(clocked: &Clocked) -> Vec<(u64, u64)> {
    let starts = clocked.starts.lock().unwrap().clone();
    let first = starts.iter().map(|&(_, at)| at).min().expect("a start");
    let mut offsets: Vec<(u64, u64)> = starts
        .iter()
        .map(|&(id, at)| (id, at.duration_since(first).as_millis() as u64))
        .collect();
    offsets.sort_by_key(|&(id, at)| (at, id));
    offsets
}

async fn retrieve_all(pool: &ResourcePool<u32, u64, Clocked>, ids: std::ops::RangeInclusive<u64>) {
    let key = MailboxKey::new("t");
    for id in ids {
        let got = pool
            .client()
            .retrieve_task(&key, id, Duration::from_secs(10))
            .await;
        assert_eq!(got, Ok(id), "task {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_start_as_the_budget_refills_never_sooner() {
    // 10 units every 500 ms (one per 50 ms), a burst of 10.
    let (pool, clocked) = pool_of(r#"{ "units": 10, "per_ms": 500 }"#);
    for id in 1..=6 {
        pool.submit(io_task(id, 5, 0)).await.expect("admitted");
    }
    retrieve_all(&pool, 1..=6).await;
    let starts = offsets(&clocked);
    let mut order: Vec<u64> = starts.iter().map(|&(id, _)| id).collect();
    // The burst starts two at once, on two worker threads: which of them notes its start
    // first is up to the threads. The rest start one by one, in rank order.
    order[..2].sort_unstable();
    assert_eq!(order, vec![1, 2, 3, 4, 5, 6], "rank order: {starts:?}");
    // The burst pays for two; each later one waits for 5 units, 250 ms. The pool's clock
    // counts whole milliseconds, and the offsets run from the first executor to note its
    // start, which may do so a few ms late on a loaded machine: allow 10 ms.
    for (n, &(_, at)) in starts.iter().enumerate().skip(2) {
        let earliest = (n as u64 - 1) * 250;
        assert!(
            at + 10 >= earliest,
            "start {n} at {at} ms, before {earliest}: {starts:?}"
        );
    }
    let stats = pool.stats();
    assert_eq!(stats.completed_tasks, 6);
    assert_eq!(
        stats.used_by_kind[ResourceKind::Io.index()],
        0,
        "a budget holds nothing"
    );
    assert_eq!(stats.budgets.len(), 1);
    assert_eq!(
        (
            stats.budgets[0].kind,
            stats.budgets[0].burst,
            stats.budgets[0].units,
            stats.budgets[0].per_ms
        ),
        (ResourceKind::Io, 10, 10, 500)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cap_spaces_starts_whatever_their_units() {
    let (pool, clocked) =
        pool_of(r#"{ "units": 1000, "per_secs": 1, "max_starts": { "count": 2, "per_ms": 400 } }"#);
    for id in 1..=5 {
        pool.submit(io_task(id, 1, 0)).await.expect("admitted");
    }
    retrieve_all(&pool, 1..=5).await;
    let starts = offsets(&clocked);
    // Two at once, then one every 200 ms. The offsets are the executors' clocks, measured
    // from the first executor to note its start, which may note it a few ms after the
    // scheduler started it (a loaded machine): allow that much.
    for (n, &(_, at)) in starts.iter().enumerate().skip(2) {
        let earliest = (n as u64 - 1) * 200;
        assert!(at + 10 >= earliest, "start {n} at {at} ms: {starts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_a_run_gives_back_let_the_next_task_start_at_once() {
    // 10 units a minute: without the give-back, task 2 would wait about 48 s.
    let (pool, clocked) = pool_of(r#"{ "units": 10, "per_secs": 60 }"#);
    pool.submit(io_task(1, 10, 8)).await.expect("admitted");
    pool.submit(io_task(2, 8, 0)).await.expect("admitted");
    let began = Instant::now();
    retrieve_all(&pool, 1..=2).await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "task 2 started with task 1's 8 unused units"
    );
    assert_eq!(offsets(&clocked).len(), 2);
    let stats = pool.stats();
    assert_eq!(stats.budgets[0].level, 0, "10 - 10 + 8 - 8");
}

/// Remembers the budget waits it hears of.
#[derive(Default)]
struct Waits(Mutex<Vec<(u64, u128, u128)>>);

impl EventSubscriber for Waits {
    fn on_event(&self, event: &TaskEvent<'_>) {
        if let TaskStep::WaitsForBudget { until_ms } = event.step {
            self.0
                .lock()
                .unwrap()
                .push((event.task_id, event.at_ms, *until_ms));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_a_budget_says_so_and_until_when() {
    let waits = Arc::new(Waits::default());
    // 6 units a minute, so the wait outlasts the test: one unit every 10 s.
    let supervisor = spawn_supervisor().await.expect("a supervisor");
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "quota".into(),
        limits: PoolLimits::new(8, 2).with_budget(ResourceKind::Io, Budget::per_minute(6)),
        workers: WorkerSettings {
            count: 2,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Clocked::default(),
        queue: Box::new(InMemoryQueue::new()),
        mailbox: Arc::new(InMemoryMailbox::new()),
        notifiers: Vec::new(),
        result_encoder: None,
        subscribers: vec![waits.clone()],
        retention: None,
        shared: None,
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    let pool = start_pool(&supervisor, spec)
        .await
        .expect("the pool starts");
    for (id, units) in [(1, 6), (2, 2)] {
        pool.submit(io_task(id, units, 0), SubmitOptions::default())
            .await
            .expect("admitted");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let heard = loop {
        if let Some(&wait) = waits.0.lock().unwrap().first() {
            break wait;
        }
        assert!(Instant::now() < deadline, "task 2's wait was announced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (task, at_ms, until_ms) = heard;
    assert_eq!(task, 2);
    // Two units at one every 10 s, counted from task 1's start (which spent all six) a
    // moment before task 2 parked.
    assert!((19_000..=20_000).contains(&(until_ms - at_ms)), "{heard:?}");
    let stats = loop {
        let stats = pool.stats();
        if stats.queued_tasks == 1
            && stats.completed_tasks == 1
            && stats
                .budgets
                .first()
                .is_some_and(|b| b.waiting_until_ms.is_some())
        {
            break stats;
        }
        assert!(Instant::now() < deadline, "the stats show the wait");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(stats.budgets[0].level, 0);
    assert_eq!(stats.budgets[0].waiting_until_ms, Some(until_ms));
    let _ = pool.shutdown(Duration::ZERO).await;
}

/// A gate over a budget: a permit spends its units when granted (API calls an engine makes
/// itself), a grow spends more, and a permit that waits is granted the moment the bucket
/// holds its units; dropping a permit gives nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_of_a_budget_spend_it_and_wait_for_its_refill() {
    use prometheus_parking_lot::{CapacityGate, PoolError, WorkerPoolConfig};
    let gate_of = |budget| {
        CapacityGate::new(WorkerPoolConfig::new().with_budget(ResourceKind::Io, budget))
            .expect("a gate")
    };
    let meta = |id| TaskMetadata::new(id, ResourceCost::io(6));
    // 10 units a minute: nothing refills while this part runs.
    let slow = gate_of(Budget::per_minute(10));
    let first = slow.try_acquire(meta(1)).expect("6 of 10");
    assert_eq!(first.try_grow(3), Ok(()), "3 more of the 4 left");
    assert_eq!(first.try_grow(2).err(), Some(PoolError::WouldWait));
    drop(first);
    assert_eq!(
        slow.try_acquire(meta(2)).err(),
        Some(PoolError::WouldWait),
        "1 left"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while slow.stats().budgets.first().map(|b| b.level) != Some(1) {
        assert!(Instant::now() < deadline, "dropping gives nothing back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 10 units every 400 ms (one every 40 ms): a second permit of 6 waits for 2 more.
    let fast = gate_of(Budget::new(10, Duration::from_millis(400)));
    let held = fast.try_acquire(meta(3)).expect("6 of 10");
    let asked = Instant::now();
    let second = fast.acquire(meta(4)).await.expect("granted once refilled");
    assert!(
        asked.elapsed() >= Duration::from_millis(75),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        second.units(),
        0,
        "a budget's permit holds nothing; it spent its 6"
    );
    drop((held, second));
}
