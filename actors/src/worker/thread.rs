//! The body of a worker thread.
//!
//! The thread consumes its worker's own job channel (see the [module docs](super)). It first
//! locks the channel's receiver and holds the lock for as long as it lives, so a replacement
//! thread started after a panic waits for the dying thread to let go and then consumes the
//! same channel: jobs sent meanwhile wait there. The whole loop runs inside one `block_on` of
//! the thread's current-thread runtime, so the runtime is driven the entire time the thread
//! lives: tasks an executor spawned keep running between jobs. After each job the thread
//! reports the outcome through the scheduler's inbox, which frees its slot; when tasks the
//! executor spawned are still alive on the runtime, the slot *rests* instead, and the thread
//! reports it ready once it has let them run (a spawned task that blocks the thread holds
//! that report up, so no job is handed to a thread that cannot take it).
//!
//! Everything a job does runs inside one panic boundary: the executor's future, and the
//! drops of its payload, its future (on timeout or cancel) and its panic payload. A panic
//! anywhere in there ends the task `Failed` with the panic message; the thread reports it,
//! exits and asks its actor to fail, so the supervisor replaces it with a fresh thread:
//! whatever state the panic left behind goes with it. When the job channel closes (the pool
//! stopped), the thread exits after its current job.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use futures_util::FutureExt;
use ractor::ActorRef;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::{Job, JobReceiver, RunReports, WorkerMsg, WorkerSettings};
use crate::domain::PoolError;
use crate::observe::stats::PoolCounters;
use crate::sync::slots::SlotBudget;
use crate::sync::spin::{Spin, SPIN_TIME};
use crate::util::contain::{drop_contained, panic_message};
use crate::worker::executor::TaskExecutor;

/// Everything one worker thread needs; cloned for each (re)start.
pub struct WorkerThreadSpec<P, R, E> {
    /// The pool's name.
    pub(crate) pool: Arc<str>,
    /// The worker's index within the pool: which job channel it consumes.
    pub(crate) index: usize,
    /// How the thread is built.
    pub(crate) settings: WorkerSettings,
    /// This worker's job channel, shared with the threads that replace this one.
    pub(crate) jobs: JobReceiver<P>,
    /// The user's work.
    pub(crate) executor: Arc<E>,
    /// Where finished runs are reported.
    pub(crate) reports: Arc<dyn RunReports<R>>,
    /// The pool's counters (`live_worker_threads`).
    pub(crate) counters: Arc<PoolCounters>,
    /// The pool's nested slots: the thread marks itself as this pool's, so submissions it
    /// makes to the same pool are recognised as nested (see [`crate::sync::slots`]).
    pub(crate) nested: Arc<SlotBudget>,
}

impl<P, R, E> Clone for WorkerThreadSpec<P, R, E> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            index: self.index,
            settings: self.settings.clone(),
            jobs: self.jobs.clone(),
            executor: self.executor.clone(),
            reports: self.reports.clone(),
            counters: self.counters.clone(),
            nested: self.nested.clone(),
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

thread_local! {
    /// The pool this thread works for (its nested budget's address), 0 on other threads.
    static WORKER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn pool_identity(nested: &Arc<SlotBudget>) -> usize {
    Arc::as_ptr(nested) as usize
}

/// Whether the calling thread is one of the worker threads of the pool whose nested budget
/// is `nested`: a submission from it to that pool is nested work.
pub(crate) fn is_worker_of(nested: &Arc<SlotBudget>) -> bool {
    WORKER_OF.with(|pool| pool.get() == pool_identity(nested))
}

/// The thread name: `parking-lot-worker-{pool}-{n}`.
pub(crate) fn thread_name(pool: &str, index: usize) -> String {
    format!("parking-lot-worker-{pool}-{index}")
}

/// Starts the thread. `actor` hears about the thread's death by panic.
pub(crate) fn spawn<P, R, E>(
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
        WORKER_OF.with(|pool| pool.set(pool_identity(&spec.nested)));
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
        drop_contained(runtime);
    })
}

