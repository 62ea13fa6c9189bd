//! A job goes only to a worker whose thread can take it: a task that returns at once but
//! leaves a task on its worker's runtime that blocks the thread does not hold up the next job
//! while another worker is idle.

use std::time::{Duration, Instant};

use prometheus_parking_lot::core::WorkerExecutor;
use prometheus_parking_lot::{ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig};

/// Payload 1 spawns a task that blocks its worker's thread for 2 s (a token producer doing
/// blocking I/O) and returns at once; any other payload returns at once.
#[derive(Clone)]
struct LeavesWork;

#[async_trait::async_trait]
impl WorkerExecutor<u32, u32> for LeavesWork {
    async fn execute(&self, payload: u32, _meta: TaskMetadata) -> u32 {
        if payload == 1 {
            tokio::spawn(async {
                std::thread::sleep(Duration::from_secs(2));
            });
        }
        payload
    }
}

fn meta(id: u64) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(1))
}

#[tokio::test]
async fn the_next_job_goes_to_the_idle_worker_not_the_blocked_one() {
    let config = WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(8);
    let pool = WorkerPool::new(config, LeavesWork).unwrap();
    let wait = Duration::from_secs(10);
    let first = pool.submit_async(1, meta(1)).await.unwrap();
    assert_eq!(pool.retrieve_async(&first, wait).await.unwrap(), 1);
    // The first worker's thread is blocked for 2 s by the task it was left with; the second
    // is idle and takes the next jobs at once.
    for id in 2..6 {
        let asked = Instant::now();
        let key = pool.submit_async(0, meta(id)).await.unwrap();
        assert_eq!(pool.retrieve_async(&key, wait).await.unwrap(), 0);
        assert!(
            asked.elapsed() < Duration::from_millis(1_000),
            "job {id} took {:?}: it waited on the blocked worker",
            asked.elapsed()
        );
    }
    // Once the blocked thread is free, its slot takes jobs again: two jobs run at once.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let stats = pool.stats();
    assert_eq!(stats.completed_tasks, 5);
    assert_eq!(stats.live_worker_threads, 2);
}
