//! Where a task stands: its lifecycle status and its place in the parking lot.

use serde::{Deserialize, Serialize};

use super::{PoolError, TaskFailure};

/// The lifecycle of a task. Every accepted task reaches exactly one terminal state.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum TaskStatus {
    /// Waiting in the parking lot for capacity.
    Parked,
    /// Holding its capacity on a worker.
    Running,
    /// The executor returned a result.
    Completed,
    /// The executor panicked or the task could not run; the reason says which.
    Failed(String),
    /// Its deadline passed before it could start.
    Expired,
    /// It ran longer than its execution timeout.
    TimedOut,
    /// Someone cancelled it, or the pool shut down before it started.
    Cancelled,
    /// Admission refused it; the reason says why.
    Rejected(String),
}

impl TaskStatus {
    /// Whether the task is finished for good.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::TaskStatus;
    /// assert!(TaskStatus::Expired.is_terminal());
    /// assert!(!TaskStatus::Parked.is_terminal());
    /// ```
    pub fn is_terminal(&self) -> bool {
        !matches!(self, TaskStatus::Parked | TaskStatus::Running)
    }
}

/// A live task's place in the parking lot, as the scheduling core sees it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WakeState {
    /// Parked; it starts when it is the best-ranked parked task that fits.
    Parked,
    /// Parked and starving: it waited past the starvation guard, so nothing ranked below it
    /// starts until it has started.
    Reserved,
    /// Started and holding its capacity.
    Running,
}

/// The terminal status an outcome stands for.
pub fn status_of<R>(outcome: &Result<R, TaskFailure>) -> TaskStatus {
    match outcome {
        Ok(_) => TaskStatus::Completed,
        Err(TaskFailure::Expired) => TaskStatus::Expired,
        Err(TaskFailure::TimedOut) => TaskStatus::TimedOut,
        Err(TaskFailure::Cancelled) => TaskStatus::Cancelled,
        Err(TaskFailure::Failed(reason)) => TaskStatus::Failed(reason.clone()),
        Err(TaskFailure::Lost(error)) => match error.as_ref() {
            PoolError::Shutdown => TaskStatus::Cancelled,
            refusal @ (PoolError::QueueFull
            | PoolError::InsufficientResources { .. }
            | PoolError::MailboxFull { .. }
            | PoolError::DuplicateTask(_)
            | PoolError::ResultPending(_)
            | PoolError::NestedBudgetExhausted { .. }) => TaskStatus::Rejected(refusal.to_string()),
            other => TaskStatus::Failed(other.to_string()),
        },
    }
}
