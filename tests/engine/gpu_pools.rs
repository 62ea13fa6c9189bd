//! GPU-aware pools through the configuration path, with the fake GPU: `"max_units": "auto"`
//! sizing, one pool per device, the live guard (a task parked while another process holds
//! the card starts once the fake frees memory), stats, and the errors of a machine without
//! a GPU.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::PoolStats;
use prometheus_parking_lot::gpu::{FakeGpu, GpuError, GpuStats};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::*;

#[cfg(not(feature = "gpu"))]
#[path = "../support/features.rs"]
mod features;

/// Says which pool ran the task; a task whose payload is `slow` takes half a second.
#[derive(Clone)]
struct Named(String);

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Named {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        if payload == "slow" {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        format!("{}:{payload}", self.0)
    }
}

fn build(json: &str, gpu: &Arc<FakeGpu>) -> Result<BuiltPools<String, String, Named>, PoolError> {
    let config = SchedulerConfig::from_json_str(json).expect("valid config");
    build_pools_with_gpu_probe::<String, String, Named, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |name| Named(name.to_owned()),
        TokioSpawner,
        gpu.clone(),
    )
}

fn card(total_mib: u64) -> Arc<FakeGpu> {
    Arc::new(FakeGpu::new().with_device("NVIDIA L40S", total_mib))
}

fn vram_task(id: TaskId, mib: u32) -> ScheduledTask<String> {
    ScheduledTask {
        meta: TaskMetadata::new(id, ResourceCost::gpu_vram(mib)),
        payload: format!("task{id}"),
    }
}

/// Waits (bounded) until `stats` says so; panics with the last stats otherwise.
async fn eventually(
    pool: &ResourcePool<String, String, Named>,
    what: &str,
    ok: impl Fn(&PoolStats) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = pool.stats();
        if ok(&stats) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sizes_a_vram_pool_from_the_device_less_the_reserve() {
    let gpu = card(16_000);
    let built = build(
        r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 2 } } }"#,
        &gpu,
    )
    .unwrap();
    let pool = &built.pools["llm"];
    let stats = pool.stats();
    // 16,000 MiB less the default reserve of a tenth.
    assert_eq!(stats.total_by_kind[ResourceKind::GpuVram.index()], 14_400);
    assert_eq!(
        stats.gpu,
        Some(GpuStats {
            index: 0,
            name: "NVIDIA L40S".into(),
            total_mib: 16_000,
            free_mib: 16_000,
            reserve_mib: 1_600,
            live_guard: false,
        })
    );
    assert_eq!(
        pool.submit(vram_task(1, 14_401)).await,
        Err(PoolError::InsufficientResources {
            needed: 14_401,
            available: 14_400,
            kind: ResourceKind::GpuVram,
        })
    );
    let key = pool.submit(vram_task(2, 14_400)).await.unwrap();
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "llm:task2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_make_one_pool_per_gpu_named_after_it() {
    let gpu = Arc::new(
        FakeGpu::new()
            .with_device("NVIDIA A10", 24_000)
            .with_device("NVIDIA A100-SXM4-80GB", 80_000)
            .with_device("NVIDIA A10", 24_000),
    );
    let built = build(
        r#"{ "pools": {
            "llm": { "max_units": "auto", "worker_threads": 1,
                     "gpu": { "devices": [2, 1], "reserve_fraction": 0.25 } },
            "embed": { "max_units": 8, "worker_threads": 1 } } }"#,
        &gpu,
    )
    .unwrap();
    let mut names: Vec<&str> = built.pools.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["embed", "llm.gpu1", "llm.gpu2"]);
    let big = built.pools["llm.gpu1"].stats();
    assert_eq!(big.total_by_kind[ResourceKind::GpuVram.index()], 60_000);
    assert_eq!(
        big.gpu.map(|gpu| (gpu.index, gpu.name)),
        Some((1, "NVIDIA A100-SXM4-80GB".to_owned()))
    );
    let small = built.pools["llm.gpu2"].stats();
    assert_eq!(small.total_by_kind[ResourceKind::GpuVram.index()], 18_000);
    assert_eq!(small.gpu.map(|gpu| gpu.index), Some(2));
    assert_eq!(
        built.pools["embed"].stats().gpu,
        None,
        "a pool without a GPU"
    );
    // Each device's pool got an executor made for its own name.
    let pool = &built.pools["llm.gpu2"];
    let key = pool.submit(vram_task(1, 100)).await.unwrap();
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "llm.gpu2:task1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_number_with_a_gpu_section_counts_mib_of_the_device_and_must_fit_it() {
    let gpu = card(16_000);
    let built = build(
        r#"{ "pools": { "p": { "max_units": 8000, "worker_threads": 1, "gpu": { "device": 0 } } } }"#,
        &gpu,
    )
    .unwrap();
    let stats = built.pools["p"].stats();
    assert_eq!(stats.total_by_kind[ResourceKind::GpuVram.index()], 8_000);
    assert_eq!(stats.gpu.map(|gpu| gpu.total_mib), Some(16_000));

    let error = build(
        r#"{ "pools": { "p": { "max_units": 15000, "gpu": { "reserve_fraction": 0.1 } } } }"#,
        &gpu,
    )
    .err()
    .expect("too large for the card");
    assert_eq!(
        error.to_string(),
        "invalid configuration: pools.p.max_units: 15000 MiB is more than GPU 0 (NVIDIA L40S) \
         leaves after its reserve: 14400 of 16000 MiB; lower it, lower gpu.reserve_fraction, or \
         use \"auto\""
    );
}