/// Runs jobs until the job channel closes (`None`) or a job panics (`Some(message)`).
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
    let runtime = tokio::runtime::Handle::current().metrics();
    while let Some(job) = next_job(&mut jobs).await {
        let entry = job.entry;
        let (outcome, panic) = match AssertUnwindSafe(run_job(spec.executor.as_ref(), job))
            .catch_unwind()
            .await
        {
            Ok((outcome, false)) => (outcome, None),
            Ok((outcome, true)) => (outcome, Some(DROP_PANICKED.to_owned())),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                drop_contained(payload);
                let outcome = Err(PoolError::Failed(format!("executor panicked: {message}")));
                (outcome, Some(message))
            }
        };
        // Tasks the executor spawned on this thread's runtime may still be there to run
        // (a token producer, say). If so, the slot rests: the next job goes to another
        // worker until this thread has given them their turn and can take one again.
        let rests = panic.is_none() && runtime.num_alive_tasks() > 0;
        spec.reports.finished(entry, outcome, rests);
        if panic.is_some() {
            return panic;
        }
        if rests {
            tokio::task::yield_now().await;
            spec.reports.ready(spec.index);
        }
    }
    None
}

/// How many times an idle worker checks for its next job before it sleeps.
///
/// Under load the scheduler often hands a worker its next job a few microseconds after the
/// last one finished; catching it while still awake spares a kernel wake-up on both sides.
/// Each round yields the CPU (`sched_yield`), so a spinning worker never keeps a runnable
/// thread off its core, and every few rounds it yields to its own runtime too, so tasks an
/// executor spawned keep running. The spin is also cut off after [`SPIN_TIME`] of wall time
/// (see [`crate::sync::spin`]).
const IDLE_SPIN_ROUNDS: u32 = 64;

/// The next job: checked for a short while (see [`IDLE_SPIN_ROUNDS`]), then awaited.
async fn next_job<P>(jobs: &mut UnboundedReceiver<Job<P>>) -> Option<Job<P>> {
    let mut spin = Spin::new(IDLE_SPIN_ROUNDS, SPIN_TIME);
    for round in 1.. {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if !spin.round() => break,
            Err(TryRecvError::Empty) if round % 16 == 0 => tokio::task::yield_now().await,
            Err(TryRecvError::Empty) => {}
        }
    }
    jobs.recv().await
}

/// Why a worker is replaced after a value panicked in `Drop` outside `execute`.
const DROP_PANICKED: &str = "a value panicked while being dropped";

/// Runs one job under its timeout and cancellation flag, with its [run
/// context](crate::running) published to the executor. Returns the outcome and whether
/// dropping the abandoned future panicked (contained here, so the outcome still stands, but
/// the thread is replaced as after any panic).
///
/// The future is owned here, not by the timer or the `select!`, so a timeout or a cancel
/// drops it outside any poll, where [`drop_contained`] can catch what its `Drop` raises.
async fn run_job<P, R, E>(executor: &E, job: Job<P>) -> (Result<R, PoolError>, bool)
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R>,
{
    let Job {
        task,
        timeout,
        context,
        span,
        ..
    } = job;
    let cancellation = context.cancellation.clone();
    let _entered = crate::running::enter(context);
    let deadline = timeout.and_then(|limit| tokio::time::Instant::now().checked_add(limit));
    let mut execution =
        tracing::Instrument::instrument(executor.execute(task.payload, task.meta), span);
    let outcome = tokio::select! {
        biased;
        () = cancellation.cancelled() => Err(PoolError::Cancelled),
        () = expiry(deadline) => Err(PoolError::TimedOut),
        result = &mut execution => Ok(result),
    };
    // An executor that blocks its thread returns only after it read the flag (or finished
    // anyway): a run cancelled meanwhile still ends `Cancelled`, its value dropped.
    let outcome = match outcome {
        Ok(result) if cancellation.is_cancelled() => {
            drop_contained(result);
            Err(PoolError::Cancelled)
        }
        outcome => outcome,
    };
    (outcome, drop_contained(execution))
}

/// Completes at `deadline`, or never without one (a limit too large for the timer, such as
/// `Duration::MAX`, means no limit).
async fn expiry(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
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
