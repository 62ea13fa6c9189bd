//! The error every public operation returns.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{BackendError, DependencyError, ResourceKind, TaskId};

/// Why a pool operation failed.
///
/// Most variants are an operation's own failure: the call was refused (`QueueFull`,
/// `InsufficientResources`, `Draining`...), the caller stopped waiting (`Timeout`), or a
/// backend failed under it (`Backend`, which keeps its cause). Four say instead how the task
/// a retrieve waited for ended without a result: [`Failed`](Self::Failed),
/// [`Expired`](Self::Expired), [`TimedOut`](Self::TimedOut) and
/// [`Cancelled`](Self::Cancelled). A mailbox stores those as a [`TaskFailure`], the type of a
/// task's outcome; a retrieve hands them back as these variants, so code can tell "my wait
/// ran out" (`Timeout`: nothing was taken; try again unless the pool abandoned the task)
/// from "the task ran too long" (`TimedOut`: it will never have a result), and both from
/// "nothing will ever come under that key" (`NothingToRetrieve`).
///
/// It serialises (a [`TaskFailure::Lost`] stores one) in serde's default externally tagged
/// form: `"QueueFull"`, `{"InvalidConfig": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum PoolError {
    /// The parking lot holds `max_queue_depth` tasks already (or `max_queued_units` units of
    /// the task's kind) and none of lower priority could make room; or the task was parked
    /// and a newcomer of higher priority took its place (it was shed, core rule 21).
    #[error("queue full: the pool's parking lot is at its max_queue_depth or max_queued_units")]
    QueueFull,
    /// The task costs more than the pool could ever give it, of the kind it asked for.
    ///
    /// Match it with `{ needed, available, .. }`: the fields are the ones servers have always
    /// read, plus the kind.
    #[error("insufficient resources: the task needs {needed} units of {kind} but at most {available} of that kind can be held by one task (the pool's total, or one tenant's fair share)")]
    InsufficientResources {
        /// Units the task asked for.
        needed: usize,
        /// The most units of that kind one task can hold: the pool's total, or under a fair
        /// share the cap per tenant when that is lower.
        available: usize,
        /// The resource kind the task asked for.
        kind: ResourceKind,
    },
    /// Results waiting to be collected plus tasks still live reached the mailbox's bound;
    /// a new task could only be taken by dropping a stored result, so it is refused instead.
    #[error("mailbox full: {stored} results wait to be collected and {live} tasks are live; the bound is {max_messages}; retrieve results or raise mailbox max_messages")]
    MailboxFull {
        /// Results stored and not yet retrieved.
        stored: usize,
        /// Tasks admitted and not yet ended.
        live: usize,
        /// The configured bound.
        max_messages: usize,
    },
    /// The caller stopped waiting for a result. Nothing was taken. The task carries on and
    /// a later retrieve can still get its result, unless the pool abandons tasks whose
    /// waiter gave up (see [`OnGiveUp`](super::OnGiveUp)): it does so only for a task under
    /// a key the pool made, by default where results are kept in memory.
    #[error("timed out waiting; nothing was taken (a retrieved task carries on, unless the pool abandons tasks whose only waiter gave up: see on_give_up)")]
    Timeout,
    /// A retrieve asked for a result that no task of this pool will ever store and that does
    /// not wait in the mailbox: the pool never accepted a task under that key (and id), or
    /// its result was taken already, dropped by retention, or never kept because its task
    /// was abandoned when an earlier retrieve gave up. Said at once, where the pool can know
    /// it: a key the pool made, or a key with a task id, in a mailbox in this process's
    /// memory, with a queue no other node runs tasks from. (Elsewhere a retrieve waits, as a
    /// result may still come from outside the process.)
    #[error("nothing to retrieve{}: no live task of this pool will store a result there and none waits; the key was never accepted here, or its result was taken already, dropped by retention, or abandoned when an earlier retrieve gave up", task_suffix(*.task))]
    NothingToRetrieve {
        /// The task id the retrieve named, if it named one.
        task: Option<TaskId>,
    },
    /// No result is stored under that key.
    #[error("no result found for that mailbox key")]
    ResultNotFound,
    /// The pool is shutting down or gone.
    #[error("the pool is shut down")]
    Shutdown,
    /// An operator drains the pool: it runs the work it has and takes no new work until it
    /// is resumed.
    #[error(
        "the pool is draining: it finishes the work it has and takes no new work until resumed"
    )]
    Draining,
    /// A submission's dependencies (`SubmitOptions::depends_on`) were refused: an unknown
    /// parent, one of another tenant, a cycle, a parent that failed already, or a queue that
    /// does not support them.
    #[error("dependencies refused: {0}")]
    Dependency(Box<DependencyError>),
    /// A setting is out of range; the text names it and what is allowed.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A queue, mailbox or database failed while the pool used it. It names the pool, the
    /// backend and the operation, and keeps the backend's fault as its
    /// [`source`](std::error::Error::source); the fault's [`kind`](super::FaultKind) says
    /// whether retrying may help ([`PoolError::is_retryable`]).
    #[error(transparent)]
    Backend(Box<BackendError>),
    /// Something the pool itself got wrong, or the operating system refused it (a thread or
    /// a runtime it could not start); the text says what. Nothing a caller can fix by
    /// changing a setting or an input ends here: those have variants of their own.
    #[error("internal error: {0}")]
    Internal(String),
    /// The executor panicked or failed; the text carries the panic message.
    #[error("task failed: {0}")]
    Failed(String),
    /// The task's deadline passed before it could start.
    #[error("task expired before it could start")]
    Expired,
    /// The task ran past its execution timeout.
    #[error("task ran past its execution timeout")]
    TimedOut,
    /// The task was cancelled, or the pool shut down before it ran.
    #[error("task cancelled")]
    Cancelled,
    /// No live task has this id.
    #[error("no live task with id {0}")]
    TaskNotFound(TaskId),
    /// A live task with this id exists already.
    #[error("a live task with id {0} exists already")]
    DuplicateTask(TaskId),
    /// An earlier task with this id ended and its result still waits under this key: a new
    /// task of the same id would be answered with that result, so it is refused.
    #[error("the result of an earlier task with id {0} still waits under this key; retrieve it (or let its retention pass) before submitting the id again, or use a new id")]
    ResultPending(TaskId),
    /// A task submitted from one of the pool's own worker threads (nested work) was refused
    /// at once: all the pool's nested slots (one fewer than its workers) are held, so it
    /// might never get a worker while its parent waits for it (see the `budget` module).
    #[error("nested submission refused: it comes from one of this pool's own worker threads and all {slots} nested slots (worker_count - 1) are held, so it could wait for ever on a worker its parent holds; raise worker_count, or run the work inline")]
    NestedBudgetExhausted {
        /// The pool's nested slots.
        slots: usize,
    },
    /// The pool refuses submissions that would miss their deadline (`"admission":
    /// {"refuse_if_late": true}`), and this one's estimated start is after its deadline:
    /// refused at once rather than parked to expire. Submitting again later, or to another
    /// pool, may succeed. (Boxed: it is rare, and its two instants would double every
    /// result's size.)
    #[error("{0}")]
    WouldMissDeadline(Box<DeadlineMiss>),
    /// A permit (or more units for one) was asked for with `try_acquire` or `try_grow`,
    /// which never wait, and the gate could not grant it at once.
    #[error("the gate cannot grant that at once: the units are held, or better-ranked waiters come first; acquire (or grow) and wait, or try again later")]
    WouldWait,
    /// A permit asked to grow while every other holder of units of its kind waits to grow
    /// too: nobody would ever release anything, so the wait is refused instead.
    #[error("growing would deadlock: every other holder of {kind} units waits to grow as well; shrink or drop a permit (or preempt) before growing")]
    WouldDeadlock {
        /// The kind every holder waits for.
        kind: ResourceKind,
    },
}

