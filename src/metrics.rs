//! Prometheus-style metrics through the [`metrics`](https://docs.rs/metrics) facade (cargo
//! feature `metrics`, on by default).
//!
//! Every pool the crate builds registers a [`PoolMetrics`] with the recorder installed at
//! that moment and subscribes it to its scheduler's event stream: counters and histograms
//! move with the events, gauges with the reading the scheduler publishes after each batch.
//! Nothing is formatted or allocated per event; the handles are registered once per pool,
//! kind, priority and reason. Install the recorder (for example
//! `metrics_exporter_prometheus::PrometheusBuilder`) *before* building pools: a pool built
//! with no recorder installed records nothing, at the cost of a no-op call per event.
//!
//! The names follow Prometheus conventions (the `parking_lot_` prefix, `_total` counters,
//! times in seconds); [`names`] lists them and the metrics table of `docs/guide/operating.md`
//! says what each means. Times come from the scheduler's clock, in whole milliseconds: a wait shorter than
//! a millisecond is recorded as 0.
//!
//! A pool started through the actor API ([`PoolSpec`](crate::actors::PoolSpec)) gets the
//! same metrics by putting a [`PoolMetrics`] in its `subscribers`.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram};
use metrics::{gauge, histogram, Counter, Gauge, Histogram, Unit};
use prometheus_parking_lot_actors::observe::events::{
    EventSubscriber, PoolReading, Refusal, TaskEvent, TaskStep,
};

use crate::core::{Capacity, TaskStatus};
use crate::util::serde::{Priority, ResourceKind};

/// The metric names, for readers of a recorder's output.
pub mod names {
    /// Counter: tasks admitted (started at once or parked).
    pub const TASKS_SUBMITTED: &str = "parking_lot_tasks_submitted_total";
    /// Counter: tasks whose executor returned a result.
    pub const TASKS_COMPLETED: &str = "parking_lot_tasks_completed_total";
    /// Counter: tasks whose executor panicked or that could not run.
    pub const TASKS_FAILED: &str = "parking_lot_tasks_failed_total";
    /// Counter: parked tasks whose deadline passed before they could start.
    pub const TASKS_EXPIRED: &str = "parking_lot_tasks_expired_total";
    /// Counter: tasks that ran past their execution timeout.
    pub const TASKS_TIMED_OUT: &str = "parking_lot_tasks_timed_out_total";
    /// Counter: tasks cancelled (explicitly, or by shutdown).
    pub const TASKS_CANCELLED: &str = "parking_lot_tasks_cancelled_total";
    /// Counter, label `reason`: submissions refused.
    pub const TASKS_REJECTED: &str = "parking_lot_tasks_rejected_total";
    /// Gauge: tasks parked now.
    pub const QUEUE_DEPTH: &str = "parking_lot_queue_depth";
    /// Gauge: tasks running now.
    pub const TASKS_RUNNING: &str = "parking_lot_tasks_running";
    /// Gauge, label `kind`: units held by running tasks.
    pub const UNITS_USED: &str = "parking_lot_units_used";
    /// Gauge, label `kind`: the pool's budget.
    pub const UNITS_TOTAL: &str = "parking_lot_units_total";
    /// Histogram, label `priority`: admission to start, seconds.
    pub const TASK_WAIT: &str = "parking_lot_task_wait_seconds";
    /// Histogram: start to end, seconds.
    pub const TASK_RUN: &str = "parking_lot_task_run_seconds";
    /// Counter: worker threads restarted after a panic.
    pub const WORKER_RESTARTS: &str = "parking_lot_worker_restarts_total";
    /// Counter: queue backend calls that failed.
    pub const QUEUE_ERRORS: &str = "parking_lot_queue_errors_total";
    /// Counter: capacity permits asked to yield to a waiter of higher priority.
    pub const PREEMPTIONS_ASKED: &str = "parking_lot_preemptions_asked_total";
    /// Counter: permits asked to yield that were dropped since.
    pub const PREEMPTIONS_HONOURED: &str = "parking_lot_preemptions_honoured_total";
    /// Counter: units that permits asked to yield gave back.
    pub const PREEMPTED_UNITS: &str = "parking_lot_preempted_units_total";
    /// Counter: runs of shared-queue tasks whose claim was lost (nothing they produced was
    /// published).
    pub const LOST_LEASES: &str = "parking_lot_lost_leases_total";
    /// Counter: failed runs whose task parks again to be tried again.
    pub const TASK_RETRIES: &str = "parking_lot_task_retries_total";
    /// Gauge, label `kind`: whole units in a budget's bucket (kinds whose units refill with
    /// time).
    pub const BUDGET_LEVEL: &str = "parking_lot_budget_level";
    /// Gauge, label `kind`: seconds until the task that waits for the budget could start
    /// as far as the budget goes; 0 when none waits.
    pub const BUDGET_READY_IN: &str = "parking_lot_budget_ready_in_seconds";
    /// Counter, label `kind`: tasks that parked because the budget held too few units.
    pub const BUDGET_WAITS: &str = "parking_lot_budget_waits_total";
    /// Counter, label `reason`: webhook notifications that failed.
    pub const WEBHOOK_FAILURES: &str = "parking_lot_webhook_failures_total";
}

