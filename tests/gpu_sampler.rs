//! A GPU pool's sampler thread lives exactly as long as its pool: one per GPU pool while it
//! runs, none once it has shut down. (Its own test binary: it counts the process's threads.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::gpu::FakeGpu;
use prometheus_parking_lot::*;

#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload
    }
}

/// Threads of this process named `parking-lot-gpu-*` (Linux shows the first 15 bytes).
fn sampler_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("parking-lot-gpu"))
        .count()
}

async fn wait_for_samplers(expected: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while sampler_threads() != expected {
        assert!(
            Instant::now() < deadline,
            "{} sampler threads, expected {expected}",
            sampler_threads()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gpu_pool_has_one_sampler_thread_until_it_shuts_down() {
    let gpu = Arc::new(
        FakeGpu::new()
            .with_device("NVIDIA T4", 15_360)
            .with_device("NVIDIA T4", 15_360),
    );
    let config = SchedulerConfig::from_json_str(
        r#"{ "pools": {
            "llm": { "max_units": "auto", "worker_threads": 1, "gpu": { "devices": [0, 1], "live_guard": true } },
            "chat": { "max_units": 4, "worker_threads": 1 } } }"#,
    )
    .unwrap();
    assert_eq!(sampler_threads(), 0);
    let built = build_pools_with_gpu_probe::<String, String, Echo, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
        gpu,
    )
    .unwrap();
    wait_for_samplers(2).await;
    for pool in built.pools.values() {
        pool.shutdown_with_drain(Duration::from_secs(5))
            .await
            .unwrap();
    }
    drop(built);
    wait_for_samplers(0).await;
}
