//! Capacity permits from the outside: rank order, cancel-safety, grow and shrink
//! accounting, the deadlock rule, preemption order and its bound, a pool's own gate, and the
//! config file's `preemption` section.

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::WorkerExecutor;
use prometheus_parking_lot::{
    CapacityGate, PoolError, Priority, ResourceCost, ResourceKind, SchedulerConfig, TaskMetadata,
    WorkerPool, WorkerPoolConfig,
};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);

fn gate(units: u32) -> CapacityGate {
    CapacityGate::new(WorkerPoolConfig::new().with_max_units(units)).unwrap()
}

fn meta(id: u64, units: u32, priority: Priority) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(priority)
}

fn used(gate: &CapacityGate) -> u64 {
    gate.stats().used_by_kind[ResourceKind::GpuVram.index()]
}

/// Waits until the gate reports `queued` waiters (the scheduler has parked them).
async fn until_queued(gate: &CapacityGate, queued: usize) {
    for _ in 0..2_000 {
        if gate.stats().queued_tasks == queued {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("expected {queued} waiters, stats: {:?}", gate.stats());
}

/// Waits until the gate reports `units` held.
async fn until_used(gate: &CapacityGate, units: u64) {
    for _ in 0..2_000 {
        if used(gate) == units {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("expected {units} units held, stats: {:?}", gate.stats());
}

#[tokio::test]
async fn waiters_are_granted_in_rank_order_and_units_come_back_on_drop() {
    let gate = Arc::new(gate(10));
    let holder = gate.acquire(meta(1, 10, Priority::Normal)).await.unwrap();
    assert_eq!(holder.units(), 10);
    let (granted, mut order) = mpsc::unbounded_channel();
    for (id, priority) in [
        (2, Priority::Low),
        (3, Priority::High),
        (4, Priority::Normal),
    ] {
        let (waiter, granted) = (gate.clone(), granted.clone());
        tokio::spawn(async move {
            let permit = waiter.acquire(meta(id, 10, priority)).await.unwrap();
            granted.send(id).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            drop(permit);
        });
        until_queued(&gate, (id - 1) as usize).await;
    }
    drop(holder);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            tokio::time::timeout(WAIT, order.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(ids, vec![3, 4, 2], "High, then Normal, then Low");
    until_used(&gate, 0).await;
}

#[tokio::test]
async fn a_dropped_waiter_is_withdrawn_and_leaks_nothing() {
    let gate = gate(8);
    let holder = gate.acquire(meta(1, 8, Priority::Normal)).await.unwrap();
    // A waiter given up before its grant.
    let given_up = tokio::time::timeout(
        Duration::from_millis(20),
        gate.acquire(meta(2, 8, Priority::High)),
    )
    .await;
    assert!(given_up.is_err());
    until_queued(&gate, 0).await;
    // Many waiters given up at random moments, some as their grant races the drop.
    for round in 0..200u64 {
        let attempt = gate.acquire(meta(100 + round, 4, Priority::Normal));
        let _ = tokio::time::timeout(Duration::from_micros(round % 7 * 50), attempt).await;
        if round == 100 {
            holder.shrink(4);
        }
    }
    drop(holder);
    until_used(&gate, 0).await;
    until_queued(&gate, 0).await;
    // The whole budget is free again.
    let all = gate.try_acquire(meta(9, 8, Priority::Low)).unwrap();
    assert_eq!(all.units(), 8);
}

#[tokio::test]
async fn try_acquire_never_waits_and_refusals_name_the_reason() {
    let gate = gate(8);
    let held = gate.try_acquire(meta(1, 6, Priority::Normal)).unwrap();
    assert_eq!(
        gate.try_acquire(meta(2, 4, Priority::Critical))
            .unwrap_err(),
        PoolError::WouldWait
    );
    assert_eq!(
        gate.stats().queued_tasks,
        0,
        "a refused try_acquire does not stay parked"
    );
    let too_large = gate
        .acquire(meta(3, 9, Priority::Normal))
        .await
        .unwrap_err();
    assert!(
        matches!(
            too_large,
            PoolError::InsufficientResources { needed: 9, .. }
        ),
        "{too_large}"
    );
    let blocked = gate.acquire_blocking(meta(4, 4, Priority::Normal), Duration::from_millis(30));
    assert_eq!(blocked.unwrap_err(), PoolError::Timeout);
    until_queued(&gate, 0).await;
    drop(held);
    until_used(&gate, 0).await;
}

#[tokio::test]
async fn a_full_queue_refuses_waiters() {
    let gate = CapacityGate::new(
        WorkerPoolConfig::new()
            .with_max_units(4)
            .with_max_queue_depth(1),
    )
    .unwrap();
    let _held = gate.try_acquire(meta(1, 4, Priority::Normal)).unwrap();
    let waiting = gate.acquire(meta(2, 4, Priority::Normal));
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut waiting)
            .await
            .is_err()
    );
    let refused = gate
        .acquire(meta(3, 4, Priority::Normal))
        .await
        .unwrap_err();
    assert_eq!(refused, PoolError::QueueFull);
}

#[tokio::test]
async fn growing_and_shrinking_keep_the_books_exact() {
    let gate = Arc::new(gate(10));
    let a = gate.acquire(meta(1, 4, Priority::Normal)).await.unwrap();
    let b = gate.acquire(meta(2, 4, Priority::Normal)).await.unwrap();
    a.try_grow(2).unwrap();
    assert_eq!(a.units(), 6);
    until_used(&gate, 10).await;
    assert_eq!(b.try_grow(1).unwrap_err(), PoolError::WouldWait);
    let too_much = a.try_grow(5).unwrap_err();
    assert!(
        matches!(too_much, PoolError::InsufficientResources { .. }),
        "{too_much}"
    );
    // A ranked grow waits while keeping what it holds, and gets the units b gives back.
    let grown = tokio::spawn({
        async move {
            a.grow(3).await.unwrap();
            a
        }
    });
    until_queued(&gate, 1).await;
    b.shrink(3);
    let a = tokio::time::timeout(WAIT, grown).await.unwrap().unwrap();
    assert_eq!((a.units(), b.units()), (9, 1));
    until_used(&gate, 10).await;
    a.shrink(100);
    assert_eq!(a.units(), 0);
    until_used(&gate, 1).await;
    drop(b);
    drop(a);
    until_used(&gate, 0).await;
}

#[tokio::test]
async fn a_grow_that_would_deadlock_is_refused() {
    let gate = Arc::new(gate(10));
    let a = Arc::new(gate.acquire(meta(1, 5, Priority::Normal)).await.unwrap());
    let b = gate.acquire(meta(2, 5, Priority::Normal)).await.unwrap();
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { a.grow(1).await }
    });
    until_queued(&gate, 1).await;
    // Every other holder (a) waits to grow: b's wait could never end.
    assert_eq!(
        b.grow(1).await.unwrap_err(),
        PoolError::WouldDeadlock {
            kind: ResourceKind::GpuVram
        }
    );
    drop(b);
    tokio::time::timeout(WAIT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(a.units(), 6);
}

#[tokio::test]
async fn preemption_asks_the_fewest_lowest_and_newest_holders() {
    let gate = Arc::new(
        CapacityGate::new(
            WorkerPoolConfig::new()
                .with_max_units(10)
                .with_preemption(2),
        )
        .unwrap(),
    );
    let low_old = gate.acquire(meta(1, 3, Priority::Low)).await.unwrap();
    let low_new = gate.acquire(meta(2, 3, Priority::Low)).await.unwrap();
    let normal = gate.acquire(meta(3, 3, Priority::Normal)).await.unwrap();
    // 1 unit free; a critical waiter for 4 needs 3 more: the newest low holder is enough.
    let critical = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(meta(4, 4, Priority::Critical)).await }
    });
    tokio::time::timeout(WAIT, low_new.preempted())
        .await
        .unwrap();
    assert!(low_new.is_preempted());
    assert!(!low_old.is_preempted() && !normal.is_preempted());
    assert_eq!(gate.stats().preemptions_asked, 1);
    drop(low_new);
    let granted = tokio::time::timeout(WAIT, critical)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(granted.units(), 4);
    let stats = gate.stats();
    assert_eq!((stats.preemptions_honoured, stats.preempted_units), (1, 3));
    // A waiter of the same priority as every holder preempts nobody.
    let equal = gate.acquire(meta(5, 4, Priority::Normal));
    tokio::pin!(equal);
    assert!(tokio::time::timeout(Duration::from_millis(30), &mut equal)
        .await
        .is_err());
    assert_eq!(
        gate.stats().preemptions_asked,
        2 - 1,
        "only low holders are below Normal"
    );
    drop((low_old, normal, granted));
}