impl PoolError {
    /// Whether the same call may succeed if tried again later: a backend that could not be
    /// reached, a full queue or mailbox that others drain, a submission refused because it
    /// would start after its deadline (the queue drains), or a retrieve whose wait ran out
    /// (its task carries on, unless the pool abandoned it: see
    /// [`OnGiveUp`](super::OnGiveUp)).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::PoolError;
    ///
    /// assert!(PoolError::QueueFull.is_retryable());
    /// assert!(!PoolError::InvalidConfig("max_units is 0".into()).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Backend(error) => error.fault.kind.is_retryable(),
            Self::QueueFull
            | Self::MailboxFull { .. }
            | Self::WouldMissDeadline(_)
            | Self::Timeout => true,
            _ => false,
        }
    }

    /// The name code written for the upstream crate matches on: the same error as
    /// [`Shutdown`](PoolError::Shutdown), so both names work in patterns and in comparisons.
    ///
    /// It is a constant, not a second variant, so there is one error and a `match` on
    /// either name catches it. A constant in a pattern does not look through a reference the
    /// way a variant does: match on the error itself (`match result { Err(PoolError::
    /// PoolShutdown) => .. }`), or write `*error` or `&PoolError::PoolShutdown` when you hold
    /// a `&PoolError`.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::PoolError;
    ///
    /// let refused: Result<(), PoolError> = Err(PoolError::Shutdown);
    /// assert!(matches!(refused, Err(PoolError::PoolShutdown)));
    /// assert!(matches!(PoolError::PoolShutdown, PoolError::Shutdown));
    /// assert_eq!(PoolError::PoolShutdown, PoolError::Shutdown);
    ///
    /// let by_reference = &PoolError::Shutdown;
    /// assert!(matches!(*by_reference, PoolError::PoolShutdown));
    /// assert!(matches!(by_reference, &PoolError::PoolShutdown));
    /// ```
    #[allow(non_upper_case_globals)]
    pub const PoolShutdown: PoolError = PoolError::Shutdown;
}

