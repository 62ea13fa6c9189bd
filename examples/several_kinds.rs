//! Tasks that need several resources at once, from `config/several_kinds.json`:
//!
//! - `decode`: each sequence holds KV-cache blocks (`gpu_vram`, 4,096 of them) **and** one of
//!   the engine's 8 sequence slots (`cpu`). Blocks alone would let 13 sequences of 300 run;
//!   the slots let 8, and the pool never runs a ninth.
//! - `provider`: each call spends tokens (`io`, 90,000 a minute, at most 45,000 at once) **and**
//!   a request (`mixed`, 500 a minute), both or neither.
//!
//! ```sh
//! cargo run --example several_kinds
//! ```
//!
//! Its output: the most sequences that ran at once (8), the units of each kind held while
//! they ran, and what the provider's two buckets hold after six calls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::SubmitOptions;
use prometheus_parking_lot::*;

/// Pretends to decode (or to call the provider) for 50 ms, counting how many run at once.
#[derive(Clone, Default)]
struct Work {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Work {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        payload
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/several_kinds.json");
    let config = SchedulerConfig::from_path(path)?;
    let work = Work::default();
    let executor = work.clone();
    let built = build_pools_from_scheduler_config::<u64, u64, Work, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        move |_| executor.clone(),
        TokioSpawner,
    )?;

    // Twenty sequences of 300 blocks, each with one sequence slot.
    let decode = &built.pools["decode"];
    let slot = SubmitOptions::default().with_also(ResourceCost::cpu(1));
    let mut keys = Vec::new();
    for id in 1..=20 {
        let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(300));
        let task = ScheduledTask::new(meta, id);
        keys.push(decode.submit_with(task, slot.clone()).await?);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let held = decode.stats().used_by_kind;
    println!(
        "decode: {} blocks and {} slots held while the first sequences run",
        held[ResourceKind::GpuVram.index()],
        held[ResourceKind::Cpu.index()]
    );
    for key in &keys {
        decode
            .client()
            .retrieve(key, Duration::from_secs(10))
            .await?;
    }
    println!(
        "decode: at most {} sequences ran at once (8 slots; blocks alone would allow 13)",
        work.most.load(Ordering::SeqCst)
    );

    // Six provider calls: 4,096 tokens and one request each.
    let provider = &built.pools["provider"];
    let request = SubmitOptions::default().with_also(ResourceCost::mixed(1));
    let mut keys = Vec::new();
    for id in 1..=6 {
        let meta = TaskMetadata::new(100 + id, ResourceCost::io(4_096));
        let task = ScheduledTask::new(meta, id);
        keys.push(provider.submit_with(task, request.clone()).await?);
    }
    for key in &keys {
        provider
            .client()
            .retrieve(key, Duration::from_secs(10))
            .await?;
    }
    for budget in provider.stats().budgets {
        println!(
            "provider: the {} bucket holds {} of {}",
            budget.kind, budget.level, budget.burst
        );
    }
    built.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}