/// The issue's scenario: another process holds most of the card. A task that fits the
/// pool's budget but not the free memory waits; a smaller one that fits starts; once the
/// other process frees its memory, the parked task starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_guard_parks_a_task_until_another_process_frees_memory() {
    let gpu = card(16_000);
    // Another process holds 12,000 MiB: 4,000 free, 2,400 past the 1,600 MiB reserve.
    gpu.set_free_mib(0, 4_000);
    let built = build(
        r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 2,
              "gpu": { "live_guard": true, "sample_ms": 5 } } } }"#,
        &gpu,
    )
    .unwrap();
    let pool = &built.pools["llm"];
    assert_eq!(pool.stats().gpu.map(|gpu| gpu.free_mib), Some(4_000));

    let big = pool.submit(vram_task(1, 3_000)).await.unwrap();
    let small = pool.submit(vram_task(2, 2_000)).await.unwrap();
    assert_eq!(
        pool.retrieve(&small, Duration::from_secs(5)).await.unwrap(),
        "llm:task2",
        "the small task fits the free memory and starts"
    );
    // Forty samples later the big task is still parked: the card is still full.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats = pool.stats();
    assert_eq!(
        (
            stats.queued_tasks,
            stats.active_tasks,
            stats.completed_tasks
        ),
        (1, 0, 1),
        "{stats:?}"
    );
    // No result yet. (Asked without waiting: a retrieve that gave up would abandon the
    // task, whose key the pool made, as nobody else could collect it.)
    assert_eq!(
        pool.client().try_retrieve(&big).await,
        Err(PoolError::ResultNotFound)
    );

    // The other process exits.
    gpu.set_free_mib(0, 16_000);
    assert_eq!(
        pool.retrieve(&big, Duration::from_secs(5)).await.unwrap(),
        "llm:task1"
    );
    eventually(pool, "idle with the new sample", |stats| {
        stats.queued_tasks == 0
            && stats.used_by_kind[ResourceKind::GpuVram.index()] == 0
            && stats.gpu.as_ref().is_some_and(|gpu| gpu.free_mib == 16_000)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_live_guard_the_pool_budget_alone_decides() {
    let gpu = card(16_000);
    gpu.set_free_mib(0, 4_000);
    let built = build(
        r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 2, "gpu": { "sample_ms": 5 } } } }"#,
        &gpu,
    )
    .unwrap();
    let pool = &built.pools["llm"];
    let key = pool.submit(vram_task(1, 3_000)).await.unwrap();
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "llm:task1"
    );
    // The stats still follow the card.
    gpu.set_free_mib(0, 9_000);
    eventually(pool, "showing the new free memory", |stats| {
        stats
            .gpu
            .as_ref()
            .is_some_and(|gpu| gpu.free_mib == 9_000 && !gpu.live_guard)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sample_lifts_the_guard_instead_of_parking_for_ever() {
    let gpu = card(16_000);
    gpu.set_free_mib(0, 2_000);
    let built = build(
        r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 1,
              "gpu": { "live_guard": true, "sample_ms": 5 } } } }"#,
        &gpu,
    )
    .unwrap();
    let pool = &built.pools["llm"];
    let key = pool.submit(vram_task(1, 1_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        pool.stats().queued_tasks,
        1,
        "2,000 free less 1,600 reserved"
    );
    gpu.set_failure(Some(GpuError::Nvml {
        detail: "GPU is lost".into(),
    }));
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "llm:task1"
    );
}