/// " for task N" when a retrieve named task N, else nothing.
fn task_suffix(task: Option<TaskId>) -> String {
    task.map(|id| format!(" for task {id}")).unwrap_or_default()
}

/// How a task ended without a result: what its mailbox keeps in place of one.
///
/// It is the task's outcome, not an operation's error: a [`PoolError`] says why a call
/// failed (the caller stopped waiting, the queue is full, the database is away), a
/// `TaskFailure` why the task itself produced nothing. A retrieve turns it into the
/// [`PoolError`] variant of the same name ([`Failed`](PoolError::Failed),
/// [`Expired`](PoolError::Expired), [`TimedOut`](PoolError::TimedOut),
/// [`Cancelled`](PoolError::Cancelled)), so code that matches those keeps working, and
/// `PoolError::Timeout` (the caller gave up) is never one of them.
///
/// It serialises (durable mailboxes store it) in serde's externally tagged form, the same
/// text earlier versions stored for these outcomes: `"TimedOut"`, `{"Failed": "boom"}`.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{PoolError, TaskFailure};
///
/// let ended = TaskFailure::TimedOut;
/// assert_eq!(PoolError::from(ended), PoolError::TimedOut);
/// assert_ne!(PoolError::from(TaskFailure::TimedOut), PoolError::Timeout);
/// assert_eq!(serde_json::to_string(&TaskFailure::Failed("boom".into())).unwrap(), r#"{"Failed":"boom"}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum TaskFailure {
    /// The executor panicked, or its run failed for good; the text says how.
    #[error("task failed: {0}")]
    Failed(String),
    /// Its deadline passed before it could start.
    #[error("task expired before it could start")]
    Expired,
    /// It ran past its execution timeout.
    #[error("task ran past its execution timeout")]
    TimedOut,
    /// It was cancelled, or the pool shut down before it ran.
    #[error("task cancelled")]
    Cancelled,
    /// The pool could not carry it to its end after admitting it (its queue or the pool
    /// failed under it, or the pool shut down); the error says what.
    #[error(transparent)]
    Lost(Box<PoolError>),
}

// Every result the engine passes around carries a `PoolError`'s room: a rare error with
// many fields is boxed so the common ones stay this small.
const _: () = assert!(std::mem::size_of::<PoolError>() <= 32);
const _: () = assert!(std::mem::size_of::<TaskFailure>() <= 32);

/// A backend's failure is [`PoolError::Backend`] (boxed: it is rare, and keeps every other
/// result small).
impl From<BackendError> for PoolError {
    fn from(error: BackendError) -> Self {
        PoolError::Backend(Box::new(error))
    }
}

