//! A test executor whose jobs say what to do (finish, wait for a gate, sleep, block, panic),
//! and which reports every start, so tests can observe the scheduler's decisions.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::StarvationGuard;
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::{Priority, ResourceCost, TaskId};
use tokio::sync::{mpsc, oneshot};

/// What a test job does on its worker thread.
pub enum Job {
    /// Returns its id at once.
    Quick,
    /// Waits until its gate is opened (or dropped).
    Gated(oneshot::Receiver<()>),
    /// Sleeps asynchronously (interruptible by timeout or cancel).
    Sleep(Duration),
    /// Blocks its thread (not interruptible).
    Block(Duration),
    /// Panics.
    Panic,
}

/// Reports `(task id, thread name)` when a job starts, then does what the job says.
#[derive(Clone)]
pub struct Lab {
    started: mpsc::UnboundedSender<(TaskId, String)>,
}

#[async_trait::async_trait]
impl WorkerExecutor<Job, TaskId> for Lab {
    async fn execute(&self, job: Job, meta: TaskMetadata) -> TaskId {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        let _ = self.started.send((meta.id, thread));
        match job {
            Job::Quick => {}
            Job::Gated(gate) => {
                let _ = gate.await;
            }
            Job::Sleep(duration) => tokio::time::sleep(duration).await,
            Job::Block(duration) => std::thread::sleep(duration),
            Job::Panic => panic!("task {} exploded", meta.id),
        }
        meta.id
    }
}

/// A pool of `Lab` executors and what it reports.
pub struct LabPool {
    pub pool: WorkerPool<Job, TaskId, Lab>,
    pub started: mpsc::UnboundedReceiver<(TaskId, String)>,
    gates: HashMap<TaskId, oneshot::Sender<()>>,
}

/// Settings most tests start from: `workers` threads, `units` GPU units, no starvation guard.
pub fn settings(name: &str, workers: usize, units: u32) -> WorkerPoolConfig {
    WorkerPoolConfig::new()
        .with_name(name)
        .with_worker_count(workers)
        .with_max_units(units)
        .with_max_queue_depth(1_000)
        .with_starvation(StarvationGuard::disabled())
}

impl LabPool {
    pub fn new(config: WorkerPoolConfig) -> Self {
        let (started_tx, started) = mpsc::unbounded_channel();
        let pool = WorkerPool::new(
            config,
            Lab {
                started: started_tx,
            },
        )
        .expect("pool starts");
        Self {
            pool,
            started,
            gates: HashMap::new(),
        }
    }

    /// A gated job for `id`; open it with [`open`](Self::open).
    pub fn gated(&mut self, id: TaskId) -> Job {
        let (open, gate) = oneshot::channel();
        self.gates.insert(id, open);
        Job::Gated(gate)
    }

    /// Lets a gated job finish.
    pub fn open(&mut self, id: TaskId) {
        if let Some(gate) = self.gates.remove(&id) {
            let _ = gate.send(());
        }
    }

    /// The next started task id (fails the test after 10 s).
    pub async fn next_start(&mut self) -> TaskId {
        tokio::time::timeout(Duration::from_secs(10), self.started.recv())
            .await
            .expect("a task starts within 10 s")
            .expect("executor alive")
            .0
    }

    /// Asserts that nothing else starts for a while.
    pub async fn assert_no_start(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(150), self.started.recv()).await;
        assert!(next.is_err(), "unexpected start: {next:?}");
    }
}

/// Metadata for a GPU task.
pub fn gpu(id: TaskId, priority: Priority, units: u32) -> TaskMetadata {
    TaskMetadata {
        created_at_ms: u128::from(id),
        ..TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(priority)
    }
}

/// Polls `check` until it holds (fails the test after 10 s).
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

/// Runs blocking `work` on a plain thread and waits for it at most 10 s: a blocking call that
/// never returns fails the test instead of hanging it (or the runtime's shutdown, which would
/// wait for a `spawn_blocking` task for ever).
pub async fn on_plain_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    tokio::time::timeout(Duration::from_secs(10), result)
        .await
        .expect("the blocking call returns within 10 s")
        .expect("the blocking call did not panic")
}