#[tokio::test]
async fn a_task_id_is_preempted_at_most_max_per_task_times() {
    let gate = Arc::new(
        CapacityGate::new(WorkerPoolConfig::new().with_max_units(4).with_preemption(1)).unwrap(),
    );
    let first = gate.acquire(meta(7, 4, Priority::Low)).await.unwrap();
    let urgent = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(meta(8, 4, Priority::Critical)).await }
    });
    tokio::time::timeout(WAIT, first.preempted()).await.unwrap();
    drop(first);
    let urgent = tokio::time::timeout(WAIT, urgent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(urgent);
    // Task 7 comes back (it recomputes) and is not asked again: it runs undisturbed.
    let again = gate.acquire(meta(7, 4, Priority::Low)).await.unwrap();
    let second = gate.acquire(meta(9, 4, Priority::Critical));
    tokio::pin!(second);
    assert!(tokio::time::timeout(Duration::from_millis(50), &mut second)
        .await
        .is_err());
    assert!(!again.is_preempted());
    assert_eq!(gate.stats().preemptions_asked, 1);
    drop(again);
    let second = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    assert_eq!(second.units(), 4);
}

#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl WorkerExecutor<u32, u32> for Echo {
    async fn execute(&self, payload: u32, _meta: TaskMetadata) -> u32 {
        payload
    }
}