impl From<TaskFailure> for PoolError {
    fn from(failure: TaskFailure) -> Self {
        match failure {
            TaskFailure::Failed(reason) => PoolError::Failed(reason),
            TaskFailure::Expired => PoolError::Expired,
            TaskFailure::TimedOut => PoolError::TimedOut,
            TaskFailure::Cancelled => PoolError::Cancelled,
            TaskFailure::Lost(error) => *error,
        }
    }
}

impl From<PoolError> for TaskFailure {
    /// The outcome a task that ended with `error` has: the variants of the same name, and
    /// any other error as [`TaskFailure::Lost`].
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::Failed(reason) => TaskFailure::Failed(reason),
            PoolError::Expired => TaskFailure::Expired,
            PoolError::TimedOut => TaskFailure::TimedOut,
            PoolError::Cancelled => TaskFailure::Cancelled,
            other => TaskFailure::Lost(Box::new(other)),
        }
    }
}

/// The instants of a [`PoolError::WouldMissDeadline`] refusal, ms since the Unix epoch
/// (the width of [`now_ms`](crate::util::clock::now_ms) and of a task's `deadline_ms`).
///
/// ```
/// use prometheus_parking_lot_actors::domain::{DeadlineMiss, PoolError};
///
/// let refused = PoolError::WouldMissDeadline(Box::new(DeadlineMiss {
///     estimated_start_ms: 1_764_689_492_120,
///     deadline_ms: 1_764_689_490_000,
/// }));
/// if let PoolError::WouldMissDeadline(miss) = &refused {
///     assert_eq!(miss.late_by_ms(), 2_120);
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadlineMiss {
    /// When the pool expects it would start; for a task far back in a long queue, an
    /// instant past the deadline before which it would not start (the estimate stops
    /// looking a little after the deadline: `ParkingLot::misses_deadline`).
    pub estimated_start_ms: u128,
    /// The task's deadline to start by.
    pub deadline_ms: u128,
}

impl DeadlineMiss {
    /// How far past its deadline the task is expected to start, ms.
    pub fn late_by_ms(&self) -> u128 {
        self.estimated_start_ms.saturating_sub(self.deadline_ms)
    }
}

impl std::fmt::Display for DeadlineMiss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused: the task is expected to start at {}, {} ms after its deadline of {}; \
             submit it elsewhere, later, or with a later deadline",
            instant_text(self.estimated_start_ms),
            self.late_by_ms(),
            instant_text(self.deadline_ms)
        )
    }
}

/// An instant (ms since the Unix epoch) as a reader takes it in a message: UTC, to the
/// millisecond (`2026-12-02T15:31:32.120Z`); the raw number where it is out of range.
pub(crate) fn instant_text(ms: u128) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{ms} ms since the epoch"), |at| at.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_refusal_shows_its_instants_as_times() {
        let refused = PoolError::WouldMissDeadline(Box::new(DeadlineMiss {
            estimated_start_ms: 1_764_689_492_120,
            deadline_ms: 1_764_689_490_000,
        }));
        assert_eq!(
            refused.to_string(),
            "refused: the task is expected to start at 2025-12-02T15:31:32.12Z, 2120 ms after \
             its deadline of 2025-12-02T15:31:30Z; submit it elsewhere, later, or with a later \
             deadline"
        );
        assert_eq!(
            instant_text(u128::from(u64::MAX)),
            "18446744073709551615 ms since the epoch"
        );
    }

    #[test]
    fn a_deadline_refusal_keeps_the_json_an_earlier_version_stored() {
        // Stored by a version whose variant held its two fields itself (u64).
        let stored = r#"{"WouldMissDeadline":{"estimated_start_ms":1764689492120,"deadline_ms":1764689490000}}"#;
        let read: PoolError = serde_json::from_str(stored).expect("reads");
        let expected = PoolError::WouldMissDeadline(Box::new(DeadlineMiss {
            estimated_start_ms: 1_764_689_492_120,
            deadline_ms: 1_764_689_490_000,
        }));
        assert_eq!(read, expected);
        assert_eq!(serde_json::to_string(&expected).expect("writes"), stored);
    }
}
