//! The real NVML, wherever the tests run (cargo feature `gpu`).
//!
//! On a machine with an NVIDIA driver it prints every GPU it finds (index, name, total and
//! free MiB), checks the values are sane, and builds an `"auto"` pool on GPU 0 through the
//! plain config builder. On a machine without one (CI, laptops) it checks that the probe
//! fails with the documented cause (library not found, or driver not loaded), prints it,
//! and checks that `"auto"` then fails with an error naming the field, the cause and what
//! to configure instead, while a pool without a GPU still builds.
//!
//! Run it with `cargo test --features gpu --test gpu_nvml -- --nocapture` to see what it
//! found.
#![cfg(feature = "gpu")]

use std::time::Duration;

use prometheus_parking_lot::gpu::{GpuError, GpuProbe, NvmlProbe};
use prometheus_parking_lot::*;

#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload
    }
}

fn build(json: &str) -> Result<BuiltPools<String, String, Echo>, PoolError> {
    let config = SchedulerConfig::from_json_str(json).expect("valid config");
    build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
    )
}

const AUTO_POOL: &str = r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 1,
    "gpu": { "device": 0, "live_guard": true } } } }"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_reports_this_machines_gpus_or_says_why_it_cannot() {
    match NvmlProbe::new() {
        Ok(nvml) => with_a_driver(&nvml).await,
        Err(error) => without_a_driver(error).await,
    }
}

async fn with_a_driver(nvml: &NvmlProbe) {
    let count = nvml.device_count().expect("device count");
    println!("NVML loaded: {count} GPU(s)");
    for index in 0..count {
        let gpu = nvml.device(index).expect("device");
        println!(
            "  GPU {index}: {} — {} MiB total, {} MiB free",
            gpu.name,
            gpu.total_mib(),
            gpu.free_mib()
        );
        assert_eq!(gpu.index, index);
        assert!(!gpu.name.trim().is_empty(), "GPU {index} has no name");
        assert!(
            gpu.total_mib() >= 256,
            "GPU {index}: {} MiB",
            gpu.total_mib()
        );
        assert!(gpu.free_bytes <= gpu.total_bytes, "GPU {index}: {gpu:?}");
        let free = nvml.free_bytes(index).expect("free memory");
        assert!(free <= gpu.total_bytes);
    }
    assert_eq!(
        nvml.device(count).unwrap_err(),
        GpuError::NoDevice {
            index: count,
            count
        }
    );
    if count == 0 {
        println!("  no GPU to build an \"auto\" pool on");
        return;
    }
    let total_mib = nvml.device(0).expect("device 0").total_mib();
    let built = build(AUTO_POOL).expect("an auto pool on GPU 0");
    let pool = &built.pools["llm"];
    let stats = pool.stats();
    let gpu = stats.gpu.clone().expect("GPU stats");
    println!(
        "  \"auto\" pool on GPU 0: {} units (MiB), reserve {} MiB, {} MiB free at the last sample",
        stats.total_units, gpu.reserve_mib, gpu.free_mib
    );
    assert_eq!(gpu.total_mib, total_mib);
    assert_eq!(gpu.reserve_mib, (total_mib as f64 * 0.1).ceil() as u64);
    assert_eq!(
        stats.total_by_kind[ResourceKind::GpuVram.index()],
        total_mib - gpu.reserve_mib
    );
    // A tiny task runs under the live guard unless the card is nearly full.
    if gpu.free_mib > gpu.reserve_mib + 1 {
        let key = pool
            .submit(ScheduledTask {
                meta: TaskMetadata::new(1, ResourceCost::gpu_vram(1)),
                payload: "ran".into(),
            })
            .await
            .unwrap();
        assert_eq!(
            pool.retrieve(&key, Duration::from_secs(10)).await.unwrap(),
            "ran"
        );
    }
}

async fn without_a_driver(error: GpuError) {
    println!("NVML is not usable on this machine (no GPU test possible): {error}");
    assert!(
        matches!(
            error,
            GpuError::LibraryNotFound { .. } | GpuError::DriverNotLoaded
        ),
        "an undocumented cause: {error:?}"
    );
    let refused = build(AUTO_POOL).err().expect("no GPU to size from");
    println!("  \"auto\" is refused with: {refused}");
    let message = refused.to_string();
    assert!(
        message.starts_with(
            "invalid configuration: pools.llm.max_units: \"auto\" sizes the pool from GPU 0, but "
        ),
        "{message}"
    );
    assert!(message.contains(&error.to_string()), "{message}");
    assert!(
        message.ends_with("set max_units to a number of units and remove the gpu section"),
        "{message}"
    );
    // Everything else works.
    let built = build(r#"{ "pools": { "chat": { "max_units": 4, "worker_threads": 1 } } }"#)
        .expect("a pool without a GPU");
    let key = built.pools["chat"]
        .submit(ScheduledTask {
            meta: TaskMetadata::new(1, ResourceCost::cpu(1)),
            payload: "still works".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        built.pools["chat"]
            .retrieve(&key, Duration::from_secs(5))
            .await
            .unwrap(),
        "still works"
    );
}
