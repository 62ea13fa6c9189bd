//! Tasks: identity, priority and the metadata the scheduler ranks them by.

use serde::{Deserialize, Serialize};

use super::{MailboxKey, ResourceCost};
use crate::util::clock::now_ms;

/// Identifies a task within a pool. Callers choose it (a request id, a random number).
pub type TaskId = u64;

/// How urgent a task is. Higher priorities are unparked first: `Low < Normal < High <
/// Critical`.
///
/// ```
/// use prometheus_parking_lot_actors::domain::Priority;
///
/// assert!(Priority::Critical > Priority::High);
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert_eq!(Priority::ALL.iter().max(), Some(&Priority::Critical));
/// ```
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
pub enum Priority {
    /// Batch work that may wait behind everything else.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Interactive work.
    High,
    /// Work that must go first (health checks, control traffic).
    Critical,
}

impl Priority {
    /// All priorities, lowest first.
    pub const ALL: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];
}

/// Everything the scheduler needs to know about a task, apart from its payload.
///
/// Built with [`TaskMetadata::new`] and the `with_*` calls, or as a struct literal:
///
/// ```
/// use prometheus_parking_lot_actors::util::clock::now_ms;
/// use prometheus_parking_lot_actors::domain::{MailboxKey, Priority, ResourceCost, TaskMetadata};
///
/// let chat = TaskMetadata::new(1, ResourceCost::gpu_vram(2))
///     .with_priority(Priority::High)
///     .with_mailbox(MailboxKey::new("acme").with_user("ada"))
///     .with_deadline_ms(now_ms() + 30_000);
/// let batch = TaskMetadata {
///     id: 2,
///     mailbox: None,
///     priority: Priority::Low,
///     cost: ResourceCost::gpu_vram(12),
///     deadline_ms: None,
///     created_at_ms: now_ms(),
/// };
/// assert!(chat.priority > batch.priority);
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TaskMetadata {
    /// The caller's id for this task; unique among the pool's live tasks.
    pub id: TaskId,
    /// Where the result goes. `None` lets the pool pick a fresh, unique key.
    pub mailbox: Option<MailboxKey>,
    /// Rank among parked tasks.
    pub priority: Priority,
    /// What the task holds while it runs.
    pub cost: ResourceCost,
    /// Milliseconds since the Unix epoch after which the task must not start.
    pub deadline_ms: Option<u128>,
    /// Milliseconds since the Unix epoch when the task was created; older ranks first within a
    /// priority.
    pub created_at_ms: u128,
}

impl TaskMetadata {
    /// Metadata with `Normal` priority, created now, no deadline and no mailbox.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{Priority, ResourceCost, TaskMetadata};
    ///
    /// let meta = TaskMetadata::new(42, ResourceCost::gpu_vram(100));
    /// assert_eq!(meta.id, 42);
    /// assert_eq!(meta.priority, Priority::Normal);
    /// assert!(meta.deadline_ms.is_none());
    /// ```
    pub fn new(id: TaskId, cost: ResourceCost) -> Self {
        Self {
            id,
            mailbox: None,
            priority: Priority::Normal,
            cost,
            deadline_ms: None,
            created_at_ms: now_ms(),
        }
    }

    /// The same metadata with another priority.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The same metadata with an absolute deadline (milliseconds since the Unix epoch).
    pub fn with_deadline_ms(mut self, deadline_ms: u128) -> Self {
        self.deadline_ms = Some(deadline_ms);
        self
    }

    /// The same metadata with its result addressed to `mailbox`.
    pub fn with_mailbox(mut self, mailbox: MailboxKey) -> Self {
        self.mailbox = Some(mailbox);
        self
    }
}

/// A task as queues store it: its metadata and the payload the executor receives.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{ResourceCost, ScheduledTask, TaskMetadata};
///
/// let task = ScheduledTask::new(TaskMetadata::new(7, ResourceCost::cpu(1)), "summarise".to_string());
/// assert_eq!(task.meta.id, 7);
/// assert_eq!(task.payload, "summarise");
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ScheduledTask<P> {
    /// Scheduling information.
    pub meta: TaskMetadata,
    /// The work itself.
    pub payload: P,
}

impl<P> ScheduledTask<P> {
    /// Pairs a payload with its metadata.
    pub fn new(meta: TaskMetadata, payload: P) -> Self {
        Self { meta, payload }
    }
}