#[tokio::test]
async fn a_pools_gate_shares_its_budget_with_its_tasks() {
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(8),
        Echo,
    )
    .unwrap();
    let gate = pool.gate();
    let permit = gate.acquire(meta(1, 8, Priority::Normal)).await.unwrap();
    let key = pool
        .submit_async(5, meta(2, 4, Priority::Normal))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        pool.stats().queued_tasks,
        1,
        "the task waits for the permit's units"
    );
    drop(permit);
    assert_eq!(pool.retrieve_async(&key, WAIT).await.unwrap(), 5);
}

#[tokio::test]
async fn a_pool_shut_down_refuses_the_waiters_of_its_gate() {
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(2),
        Echo,
    )
    .unwrap();
    let gate = Arc::new(pool.gate());
    let held = gate.try_acquire(meta(1, 2, Priority::Normal)).unwrap();
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.acquire(meta(2, 2, Priority::Normal)).await }
    });
    until_queued(&gate, 1).await;
    pool.shutdown();
    let refused = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(refused.unwrap_err(), PoolError::Shutdown);
    assert_eq!(
        gate.try_acquire(meta(3, 1, Priority::Normal)).unwrap_err(),
        PoolError::Shutdown
    );
    drop(held);
}

#[test]
fn the_config_file_turns_preemption_on_and_checks_its_bound() {
    let pool = |preemption: &str| {
        format!(
            r#"{{"pools": {{"kv": {{"max_units": 64, "worker_threads": 1, "preemption": {preemption}}}}}}}"#
        )
    };
    let config = SchedulerConfig::from_json_str(&pool(r#"{"max_per_task": 3}"#)).unwrap();
    let settings = config.worker_pool_config("kv", 64).unwrap();
    assert_eq!(settings.preemption.map(|p| p.max_per_task), Some(3));
    let zero = SchedulerConfig::from_json_str(&pool(r#"{"max_per_task": 0}"#))
        .unwrap_err()
        .to_string();
    assert!(zero.contains("preemption.max_per_task"), "{zero}");
    let unknown = SchedulerConfig::from_json_str(&pool(r#"{"max": 3}"#))
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("max_per_task"), "{unknown}");
    let invalid = CapacityGate::new(WorkerPoolConfig::new().with_preemption(0)).unwrap_err();
    assert!(invalid.to_string().contains("max_per_task"), "{invalid}");
}

/// Payload 0 returns at once; any other runs until it is preempted or 2 s pass, and
/// returns which run of it this was.
#[derive(Clone)]
struct Yielding {
    runs: Arc<std::sync::atomic::AtomicU32>,
}

#[async_trait::async_trait]
impl WorkerExecutor<u32, u32> for Yielding {
    async fn execute(&self, payload: u32, _meta: TaskMetadata) -> u32 {
        if payload == 0 {
            return 0;
        }
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let started = std::time::Instant::now();
        while !prometheus_parking_lot::running::is_preempted()
            && started.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        run
    }
}

#[tokio::test]
async fn a_preempted_pool_task_parks_again_and_runs_again_at_most_max_per_task_times() {
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let config = WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(4)
        .with_preemption(1);
    let pool = WorkerPool::new(config, Yielding { runs: runs.clone() }).unwrap();
    pool.preempt_tasks();
    let low = pool
        .submit_async(1, meta(1, 4, Priority::Low))
        .await
        .unwrap();
    while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A critical task that does not fit asks the low one to yield; it runs first.
    let asked_at = std::time::Instant::now();
    let critical = pool
        .submit_async(0, meta(2, 2, Priority::Critical))
        .await
        .unwrap();
    assert_eq!(pool.retrieve_async(&critical, WAIT).await.unwrap(), 0);
    assert!(
        asked_at.elapsed() < Duration::from_millis(300),
        "the low task yielded at once"
    );
    // The low task parked again and runs a second time; it may not be asked again.
    while runs.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let second = pool
        .submit_async(0, meta(3, 4, Priority::Critical))
        .await
        .unwrap();
    assert_eq!(
        pool.retrieve_async(&low, WAIT).await.unwrap(),
        2,
        "only the second run's result is delivered"
    );
    assert_eq!(pool.retrieve_async(&second, WAIT).await.unwrap(), 0);
    let stats = pool.stats();
    assert_eq!(
        (
            stats.preemptions_asked,
            stats.preemptions_honoured,
            stats.preempted_units
        ),
        (1, 1, 4)
    );
    assert_eq!(stats.completed_tasks, 3);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn without_preempt_tasks_a_pool_task_is_never_asked() {
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let config = WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(4)
        .with_preemption(3);
    let pool = WorkerPool::new(config, Yielding { runs: runs.clone() }).unwrap();
    let low = pool
        .submit_async(1, meta(1, 4, Priority::Low))
        .await
        .unwrap();
    while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let critical = pool
        .submit_async(0, meta(2, 2, Priority::Critical))
        .await
        .unwrap();
    assert_eq!(
        pool.retrieve_async(&low, WAIT).await.unwrap(),
        1,
        "it ran to its end, once"
    );
    assert_eq!(pool.retrieve_async(&critical, WAIT).await.unwrap(), 0);
    assert_eq!(pool.stats().preemptions_asked, 0);
}

/// An operator's view of a pool shows permits beside tasks: a held one among the running,
/// a waiting one among the parked, each with its caller's id and its reason.
#[tokio::test]
async fn inspect_shows_held_and_waiting_permits_beside_tasks() {
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(8),
        Echo,
    )
    .unwrap();
    let gate = Arc::new(pool.gate());
    let held = gate.acquire(meta(1, 6, Priority::Normal)).await.unwrap();
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.acquire(meta(3, 4, Priority::High)).await })
    };
    let key = pool
        .submit_async(5, meta(2, 4, Priority::Normal))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let view = loop {
        let view = pool.client().inspect(0, 10).await.unwrap();
        if view.parked_total == 2 {
            break view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "both wait: {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let running: Vec<_> = view
        .running
        .iter()
        .map(|task| (task.id, task.permit))
        .collect();
    assert_eq!(running, [(1, true)], "the held permit");
    let parked: Vec<_> = view
        .parked
        .iter()
        .map(|task| (task.id, task.permit, task.cost.units))
        .collect();
    assert_eq!(
        parked,
        [(3, true, 4), (2, false, 4)],
        "the high-priority permit first"
    );
    assert!(view.parked.iter().all(|task| task.reason.is_some()));
    drop(held);
    let granted = tokio::time::timeout(WAIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(granted);
    assert_eq!(pool.retrieve_async(&key, WAIT).await.unwrap(), 5);
}

/// A snapshot reads the view and the counters at one instant, permits of the fast path
/// included: the counters count the permits and tasks the view lists, and the units they
/// hold.
#[tokio::test]
async fn a_snapshot_counts_what_its_view_lists_permits_included() {
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(8),
        Echo,
    )
    .unwrap();
    let gate = pool.gate();
    let first = gate.acquire(meta(1, 3, Priority::Normal)).await.unwrap();
    let second = gate.acquire(meta(2, 2, Priority::Normal)).await.unwrap();
    let snapshot = pool.client().snapshot(0, 10).await.unwrap();
    let listed: Vec<_> = snapshot
        .view
        .running
        .iter()
        .map(|task| (task.id, task.permit, task.cost.units))
        .collect();
    assert_eq!(listed, [(1, true, 3), (2, true, 2)]);
    let stats = &snapshot.stats;
    assert_eq!(
        (
            stats.active_tasks,
            stats.queued_tasks,
            stats.used_by_kind[ResourceKind::GpuVram.index()]
        ),
        (2, 0, 5),
        "{stats:?}"
    );
    drop(first);
    drop(second);
    let after = pool.client().snapshot(0, 10).await.unwrap();
    assert_eq!(
        (
            after.view.running.len(),
            after.stats.active_tasks,
            after.stats.used_by_kind[ResourceKind::GpuVram.index()]
        ),
        (0, 0, 0),
        "{after:?}"
    );
}
