//! End-to-end cost of running no-op tasks through a `WorkerPool` (in-memory queue and
//! mailbox) beside baselines, all in one process and one run, with the same W worker
//! threads, task cost (1 unit of 1,000,000) and number of tasks N per run.
//!
//! **Burst** (one async client submits all N tasks, then retrieves every key in submission
//! order; throughput is N over the time from the first submit to the last retrieve):
//!
//! - *WorkerPool*: `submit_async` each task, then `retrieve_async` each key.
//! - *WorkerPool, submit_batch*: all N tasks in one `submit_batch` call, then `retrieve_async`
//!   each key.
//! - *semaphore gate*: a `tokio::sync::Semaphore` with W permits; the client spawns one tokio
//!   task per item that acquires a permit and runs the no-op in `spawn_blocking`, keeps the
//!   `JoinHandle`s, then awaits them in order.
//! - *bare channel*: W plain threads pull payloads from one crossbeam channel and send
//!   results back through another; the client (a plain thread) sends all, then receives all.
//! - *stripped hand-off model*: the pool's hand-offs and nothing else. Client → one scheduler
//!   thread → W worker threads (one channel each, a job only to an idle worker) → back to the
//!   scheduler → results channel, every thread spinning on `try_recv` with `yield_now`. No
//!   tokio, no actor, no scheduling core. Also a variant whose scheduler spends about 1 µs of
//!   busy work on each task it admits.
//!
//! **Closed loop**: C async clients on the client runtime each loop submit → wait for the
//! result of their own task, N tasks in all; for the pool and for the gate.
//!
//! Each path runs R rounds, interleaved with the other paths (the order rotates each round),
//! and reports its best and median throughput; ratios are of medians. Then, one more run of
//! each path with a counting global allocator switched on for the measured window only gives
//! heap allocations per task (every thread of the process counts, so a pool's actor and
//! worker threads do). Then mailbox wake-up through the pool, executor return →
//! `retrieve_async` returns, one client, one task at a time; then the process CPU time used
//! while that pool sits idle for 1 s right after its last task (spin-waits included).
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench end_to_end` runs N = 100,000, W = 2, C =
//! 64, R = 3 (override with the environment variables `E2E_TASKS`, `E2E_WORKERS`, `E2E_CLIENTS`,
//! `E2E_ROUNDS`). Under `cargo test` (no `--bench` argument) it runs the same code with a few
//! hundred tasks and one round as a smoke test that checks every result but no speed.

#[path = "support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// Counts heap allocations while `COUNTING` is on, so allocations per task are measured.
struct CountingAllocator;

/// Whether allocations are being counted (only inside a measured window).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations (including reallocations) made while counting, by every thread.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn count_allocation() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Threads of the clients' tokio runtime (the machine this was written on has 2 cores).
const CLIENT_THREADS: usize = 2;
/// Units each task costs.
const TASK_UNITS: u32 = 1;
/// The pool's capacity: far more than the tasks running at once, so only W limits them.
const MAX_UNITS: u32 = 1_000_000;
/// The pool's queue depth, at least: a whole burst parks without `QueueFull`.
const MIN_QUEUE_DEPTH: usize = 1_000_000;
/// The pool's default execution timeout (never reached by a no-op).
const TASK_TIMEOUT_MS: u64 = 60_000;
/// How long a client waits for one result before the run fails.
const RETRIEVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Busy work the slower stripped model's scheduler spends on each task it admits.
const SCHEDULER_BUSY_WORK: Duration = Duration::from_micros(1);
/// How long the pool sits idle while its CPU time is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(1);

/// The run's size: the real benchmark, or a smoke test under `cargo test`.
struct Scale {
    bench: bool,
    tasks: u64,
    warmup: u64,
    workers: usize,
    clients: u64,
    rounds: usize,
    wake_samples: u64,
    only: Vec<String>,
}

impl Scale {
    fn from_args() -> Self {
        let bench = support::measured();
        let env = support::env_u64;
        let (tasks, clients, rounds, wake_samples) = if bench {
            (100_000, 64, 3, 10_000)
        } else {
            (400, 8, 1, 200)
        };
        let tasks = env("E2E_TASKS", tasks).max(1);
        Self {
            bench,
            tasks,
            warmup: (tasks / 20).max(50),
            workers: env("E2E_WORKERS", 2).max(1) as usize,
            clients: env("E2E_CLIENTS", clients).max(1),
            rounds: env("E2E_ROUNDS", rounds).max(1) as usize,
            wake_samples,
            only: std::env::var("E2E_ONLY")
                .map(|words| words.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether this run measures the path: all of them, unless `E2E_ONLY` lists words that
    /// its label ("burst WorkerPool, submit_batch") must contain one of (comma-separated),
    /// for profiling one path. Ratios to a baseline left out print as "–".
    fn selects(&self, shape: Shape, subject: Subject) -> bool {
        let label = format!("{} {}", shape.label(), subject.label());
        self.only.is_empty() || self.only.iter().any(|word| label.contains(word.as_str()))
    }

    /// The ids of the warm-up tasks, then of the measured ones.
    fn warmup_ids(&self) -> Range<u64> {
        0..self.warmup
    }

    fn measured_ids(&self) -> Range<u64> {
        self.warmup..self.warmup + self.tasks
    }
}

/// What a task returns: its input, its answer, and when the no-op returned.
#[derive(Debug, Clone, Copy)]
struct Done {
    input: u64,
    output: u64,
    returned: Instant,
}

/// The no-op every path runs.
fn no_op(input: u64) -> Done {
    Done {
        input,
        output: expected(input),
        returned: Instant::now(),
    }
}

fn expected(input: u64) -> u64 {
    input.wrapping_mul(2).wrapping_add(1)
}

/// Checks the result of the task submitted with `input`.
fn check(input: u64, done: Done) {
    assert_eq!(done.input, input, "task {input} got another task's result");
    assert_eq!(
        done.output,
        expected(input),
        "task {input} got a wrong result"
    );
}

/// Checks results that arrive in any order: each right, each exactly once.
struct Unordered {
    ids: Range<u64>,
    seen: Vec<bool>,
    received: u64,
}

impl Unordered {
    /// Allocates everything it needs now, so that none of it counts in a measured window.
    fn new(ids: Range<u64>) -> Self {
        Self {
            seen: vec![false; (ids.end - ids.start) as usize],
            ids,
            received: 0,
        }
    }

    fn record(&mut self, done: Done) {
        check(done.input, done);
        let seen = &mut self.seen[(done.input - self.ids.start) as usize];
        assert!(!*seen, "task {} answered twice", done.input);
        *seen = true;
        self.received += 1;
    }

    fn assert_complete(&self) {
        assert_eq!(
            self.received,
            self.ids.end - self.ids.start,
            "every task answers"
        );
    }
}

#[derive(Clone)]
struct NoOp;

#[async_trait::async_trait]
impl WorkerExecutor<u64, Done> for NoOp {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> Done {
        no_op(payload)
    }
}

/// The measured part of one run: its wall time and, when counted, its allocations.
struct Window {
    elapsed: Duration,
    allocations: Option<u64>,
}

/// A measured window that is still open.
struct OpenWindow {
    began: Instant,
    allocations_before: Option<u64>,
}

/// Opens a measured window; `count_allocations` switches the counting allocator on for it.
fn open_window(count_allocations: bool) -> OpenWindow {
    let allocations_before = count_allocations.then(|| {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        before
    });
    OpenWindow {
        began: Instant::now(),
        allocations_before,
    }
}

impl OpenWindow {
    fn close(self) -> Window {
        let elapsed = self.began.elapsed();
        COUNTING.store(false, Ordering::Relaxed);
        Window {
            elapsed,
            allocations: self
                .allocations_before
                .map(|before| ALLOCATIONS.load(Ordering::Relaxed) - before),
        }
    }
}

type NoOpPool = WorkerPool<u64, Done, NoOp>;

fn new_pool(scale: &Scale) -> Arc<NoOpPool> {
    let queue_depth = MIN_QUEUE_DEPTH.max((scale.warmup + scale.tasks) as usize);
    let config = WorkerPoolConfig::new()
        .with_name("e2e")
        .with_worker_count(scale.workers)
        .with_max_units(MAX_UNITS)
        .with_max_queue_depth(queue_depth)
        .with_max_messages(queue_depth)
        .with_timeout_ms(TASK_TIMEOUT_MS);
    Arc::new(WorkerPool::new(config, NoOp).expect("pool starts"))
}

fn metadata(input: u64) -> TaskMetadata {
    TaskMetadata::new(input, ResourceCost::cpu(TASK_UNITS))
}

async fn submit(pool: &NoOpPool, input: u64) -> MailboxKey {
    pool.submit_async(input, metadata(input))
        .await
        .expect("submit admitted")
}

async fn retrieve(pool: &NoOpPool, key: &MailboxKey) -> Done {
    pool.retrieve_async(key, RETRIEVE_TIMEOUT)
        .await
        .expect("result retrieved")
}

/// Checks the pool's counters, then shuts it down.
fn shut_down(runtime: &Runtime, pool: Arc<NoOpPool>, expected_completed: u64) {
    let stats = pool.stats();
    assert_eq!(stats.rejected_tasks, 0, "no task may be rejected");
    assert_eq!(
        stats.completed_tasks, expected_completed,
        "every task completes"
    );
    runtime
        .block_on(pool.shutdown_with_drain(Duration::from_secs(5)))
        .expect("pool shuts down");
}

/// Runs `client` as one task on the client runtime and returns what it returns.
fn on_runtime<T: Send + 'static>(
    runtime: &Runtime,
    client: impl Future<Output = T> + Send + 'static,
) -> T {
    runtime.block_on(runtime.spawn(client)).expect("client ran")
}

/// How a burst client hands its tasks to the pool.
#[derive(Debug, Clone, Copy)]
enum Submission {
    /// `submit_async` each task, awaiting its admission before the next.
    OneByOne,
    /// All tasks in one `submit_batch` call.
    Batch,
}

/// Submits every task of `ids`; returns their keys in submission order.
async fn submit_all(pool: &NoOpPool, ids: Range<u64>, submission: Submission) -> Vec<MailboxKey> {
    match submission {
        Submission::OneByOne => {
            let mut keys = Vec::with_capacity(ids.clone().count());
            for input in ids {
                keys.push(submit(pool, input).await);
            }
            keys
        }
        Submission::Batch => pool
            .submit_batch(ids.map(|input| (input, metadata(input))))
            .await
            .into_iter()
            .map(|key| key.expect("submit admitted"))
            .collect(),
    }
}

/// Burst through the pool: submit every task, then retrieve every key in order.
async fn pool_burst(pool: &NoOpPool, ids: Range<u64>, submission: Submission) {
    let keys = submit_all(pool, ids.clone(), submission).await;
    for (input, key) in ids.zip(keys) {
        check(input, retrieve(pool, &key).await);
    }
}

fn burst_worker_pool(
    runtime: &Runtime,
    scale: &Scale,
    submission: Submission,
    count_allocations: bool,
) -> Window {
    let pool = new_pool(scale);
    let client_pool = pool.clone();
    let (warmup, measured) = (scale.warmup_ids(), scale.measured_ids());
    let window = on_runtime(runtime, async move {
        pool_burst(&client_pool, warmup, submission).await;
        let window = open_window(count_allocations);
        pool_burst(&client_pool, measured, submission).await;
        window.close()
    });
    shut_down(runtime, pool, scale.warmup + scale.tasks);
    window
}

/// The gate's unit of work: wait for a permit, run the no-op on the blocking pool.
async fn gated_no_op(gate: &Semaphore, input: u64) -> Done {
    let _permit = gate.acquire().await.expect("semaphore open");
    tokio::task::spawn_blocking(move || no_op(input))
        .await
        .expect("no-op ran")
}

/// Burst through the gate: spawn one gated task per item, then await them in order.
async fn gate_burst(gate: &Arc<Semaphore>, ids: Range<u64>) {
    let handles: Vec<_> = ids
        .clone()
        .map(|input| {
            let gate = gate.clone();
            tokio::spawn(async move { gated_no_op(&gate, input).await })
        })
        .collect();
    for (input, handle) in ids.zip(handles) {
        check(input, handle.await.expect("gated task ran"));
    }
}

fn burst_gate(runtime: &Runtime, scale: &Scale, count_allocations: bool) -> Window {
    let gate = Arc::new(Semaphore::new(scale.workers));
    let (warmup, measured) = (scale.warmup_ids(), scale.measured_ids());
    on_runtime(runtime, async move {
        gate_burst(&gate, warmup).await;
        let window = open_window(count_allocations);
        gate_burst(&gate, measured).await;
        window.close()
    })
}

/// A set of plain threads that takes a burst from a client thread and answers it in any
/// order.
trait ThreadModel {
    /// Submits every task of `results.ids`, then receives every result into `results`.
    fn burst(&self, results: &mut Unordered);
    /// Lets the threads finish and joins them.
    fn stop(self);
}

/// Runs a thread model's warm-up burst, then its measured burst, from this thread.
fn burst_threads(model: impl ThreadModel, scale: &Scale, count_allocations: bool) -> Window {
    model.burst(&mut Unordered::new(scale.warmup_ids()));
    let mut results = Unordered::new(scale.measured_ids());
    let window = open_window(count_allocations);
    model.burst(&mut results);
    let window = window.close();
    results.assert_complete();
    model.stop();
    window
}

/// Baseline: W plain threads on one job channel, answering on one results channel.
struct BareChannel {
    jobs: Sender<u64>,
    results: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl BareChannel {
    fn start(workers: usize) -> Self {
        let (jobs, job_receiver) = crossbeam_channel::unbounded::<u64>();
        let (result_sender, results) = crossbeam_channel::unbounded();
        let threads = (0..workers)
            .map(|_| {
                let job_receiver = job_receiver.clone();
                let result_sender = result_sender.clone();
                std::thread::spawn(move || {
                    while let Ok(input) = job_receiver.recv() {
                        result_sender.send(no_op(input)).expect("client alive");
                    }
                })
            })
            .collect();
        Self {
            jobs,
            results,
            threads,
        }
    }
}

impl ThreadModel for BareChannel {
    fn burst(&self, results: &mut Unordered) {
        for input in results.ids.clone() {
            self.jobs.send(input).expect("threads alive");
        }
        for _ in results.ids.clone() {
            results.record(self.results.recv().expect("threads alive"));
        }
    }

    fn stop(self) {
        drop(self.jobs);
        for thread in self.threads {
            thread.join().expect("thread exits");
        }
    }
}

/// Receives from `receiver`, spinning with `yield_now` while it is empty; `None` once it is
/// disconnected.
fn spin_recv<T>(receiver: &Receiver<T>) -> Option<T> {
    loop {
        match receiver.try_recv() {
            Ok(value) => return Some(value),
            Err(TryRecvError::Empty) => std::thread::yield_now(),
            Err(TryRecvError::Disconnected) => return None,
        }
    }
}

/// Spins for `duration`, standing in for a scheduler's work on one task.
fn busy_for(duration: Duration) {
    let began = Instant::now();
    while began.elapsed() < duration {
        std::hint::spin_loop();
    }
}

/// Baseline: the pool's chain of hand-offs between threads and nothing else.
struct StrippedModel {
    submissions: Sender<u64>,
    results: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl StrippedModel {
    fn start(workers: usize, busy_work: Duration) -> Self {
        let (submissions, submission_receiver) = crossbeam_channel::unbounded();
        let (result_sender, results) = crossbeam_channel::unbounded();
        let (completion_sender, completions) = crossbeam_channel::unbounded();
        let mut threads = Vec::with_capacity(workers + 1);
        let mut to_workers = Vec::with_capacity(workers);
        for index in 0..workers {
            let (to_worker, jobs) = crossbeam_channel::unbounded();
            to_workers.push(to_worker);
            let completions = completion_sender.clone();
            threads.push(std::thread::spawn(move || {
                stripped_worker(index, &jobs, &completions)
            }));
        }
        let scheduler = StrippedScheduler {
            submissions: submission_receiver,
            completions,
            idle: (0..workers).collect(),
            to_workers,
            parked: VecDeque::new(),
            results: result_sender,
            busy_work,
        };
        threads.push(std::thread::spawn(move || scheduler.run()));
        Self {
            submissions,
            results,
            threads,
        }
    }
}

impl ThreadModel for StrippedModel {
    fn burst(&self, results: &mut Unordered) {
        for input in results.ids.clone() {
            self.submissions.send(input).expect("scheduler alive");
        }
        for _ in results.ids.clone() {
            results.record(spin_recv(&self.results).expect("scheduler alive"));
        }
    }

    fn stop(self) {
        drop(self.submissions);
        for thread in self.threads {
            thread.join().expect("thread exits");
        }
    }
}

/// A stripped model's worker: runs each job it is handed, reports to the scheduler.
fn stripped_worker(index: usize, jobs: &Receiver<u64>, completions: &Sender<(usize, Done)>) {
    while let Some(input) = spin_recv(jobs) {
        completions
            .send((index, no_op(input)))
            .expect("scheduler alive");
    }
}

/// A stripped model's scheduler: parks submissions in arrival order, hands each to an idle
/// worker, forwards each completion to the client. Like an actor, it handles one message at
/// a time: each turn at most one submission and one completion, then it dispatches. Spins
/// until the client hangs up and nothing is left.
struct StrippedScheduler {
    submissions: Receiver<u64>,
    completions: Receiver<(usize, Done)>,
    to_workers: Vec<Sender<u64>>,
    idle: Vec<usize>,
    parked: VecDeque<u64>,
    results: Sender<Done>,
    busy_work: Duration,
}

impl StrippedScheduler {
    fn run(mut self) {
        let mut client_open = true;
        loop {
            let mut progressed = false;
            if client_open {
                match self.submissions.try_recv() {
                    Ok(input) => {
                        self.admit(input);
                        progressed = true;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => client_open = false,
                }
            }
            progressed |= self.complete_one();
            progressed |= self.dispatch();
            if !client_open && self.parked.is_empty() && self.idle.len() == self.to_workers.len() {
                return;
            }
            if !progressed {
                std::thread::yield_now();
            }
        }
    }

    fn admit(&mut self, input: u64) {
        if !self.busy_work.is_zero() {
            busy_for(self.busy_work);
        }
        self.parked.push_back(input);
    }

    /// Forwards one waiting completion, if any, to the client and marks its worker idle.
    fn complete_one(&mut self) -> bool {
        let Ok((worker, done)) = self.completions.try_recv() else {
            return false;
        };
        self.idle.push(worker);
        self.results.send(done).expect("client alive");
        true
    }

    /// Hands parked tasks to idle workers, oldest first; whether it handed any.
    fn dispatch(&mut self) -> bool {
        let mut dispatched = false;
        while !self.parked.is_empty() {
            let Some(worker) = self.idle.pop() else {
                break;
            };
            let input = self.parked.pop_front().expect("a parked task");
            self.to_workers[worker].send(input).expect("worker alive");
            dispatched = true;
        }
        dispatched
    }
}

/// Runs the tasks `ids` on `clients` concurrent client loops on the client runtime; client
/// `c` runs the tasks whose id is `c` modulo `clients`, one after another.
fn run_clients<F, Fut>(
    runtime: &Runtime,
    ids: Range<u64>,
    clients: u64,
    client: &F,
    count_allocations: bool,
) -> Window
where
    F: Fn(Vec<u64>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let loops: Vec<_> = (0..clients)
        .map(|c| {
            ids.clone()
                .filter(|id| id % clients == c)
                .collect::<Vec<u64>>()
        })
        .filter(|ids| !ids.is_empty())
        .map(client)
        .collect();
    runtime.block_on(async move {
        let window = open_window(count_allocations);
        let handles: Vec<_> = loops.into_iter().map(tokio::spawn).collect();
        for handle in handles {
            handle.await.expect("client loop ran");
        }
        window.close()
    })
}

/// Closed loop: warms the path up, then measures it.
fn closed_loop<F, Fut>(
    runtime: &Runtime,
    scale: &Scale,
    count_allocations: bool,
    client: F,
) -> Window
where
    F: Fn(Vec<u64>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    run_clients(runtime, scale.warmup_ids(), scale.clients, &client, false);
    run_clients(
        runtime,
        scale.measured_ids(),
        scale.clients,
        &client,
        count_allocations,
    )
}

async fn pool_closed_client(pool: Arc<NoOpPool>, ids: Vec<u64>) {
    for input in ids {
        let key = submit(&pool, input).await;
        check(input, retrieve(&pool, &key).await);
    }
}

fn closed_worker_pool(runtime: &Runtime, scale: &Scale, count_allocations: bool) -> Window {
    let pool = new_pool(scale);
    let window = closed_loop(runtime, scale, count_allocations, |ids| {
        pool_closed_client(pool.clone(), ids)
    });
    shut_down(runtime, pool, scale.warmup + scale.tasks);
    window
}

async fn gate_closed_client(gate: Arc<Semaphore>, ids: Vec<u64>) {
    for input in ids {
        check(input, gated_no_op(&gate, input).await);
    }
}

fn closed_gate(runtime: &Runtime, scale: &Scale, count_allocations: bool) -> Window {
    let gate = Arc::new(Semaphore::new(scale.workers));
    closed_loop(runtime, scale, count_allocations, |ids| {
        gate_closed_client(gate.clone(), ids)
    })
}

/// How the tasks of a run arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Burst,
    ClosedLoop,
}

impl Shape {
    fn label(self) -> &'static str {
        match self {
            Shape::Burst => "burst",
            Shape::ClosedLoop => "closed loop",
        }
    }
}

/// What runs the tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    WorkerPool,
    WorkerPoolBatch,
    Gate,
    BareChannel,
    StrippedModel,
    StrippedModelBusy,
}

impl Subject {
    fn is_pool(self) -> bool {
        matches!(self, Subject::WorkerPool | Subject::WorkerPoolBatch)
    }

    fn label(self) -> &'static str {
        match self {
            Subject::WorkerPool => "WorkerPool",
            Subject::WorkerPoolBatch => "WorkerPool, submit_batch",
            Subject::Gate => "semaphore + spawn_blocking",
            Subject::BareChannel => "bare channel, W threads",
            Subject::StrippedModel => "stripped hand-off model",
            Subject::StrippedModelBusy => "stripped model, 1 µs/task",
        }
    }
}

/// One measured path: how to run it once, and what its runs gave.
struct MeasuredPath<'a> {
    shape: Shape,
    subject: Subject,
    /// One run: set up, warm up, measure (counting allocations when asked), tear down.
    run: Box<dyn Fn(bool) -> Window + 'a>,
    tasks_per_s: Vec<f64>,
    allocations_per_task: f64,
}

impl<'a> MeasuredPath<'a> {
    fn new(shape: Shape, subject: Subject, run: impl Fn(bool) -> Window + 'a) -> Self {
        Self {
            shape,
            subject,
            run: Box::new(run),
            tasks_per_s: Vec::new(),
            allocations_per_task: f64::NAN,
        }
    }

    fn best(&self) -> f64 {
        self.tasks_per_s.iter().copied().fold(f64::NAN, f64::max)
    }

    fn median(&self) -> f64 {
        let mut rates = self.tasks_per_s.clone();
        rates.sort_by(f64::total_cmp);
        let middle = rates.len() / 2;
        if rates.len() % 2 == 1 {
            rates[middle]
        } else {
            (rates[middle - 1] + rates[middle]) / 2.0
        }
    }
}

/// Every path of the comparison, in the order they are reported.
fn paths<'a>(runtime: &'a Runtime, scale: &'a Scale) -> Vec<MeasuredPath<'a>> {
    use Shape::{Burst, ClosedLoop};
    let workers = scale.workers;
    vec![
        MeasuredPath::new(Burst, Subject::WorkerPool, move |count| {
            burst_worker_pool(runtime, scale, Submission::OneByOne, count)
        }),
        MeasuredPath::new(Burst, Subject::WorkerPoolBatch, move |count| {
            burst_worker_pool(runtime, scale, Submission::Batch, count)
        }),
        MeasuredPath::new(Burst, Subject::Gate, move |count| {
            burst_gate(runtime, scale, count)
        }),
        MeasuredPath::new(Burst, Subject::BareChannel, move |count| {
            burst_threads(BareChannel::start(workers), scale, count)
        }),
        MeasuredPath::new(Burst, Subject::StrippedModel, move |count| {
            burst_threads(StrippedModel::start(workers, Duration::ZERO), scale, count)
        }),
        MeasuredPath::new(Burst, Subject::StrippedModelBusy, move |count| {
            let model = StrippedModel::start(workers, SCHEDULER_BUSY_WORK);
            burst_threads(model, scale, count)
        }),
        MeasuredPath::new(ClosedLoop, Subject::WorkerPool, move |count| {
            closed_worker_pool(runtime, scale, count)
        }),
        MeasuredPath::new(ClosedLoop, Subject::Gate, move |count| {
            closed_gate(runtime, scale, count)
        }),
    ]
    .into_iter()
    .filter(|path| scale.selects(path.shape, path.subject))
    .collect()
}

/// Runs every path `rounds` times, interleaved, rotating which goes first; then once more
/// each with allocations counted.
fn measure(paths: &mut [MeasuredPath<'_>], scale: &Scale) {
    for round in 0..scale.rounds {
        for offset in 0..paths.len() {
            let path = &mut paths[(round + offset) % paths.len()];
            let window = (path.run)(false);
            path.tasks_per_s
                .push(scale.tasks as f64 / window.elapsed.as_secs_f64());
        }
    }
    for path in paths.iter_mut() {
        let allocations = (path.run)(true).allocations.expect("allocations counted");
        path.allocations_per_task = allocations as f64 / scale.tasks as f64;
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

    /// The `q`-quantile (0..=1), nearest rank, in microseconds.
    fn quantile_us(&mut self, q: f64) -> f64 {
        assert!(!self.0.is_empty(), "no samples");
        self.0.sort_unstable();
        let rank = ((self.0.len() as f64 * q).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] as f64 / 1_000.0
    }
}

/// One client, one task at a time: executor return → `retrieve_async` returns. The client
/// runs on this thread (`block_on`), as in earlier versions of this benchmark.
async fn wakeup_client(pool: Arc<NoOpPool>, warmup: u64, samples: u64) -> Samples {
    let mut latencies = Samples::default();
    for input in 0..warmup + samples {
        let key = submit(&pool, input).await;
        let done = retrieve(&pool, &key).await;
        let retrieved = Instant::now();
        check(input, done);
        if input >= warmup {
            latencies.push(retrieved - done.returned);
        }
    }
    latencies
}

/// The process's CPU time so far, user and system, all threads.
fn process_cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the `rusage` it is pointed at, which lives through the call.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(status, 0, "getrusage failed");
    // SAFETY: zeroed is a valid `rusage`, and `getrusage` succeeded.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Mailbox wake-up through the pool, then the CPU time the process uses while that pool sits
/// idle for `IDLE_WINDOW` right after its last task.
fn wakeup_then_idle(runtime: &Runtime, scale: &Scale) -> (Samples, Duration) {
    let pool = new_pool(scale);
    let warmup = scale.wake_samples / 10;
    let samples = runtime.block_on(wakeup_client(pool.clone(), warmup, scale.wake_samples));
    let cpu_before = process_cpu_time();
    std::thread::sleep(IDLE_WINDOW);
    let idle_cpu = process_cpu_time() - cpu_before;
    shut_down(runtime, pool, warmup + scale.wake_samples);
    (samples, idle_cpu)
}

/// `1234567.8` → `"1,234,568"`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// A ratio with two decimals, or three below 0.1 so that a small one does not read 0.00x.
fn ratio_text(ratio: f64) -> String {
    if ratio < 0.1 {
        format!("{ratio:.3}x")
    } else {
        format!("{ratio:.2}x")
    }
}

/// One report row: a path's figures and its ratios (of medians) to the baselines.
struct Row {
    shape: &'static str,
    path: &'static str,
    best: String,
    median: String,
    vs_gate: String,
    vs_bare_channel: String,
    vs_stripped: String,
    vs_stripped_busy: String,
    allocations_per_task: String,
}

fn rows(paths: &[MeasuredPath<'_>]) -> Vec<Row> {
    let median_of = |shape: Shape, subject: Subject| {
        paths
            .iter()
            .find(|path| path.shape == shape && path.subject == subject)
            .map(MeasuredPath::median)
    };
    paths
        .iter()
        .map(|path| {
            let ratio = |baseline: Subject| {
                let applies = path.subject.is_pool() || baseline == Subject::Gate;
                match median_of(path.shape, baseline) {
                    Some(baseline) if applies => ratio_text(path.median() / baseline),
                    _ => "–".to_owned(),
                }
            };
            Row {
                shape: path.shape.label(),
                path: path.subject.label(),
                best: thousands(path.best()),
                median: thousands(path.median()),
                vs_gate: ratio(Subject::Gate),
                vs_bare_channel: ratio(Subject::BareChannel),
                vs_stripped: ratio(Subject::StrippedModel),
                vs_stripped_busy: ratio(Subject::StrippedModelBusy),
                allocations_per_task: format!("{:.1}", path.allocations_per_task),
            }
        })
        .collect()
}

const HEADINGS: [&str; 9] = [
    "shape",
    "path",
    "best tasks/s",
    "median tasks/s",
    "vs gate",
    "vs bare channel",
    "vs stripped",
    "vs stripped 1 µs",
    "allocs/task",
];

impl Row {
    fn cells(&self) -> [&str; 9] {
        [
            self.shape,
            self.path,
            &self.best,
            &self.median,
            &self.vs_gate,
            &self.vs_bare_channel,
            &self.vs_stripped,
            &self.vs_stripped_busy,
            &self.allocations_per_task,
        ]
    }
}

fn print_table(rows: &[Row]) {
    let widths: Vec<usize> = (0..HEADINGS.len())
        .map(|column| {
            rows.iter()
                .map(|row| row.cells()[column].chars().count())
                .chain([HEADINGS[column].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 9]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, &width))| {
                if column < 2 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(HEADINGS);
    for row in rows {
        line(row.cells());
    }
}

fn print_markdown(rows: &[Row], wakeup: &mut Samples, idle_cpu: Duration) {
    println!("| {} |", HEADINGS.join(" | "));
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!("| {} |", row.cells().join(" | "));
    }
    println!();
    println!("| measure | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    println!(
        "| through the pool, executor return → `retrieve_async` returns, 1 client | {:.1} | {:.1} |",
        wakeup.quantile_us(0.50),
        wakeup.quantile_us(0.99)
    );
    println!();
    println!(
        "| process CPU time while the pool sits idle for 1 s after its last task | {:.1} ms |",
        idle_cpu.as_secs_f64() * 1_000.0
    );
}

/// `E2E_TRACING=LEVEL` (`info`, `debug`, `trace`) installs a `tracing` subscriber at that
/// level writing to nowhere, to measure what the pool's task spans cost: at `info` they are
/// disabled (the production default), at `debug` every task's span is built and entered.
/// Unset: no subscriber at all.
fn install_tracing() {
    let Ok(level) = std::env::var("E2E_TRACING") else {
        return;
    };
    let level: tracing::Level = level
        .parse()
        .unwrap_or_else(|_| panic!("E2E_TRACING={level}: use info, debug or trace"));
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::sink)
        .init();
    println!("tracing: a subscriber at {level}, writing to nowhere");
}

fn main() {
    let scale = Scale::from_args();
    install_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CLIENT_THREADS)
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "end_to_end: N = {} tasks per run (+{} warm-up), W = {} worker threads, cost {} of {} \
         units, C = {} closed-loop clients on a {}-thread tokio runtime, R = {} rounds, {} CPUs{}",
        thousands(scale.tasks as f64),
        scale.warmup,
        scale.workers,
        TASK_UNITS,
        thousands(f64::from(MAX_UNITS)),
        scale.clients,
        CLIENT_THREADS,
        scale.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
        if scale.bench { "" } else { " (smoke test)" }
    );

    let mut paths = paths(&runtime, &scale);
    measure(&mut paths, &scale);
    let (mut wakeup, idle_cpu) = wakeup_then_idle(&runtime, &scale);
    let rows = rows(&paths);

    println!();
    println!(
        "throughput (ratios are of medians; allocations per task from one more run with the \
         counting allocator on):"
    );
    print_table(&rows);
    println!();
    println!(
        "mailbox wake-up through the pool, executor return → retrieve_async returns, 1 client: \
         p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs ({} samples)",
        wakeup.quantile_us(0.50),
        wakeup.quantile_us(0.99),
        wakeup.quantile_us(1.0),
        wakeup.0.len()
    );
    println!(
        "idle CPU: {:.1} ms of process CPU time in the {} s the pool sat idle after its last task \
         (the whole run used {:.1} s)",
        idle_cpu.as_secs_f64() * 1_000.0,
        IDLE_WINDOW.as_secs(),
        process_cpu_time().as_secs_f64()
    );
    println!();
    println!("markdown for BENCHMARKS.md:");
    println!();
    print_markdown(&rows, &mut wakeup, idle_cpu);
}