#[test]
fn auto_without_a_driver_names_the_field_the_cause_and_what_to_configure() {
    let cases = [
        (
            FakeGpu::failing(GpuError::LibraryNotFound {
                detail:
                    "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"
                        .into(),
            }),
            r#"{ "pools": { "llm": { "max_units": "auto" } } }"#,
            "pools.llm.max_units: \"auto\" sizes the pool from GPU 0, but the NVIDIA management \
             library (libnvidia-ml.so.1) was not found or could not be loaded: libnvidia-ml.so.1: \
             cannot open shared object file: No such file or directory; install or start the \
             NVIDIA driver, or run without a GPU: set max_units to a number of units and remove \
             the gpu section",
        ),
        (
            FakeGpu::failing(GpuError::DriverNotLoaded),
            r#"{ "pools": { "llm": { "max_units": 512, "gpu": { "device": 1 } } } }"#,
            "pools.llm.gpu: the pool's units are MiB of GPU 1, but the NVIDIA driver is not \
             loaded; install or start the NVIDIA driver, or run without a GPU: set max_units to \
             a number of units and remove the gpu section",
        ),
        (
            FakeGpu::new().with_device("NVIDIA T4", 15_360),
            r#"{ "pools": { "llm": { "max_units": "auto", "gpu": { "device": 3 } } } }"#,
            "pools.llm.gpu.device: \"auto\" sizes the pool from GPU 3, but there is no GPU 3; \
             this machine has 1 (indexes 0 to 0); name a device this machine has",
        ),
        (
            FakeGpu::new(),
            r#"{ "pools": { "llm": { "max_units": "auto", "gpu": { "devices": [0, 1] } } } }"#,
            "pools.llm.gpu.devices: \"auto\" sizes the pool from GPU 0, but there is no GPU 0; \
             this machine has none; name a device this machine has",
        ),
    ];
    for (gpu, json, expected) in cases {
        let error = build(json, &Arc::new(gpu)).err().expect(json);
        assert_eq!(
            error,
            PoolError::InvalidConfig(expected.into()),
            "for {json}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gpu_every_other_pool_builds_and_a_gpu_pool_stops_them_all() {
    let no_driver = Arc::new(FakeGpu::failing(GpuError::DriverNotLoaded));
    let plain = r#"{ "pools": { "chat": { "max_units": 8, "worker_threads": 1 } } }"#;
    let built = build(plain, &no_driver).expect("no pool asks the GPU");
    let key = built.pools["chat"]
        .submit(ScheduledTask {
            meta: TaskMetadata::new(1, ResourceCost::cpu(1)),
            payload: "hi".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        built.pools["chat"]
            .retrieve(&key, Duration::from_secs(5))
            .await
            .unwrap(),
        "chat:hi"
    );

    // One GPU pool that cannot be sized: nothing is started, not even the plain pool.
    let started = Arc::new(Mutex::new(Vec::new()));
    let config = SchedulerConfig::from_json_str(
        r#"{ "pools": { "a_chat": { "max_units": 8, "worker_threads": 1 },
                         "b_llm": { "max_units": "auto", "worker_threads": 1 } } }"#,
    )
    .unwrap();
    let error = build_pools_with_gpu_probe::<String, String, Named, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |name| {
            started.lock().unwrap().push(name.to_owned());
            Named(name.to_owned())
        },
        TokioSpawner,
        no_driver,
    )
    .err()
    .expect("b_llm cannot be sized");
    assert!(
        error.to_string().contains("pools.b_llm.max_units"),
        "{error}"
    );
    assert!(started.lock().unwrap().is_empty(), "a pool was started");
}

#[cfg(not(feature = "gpu"))]
#[test]
fn without_the_gpu_feature_the_plain_builder_refuses_auto_naming_the_feature() {
    let config =
        SchedulerConfig::from_json_str(r#"{ "pools": { "llm": { "max_units": "auto" } } }"#)
            .unwrap();
    let error = build_pools_from_scheduler_config::<String, String, Named, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |name| Named(name.to_owned()),
        TokioSpawner,
    )
    .err()
    .expect("no NVML in this build");
    let text = error.to_string();
    assert!(
        text.starts_with(
            "invalid configuration: pools.llm.max_units: \"auto\" (GPU sizing) is not available \
             in this build of prometheus_parking_lot (it needs the cargo feature `gpu`); \
             available here: "
        ),
        "{text}"
    );
    features::assert_lists_what_this_build_has(&text);
}

/// A finished task's memory counts at once: the scheduler asks for a sample when a task
/// ends while others wait, instead of waiting out the interval (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_wakes_the_sampler_for_the_tasks_waiting_on_memory() {
    let gpu = card(16_000);
    gpu.set_free_mib(0, 4_000); // 2,400 MiB past the reserve
    let built = build(
        r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 2,
              "gpu": { "live_guard": true, "sample_ms": 60000 } } } }"#,
        &gpu,
    )
    .unwrap();
    let pool = &built.pools["llm"];
    // The first start takes 2,000 MiB off the sampled headroom: the second task waits for
    // the next sample, which comes when the first one finishes.
    let slow = ScheduledTask {
        payload: "slow".into(),
        ..vram_task(1, 2_000)
    };
    let first = pool.submit(slow).await.unwrap();
    let second = pool.submit(vram_task(2, 2_000)).await.unwrap();
    eventually(pool, "parking the second task", |stats| {
        stats.queued_tasks == 1
    })
    .await;
    assert_eq!(
        pool.retrieve(&first, Duration::from_secs(5)).await.unwrap(),
        "llm:slow"
    );
    assert_eq!(
        pool.retrieve(&second, Duration::from_secs(5))
            .await
            .unwrap(),
        "llm:task2"
    );
}
