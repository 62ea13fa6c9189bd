//! "Why is my task not running?": the reason a pool gives for a parked task (core rule
//! 17), asked through the public API while the pool runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::Budget;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::{MailboxKey, ResourceCost, ResourceKind, WorkerPoolConfig};

/// Runs until the gate opens.
#[derive(Clone)]
struct Gated(Arc<AtomicBool>);

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        while !self.0.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        payload
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_task_says_what_it_waits_for() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(10)
            .with_budget(ResourceKind::Io, Budget::per_minute(6)),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let meta = |id, cost| TaskMetadata::new(id, cost).with_mailbox(MailboxKey::new("acme"));
    let key = MailboxKey::new("acme");
    // Two run (8 VRAM units; the budget's 6 I/O units), holding both workers.
    for (id, cost) in [(1, ResourceCost::gpu_vram(8)), (2, ResourceCost::io(6))] {
        pool.submit_async(id, meta(id, cost)).await.expect("runs");
    }
    for (id, cost) in [
        (3, ResourceCost::gpu_vram(6)),
        (4, ResourceCost::io(1)),
        (5, ResourceCost::gpu_vram(1)),
    ] {
        pool.submit_async(id, meta(id, cost)).await.expect("parks");
    }
    assert_eq!(pool.why_waiting(&key, 1).await, Ok(None), "it runs");
    assert_eq!(
        pool.why_waiting(&key, 3).await,
        Ok(Some(WaitReason::Units {
            kind: ResourceKind::GpuVram,
            needed: 6,
            free: 2
        }))
    );
    let Ok(Some(WaitReason::Budget {
        kind,
        needed,
        level,
        ready_at_ms,
    })) = pool.why_waiting(&key, 4).await
    else {
        panic!("task 4 waits for the budget");
    };
    assert_eq!((kind, needed, level), (ResourceKind::Io, 1, 0));
    let in_ms = ready_at_ms.saturating_sub(prometheus_parking_lot::util::clock::now_ms());
    assert!(
        in_ms > 5_000 && in_ms <= 10_000,
        "one unit every 10 s: {in_ms} ms"
    );
    assert_eq!(
        pool.why_waiting(&key, 5).await,
        Ok(Some(WaitReason::Worker { busy: 2 })),
        "it fits, but both workers are busy"
    );
    assert_eq!(
        pool.why_waiting(&key, 99).await,
        Err(PoolError::TaskNotFound(99))
    );
    assert_eq!(
        pool.why_waiting(&MailboxKey::new("other"), 3).await,
        Err(PoolError::TaskNotFound(3)),
        "another tenant's key"
    );
    gate.store(true, Ordering::Release);
    for id in [1, 3, 5] {
        let got = pool
            .client()
            .retrieve_task(&key, id, Duration::from_secs(10))
            .await;
        assert_eq!(got, Ok(id), "task {id}");
    }
}

/// A paused pool admits and parks, runs on what runs, starts nothing, says so, and starts
/// what fits when resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_pool_parks_everything_runs_on_and_resumes() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(10),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let key = MailboxKey::new("acme");
    let meta =
        |id, units| TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(key.clone());
    pool.submit_async(1, meta(1, 2)).await.expect("runs");
    pool.pause().await.expect("paused");
    for (id, priority) in [
        (2, prometheus_parking_lot::Priority::Low),
        (3, prometheus_parking_lot::Priority::High),
    ] {
        pool.submit_async(id, meta(id, 1).with_priority(priority))
            .await
            .expect("admitted while paused");
    }
    assert_eq!(
        pool.why_waiting(&key, 2).await,
        Ok(Some(WaitReason::Paused))
    );
    assert_eq!(pool.why_waiting(&key, 1).await, Ok(None), "task 1 runs on");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(pool.stats().paused && pool.stats().queued_tasks == 2) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stats show the pause"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    gate.store(true, Ordering::Release);
    let first = pool
        .client()
        .retrieve_task(&key, 1, Duration::from_secs(10))
        .await;
    assert_eq!(first, Ok(1), "a running task ends as usual");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        pool.stats().completed_tasks,
        1,
        "nothing else started while paused"
    );
    pool.resume().await.expect("resumed");
    for id in [3, 2] {
        let got = pool
            .client()
            .retrieve_task(&key, id, Duration::from_secs(10))
            .await;
        assert_eq!(got, Ok(id), "task {id}");
    }
    assert!(!pool.stats().paused);
}