/// The label value of a resource kind: `cpu`, `gpu_vram`, `io`, `mixed`.
pub fn kind_label(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Cpu => "cpu",
        ResourceKind::GpuVram => "gpu_vram",
        ResourceKind::Io => "io",
        ResourceKind::Mixed => "mixed",
    }
}

/// The label value of a priority: `low`, `normal`, `high`, `critical`.
pub fn priority_label(priority: Priority) -> &'static str {
    match priority {
        Priority::Low => "low",
        Priority::Normal => "normal",
        Priority::High => "high",
        Priority::Critical => "critical",
    }
}

/// One pool's metric handles; an [`EventSubscriber`] of its scheduler. See the module docs.
///
/// ```
/// use prometheus_parking_lot::metrics::PoolMetrics;
/// use prometheus_parking_lot::core::Capacity;
/// use prometheus_parking_lot::ResourceKind;
///
/// // With no recorder installed the handles are no-ops; install one first to record.
/// let capacity = Capacity::uniform(0).with(ResourceKind::GpuVram, 24);
/// let metrics = PoolMetrics::register("chat", capacity);
/// # drop(metrics);
/// ```
pub struct PoolMetrics {
    submitted: Counter,
    completed: Counter,
    failed: Counter,
    expired: Counter,
    timed_out: Counter,
    cancelled: Counter,
    /// Indexed by [`Refusal::index`].
    rejected: [Counter; Refusal::ALL.len()],
    queue_depth: Gauge,
    running: Gauge,
    /// Indexed by [`ResourceKind::index`]; `None` for a kind the pool has no budget of.
    units_used: [Option<Gauge>; ResourceKind::COUNT],
    /// Indexed by priority, lowest first.
    wait: [Histogram; Priority::ALL.len()],
    run: Histogram,
    worker_restarts: Counter,
    queue_errors: Counter,
    preemptions_asked: Counter,
    preemptions_honoured: Counter,
    preempted_units: Counter,
    lost_leases: Counter,
    retries: Counter,
    /// Indexed by [`ResourceKind::index`]: registered when a kind's budget is first heard of.
    budgets: [std::sync::OnceLock<BudgetGauges>; ResourceKind::COUNT],
    pool: String,
}

/// The handles of one budget.
struct BudgetGauges {
    level: Gauge,
    ready_in: Gauge,
    waits: Counter,
}

impl PoolMetrics {
    /// The handles of `kind`'s budget, registered on first use.
    fn budget_gauges(&self, kind: ResourceKind) -> &BudgetGauges {
        self.budgets[kind.index()].get_or_init(|| {
            let labels = [
                ("pool", self.pool.clone()),
                ("kind", kind_label(kind).to_owned()),
            ];
            BudgetGauges {
                level: gauge!(names::BUDGET_LEVEL, &labels[..]),
                ready_in: gauge!(names::BUDGET_READY_IN, &labels[..]),
                waits: counter!(names::BUDGET_WAITS, &labels[..]),
            }
        })
    }

