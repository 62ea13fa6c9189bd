//! Pool statistics, read without a message round trip: counters kept by subscribing to the
//! scheduler's event stream, and gauges (running, parked, units held) the scheduler
//! publishes from its core after each batch.

use std::sync::atomic::{
    AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, OnceLock};

use crate::domain::{Budget, ResourceKind, TaskStatus};
use crate::observe::events::{EventSubscriber, PoolReading, TaskEvent, TaskStep};
use crate::util::clock::engine_ms;

/// A snapshot of a pool.
///
/// `used_units` and `total_units` describe the same resource kind: the pool's *bottleneck*,
/// the kind whose budget is most used (the kind with the largest budget when the pool is
/// idle), so `used_units <= total_units` always holds and their ratio is the pool's
/// utilisation. `used_by_kind` and `total_by_kind` give every kind, indexed by
/// [`ResourceKind::index`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Worker threads the pool is configured with.
    pub worker_count: usize,
    /// Submissions to this pool admitted (started or parked), each once. Tasks this pool
    /// claimed from a shared queue or resumed from a durable one were submitted elsewhere:
    /// they count in the outcomes (`completed_tasks` and the others), not here. Every
    /// reading has each outcome's task counted here already, if it was submitted here.
    pub submitted_tasks: u64,
    /// Tasks whose executor returned a result.
    pub completed_tasks: u64,
    /// Tasks whose executor panicked, or that could not be run.
    pub failed_tasks: u64,
    /// Tasks running now.
    pub active_tasks: usize,
    /// Tasks parked now.
    pub queued_tasks: usize,
    /// Units held by running tasks of the bottleneck kind (see the type's docs).
    pub used_units: u64,
    /// The bottleneck kind's budget (see the type's docs).
    pub total_units: u64,
    /// Units held per kind.
    pub used_by_kind: [u64; ResourceKind::COUNT],
    /// Budget per kind.
    pub total_by_kind: [u64; ResourceKind::COUNT],
    /// Tasks that ran past their execution timeout.
    pub timed_out_tasks: u64,
    /// Parked tasks whose deadline passed.
    pub expired_tasks: u64,
    /// Tasks cancelled (explicitly or by shutdown).
    pub cancelled_tasks: u64,
    /// Submissions refused (queue full, too large, duplicate id, shutting down).
    pub rejected_tasks: u64,
    /// Results dropped uncollected because their retention period passed.
    pub expired_results: u64,
    /// Worker threads restarted after a panic.
    pub worker_restarts: u64,
    /// Queue backend calls that failed (park, claim, settle, remove).
    pub queue_errors: u64,
    /// Worker threads alive right now.
    pub live_worker_threads: usize,
    /// Capacity permits asked to yield to a waiter of higher priority.
    pub preemptions_asked: u64,
    /// Permits asked to yield that were dropped since.
    pub preemptions_honoured: u64,
    /// Units those dropped permits gave back.
    pub preempted_units: u64,
    /// Runs of shared-queue tasks whose claim was lost (the lease ran out while they ran or
    /// before their outcome was stored): stopped, nothing published, not counted as ended.
    pub lost_leases: u64,
    /// Runs that failed in a way worth trying again and were: their tasks parked again
    /// after a backoff (see `PoolLimits::retry`).
    pub retried_runs: u64,
    /// Whether the pool is paused: it admits (tasks park) and starts nothing until resumed.
    pub paused: bool,
    /// Whether an operator drains the pool: it refuses new work and runs what it has.
    pub draining: bool,
    /// The GPU the pool's VRAM units live on, for a pool sized from one (see
    /// [`GpuWatch`](crate::scheduler::gpu_watch::GpuWatch)); `None` otherwise.
    pub gpu: Option<GpuStats>,
    /// The kinds whose units refill with time, with their levels (see
    /// [`Budget`]); empty for a pool without budgets.
    pub budgets: Vec<BudgetStats>,
}

/// A budget of [`PoolStats`]: its shape, its level at the last reading, and when the task
/// that waits for it first could start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BudgetStats {
    /// The kind whose units refill.
    pub kind: ResourceKind,
    /// Whole units in the bucket.
    pub level: u64,
    /// The most the bucket holds.
    pub burst: u32,
    /// Units that come back every `per_ms`.
    pub units: u32,
    /// The refill period, ms.
    pub per_ms: u64,
    /// When the best-ranked task parked on the budget could start as far as the budget goes
    /// (ms since the epoch), when one waits for it.
    pub waiting_until_ms: Option<u128>,
}

/// The GPU part of [`PoolStats`]: which device, and its memory as last sampled.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GpuStats {
    /// The device's index.
    pub index: u32,
    /// The device's name, like `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// The device's total memory, MiB.
    pub total_mib: u64,
    /// Its free memory at the last sample, MiB (all processes' use counted).
    pub free_mib: u64,
    /// Memory the pool leaves free, MiB.
    pub reserve_mib: u64,
    /// Whether the live guard holds VRAM tasks back while free memory is short.
    pub live_guard: bool,
}

