//! End-to-end cost of running a task through a `WorkerPool` (in-memory queue and mailbox),
//! beside two baselines with the same number of tasks, the same number of worker threads W
//! and the same number C of concurrent async clients, all in one run:
//!
//! - **WorkerPool**: each client loops `submit_async` then `retrieve_async`; the executor is
//!   a no-op. Every task goes client → scheduler actor → (queue actor when parked) → worker
//!   thread → scheduler actor → mailbox actor → waiting `retrieve_async`.
//! - **Semaphore gate** (baseline A): a `tokio::sync::Semaphore` with W permits; each task
//!   acquires a permit, runs the no-op in `tokio::task::spawn_blocking`, awaits it, releases.
//! - **crossbeam pool** (baseline B): W OS threads pull boxed jobs from a `crossbeam_channel`
//!   and send each result back through the task's own `tokio::sync::oneshot`.
//!
//! For each path it reports throughput and submit→start latency (the payload carries the
//! `Instant` taken just before submitting; the no-op records `Instant::now()` when it
//! starts). Then mailbox wake-up latency, store → waiting retrieve: (a) raw, a storer thread
//! calling `InMemoryMailbox::store` while a task waits on the key the way `retrieve_async`
//! does; (b) through the pool, from the executor's return to `retrieve_async` returning
//! (worker → scheduler → mailbox actor → client), unloaded (one client) and under the
//! throughput run's load.
//!
//! `cargo bench --bench end_to_end` runs 100,000 tasks per path with W = 2 and C = 64
//! (override with the environment variables `E2E_TASKS`, `E2E_WORKERS`, `E2E_CLIENTS`).
//! Under `cargo test` (no `--bench` argument) it runs the same code with a few hundred tasks
//! as a smoke test that checks every result but no speed.

use std::pin::pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{Delivery, Mailbox, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// How long a client waits for one result before the run fails.
const RETRIEVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Threads of the clients' tokio runtime (the machine this was written on has 2 cores).
const CLIENT_THREADS: usize = 2;

/// The run's size: the real benchmark, or a smoke test under `cargo test`.
struct Scale {
    bench: bool,
    tasks: u64,
    warmup: u64,
    workers: usize,
    clients: u64,
    wake_samples: u64,
}

impl Scale {
    fn from_args() -> Self {
        let bench = std::env::args().any(|arg| arg == "--bench");
        let env = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|value| value.parse().ok())
                .unwrap_or(default)
        };
        let (tasks, clients, wake_samples) = if bench {
            (100_000, 64, 10_000)
        } else {
            (400, 8, 200)
        };
        let tasks = env("E2E_TASKS", tasks);
        Self {
            bench,
            tasks,
            warmup: (tasks / 20).max(50),
            workers: env("E2E_WORKERS", 2).max(1) as usize,
            clients: env("E2E_CLIENTS", clients).max(1),
            wake_samples,
        }
    }
}

/// What a task carries: its input and when it was submitted.
#[derive(Debug, Clone, Copy)]
struct Payload {
    value: u64,
    submitted: Instant,
}

/// What a task returns: its answer, when the no-op started, and how long after its
/// submission that was.
#[derive(Debug, Clone, Copy)]
struct Done {
    value: u64,
    started: Instant,
    submit_to_start: Duration,
}

/// The no-op every path runs.
fn no_op(payload: Payload) -> Done {
    let started = Instant::now();
    Done {
        value: expected(payload.value),
        started,
        submit_to_start: started - payload.submitted,
    }
}

fn expected(value: u64) -> u64 {
    value.wrapping_mul(2).wrapping_add(1)
}

#[derive(Clone)]
struct NoOp;

#[async_trait::async_trait]
impl WorkerExecutor<Payload, Done> for NoOp {
    async fn execute(&self, payload: Payload, _meta: TaskMetadata) -> Done {
        no_op(payload)
    }
}

/// Latency samples in nanoseconds, and their percentiles.
#[derive(Default)]
struct Samples(Vec<u64>);

impl Samples {
    fn push(&mut self, elapsed: Duration) {
        self.0
            .push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    }

    fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// The `q`-quantile (0..=1), nearest rank, in microseconds.
    fn quantile_us(&mut self, q: f64) -> f64 {
        assert!(!self.0.is_empty(), "no samples");
        self.0.sort_unstable();
        let rank = ((self.0.len() as f64 * q).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1_000.0
    }

    fn summary(&mut self) -> String {
        format!(
            "p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs ({} samples)",
            self.quantile_us(0.50),
            self.quantile_us(0.99),
            self.quantile_us(1.0),
            self.0.len()
        )
    }
}

/// One measured path.
struct PathResult {
    name: &'static str,
    tasks_per_s: f64,
    submit_to_start: Samples,
}

/// What one client loop measured.
#[derive(Default)]
struct ClientSamples {
    submit_to_start: Samples,
    /// Executor return → result in the client's hands (WorkerPool only).
    done_to_retrieved: Samples,
}

impl ClientSamples {
    fn record(&mut self, value: u64, done: Done) {
        let retrieved = Instant::now();
        assert_eq!(
            done.value,
            expected(value),
            "task {value} got a wrong result"
        );
        self.submit_to_start.push(done.submit_to_start);
        self.done_to_retrieved.push(retrieved - done.started);
    }
}

/// Runs tasks `first..first + count` on `clients` concurrent client loops; client `c` runs
/// the tasks whose id is `c` modulo `clients`, one after another. Returns the wall time
/// and the merged samples.
fn run_clients<F, Fut>(
    runtime: &Runtime,
    first: u64,
    count: u64,
    clients: u64,
    client: F,
) -> (Duration, ClientSamples)
where
    F: Fn(Vec<u64>) -> Fut,
    Fut: std::future::Future<Output = ClientSamples> + Send + 'static,
{
    let loops: Vec<_> = (0..clients)
        .map(|c| {
            (first..first + count)
                .filter(|id| id % clients == c)
                .collect::<Vec<u64>>()
        })
        .filter(|ids| !ids.is_empty())
        .map(client)
        .collect();
    runtime.block_on(async move {
        let began = Instant::now();
        let handles: Vec<_> = loops.into_iter().map(tokio::spawn).collect();
        let mut merged = ClientSamples::default();
        for handle in handles {
            let samples = handle.await.expect("client loop panicked");
            merged.submit_to_start.extend(samples.submit_to_start);
            merged.done_to_retrieved.extend(samples.done_to_retrieved);
        }
        (began.elapsed(), merged)
    })
}

/// Warms a path up, then measures it.
fn measure<F, Fut>(
    name: &'static str,
    runtime: &Runtime,
    scale: &Scale,
    clients: u64,
    client: F,
) -> (PathResult, ClientSamples)
where
    F: Fn(Vec<u64>) -> Fut,
    Fut: std::future::Future<Output = ClientSamples> + Send + 'static,
{
    run_clients(runtime, 0, scale.warmup, clients, &client);
    let (elapsed, mut samples) = run_clients(runtime, scale.warmup, scale.tasks, clients, client);
    assert_eq!(samples.submit_to_start.0.len() as u64, scale.tasks);
    let result = PathResult {
        name,
        tasks_per_s: scale.tasks as f64 / elapsed.as_secs_f64(),
        submit_to_start: std::mem::take(&mut samples.submit_to_start),
    };
    (result, samples)
}

type NoOpPool = WorkerPool<Payload, Done, NoOp>;

fn new_pool(scale: &Scale) -> Arc<NoOpPool> {
    let config = WorkerPoolConfig::new()
        .with_name("e2e")
        .with_worker_count(scale.workers)
        .with_max_units(1_024)
        .with_max_queue_depth(scale.clients as usize * 4 + 1_024);
    Arc::new(WorkerPool::new(config, NoOp).expect("pool starts"))
}

/// One client loop of the WorkerPool path: submit, then wait for the result.
async fn pool_client(pool: Arc<NoOpPool>, ids: Vec<u64>) -> ClientSamples {
    let mut samples = ClientSamples::default();
    for value in ids {
        let meta = TaskMetadata::new(value, ResourceCost::cpu(1));
        let submitted = Instant::now();
        let key = pool
            .submit_async(Payload { value, submitted }, meta)
            .await
            .expect("submit admitted");
        let done = pool
            .retrieve_async(&key, RETRIEVE_TIMEOUT)
            .await
            .expect("result retrieved");
        samples.record(value, done);
    }
    samples
}

fn shut_down(runtime: &Runtime, pool: Arc<NoOpPool>, expected_completed: u64) {
    let stats = pool.stats();
    assert_eq!(stats.rejected_tasks, 0, "no task may be rejected");
    assert_eq!(
        stats.completed_tasks, expected_completed,
        "every task completes"
    );
    runtime
        .block_on(pool.shutdown(Duration::from_secs(5)))
        .expect("pool shuts down");
}

/// The crate's path. Also returns executor-return → retrieved samples under this load.
fn worker_pool(runtime: &Runtime, scale: &Scale) -> (PathResult, Samples) {
    let pool = new_pool(scale);
    let (result, samples) = measure("WorkerPool", runtime, scale, scale.clients, |ids| {
        pool_client(pool.clone(), ids)
    });
    shut_down(runtime, pool, scale.warmup + scale.tasks);
    (result, samples.done_to_retrieved)
}

/// Baseline A: a semaphore with W permits in front of `spawn_blocking`.
fn semaphore_gate(runtime: &Runtime, scale: &Scale) -> PathResult {
    let gate = Arc::new(Semaphore::new(scale.workers));
    let client = |ids: Vec<u64>| {
        let gate = gate.clone();
        async move {
            let mut samples = ClientSamples::default();
            for value in ids {
                let submitted = Instant::now();
                let permit = gate.acquire().await.expect("semaphore open");
                let payload = Payload { value, submitted };
                let done = tokio::task::spawn_blocking(move || no_op(payload))
                    .await
                    .expect("no-op ran");
                drop(permit);
                samples.record(value, done);
            }
            samples
        }
    };
    measure(
        "semaphore + spawn_blocking",
        runtime,
        scale,
        scale.clients,
        client,
    )
    .0
}

type BoxedJob = Box<dyn FnOnce() + Send>;

/// Baseline B: W threads pulling boxed jobs from a crossbeam channel.
fn crossbeam_pool(runtime: &Runtime, scale: &Scale) -> PathResult {
    let (jobs, job_receiver) = crossbeam_channel::unbounded::<BoxedJob>();
    let threads: Vec<JoinHandle<()>> = (0..scale.workers)
        .map(|_| {
            let job_receiver = job_receiver.clone();
            std::thread::spawn(move || {
                while let Ok(job) = job_receiver.recv() {
                    job();
                }
            })
        })
        .collect();
    let client = |ids: Vec<u64>| {
        let jobs = jobs.clone();
        async move {
            let mut samples = ClientSamples::default();
            for value in ids {
                let (answer, answered) = oneshot::channel();
                let submitted = Instant::now();
                let payload = Payload { value, submitted };
                jobs.send(Box::new(move || {
                    let _ = answer.send(no_op(payload));
                }))
                .expect("pool threads alive");
                let done = answered.await.expect("job ran");
                samples.record(value, done);
            }
            samples
        }
    };
    let (result, _) = measure(
        "crossbeam thread pool",
        runtime,
        scale,
        scale.clients,
        client,
    );
    drop(jobs);
    for thread in threads {
        thread.join().expect("pool thread exits");
    }
    result
}

/// Mailbox wake-up (a): a storer thread (its own current-thread runtime, like a pool's actor
/// runtime) stores under a key a task on the client runtime waits on, the way
/// `retrieve_async` waits: subscribe, enable `notified()`, `take`, await. The stored value is
/// the storer's `Instant` just before `store`; the waiter measures when `take` hands it over.
fn raw_mailbox_wakeup(runtime: &Runtime, samples: u64) -> Samples {
    let mailbox = Arc::new(InMemoryMailbox::<u64>::new());
    let base = Instant::now();
    let key = |i: u64| MailboxKey::new("bench").with_session(i.to_string());
    let (waiting, mut waiting_receiver) = mpsc::unbounded_channel::<u64>();

    let storer_mailbox = mailbox.clone();
    let storer = std::thread::spawn(move || {
        let storer_runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("storer runtime");
        storer_runtime.block_on(async move {
            while let Some(i) = waiting_receiver.recv().await {
                // Give the waiter time to park, so this measures a wake-up, not a race.
                let pause = Instant::now();
                while pause.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
                let stored = u64::try_from(base.elapsed().as_nanos()).expect("fits");
                let delivery = Delivery {
                    task_id: i,
                    outcome: Ok(stored),
                    stored_at_ms: 0,
                };
                storer_mailbox
                    .store(&key(i), delivery)
                    .await
                    .expect("stored");
            }
        });
    });

    let measured = runtime.block_on(async move {
        let waiter = tokio::spawn(async move {
            let mut latencies = Samples::default();
            for i in 0..samples {
                let key = key(i);
                let stored = mailbox.subscribe(&key);
                let mut announced = false;
                let delivery = loop {
                    let mut notified = pin!(stored.notified());
                    notified.as_mut().enable();
                    if let Some(delivery) = mailbox.take(&key).await.expect("take") {
                        break delivery;
                    }
                    if !announced {
                        announced = true;
                        waiting.send(i).expect("storer alive");
                    }
                    notified.await;
                };
                let received = Instant::now();
                assert_eq!(delivery.task_id, i);
                let stored_at = base + Duration::from_nanos(delivery.outcome.expect("a value"));
                latencies.push(received - stored_at);
            }
            latencies
        });
        waiter.await.expect("waiter ran")
    });
    storer.join().expect("storer exits");
    measured
}

/// Mailbox wake-up (b), unloaded: one client, one task at a time; executor return →
/// `retrieve_async` returns.
fn pool_wakeup_unloaded(runtime: &Runtime, scale: &Scale) -> Samples {
    let pool = new_pool(scale);
    let warmup = scale.wake_samples / 10;
    let ids: Vec<u64> = (0..warmup + scale.wake_samples).collect();
    let samples = runtime.block_on(pool_client(pool.clone(), ids));
    shut_down(runtime, pool, warmup + scale.wake_samples);
    Samples(samples.done_to_retrieved.0[warmup as usize..].to_vec())
}

fn main() {
    let scale = Scale::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CLIENT_THREADS)
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "end_to_end: {} tasks per path (+{} warm-up), W = {} worker threads, C = {} concurrent \
         clients on a {}-thread tokio runtime, {} CPUs{}",
        scale.tasks,
        scale.warmup,
        scale.workers,
        scale.clients,
        CLIENT_THREADS,
        std::thread::available_parallelism().map_or(0, usize::from),
        if scale.bench { "" } else { " (smoke test)" }
    );

    let (pool, mut pool_loaded) = worker_pool(&runtime, &scale);
    let gate = semaphore_gate(&runtime, &scale);
    let crossbeam = crossbeam_pool(&runtime, &scale);

    println!();
    println!("| path | tasks/s | ratio vs semaphore gate | submit→start p50 µs | p99 µs |");
    println!("|---|---:|---:|---:|---:|");
    let gate_rate = gate.tasks_per_s;
    for mut path in [pool, gate, crossbeam] {
        println!(
            "| {} | {:.0} | {:.2}x | {:.1} | {:.1} |",
            path.name,
            path.tasks_per_s,
            path.tasks_per_s / gate_rate,
            path.submit_to_start.quantile_us(0.50),
            path.submit_to_start.quantile_us(0.99),
        );
    }

    let mut raw = raw_mailbox_wakeup(&runtime, scale.wake_samples);
    let mut unloaded = pool_wakeup_unloaded(&runtime, &scale);
    println!();
    println!("mailbox wake-up, store → waiting retrieve:");
    println!(
        "- (a) raw InMemoryMailbox, storer thread → waiting task: {}",
        raw.summary()
    );
    println!(
        "- (b) WorkerPool, executor return → retrieve_async returns, 1 client: {}",
        unloaded.summary()
    );
    println!(
        "- (b) WorkerPool, executor return → retrieve_async returns, {} clients: {}",
        scale.clients,
        pool_loaded.summary()
    );
    if scale.bench {
        println!(
            "targets: WorkerPool throughput >= 1.0x the semaphore gate; raw store → waiting \
             retrieve p99 < 100 µs"
        );
    }
}
