//! The yaque queue's cost beside the in-memory queue, in one process and one run.
//!
//! **Queue alone** (the `TaskQueue` calls the scheduler makes, one caller): park N tasks,
//! then claim and settle each; rates in operations per second for park, and for
//! claim + settle together (one task's trip out of the queue).
//!
//! **Through a pool** (`ResourcePool`, W = 2 workers, 2 units, every task costs 1 unit): one
//! client submits N no-op tasks and retrieves every result; tasks per second from the first
//! submit to the last retrieve. Two shapes: *one at a time* (each submit waits for its answer,
//! so most tasks find a free worker and start at once) and *one batch* (all N in one
//! `submit_batch`, so all but two park: each is parked, claimed and settled). Paths, all in
//! the same run, rounds interleaved:
//!
//! - *in-memory queue* (the baseline);
//! - *yaque, accepted*: every task stored before its submit returns, started ones too;
//! - *yaque, parked*: only parked tasks are stored (`spin_ms` 0);
//! - *yaque, parked, spin 5 ms*: parked tasks wait 5 ms in memory first.
//!
//! Each task carries a 200-byte payload. `cargo bench -p prometheus_parking_lot_benches --bench
//! durable_queue` runs N = 20,000 and R = 3 rounds (override with `DQ_TASKS`, `DQ_ROUNDS`); under
//! `cargo test` (no `--bench` argument) it runs 300 tasks once as a smoke test that checks every
//! result, not speed.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{
    Durability, ScheduledTask, Settlement, StarvationGuard, TaskMetadata, TaskQueue,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
use prometheus_parking_lot::util::serde::ResourceCost;
use prometheus_parking_lot::TokioSpawner;
use prometheus_parking_lot::{ResourcePool, TaskExecutor};

struct Scale {
    tasks: u64,
    rounds: usize,
    bench: bool,
}

impl Scale {
    fn from_args() -> Self {
        let bench = support::measured();
        let env = support::env_u64;
        if bench {
            Self {
                tasks: env("DQ_TASKS", 20_000),
                rounds: env("DQ_ROUNDS", 3) as usize,
                bench,
            }
        } else {
            Self {
                tasks: 300,
                rounds: 1,
                bench,
            }
        }
    }
}

/// A directory for one measurement, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("pl-bench-durable-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn payload(id: u64) -> String {
    format!("{id:>200}")
}

fn task(id: u64) -> ScheduledTask<String> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::gpu_vram(1)),
        payload(id),
    )
}

// ---------------------------------------------------------------------------------------------
// Queue alone
// ---------------------------------------------------------------------------------------------

/// (park ops/s, claim + settle ops/s).
async fn queue_alone(queue: &dyn TaskQueue<String>, tasks: u64) -> (f64, f64) {
    let started = Instant::now();
    for id in 0..tasks {
        queue.park(id, task(id)).await.expect("park");
    }
    let park = started.elapsed();
    let started = Instant::now();
    for id in 0..tasks {
        let claimed = queue.claim(id).await.expect("claim").expect("parked");
        assert_eq!(claimed.payload, payload(id));
        queue.settle(id, Settlement::Done).await.expect("settle");
    }
    let trip = started.elapsed();
    let counts = queue.counts().await.expect("counts");
    assert_eq!((counts.parked, counts.claimed), (0, 0));
    (rate(tasks, park), rate(tasks, trip))
}

// ---------------------------------------------------------------------------------------------
// Through a pool
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Length;

#[async_trait]
impl TaskExecutor<String, usize> for Length {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> usize {
        payload.len()
    }
}

#[derive(Clone, Copy)]
enum Route {
    Memory,
    Yaque(Durability),
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Memory => "in-memory queue",
            Route::Yaque(Durability::Accepted) => "yaque, accepted",
            Route::Yaque(Durability::Parked { spin }) if spin.is_zero() => "yaque, parked",
            Route::Yaque(Durability::Parked { .. }) => "yaque, parked, spin 5 ms",
        }
    }
}