/// The shared counters behind [`PoolStats`]. Task counters follow the scheduler's event
/// stream; worker threads maintain `live_worker_threads`, the supervisor `worker_restarts`,
/// the mailbox actor `expired_results`, the scheduler `queue_errors`.
///
/// A task's submission is counted before its outcome (the scheduler steps `Admitted`
/// before `Ended`, on one thread). A reading must never show an outcome without its
/// submission, though a reader on another thread reads the counters one by one while they
/// move: so an outcome is counted with `Release` and read with `Acquire`, and `submitted`
/// is read after every outcome. A reading then sees the submission of each outcome it sees,
/// and outcomes never exceed submissions plus the tasks claimed or resumed from elsewhere.
#[derive(Debug, Default)]
pub(crate) struct PoolCounters {
    pub(crate) worker_count: AtomicUsize,
    pub(crate) submitted: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) active: AtomicUsize,
    pub(crate) queued: AtomicUsize,
    pub(crate) used: [AtomicU64; ResourceKind::COUNT],
    pub(crate) total: [AtomicU64; ResourceKind::COUNT],
    pub(crate) timed_out: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) expired_results: AtomicU64,
    /// Shared with the supervisor, which counts the pool's restarts.
    pub(crate) worker_restarts: Arc<AtomicU64>,
    pub(crate) queue_errors: AtomicU64,
    pub(crate) live_threads: AtomicUsize,
    /// The pool's GPU, set once at start (its `free_mib` is read from `gpu_free_mib`).
    pub(crate) gpu: OnceLock<GpuStats>,
    /// The GPU's free memory at the last sample, MiB.
    pub(crate) gpu_free_mib: AtomicU64,
    pub(crate) preemptions_asked: AtomicU64,
    pub(crate) preemptions_honoured: AtomicU64,
    pub(crate) preempted_units: AtomicU64,
    pub(crate) lost_leases: AtomicU64,
    pub(crate) retried_runs: AtomicU64,
    pub(crate) paused: std::sync::atomic::AtomicBool,
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Per kind: its budget, set by the first reading that has one.
    pub(crate) budget_shape: [OnceLock<Budget>; ResourceKind::COUNT],
    pub(crate) budget_level: [AtomicU64; ResourceKind::COUNT],
    /// When the task waiting for the budget could start; 0 when none waits.
    pub(crate) budget_ready_at: [AtomicU64; ResourceKind::COUNT],
    /// The permits' fast path, whose holders and units no reading counts.
    pub(crate) lanes: OnceLock<Arc<dyn Unread>>,
}

/// Holders and units that no reading counts: those of the permits' fast path, which lends
/// units without a message to the scheduler. The counters ask it at each snapshot; the
/// permits implement it, so these counters need not know them.
pub(crate) trait Unread: Send + Sync + std::fmt::Debug {
    /// Units of `kind` held now.
    fn borrowed(&self, kind: ResourceKind) -> u32;
    /// How many hold some.
    fn holders(&self) -> usize;
}