    /// Registers pool `pool`'s metrics with the recorder installed now, and sets its
    /// budget gauges from `capacity` (kinds with no budget get no unit gauges).
    pub fn register(pool: &str, capacity: Capacity) -> Self {
        describe();
        let pool = pool.to_owned();
        let with_pool = |name: &'static str| counter!(name, "pool" => pool.clone());
        let units_used = ResourceKind::ALL.map(|kind| {
            let total = capacity.get(kind);
            (total > 0).then(|| {
                let labels = [
                    ("pool", pool.clone()),
                    ("kind", kind_label(kind).to_owned()),
                ];
                gauge!(names::UNITS_TOTAL, &labels[..]).set(f64::from(total));
                gauge!(names::UNITS_USED, &labels[..])
            })
        });
        Self {
            submitted: with_pool(names::TASKS_SUBMITTED),
            completed: with_pool(names::TASKS_COMPLETED),
            failed: with_pool(names::TASKS_FAILED),
            expired: with_pool(names::TASKS_EXPIRED),
            timed_out: with_pool(names::TASKS_TIMED_OUT),
            cancelled: with_pool(names::TASKS_CANCELLED),
            rejected: Refusal::ALL.map(|reason| {
                counter!(names::TASKS_REJECTED, "pool" => pool.clone(), "reason" => reason.label())
            }),
            queue_depth: gauge!(names::QUEUE_DEPTH, "pool" => pool.clone()),
            running: gauge!(names::TASKS_RUNNING, "pool" => pool.clone()),
            units_used,
            wait: Priority::ALL.map(|priority| {
                histogram!(names::TASK_WAIT, "pool" => pool.clone(), "priority" => priority_label(priority))
            }),
            run: histogram!(names::TASK_RUN, "pool" => pool.clone()),
            worker_restarts: with_pool(names::WORKER_RESTARTS),
            preemptions_asked: with_pool(names::PREEMPTIONS_ASKED),
            preemptions_honoured: with_pool(names::PREEMPTIONS_HONOURED),
            preempted_units: with_pool(names::PREEMPTED_UNITS),
            lost_leases: with_pool(names::LOST_LEASES),
            retries: with_pool(names::TASK_RETRIES),
            queue_errors: with_pool(names::QUEUE_ERRORS),
            budgets: Default::default(),
            pool,
        }
    }

    fn ended(&self, status: &TaskStatus) {
        let counter = match status {
            TaskStatus::Completed => &self.completed,
            TaskStatus::Expired => &self.expired,
            TaskStatus::TimedOut => &self.timed_out,
            TaskStatus::Cancelled => &self.cancelled,
            TaskStatus::Rejected(_) => &self.rejected[Refusal::Other.index()],
            TaskStatus::Failed(_) | TaskStatus::Parked | TaskStatus::Running => &self.failed,
        };
        counter.increment(1);
    }
}

/// Seconds from `since_ms` to `at_ms`.
fn seconds(since_ms: u128, at_ms: u128) -> f64 {
    at_ms.saturating_sub(since_ms) as f64 / 1_000.0
}

impl EventSubscriber for PoolMetrics {
    fn on_event(&self, event: &TaskEvent<'_>) {
        match event.step {
            TaskStep::Admitted => self.submitted.increment(1),
            // Submitted (and counted) where it was admitted.
            TaskStep::Claimed
            | TaskStep::Parked
            | TaskStep::WaitsForParents { .. }
            | TaskStep::ParentFailed { .. } => {}
            TaskStep::Started => {
                if let (Some(since), Some(priority)) = (event.since_ms, event.priority) {
                    self.wait[priority as usize].record(seconds(since, event.at_ms));
                }
            }
            TaskStep::Ended(status) => {
                if let Some(since) = event.since_ms {
                    self.run.record(seconds(since, event.at_ms));
                }
                self.ended(status);
            }
            TaskStep::Refused(reason) => self.rejected[reason.index()].increment(1),
            TaskStep::YieldAsked => self.preemptions_asked.increment(1),
            TaskStep::Yielded { units } => {
                self.preemptions_honoured.increment(1);
                self.preempted_units.increment(u64::from(*units));
            }
            TaskStep::LeaseLost => self.lost_leases.increment(1),
            TaskStep::Retrying { .. } => self.retries.increment(1),
            TaskStep::WaitsForBudget { .. } => {
                let kind = event.cost.kind;
                self.budget_gauges(kind).waits.increment(1);
            }
        }
    }

    fn on_reading(&self, reading: &PoolReading) {
        self.queue_depth.set(reading.parked as f64);
        self.running.set(reading.running as f64);
        for (gauge, &used) in self.units_used.iter().zip(&reading.used_by_kind) {
            if let Some(gauge) = gauge {
                gauge.set(used as f64);
            }
        }
        self.worker_restarts.absolute(reading.worker_restarts);
        self.queue_errors.absolute(reading.queue_errors);
        for (kind, budget) in ResourceKind::ALL.into_iter().zip(&reading.budgets) {
            if let Some(budget) = budget {
                let gauges = self.budget_gauges(kind);
                gauges.level.set(f64::from(budget.level));
                let ready_in = budget.ready_in_ms.unwrap_or(0);
                gauges.ready_in.set(ready_in as f64 / 1_000.0);
            }
        }
    }
}

