//! The scheduler's event stream: what happened to each task, and when.
//!
//! The scheduler publishes one event per step of a task's life, with the time of the core's
//! decision: admitted (and then started or parked), started, ended. Subscribers (the pool's
//! counters, metrics, audit logs) hear every event on the scheduler's thread, in order, so a
//! subscriber must return at once: count, or hand the event to a queue of its own. Results
//! and their notifiers are the mailbox's business ([`Notifier`](crate::mailbox::Notifier)):
//! an `Ended` event may arrive before the result is retrievable.

use crate::domain::{MailboxKey, ResourceCost, TaskId, TaskStatus};

/// One step of a task's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStep {
    /// Accepted by admission; a `Started` or `Parked` follows at the same time.
    Admitted,
    /// Waiting in the parking lot.
    Parked,
    /// Running on a worker thread; its cost is held from now until it ends.
    Started,
    /// Ended in this state; exactly one per admitted task.
    Ended(TaskStatus),
    /// Refused at admission (never admitted, so no `Ended` follows).
    Refused,
}

/// An event of one task.
#[derive(Debug, Clone, Copy)]
pub struct TaskEvent<'a> {
    /// The caller's id of the task.
    pub task_id: TaskId,
    /// The mailbox its result goes to.
    pub key: &'a MailboxKey,
    /// What it costs.
    pub cost: ResourceCost,
    /// What happened.
    pub step: &'a TaskStep,
    /// When, in milliseconds since the Unix epoch (the `now` of the core's decision).
    pub at_ms: u64,
}

/// Hears every event of a pool's tasks. See the module docs for the rules.
pub trait EventSubscriber: Send + Sync {
    /// Takes note of one event. Must return at once.
    fn on_event(&self, event: &TaskEvent<'_>);
}
