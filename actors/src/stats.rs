//! Pool statistics, published by the scheduler and read without a message round trip.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A snapshot of a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Worker threads the pool is configured with.
    pub worker_count: usize,
    /// Tasks admitted (started or parked).
    pub submitted_tasks: u64,
    /// Tasks whose executor returned a result.
    pub completed_tasks: u64,
    /// Tasks whose executor panicked, or that could not be run.
    pub failed_tasks: u64,
    /// Tasks running now.
    pub active_tasks: usize,
    /// Tasks parked now.
    pub queued_tasks: usize,
    /// Units held by running tasks, summed over resource kinds.
    pub used_units: u64,
    /// The pool's capacity: the largest budget of any resource kind (for the usual pool whose
    /// tasks all use one kind, that kind's capacity).
    pub total_units: u64,
    /// Tasks that ran past their execution timeout.
    pub timed_out_tasks: u64,
    /// Parked tasks whose deadline passed.
    pub expired_tasks: u64,
    /// Tasks cancelled (explicitly or by shutdown).
    pub cancelled_tasks: u64,
    /// Submissions refused (queue full, too large, duplicate id, shutting down).
    pub rejected_tasks: u64,
    /// Worker threads restarted after a panic.
    pub worker_restarts: u64,
    /// Worker threads alive right now.
    pub live_worker_threads: usize,
}

/// The shared counters behind [`PoolStats`]. The scheduler is the only writer of the task
/// counters; worker threads maintain `live_worker_threads`; the supervisor `worker_restarts`.
#[derive(Debug, Default)]
pub struct PoolCounters {
    pub(crate) worker_count: AtomicUsize,
    pub(crate) submitted: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) active: AtomicUsize,
    pub(crate) queued: AtomicUsize,
    pub(crate) used_units: AtomicU64,
    pub(crate) total_units: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Shared with the supervisor, which counts the pool's restarts.
    pub(crate) worker_restarts: Arc<AtomicU64>,
    pub(crate) live_threads: AtomicUsize,
}

impl PoolCounters {
    /// Reads every counter.
    pub fn snapshot(&self) -> PoolStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        PoolStats {
            worker_count: self.worker_count.load(Ordering::Relaxed),
            submitted_tasks: read(&self.submitted),
            completed_tasks: read(&self.completed),
            failed_tasks: read(&self.failed),
            active_tasks: self.active.load(Ordering::Relaxed),
            queued_tasks: self.queued.load(Ordering::Relaxed),
            used_units: read(&self.used_units),
            total_units: read(&self.total_units),
            timed_out_tasks: read(&self.timed_out),
            expired_tasks: read(&self.expired),
            cancelled_tasks: read(&self.cancelled),
            rejected_tasks: read(&self.rejected),
            worker_restarts: read(&self.worker_restarts),
            live_worker_threads: self.live_threads.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
