//! The body of a worker thread.
//!
//! The thread consumes its worker's own job channel (see the [module docs](super)). It first
//! locks the channel's receiver and holds the lock for as long as it lives, so a replacement
//! thread started after a panic waits for the dying thread to let go and then consumes the
//! same channel: jobs sent meanwhile wait there. The whole loop runs inside one `block_on` of
//! the thread's current-thread runtime, so the runtime is driven the entire time the thread
//! lives: tasks an executor spawned keep running between jobs. After each job the thread
//! reports `Finished` with its worker index, which makes it idle again for the scheduler.
//!
//! A panic in an executor is caught around that one job's future; the job ends `Failed` with
//! the panic message, the scheduler is told (releasing its capacity and worker), and the
//! thread then exits and asks its actor to fail, so the supervisor replaces it with a fresh
//! thread: whatever state the panic left behind on this thread goes with it. When every
//! sender of its channel is gone (the pool stopped), the thread exits after its current job.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use ractor::ActorRef;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::actor::WorkerMsg;
use super::{Job, JobReceiver, WorkerSettings};
use crate::domain::PoolError;
use crate::executor::TaskExecutor;
use crate::scheduler::actor::SchedulerMsg;
use crate::stats::PoolCounters;

/// Everything one worker thread needs; cloned for each (re)start.
pub struct WorkerThreadSpec<P, R, E> {
    /// The pool's name.
    pub pool: Arc<str>,
    /// The worker's index within the pool: which job channel it consumes, and what it reports
    /// in `Finished`.
    pub index: usize,
    /// How the thread is built.
    pub settings: WorkerSettings,
    /// This worker's job channel, shared with the threads that replace this one.
    pub jobs: JobReceiver<P>,
    /// The user's work.
    pub executor: Arc<E>,
    /// Where finished tasks are reported.
    pub scheduler: ActorRef<SchedulerMsg<P, R>>,
    /// The pool's counters (`live_worker_threads`).
    pub counters: Arc<PoolCounters>,
}

impl<P, R, E> Clone for WorkerThreadSpec<P, R, E> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            index: self.index,
            settings: self.settings.clone(),
            jobs: self.jobs.clone(),
            executor: self.executor.clone(),
            scheduler: self.scheduler.clone(),
            counters: self.counters.clone(),
        }
    }
}

/// Counts a live worker thread for as long as it exists.
struct LiveThread(Arc<PoolCounters>);

impl LiveThread {
    fn enter(counters: Arc<PoolCounters>) -> Self {
        counters.live_threads.fetch_add(1, Ordering::Relaxed);
        Self(counters)
    }
}

impl Drop for LiveThread {
    fn drop(&mut self) {
        self.0.live_threads.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The thread name: `parking-lot-worker-{pool}-{n}`.
pub fn thread_name(pool: &str, index: usize) -> String {
    format!("parking-lot-worker-{pool}-{index}")
}

/// Starts the thread. `actor` hears about the thread's death by panic.
pub fn spawn<P, R, E>(
    spec: WorkerThreadSpec<P, R, E>,
    actor: ActorRef<WorkerMsg>,
) -> std::io::Result<JoinHandle<()>>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let mut builder = std::thread::Builder::new().name(thread_name(&spec.pool, spec.index));
    if let Some(stack_size) = spec.settings.stack_size {
        builder = builder.stack_size(stack_size);
    }
    builder.spawn(move || {
        let _live = LiveThread::enter(spec.counters.clone());
        if spec.settings.pin_to_cpus {
            pin_to_cpu(spec.index);
        }
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let reason = format!("could not build the worker runtime: {error}");
                let _ = actor.send_message(WorkerMsg::ThreadDied { reason });
                return;
            }
        };
        if let Some(reason) = runtime.block_on(run_jobs(&spec)) {
            let _ = actor.send_message(WorkerMsg::ThreadDied { reason });
        }
    })
}

/// Runs jobs until the job channel closes (`None`) or an executor panics (`Some(message)`).
///
/// Holds the channel's lock until it returns; the lock is released before the thread's actor
/// hears of a panic, so the replacement thread never waits on a dead one.
async fn run_jobs<P, R, E>(spec: &WorkerThreadSpec<P, R, E>) -> Option<String>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R>,
{
    let mut jobs = spec.jobs.clone().lock_owned().await;
    while let Some(job) = next_job(&mut jobs).await {
        let id = job.task.meta.id;
        let (outcome, panic) = run_job(spec.executor.as_ref(), job).await;
        let _ = spec.scheduler.send_message(SchedulerMsg::Finished {
            id,
            worker: spec.index,
            outcome,
        });
        if panic.is_some() {
            return panic;
        }
    }
    None
}

/// How long an idle worker keeps checking for its next job before it sleeps.
///
/// Under load the scheduler often hands a worker its next job a few microseconds after the
/// last one finished; catching it while still awake spares the scheduler's thread a kernel
/// wake-up. Between checks the worker yields to its runtime, so tasks an executor spawned
/// keep running. The cost is bounded: at most this much CPU after each job.
const IDLE_SPIN: Duration = Duration::from_micros(30);

/// The next job: checked for a short while (see [`IDLE_SPIN`]), then awaited.
async fn next_job<P>(jobs: &mut UnboundedReceiver<Job<P>>) -> Option<Job<P>> {
    let spinning_since = Instant::now();
    while spinning_since.elapsed() < IDLE_SPIN {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => tokio::task::yield_now().await,
        }
    }
    jobs.recv().await
}

/// Runs one job under its timeout and cancel signal, catching a panic.
async fn run_job<P, R, E>(executor: &E, job: Job<P>) -> (Result<R, PoolError>, Option<String>)
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R>,
{
    let Job {
        task,
        timeout,
        cancel,
    } = job;
    let execution = AssertUnwindSafe(executor.execute(task.payload, task.meta)).catch_unwind();
    let bounded = async move {
        match timeout {
            Some(limit) => tokio::time::timeout(limit, execution).await.ok(),
            None => Some(execution.await),
        }
    };
    tokio::select! {
        biased;
        Ok(()) = cancel => (Err(PoolError::Cancelled), None),
        ran = bounded => match ran {
            Some(Ok(result)) => (Ok(result), None),
            Some(Err(panic)) => {
                let message = panic_message(panic.as_ref());
                (Err(PoolError::Failed(format!("executor panicked: {message}"))), Some(message))
            }
            None => (Err(PoolError::TimedOut), None),
        },
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

#[cfg(target_os = "linux")]
fn pin_to_cpu(index: usize) {
    let cpus = super::default_worker_count();
    // SAFETY: `set` is a plain bit set on the stack; sched_setaffinity(0, ..) only affects
    // the calling thread.
    let pinned = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(index % cpus, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !pinned {
        tracing::warn!(index, "could not pin worker thread to a CPU");
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_cpu(index: usize) {
    tracing::warn!(
        index,
        "CPU pinning is supported on Linux only; thread left unpinned"
    );
}
