//! Worker threads: each worker actor (`actor.rs`) owns one named OS thread running
//! its own current-thread tokio runtime, which takes jobs from its own job channel and runs
//! each with the user's [`TaskExecutor`](executor::TaskExecutor) ([`executor`]).
//!
//! Worker `i` has job channel `i`. The scheduler's core gives every task it starts an idle
//! worker slot (each worker runs at most one job at a time) and the scheduler sends the job
//! to that worker's channel. A worker reports every finished run through the scheduler's
//! inbox. A channel
//! outlives the threads that consume it: a worker restarted after a panic consumes the same
//! channel, so a job sent to it while it restarts is not lost. Only the scheduler holds the
//! senders; when it stops, every channel closes and each thread exits after its current job.

pub(crate) mod actor;
pub mod executor;
pub(crate) mod thread;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::Mutex;

use crate::domain::{PoolError, ScheduledTask};
use crate::queue::EntryId;
use crate::running::RunContext;

/// The sending ends of every worker's job channel; element `i` reaches worker `i`.
pub(crate) type JobSenders<P> = Arc<[UnboundedSender<Job<P>>]>;

/// The receiving end of one worker's job channel, shared by the worker's successive threads:
/// the thread that holds the lock is the one consuming the channel.
pub(crate) type JobReceiver<P> = Arc<Mutex<UnboundedReceiver<Job<P>>>>;

/// Creates one job channel per worker: the senders, and receiver `i` for worker `i`.
pub(crate) fn job_channels<P>(workers: usize) -> (JobSenders<P>, Vec<JobReceiver<P>>) {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..workers)
        .map(|_| {
            let (sender, receiver) = mpsc::unbounded_channel();
            (sender, Arc::new(Mutex::new(receiver)))
        })
        .unzip();
    (senders.into(), receivers)
}

/// A task handed to one worker thread: its capacity and its worker are held from the moment
/// it is sent.
pub(crate) struct Job<P> {
    /// The task's entry, which the worker reports back when the run is over.
    pub entry: EntryId,
    /// The task to run.
    pub task: ScheduledTask<P>,
    /// Its execution timeout, if any.
    pub timeout: Option<Duration>,
    /// Its cancellation flag (raised by cancel, the watchdog, a dropped stream, shutdown)
    /// and its stream, published to the executor for the run (see [`crate::running`]).
    pub(crate) context: RunContext,
    /// The task's span (disabled unless a subscriber wants it): its run is instrumented
    /// with it.
    pub span: tracing::Span,
}

/// Where a worker thread reports that a run is over (the scheduler's inbox): the worker
/// names the task's entry and what its executor produced, or how the run ended without a
/// result. The report frees the task's capacity and its worker.
pub(crate) trait RunReports<R>: Send + Sync {
    /// The run of `entry` is over. `rests`: the worker's thread still has work the task
    /// left on it (tasks it spawned), so its slot takes no job until [`ready`](Self::ready).
    fn finished(&self, entry: EntryId, outcome: Result<R, PoolError>, rests: bool);

    /// Worker `worker`'s thread, which rested, can take a job again.
    fn ready(&self, worker: usize);
}

/// Messages a worker actor handles (sent by its own thread).
#[derive(Debug)]
pub(crate) enum WorkerMsg {
    /// The thread caught an executor panic and exited.
    ThreadDied {
        /// The panic message.
        reason: String,
    },
}

/// How worker threads are built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Number of worker threads (and worker slots).
    pub count: usize,
    /// Stack size of each thread in bytes; `None` keeps the platform default.
    pub stack_size: Option<usize>,
    /// Pin thread `n` to CPU `n % cpus` (Linux only; elsewhere a no-op with a warning).
    pub pin_to_cpus: bool,
}

impl WorkerSettings {
    /// The smallest stack a worker thread may have: 64 KiB.
    pub const MIN_STACK: usize = 64 * 1024;
    /// The largest stack a worker thread may have: 1 GiB.
    pub const MAX_STACK: usize = 1024 * 1024 * 1024;
}

impl Default for WorkerSettings {
    /// One thread per CPU, 2 MiB stacks, no pinning.
    fn default() -> Self {
        Self {
            count: default_worker_count(),
            stack_size: Some(2 * 1024 * 1024),
            pin_to_cpus: false,
        }
    }
}

/// The number of CPUs this process may use (1 if unknown).
pub fn default_worker_count() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}
