//! A VRAM pool sized from the GPU (`"max_units": "auto"`), with the live guard holding a task
//! back while another process uses the card.
//!
//! ```sh
//! cargo run --example gpu_pool --features gpu   # NVML when this machine has a GPU
//! cargo run --example gpu_pool                  # a fake GPU
//! ```
//!
//! Without a GPU (or without the `gpu` feature) it runs on a fake 24 GiB card and says so;
//! the fake plays another process that holds most of the card and later exits.
//!
//! Its output: which GPU it uses, the device's memory and the pool sized from it (total less
//! the reserve). On the fake card, a 6,000 MiB task stays parked while the other process
//! holds the memory, although it fits the pool, and a 1,500 MiB one runs past it; the big
//! one finishes shortly after the memory is freed. On a real GPU, four small tasks run under
//! the live guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::gpu::{FakeGpu, GpuProbe};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::*;

/// Units are MiB: the pool is sized from the device's memory less a tenth.
const CONFIG: &str = r#"{
  "pools": {
    "llm": {
      "max_units": "auto",
      "worker_threads": 2,
      "gpu": { "device": 0, "reserve_fraction": 0.1, "live_guard": true, "sample_ms": 20 }
    }
  }
}"#;

/// Pretends to run a model for a fifth of a second.
#[derive(Clone)]
struct Inference;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Inference {
    async fn execute(&self, prompt: String, meta: TaskMetadata) -> String {
        tokio::time::sleep(Duration::from_millis(200)).await;
        format!("{prompt} ({} MiB)", meta.cost.units)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (probe, fake) = probe();
    let config = SchedulerConfig::from_json_str(CONFIG)?;
    let built = build_pools_with_gpu_probe::<String, String, Inference, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Inference,
        TokioSpawner,
        probe,
    )?;
    let pool = &built.pools["llm"];
    print_gpu(pool, "at start");
    match fake {
        Some(fake) => another_process_demo(pool, &fake).await?,
        None => real_gpu_demo(pool).await?,
    }
    print_gpu(pool, "at the end");
    Ok(())
}

/// NVML when the `gpu` feature is on and a GPU answers; the fake otherwise (the second
/// value, so the demo can play the other process on it).
fn probe() -> (Arc<dyn GpuProbe>, Option<Arc<FakeGpu>>) {
    #[cfg(feature = "gpu")]
    match prometheus_parking_lot::gpu::NvmlProbe::new() {
        Ok(nvml) if nvml.device_count().unwrap_or(0) > 0 => {
            println!("Using this machine's GPU through NVML.");
            return (Arc::new(nvml), None);
        }
        Ok(_) => println!("NVML loaded but reports no GPU: using a fake GPU instead."),
        Err(error) => println!("No GPU here ({error}): using a fake GPU instead."),
    }
    #[cfg(not(feature = "gpu"))]
    println!(
        "Built without the `gpu` feature: using a fake GPU (run with --features gpu for NVML)."
    );
    let fake = Arc::new(FakeGpu::new().with_device("Fake RTX 4090 (24 GiB)", 24_564));
    (fake.clone(), Some(fake))
}

/// On the fake: another process holds 20 GB of the card, so a 6 GB task waits while a
/// 1.5 GB one runs; when the other process exits, the 6 GB task starts.
async fn another_process_demo(
    pool: &ResourcePool<String, String, Inference>,
    fake: &FakeGpu,
) -> Result<(), PoolError> {
    println!("\nAnother process takes 20,000 MiB of the card.");
    fake.set_free_mib(0, 4_564);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let big = submit(pool, 1, 6_000, "summarise the report").await?;
    let small = submit(pool, 2, 1_500, "translate a sentence").await?;
    println!(
        "  {}",
        pool.retrieve(&small, Duration::from_secs(10)).await?
    );
    let stats = pool.stats();
    println!(
        "  after {:?}: {} task parked (6,000 MiB fits the pool's {} MiB, not the card's free memory)",
        start.elapsed(),
        stats.queued_tasks,
        stats.total_units
    );
    println!("The other process exits.");
    let freed = Instant::now();
    fake.set_free_mib(0, 24_564);
    println!("  {}", pool.retrieve(&big, Duration::from_secs(10)).await?);
    println!(
        "  the parked task finished {:?} after the memory was freed (200 ms of that running)",
        freed.elapsed()
    );
    Ok(())
}

/// On a real GPU: a few small tasks under the live guard.
async fn real_gpu_demo(pool: &ResourcePool<String, String, Inference>) -> Result<(), PoolError> {
    println!("\nFour tasks of 256 MiB each:");
    let mut keys = Vec::new();
    for id in 1..=4 {
        keys.push(submit(pool, id, 256, "hello").await?);
    }
    for key in keys {
        println!("  {}", pool.retrieve(&key, Duration::from_secs(30)).await?);
    }
    Ok(())
}

async fn submit(
    pool: &ResourcePool<String, String, Inference>,
    id: TaskId,
    mib: u32,
    prompt: &str,
) -> Result<MailboxKey, PoolError> {
    let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(mib));
    pool.submit(ScheduledTask {
        meta,
        payload: prompt.to_owned(),
    })
    .await
}

fn print_gpu(pool: &ResourcePool<String, String, Inference>, when: &str) {
    let stats = pool.stats();
    if let Some(gpu) = stats.gpu {
        println!(
            "GPU {} {when}: {} | {} MiB total, {} MiB free | pool: {} MiB ({} reserved), live guard {}",
            gpu.index,
            gpu.name,
            gpu.total_mib,
            gpu.free_mib,
            stats.total_units,
            gpu.reserve_mib,
            if gpu.live_guard { "on" } else { "off" }
        );
    }
}
