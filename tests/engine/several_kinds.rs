//! Tasks of several kinds (core rule 25) through a running pool: a decode engine's KV-cache
//! blocks and sequence slots, a provider's tokens and requests, and the refusals a
//! submission gets where such costs cannot be kept.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::{
    Budget, FairShare, PoolError, SubmitOptions, TaskMetadata, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, MailboxKey, QueueBuilderContext, ResourceCost, ResourceKind,
    ScheduledTask, SchedulerConfig, TaskExecutor, TokioSpawner, WorkerPoolConfig,
};

/// Runs until the gate opens, counting how many run at once.
#[derive(Clone, Default)]
struct Gated {
    open: Arc<AtomicBool>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Gated {
    async fn run(&self, payload: u64) -> u64 {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        while !self.open.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        payload
    }
}

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        self.run(payload).await
    }
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        self.run(payload).await
    }
}

/// Each task's own key: its result is retrieved there.
fn key(id: u64) -> MailboxKey {
    MailboxKey::new("acme").with_session(format!("s{id}"))
}

fn meta(id: u64, blocks: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(blocks)).with_mailbox(key(id))
}

/// A sequence's slot beside its blocks.
fn one_slot() -> SubmitOptions {
    SubmitOptions::default().with_also(ResourceCost::cpu(1))
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_hold_blocks_and_a_slot_and_never_more_slots_than_the_engine_has() {
    // Built from a configuration file: 1,000 blocks, 2 sequence slots, 6 workers.
    let config = SchedulerConfig::from_json_str(
        r#"{ "pools": { "engine": { "worker_threads": 6, "max_units": 1000,
             "capacity": { "cpu": 2 } } } }"#,
    )
    .expect("a valid configuration");
    let gated = Gated::default();
    let executor = gated.clone();
    let mut built = build_pools_from_scheduler_config::<u64, u64, Gated, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        move |_| executor.clone(),
        TokioSpawner,
    )
    .expect("the pool builds");
    let pool = built.pools.remove("engine").expect("the pool");
    let mut keys = Vec::new();
    for id in 1..=5 {
        let task = ScheduledTask::new(meta(id, 100), id);
        let key = pool.submit_with(task, one_slot()).await.expect("admitted");
        keys.push(key);
    }
    wait_for("two sequences to run", || {
        gated.running.load(Ordering::SeqCst) == 2
    })
    .await;
    let stats = pool.stats();
    assert_eq!(stats.used_by_kind[ResourceKind::GpuVram.index()], 200);
    assert_eq!(stats.used_by_kind[ResourceKind::Cpu.index()], 2);
    assert_eq!(
        pool.why_waiting(&key(3), 3).await,
        Ok(Some(WaitReason::Units {
            kind: ResourceKind::Cpu,
            needed: 1,
            free: 0
        })),
        "plenty of blocks: the slot is what it waits for"
    );
    let view = pool.inspect(0, 10).await.expect("a view");
    assert_eq!(view.running.len(), 2);
    assert!(view
        .running
        .iter()
        .chain(&view.parked)
        .all(|task| task.also == vec![ResourceCost::cpu(1)]));
    gated.open.store(true, Ordering::Release);
    for (id, key) in (1..=5).zip(&keys) {
        let result = pool.client().retrieve(key, Duration::from_secs(10)).await;
        assert_eq!(result, Ok(id));
    }
    assert_eq!(
        gated.most.load(Ordering::SeqCst),
        2,
        "two slots, never more"
    );
    wait_for("every unit back", || {
        let stats = pool.stats();
        stats.used_by_kind == [0; ResourceKind::COUNT]
    })
    .await;
    let _ = built.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_call_spends_tokens_and_a_request_together() {
    // 10,000 tokens and 3 requests a minute: the requests run out first.
    let (tokens, requests) = (ResourceKind::Io, ResourceKind::Mixed);
    let gated = Gated::default();
    gated.open.store(true, Ordering::Release);
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(4)
            .with_budget(tokens, Budget::per_minute(10_000))
            .with_budget(requests, Budget::per_minute(3)),
        gated.clone(),
    )
    .expect("the pool starts");
    let call = |id| TaskMetadata::new(id, ResourceCost::io(1_000)).with_mailbox(key(id));
    let request = SubmitOptions::default().with_also(ResourceCost::mixed(1));
    let mut keys = Vec::new();
    for id in 1..=4 {
        keys.push(
            pool.submit_with(id, call(id), request.clone())
                .await
                .expect("admitted"),
        );
    }
    for (id, key) in (1..=3).zip(&keys) {
        assert_eq!(
            pool.retrieve_async(key, Duration::from_secs(10)).await,
            Ok(id)
        );
    }
    let Ok(Some(WaitReason::Budget { kind, level, .. })) = pool.why_waiting(&key(4), 4).await
    else {
        panic!("the fourth call waits for a budget");
    };
    assert_eq!(
        (kind, level),
        (requests, 0),
        "the requests ran out, not the tokens"
    );
    let budgets = pool.stats().budgets;
    let level = |kind| budgets.iter().find(|b| b.kind == kind).map(|b| b.level);
    assert_eq!(
        level(tokens),
        Some(7_000),
        "three calls spent their tokens; the fourth spent none"
    );
    pool.cancel(&key(4), 4).await.expect("cancelled");
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_that_cannot_be_kept_are_refused_naming_why() {
    let gated = Gated::default();
    gated.open.store(true, Ordering::Release);
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(16),
        gated.clone(),
    )
    .expect("the pool starts");
    let twice = SubmitOptions::default()
        .with_also(ResourceCost::cpu(1))
        .with_also(ResourceCost::cpu(2));
    let Err(PoolError::InvalidConfig(message)) = pool.submit_with(1, meta(1, 4), twice).await
    else {
        panic!("a kind named twice is refused");
    };
    assert!(message.contains("`cpu` twice"), "{message}");
    let too_many = SubmitOptions::default().with_also(ResourceCost::cpu(17));
    assert_eq!(
        pool.submit_with(2, meta(2, 4), too_many).await,
        Err(PoolError::InsufficientResources {
            needed: 17,
            available: 16,
            kind: ResourceKind::Cpu
        })
    );
    pool.shutdown();

    let fair = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(16)
            .with_fair_share(FairShare::MaxUnitsPerTenant(8)),
        gated,
    )
    .expect("the pool starts");
    let Err(PoolError::InvalidConfig(message)) = fair.submit_with(3, meta(3, 4), one_slot()).await
    else {
        panic!("a pool with a fair share refuses a task of several kinds");
    };
    assert!(message.contains("a fair share"), "{message}");
    fair.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_hold_blocks_and_a_slot_and_a_waiter_gets_both_when_one_is_dropped() {
    use prometheus_parking_lot::core::Capacity;
    use prometheus_parking_lot::CapacityGate;

    // 64 KV blocks and 2 sequence slots.
    let engine = Capacity::uniform(64).with(ResourceKind::Cpu, 2);
    let gate = CapacityGate::new(WorkerPoolConfig::new().with_capacity(engine)).expect("a gate");
    let slot = [ResourceCost::cpu(1)];
    let sequence = |id, blocks| TaskMetadata::new(id, ResourceCost::gpu_vram(blocks));
    let first = gate
        .acquire_with(sequence(1, 8), &slot)
        .await
        .expect("granted");
    let second = gate
        .acquire_with(sequence(2, 8), &slot)
        .await
        .expect("granted");
    wait_for("both permits' units counted", || {
        let held = gate.stats().used_by_kind;
        (
            held[ResourceKind::GpuVram.index()],
            held[ResourceKind::Cpu.index()],
        ) == (16, 2)
    })
    .await;
    // Both slots are held: the third waits, although its blocks are free.
    let third = gate.acquire_with(sequence(3, 8), &slot);
    tokio::pin!(third);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut third)
            .await
            .is_err(),
        "no slot for the third"
    );
    first
        .try_grow(8)
        .expect("blocks are free: the first grows, keeping its slot");
    assert_eq!(first.units(), 16);
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("granted once a slot is free")
        .expect("granted");
    wait_for("the units of the dropped permit back", || {
        let held = gate.stats().used_by_kind;
        (
            held[ResourceKind::GpuVram.index()],
            held[ResourceKind::Cpu.index()],
        ) == (16, 2)
    })
    .await;
    let twice = gate
        .acquire_with(sequence(4, 1), &[ResourceCost::gpu_vram(1)])
        .await;
    assert!(
        matches!(twice, Err(PoolError::InvalidConfig(_))),
        "{twice:?}"
    );
    drop((second, third));
    wait_for("every unit back", || {
        gate.stats().used_by_kind == [0; ResourceKind::COUNT]
    })
    .await;
}
