//! The shell's observers: the event stream's subscribers (the pool's counters first, then
//! metrics and the application's own), told of every step of every task and, after each
//! batch of steps, of the pool's gauges.
//!
//! Subscribers are called in place, on the scheduler's thread, not through an effect: the
//! [`EventSubscriber`] contract makes them count or hand the event on at once, and an event
//! borrows the task's key, which an effect would have to copy for every step.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::domain::{MailboxKey, PoolLimits, Priority, ResourceCost, ResourceKind, TaskId};
use crate::observe::events::{BudgetReading, EventSubscriber, PoolReading, TaskEvent, TaskStep};
use crate::observe::stats::PoolCounters;
use crate::observe::trace::TraceParent;
use crate::scheduler::core::ParkingLot;

use super::ledger::Record;

/// Who hears the pool's events.
pub(crate) struct Observers {
    /// The pool's counters (also the first subscriber).
    pub counters: Arc<PoolCounters>,
    subscribers: Vec<Arc<dyn EventSubscriber>>,
    /// Whether a subscriber wants `Parked` events to say why the task waits.
    wants_wait_reasons: bool,
}

/// What an event adds to a task's identity: the interval it closes, the priority, the
/// trace, the run and why it waits.
#[derive(Clone, Copy)]
pub(crate) struct Detail {
    pub since_ms: Option<u64>,
    pub priority: Option<Priority>,
    pub trace: Option<TraceParent>,
    pub attempt: Option<u32>,
    pub wait_reason: Option<&'static str>,
}

impl Detail {
    /// For a task reported from outside the ledger (a shared queue's report).
    pub const NONE: Detail = Detail {
        since_ms: None,
        priority: None,
        trace: None,
        attempt: None,
        wait_reason: None,
    };

    /// For a step of a task the ledger holds: a start closes its wait (from admission), an
    /// end closes its run (from its start, if it started).
    pub fn of<P>(record: &Record<P>, step: &TaskStep) -> Detail {
        let since_ms = match step {
            TaskStep::Started => Some(record.admitted_ms()),
            TaskStep::Ended(_) => record.started_ms(),
            _ => None,
        };
        Detail {
            since_ms,
            priority: Some(record.priority),
            trace: record.trace().copied(),
            attempt: Some(record.run_number()),
            wait_reason: None,
        }
    }
}

impl Observers {
    /// The counters, then `subscribers`; the counters learn the pool's capacity.
    pub fn new(
        counters: Arc<PoolCounters>,
        subscribers: Vec<Arc<dyn EventSubscriber>>,
        limits: &PoolLimits,
    ) -> Self {
        for (gauge, kind) in counters.total.iter().zip(ResourceKind::ALL) {
            gauge.store(u64::from(limits.capacity.get(kind)), Relaxed);
        }
        counters.worker_count.store(limits.worker_slots, Relaxed);
        let mut all: Vec<Arc<dyn EventSubscriber>> = vec![counters.clone()];
        all.extend(subscribers);
        let wants_wait_reasons = all.iter().any(|subscriber| subscriber.wants_wait_reasons());
        Self {
            counters,
            subscribers: all,
            wants_wait_reasons,
        }
    }

    /// Whether `Parked` events should say why the task waits.
    pub fn wants_wait_reasons(&self) -> bool {
        self.wants_wait_reasons
    }

    /// Tells every subscriber of a step of a task the ledger holds.
    pub fn record_step<P>(&self, record: &Record<P>, step: &TaskStep, now: u64) {
        self.record_step_as(record, &record.key.key(), step, now);
    }

    /// [`record_step`](Self::record_step) with the task's full key given (a record keeps an
    /// anonymous key as its bits; building it again for every step would cost an allocation).
    pub fn record_step_as<P>(
        &self,
        record: &Record<P>,
        key: &MailboxKey,
        step: &TaskStep,
        now: u64,
    ) {
        self.record_step_why(record, key, step, now, None);
    }

    /// [`record_step_as`](Self::record_step_as) of a `Parked` step that says why the task
    /// waits (`None` unless [`wants_wait_reasons`](Self::wants_wait_reasons)).
    pub fn record_step_why<P>(
        &self,
        record: &Record<P>,
        key: &MailboxKey,
        step: &TaskStep,
        now: u64,
        wait_reason: Option<&'static str>,
    ) {
        if let Some(span) = record.rare().and_then(|rare| rare.span.as_ref()) {
            tracing::trace!(parent: span, ?step, at_ms = now, "task step");
        }
        let detail = Detail {
            wait_reason,
            ..Detail::of(record, step)
        };
        self.step(record.task_id, key, record.cost(), step, now, detail);
    }

    /// Tells every subscriber of a step.
    pub fn step(
        &self,
        task_id: TaskId,
        key: &MailboxKey,
        cost: ResourceCost,
        step: &TaskStep,
        now: u64,
        detail: Detail,
    ) {
        let event = TaskEvent {
            task_id,
            key,
            cost,
            step,
            at_ms: u128::from(now),
            since_ms: detail.since_ms.map(u128::from),
            priority: detail.priority,
            trace: detail.trace.as_ref(),
            attempt: detail.attempt,
            wait_reason: detail.wait_reason,
        };
        for subscriber in &self.subscribers {
            subscriber.on_event(&event);
        }
    }

    /// Publishes the core's gauges (running, parked, units held) and the failure counts to
    /// every subscriber, the pool's counters first.
    pub fn publish(&self, core: &ParkingLot) {
        let reading = PoolReading {
            running: core.running_len(),
            parked: core.parked_len(),
            used_by_kind: ResourceKind::ALL
                .map(|kind| u64::from(core.used(kind) - core.lent(kind))),
            worker_restarts: self.counters.worker_restarts.load(Relaxed),
            queue_errors: self.counters.queue_errors.load(Relaxed),
            paused: core.is_paused(),
            budgets: ResourceKind::ALL.map(|kind| {
                let budget = *core.limits().budgets.get(kind)?;
                let ready_at_ms = core.budget_waits_until(kind);
                Some(BudgetReading {
                    budget,
                    level: core.budget_level(kind)?,
                    ready_at_ms: ready_at_ms.map(u128::from),
                    ready_in_ms: ready_at_ms.map(|at| at.saturating_sub(core.clock())),
                })
            }),
        };
        for subscriber in &self.subscribers {
            subscriber.on_reading(&reading);
        }
    }

    /// Counts a failed queue call.
    pub fn queue_error(&self) {
        PoolCounters::bump(&self.counters.queue_errors);
    }
}
