//! Why a task that names tasks it depends on (`SubmitOptions::depends_on`) was refused at
//! submission.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{TaskId, TaskStatus};

/// The most parents one task may name: a fan-in of this many costs O(1) per parent end,
/// and the bound keeps one submission's bookkeeping small.
pub const MAX_PARENTS: usize = 10_000;

/// Why a submission with dependencies was refused. Each variant names the parent (or the
/// task) at fault.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum DependencyError {
    /// No task with this id is live in the pool, and none ended recently enough for the pool
    /// to remember how it ended.
    #[error("depends_on names task {parent}, which this pool does not know: no live task has that id under this tenant, and none ended recently with it; submit the parent first")]
    UnknownParent {
        /// The parent named.
        parent: TaskId,
    },
    /// A task with this id is live (or ended recently) under another tenant: a task may only
    /// depend on tasks of its own tenant (its mailbox key's).
    #[error("depends_on names task {parent}, which belongs to another tenant; a task may only depend on tasks of its own tenant (its mailbox key's tenant)")]
    OtherTenant {
        /// The parent named.
        parent: TaskId,
    },
    /// The task names itself: it would wait for ever on its own end.
    #[error("depends_on of task {task} names the task itself, a cycle; name only tasks submitted before it")]
    Cycle {
        /// The task.
        task: TaskId,
    },
    /// The parent ended without succeeding before the task was submitted; the task would
    /// only be cancelled (unless it runs anyway: `SubmitOptions::run_if_parents_fail`).
    #[error("depends_on names task {parent}, which ended {status:?} already; submit the task with run_if_parents_fail to run it anyway")]
    ParentEnded {
        /// The parent named.
        parent: TaskId,
        /// How it ended.
        status: TaskStatus,
    },
    /// More parents than [`MAX_PARENTS`].
    #[error("depends_on names {count} tasks; at most {max} are allowed")]
    TooManyParents {
        /// Parents named.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// The pool's queue does not support dependencies.
    #[error("depends_on is not supported by this pool's queue ({queue}); the queues that support it: {supported}")]
    Unsupported {
        /// The pool's queue.
        queue: String,
        /// The queues that do.
        supported: String,
    },
}