/// An operator's view of a pool: the running task, the parked ones in rank order with their
/// reasons (one page at a time), and each tenant's share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_running_and_parked_tasks_in_rank_order_with_reasons() {
    use prometheus_parking_lot::Priority;
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(10),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let (acme, globex) = (MailboxKey::new("acme"), MailboxKey::new("globex"));
    let meta = |id, units, key: &MailboxKey, priority| {
        TaskMetadata::new(id, ResourceCost::gpu_vram(units))
            .with_mailbox(key.clone())
            .with_priority(priority)
    };
    pool.submit_async(1, meta(1, 8, &acme, Priority::Normal))
        .await
        .expect("runs");
    for (id, units, key, priority) in [
        (2, 1, &acme, Priority::Low),
        (3, 6, &globex, Priority::High),
        (4, 1, &globex, Priority::Normal),
    ] {
        pool.submit_async(id, meta(id, units, key, priority))
            .await
            .expect("parks");
    }
    let client = pool.client();
    let view = client.inspect(0, 2).await.expect("a view");
    assert_eq!(view.running.len(), 1);
    assert_eq!(
        (view.running[0].id, view.running[0].reason.clone()),
        (1, None)
    );
    assert_eq!(view.parked_total, 3);
    let page: Vec<_> = view
        .parked
        .iter()
        .map(|task| (task.id, task.reason.clone()))
        .collect();
    assert_eq!(
        page,
        [
            (
                3,
                Some(WaitReason::Units {
                    kind: ResourceKind::GpuVram,
                    needed: 6,
                    free: 2
                })
            ),
            (4, Some(WaitReason::Worker { busy: 1 })),
        ],
        "high first, then normal; the low one is on the next page"
    );
    let next = client.inspect(2, 2).await.expect("the next page");
    let ids: Vec<_> = next.parked.iter().map(|task| task.id).collect();
    assert_eq!((ids, next.offset), (vec![2], 2));
    assert!(client
        .inspect(9, 2)
        .await
        .expect("past the end")
        .parked
        .is_empty());
    let tenants: Vec<_> = view
        .tenants
        .iter()
        .map(|t| {
            (
                t.tenant.0.as_str(),
                t.running,
                t.parked,
                t.holds[ResourceKind::GpuVram.index()],
            )
        })
        .collect();
    assert_eq!(tenants, [("acme", 1, 1, 8), ("globex", 0, 2, 0)]);
    let json = serde_json::to_value(&view).expect("a view serialises");
    assert_eq!(json["parked"][0]["reason"]["reason"], "units");
    assert!(
        json["parked"][0].get("payload").is_none(),
        "no payloads in a view"
    );
    gate.store(true, Ordering::Release);
}

/// A drained pool refuses new work, runs what it has to its end, and takes work again once
/// undrained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pool_refuses_new_work_and_finishes_what_it_has() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(10),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let key = MailboxKey::new("acme");
    let meta = |id| TaskMetadata::new(id, ResourceCost::gpu_vram(1)).with_mailbox(key.clone());
    pool.submit_async(1, meta(1)).await.expect("runs");
    pool.submit_async(2, meta(2)).await.expect("parks");
    let client = pool.client();
    client.drain().await.expect("drained");
    assert_eq!(
        pool.submit_async(3, meta(3)).await,
        Err(PoolError::Draining)
    );
    assert!(pool.stats().draining);
    assert!(client.inspect(0, 10).await.expect("a view").draining);
    gate.store(true, Ordering::Release);
    for id in [1, 2] {
        let got = client
            .retrieve_task(&key, id, Duration::from_secs(10))
            .await;
        assert_eq!(got, Ok(id), "admitted task {id} runs to its end");
    }
    client.undrain().await.expect("open again");
    assert!(!pool.stats().draining);
    pool.submit_async(3, meta(3)).await.expect("taken again");
    let got = client.retrieve_task(&key, 3, Duration::from_secs(10)).await;
    assert_eq!(got, Ok(3));
}