/// A webhook notifier's failure counters (label `reason`: `attempt_failed`, `abandoned`,
/// `dropped`).
#[cfg(feature = "webhook")]
pub(crate) struct WebhookMetrics {
    /// An attempt failed and is retried.
    pub attempt_failed: Counter,
    /// The notification was given up.
    pub abandoned: Counter,
    /// The notification was dropped from a full outbox.
    pub dropped: Counter,
}

#[cfg(feature = "webhook")]
impl Default for WebhookMetrics {
    /// Counters that record nothing.
    fn default() -> Self {
        Self {
            attempt_failed: Counter::noop(),
            abandoned: Counter::noop(),
            dropped: Counter::noop(),
        }
    }
}

#[cfg(feature = "webhook")]
impl WebhookMetrics {
    /// Registers the failure counters of the notifier of pool `pool`.
    pub fn register(pool: &str) -> Self {
        describe();
        let failures = |reason: &'static str| counter!(names::WEBHOOK_FAILURES, "pool" => pool.to_owned(), "reason" => reason);
        Self {
            attempt_failed: failures("attempt_failed"),
            abandoned: failures("abandoned"),
            dropped: failures("dropped"),
        }
    }
}

/// Tells the recorder what each metric is (its `# HELP` and unit).
fn describe() {
    let counters = [
        (
            names::TASKS_SUBMITTED,
            "Tasks admitted (started at once or parked).",
        ),
        (
            names::TASKS_COMPLETED,
            "Tasks whose executor returned a result.",
        ),
        (
            names::TASKS_FAILED,
            "Tasks whose executor panicked or that could not run.",
        ),
        (
            names::TASKS_EXPIRED,
            "Parked tasks whose deadline passed before they started.",
        ),
        (
            names::TASKS_TIMED_OUT,
            "Tasks that ran past their execution timeout.",
        ),
        (
            names::TASKS_CANCELLED,
            "Tasks cancelled, explicitly or by shutdown.",
        ),
        (names::TASKS_REJECTED, "Submissions refused, by reason."),
        (
            names::WORKER_RESTARTS,
            "Worker threads restarted after a panic.",
        ),
        (names::QUEUE_ERRORS, "Queue backend calls that failed."),
        (
            names::PREEMPTIONS_ASKED,
            "Capacity permits asked to yield to a waiter of higher priority.",
        ),
        (
            names::PREEMPTIONS_HONOURED,
            "Permits asked to yield that were dropped since.",
        ),
        (
            names::PREEMPTED_UNITS,
            "Units that permits asked to yield gave back.",
        ),
        (
            names::LOST_LEASES,
            "Runs of shared-queue tasks whose claim was lost; nothing they produced was published.",
        ),
        (
            names::WEBHOOK_FAILURES,
            "Webhook notifications that failed, by reason.",
        ),
        (
            names::TASK_RETRIES,
            "Failed runs whose task parks again to be tried again after a backoff.",
        ),
        (
            names::BUDGET_WAITS,
            "Tasks that parked because their kind's budget held too few units, by kind.",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    describe_gauge!(names::QUEUE_DEPTH, Unit::Count, "Tasks parked now.");
    describe_gauge!(names::TASKS_RUNNING, Unit::Count, "Tasks running now.");
    describe_gauge!(
        names::UNITS_USED,
        Unit::Count,
        "Units held by running tasks, by kind."
    );
    describe_gauge!(
        names::UNITS_TOTAL,
        Unit::Count,
        "The pool's budget, by kind."
    );
    describe_gauge!(
        names::BUDGET_LEVEL,
        Unit::Count,
        "Whole units in the bucket of a kind whose units refill with time."
    );
    describe_gauge!(
        names::BUDGET_READY_IN,
        Unit::Seconds,
        "Time until the task waiting for a budget could start as far as the budget goes; 0 when none waits."
    );
    describe_histogram!(
        names::TASK_WAIT,
        Unit::Seconds,
        "Time from admission to start, by priority."
    );
    describe_histogram!(names::TASK_RUN, Unit::Seconds, "Time from start to end.");
}
