//! Worker threads: each [`WorkerActor`](actor::WorkerActor) owns one named OS thread running
//! its own current-thread tokio runtime, which pulls jobs from the pool's job channel.

pub mod actor;
pub mod thread;

use std::time::Duration;

use tokio::sync::oneshot;

use crate::domain::ScheduledTask;

/// A task handed to the worker threads: its capacity is held from the moment it is sent.
pub struct Job<P> {
    /// The task to run.
    pub task: ScheduledTask<P>,
    /// Its execution timeout, if any.
    pub timeout: Option<Duration>,
    /// Fires when the scheduler cancels the running task (cancel, watchdog, shutdown).
    pub cancel: oneshot::Receiver<()>,
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