impl PoolCounters {
    /// Whether the pool is paused, set as the pause is made (the next reading says the same),
    /// so a caller of `pause` reads it at once.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
    }

    /// Whether an operator drains the pool.
    pub(crate) fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Relaxed);
    }

    /// Counts the holders and units of the permits' fast path in every snapshot.
    pub(crate) fn attach_lanes(&self, lanes: Arc<dyn Unread>) {
        let _ = self.lanes.set(lanes);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> PoolStats {
        let read = |counter: &AtomicU64| counter.load(Relaxed);
        let mut used_by_kind = self.used.each_ref().map(read);
        let mut active = self.active.load(Relaxed);
        if let Some(lanes) = self.lanes.get() {
            for kind in ResourceKind::ALL {
                used_by_kind[kind.index()] += u64::from(lanes.borrowed(kind));
            }
            active += lanes.holders();
        }
        let total_by_kind = self.total.each_ref().map(read);
        let bottleneck = bottleneck(&used_by_kind, &total_by_kind);
        // Outcomes first, then the submissions (see the type's docs).
        let outcome = |counter: &AtomicU64| counter.load(Acquire);
        let completed_tasks = outcome(&self.completed);
        let failed_tasks = outcome(&self.failed);
        let timed_out_tasks = outcome(&self.timed_out);
        let expired_tasks = outcome(&self.expired);
        let cancelled_tasks = outcome(&self.cancelled);
        let rejected_tasks = outcome(&self.rejected);
        let submitted_tasks = read(&self.submitted);
        PoolStats {
            worker_count: self.worker_count.load(Relaxed),
            submitted_tasks,
            completed_tasks,
            failed_tasks,
            active_tasks: active,
            queued_tasks: self.queued.load(Relaxed),
            used_units: used_by_kind[bottleneck],
            total_units: total_by_kind[bottleneck],
            used_by_kind,
            total_by_kind,
            timed_out_tasks,
            expired_tasks,
            cancelled_tasks,
            rejected_tasks,
            expired_results: read(&self.expired_results),
            worker_restarts: read(&self.worker_restarts),
            queue_errors: read(&self.queue_errors),
            live_worker_threads: self.live_threads.load(Relaxed),
            preemptions_asked: read(&self.preemptions_asked),
            preemptions_honoured: read(&self.preemptions_honoured),
            preempted_units: read(&self.preempted_units),
            lost_leases: read(&self.lost_leases),
            retried_runs: read(&self.retried_runs),
            paused: self.paused.load(Relaxed),
            draining: self.draining.load(Relaxed),
            gpu: self.gpu.get().map(|gpu| GpuStats {
                free_mib: read(&self.gpu_free_mib),
                ..gpu.clone()
            }),
            budgets: ResourceKind::ALL
                .into_iter()
                .filter_map(|kind| {
                    let budget = self.budget_shape[kind.index()].get()?;
                    let ready_at = read(&self.budget_ready_at[kind.index()]);
                    Some(BudgetStats {
                        kind,
                        level: read(&self.budget_level[kind.index()]),
                        burst: budget.burst,
                        units: budget.units,
                        per_ms: budget.per_ms,
                        waiting_until_ms: (ready_at > 0).then_some(u128::from(ready_at)),
                    })
                })
                .collect(),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// The counter of tasks that ended in `status`.
    fn outcome(&self, status: &TaskStatus) -> &AtomicU64 {
        match status {
            TaskStatus::Completed => &self.completed,
            TaskStatus::Expired => &self.expired,
            TaskStatus::TimedOut => &self.timed_out,
            TaskStatus::Cancelled => &self.cancelled,
            TaskStatus::Rejected(_) => &self.rejected,
            TaskStatus::Failed(_) | TaskStatus::Parked | TaskStatus::Running => &self.failed,
        }
    }
}

/// The kind with the highest `used / total` (ties and an idle pool: the largest budget).
fn bottleneck(used: &[u64; ResourceKind::COUNT], total: &[u64; ResourceKind::COUNT]) -> usize {
    (0..ResourceKind::COUNT)
        .filter(|&kind| total[kind] > 0)
        .max_by(|&a, &b| {
            // used[a] / total[a] vs used[b] / total[b], cross-multiplied (no floats, no
            // overflow: both sides are below 2^64 * 2^32).
            let left = u128::from(used[a]) * u128::from(total[b]);
            let right = u128::from(used[b]) * u128::from(total[a]);
            left.cmp(&right)
                .then(total[a].cmp(&total[b]))
                .then(b.cmp(&a))
        })
        .unwrap_or(0)
}

impl EventSubscriber for PoolCounters {
    fn on_event(&self, event: &TaskEvent<'_>) {
        match event.step {
            TaskStep::Admitted => Self::bump(&self.submitted),
            TaskStep::Claimed
            | TaskStep::Parked
            | TaskStep::Started
            | TaskStep::WaitsForBudget { .. }
            | TaskStep::WaitsForParents { .. }
            | TaskStep::ParentFailed { .. } => {}
            TaskStep::Retrying { .. } => Self::bump(&self.retried_runs),
            TaskStep::YieldAsked => Self::bump(&self.preemptions_asked),
            TaskStep::Yielded { units } => {
                Self::bump(&self.preemptions_honoured);
                self.preempted_units.fetch_add(u64::from(*units), Relaxed);
            }
            TaskStep::Refused(_) => Self::bump(&self.rejected),
            TaskStep::LeaseLost => Self::bump(&self.lost_leases),
            TaskStep::Ended(status) => {
                self.outcome(status).fetch_add(1, Release);
            }
        }
    }

    fn on_reading(&self, reading: &PoolReading) {
        self.paused.store(reading.paused, Relaxed);
        for (kind, budget) in reading.budgets.iter().enumerate() {
            if let Some(budget) = budget {
                let _ = self.budget_shape[kind].set(budget.budget);
                self.budget_level[kind].store(u64::from(budget.level), Relaxed);
                self.budget_ready_at[kind].store(budget.ready_at_ms.map_or(0, engine_ms), Relaxed);
            }
        }
        self.active.store(reading.running, Relaxed);
        self.queued.store(reading.parked, Relaxed);
        for (gauge, &units) in self.used.iter().zip(&reading.used_by_kind) {
            gauge.store(units, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bottleneck;

    #[test]
    fn the_bottleneck_is_the_most_used_kind_and_the_largest_when_idle() {
        assert_eq!(bottleneck(&[0, 0, 0, 0], &[4, 24, 0, 0]), 1);
        assert_eq!(bottleneck(&[4, 10, 0, 0], &[4, 24, 0, 0]), 0);
        assert_eq!(bottleneck(&[10, 10, 10, 10], &[10, 10, 10, 10]), 0);
        assert_eq!(bottleneck(&[0; 4], &[0; 4]), 0);
    }
}
