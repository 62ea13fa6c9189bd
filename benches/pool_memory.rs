//! What a parked task costs the whole pool in memory, beside what it costs the pure core.
//!
//! A `WorkerPool` with one worker (in-memory queue and mailbox) runs a blocker task that
//! holds its only worker; then N tasks with a 16-byte payload and no mailbox key (each gets
//! an anonymous key of its own, as most callers' tasks do) are submitted and all park. The
//! live heap bytes (counted by a global allocator) and the process's resident set (RSS, from
//! `/proc/self/statm`) are read before the submits and once every task is parked; the
//! difference over N is the cost of one parked task, payload included. In the same run, the
//! core alone (`ParkingLot`) parks N tickets of the same shape: its share of the figure.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench pool_memory` parks 1,000,000 tasks
//! (override with `POOL_MEMORY_TASKS`). Under `cargo test` (no `--bench` argument) it parks a few
//! thousand as a smoke test that checks the counts but no figure.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::PoolLimits;
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::ResourceCost;

#[global_allocator]
static ALLOCATOR: support::LiveBytes = support::LiveBytes;

/// The payload: 16 bytes.
type Payload = u128;

/// Holds its worker until `release` is set (the blocker), else returns at once.
#[derive(Clone)]
struct Blocker {
    release: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl WorkerExecutor<Payload, ()> for Blocker {
    async fn execute(&self, payload: Payload, _meta: TaskMetadata) {
        if payload == u128::MAX {
            while !self.release.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Resident set size in bytes (Linux), or 0 where `/proc` is missing.
fn rss_bytes() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0
}

fn live_bytes() -> f64 {
    support::LiveBytes::now() as f64
}

/// Bytes per parked task of the whole pool: (heap, RSS).
fn whole_pool(tasks: usize) -> (f64, f64) {
    let release = Arc::new(AtomicBool::new(false));
    let config = WorkerPoolConfig::new()
        .with_worker_count(1)
        .with_max_units(u32::MAX)
        .with_max_queue_depth(tasks + 1)
        .with_max_messages(tasks + 1);
    let pool = WorkerPool::new(
        config,
        Blocker {
            release: release.clone(),
        },
    )
    .expect("pool");
    pool.submit(u128::MAX, TaskMetadata::new(u64::MAX, ResourceCost::cpu(1)))
        .expect("the blocker is admitted");
    wait_for(|| pool.stats().active_tasks == 1);

    let (heap_before, rss_before) = (live_bytes(), rss_bytes());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        const BATCH: usize = 10_000;
        let mut id = 0u64;
        while (id as usize) < tasks {
            let batch = (id as usize..tasks.min(id as usize + BATCH)).map(|n| {
                let meta = TaskMetadata::new(n as u64, ResourceCost::cpu(1));
                (n as u128, meta)
            });
            for answer in pool.submit_batch(batch).await {
                answer.expect("parked");
            }
            id = (id as usize + BATCH).min(tasks) as u64;
        }
    });
    wait_for(|| pool.stats().queued_tasks == tasks);
    let heap = (live_bytes() - heap_before) / tasks as f64;
    let rss = (rss_bytes() - rss_before) / tasks as f64;

    release.store(true, Ordering::Relaxed);
    wait_for(|| pool.stats().completed_tasks as usize == tasks + 1);
    (heap, rss)
}

/// Bytes per parked task of the core alone, with tickets of the same shape.
fn core_only(tasks: usize) -> f64 {
    let limits = PoolLimits::new(u32::MAX, 1).with_max_queue_depth(tasks + 1);
    let ticket = |id: u64| Ticket {
        created_at_ms: id,
        ..Ticket::from(&TaskMetadata::new(id, ResourceCost::cpu(1)))
    };
    let before = live_bytes();
    let mut lot = ParkingLot::new(limits).expect("limits");
    assert_eq!(lot.admit(ticket(u64::MAX), 0), Admit::Start);
    for id in 0..tasks as u64 {
        assert_eq!(lot.admit(ticket(id), 0), Admit::Park);
    }
    let bytes = (live_bytes() - before) / tasks as f64;
    assert_eq!(lot.parked_len(), tasks);
    bytes
}

fn wait_for(done: impl Fn() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(600);
    while !done() {
        assert!(
            Instant::now() < give_up,
            "the pool did not get there in 600 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn main() {
    let measured = support::measured();
    let tasks = if measured {
        support::env_u64("POOL_MEMORY_TASKS", 1_000_000) as usize
    } else {
        5_000
    };
    let core = core_only(tasks);
    let (heap, rss) = whole_pool(tasks);
    if !measured {
        println!("pool_memory smoke test: {tasks} tasks parked and run");
        return;
    }
    println!("Memory per parked task, {tasks} parked, 16-byte payload, anonymous keys:");
    println!();
    println!("| what | bytes per parked task | beyond the payload |");
    println!("|---|---:|---:|");
    println!("| whole pool, live heap | {heap:.0} | {:.0} |", heap - 16.0);
    println!("| whole pool, RSS | {rss:.0} | {:.0} |", rss - 16.0);
    println!("| the core alone, live heap | {core:.0} | - |");
}