/// Tasks per second through a fresh pool; `batch`: all tasks in one `submit_batch`.
async fn through_pool(path: Route, batch: bool, tasks: u64, scratch: &Scratch) -> f64 {
    let (queue, durability): (Box<dyn TaskQueue<String>>, Durability) = match path {
        Route::Memory => (Box::new(InMemoryQueue::new()), Durability::Accepted),
        Route::Yaque(durability) => (
            Box::new(YaqueQueue::open(scratch.path(), "bench").expect("queue")),
            durability,
        ),
    };
    let settings = WorkerPoolConfig::new()
        .with_name("durable-bench")
        .with_worker_count(2)
        .with_max_units(2)
        .with_max_queue_depth(tasks as usize + 16)
        .with_starvation(StarvationGuard::disabled())
        .with_durability(durability);
    let pool = ResourcePool::with_settings(
        settings,
        Length,
        queue,
        Arc::new(InMemoryMailbox::new()),
        &TokioSpawner,
    )
    .expect("pool");
    let started = Instant::now();
    let mut keys = Vec::with_capacity(tasks as usize);
    if batch {
        let answers = pool
            .client()
            .submit_batch((0..tasks).map(task).collect(), Default::default())
            .await;
        for (id, answer) in answers.into_iter().enumerate() {
            keys.push(answer.unwrap_or_else(|error| panic!("{}: task {id}: {error}", path.name())));
        }
    }
    for id in (0..tasks).filter(|_| !batch) {
        keys.push(
            pool.submit(task(id))
                .await
                .unwrap_or_else(|error| panic!("{}: task {id}: {error}", path.name())),
        );
    }
    for key in &keys {
        let length = pool
            .retrieve(key, Duration::from_secs(60))
            .await
            .expect("result");
        assert_eq!(length, 200);
    }
    let elapsed = started.elapsed();
    pool.shutdown_with_drain(Duration::from_secs(10))
        .await
        .expect("shutdown");
    drop(pool);
    rate(tasks, elapsed)
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

fn rate(tasks: u64, elapsed: Duration) -> f64 {
    tasks as f64 / elapsed.as_secs_f64()
}

fn thousands(value: f64) -> String {
    let whole = value.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn main() {
    let scale = Scale::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "durable_queue: N = {} tasks, R = {} rounds, 200-byte payloads, {} CPUs{}",
        thousands(scale.tasks as f64),
        scale.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
        if scale.bench { "" } else { " (smoke test)" }
    );

    let mut memory_alone = (Vec::new(), Vec::new());
    let mut yaque_alone = (Vec::new(), Vec::new());
    let paths = [
        Route::Memory,
        Route::Yaque(Durability::Accepted),
        Route::Yaque(Durability::Parked {
            spin: Duration::ZERO,
        }),
        Route::Yaque(Durability::Parked {
            spin: Duration::from_millis(5),
        }),
    ];
    let shapes = [(false, "one at a time"), (true, "one batch")];
    let mut pooled: Vec<Vec<f64>> = vec![Vec::new(); paths.len() * shapes.len()];
    runtime.block_on(async {
        for round in 0..scale.rounds {
            let memory = InMemoryQueue::new();
            let (park, trip) = queue_alone(&memory, scale.tasks).await;
            memory_alone.0.push(park);
            memory_alone.1.push(trip);
            let scratch = Scratch::new("alone");
            let yaque = YaqueQueue::open(scratch.path(), "bench").expect("queue");
            let (park, trip) = queue_alone(&yaque, scale.tasks).await;
            drop(yaque);
            yaque_alone.0.push(park);
            yaque_alone.1.push(trip);
            for offset in 0..pooled.len() {
                let index = (offset + round) % pooled.len();
                let (path, (batch, _)) = (paths[index % paths.len()], shapes[index / paths.len()]);
                let scratch = Scratch::new("pool");
                pooled[index].push(through_pool(path, batch, scale.tasks, &scratch).await);
            }
        }
    });

    let memory_park = support::median(&memory_alone.0);
    let memory_trip = support::median(&memory_alone.1);
    let yaque_park = support::median(&yaque_alone.0);
    let yaque_trip = support::median(&yaque_alone.1);
    println!();
    println!("queue alone (medians, operations per second):");
    println!("| operation | in-memory | yaque | yaque / in-memory |");
    println!("|---|---:|---:|---:|");
    println!(
        "| park | {} | {} | {:.3}x |",
        thousands(memory_park),
        thousands(yaque_park),
        yaque_park / memory_park
    );
    println!(
        "| claim + settle | {} | {} | {:.3}x |",
        thousands(memory_trip),
        thousands(yaque_trip),
        yaque_trip / memory_trip
    );
    println!();
    println!("through a pool (submit N, retrieve N; tasks per second):");
    println!("| shape | path | best | median | median / in-memory |");
    println!("|---|---|---:|---:|---:|");
    for (shape, (_, shape_name)) in shapes.iter().enumerate() {
        let rows = &mut pooled[shape * paths.len()..(shape + 1) * paths.len()];
        let baseline = support::median(&rows[0]);
        for (path, rates) in paths.iter().zip(rows.iter_mut()) {
            let best = rates.iter().copied().fold(0.0, f64::max);
            let median = support::median(rates);
            println!(
                "| {shape_name} | {} | {} | {} | {:.3}x |",
                path.name(),
                thousands(best),
                thousands(median),
                median / baseline
            );
        }
    }
}
